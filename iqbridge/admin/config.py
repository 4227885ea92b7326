"""The admin server's configuration file (``hubs.yaml``), parsed into a typed
:class:`AdminConfig`.

Token values never appear in the file: each token names an environment variable or a
file holding its value, read once when the server starts (:mod:`iqbridge.admin.auth`).
A bad file raises :class:`AdminConfigError` listing every problem, each naming its
field; hub URLs are checked as far as they can be without connecting.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from iqbridge.errors import ConfigurationError
from iqbridge.registry import adapter_class, redact, store_class

__all__ = [
    "DEFAULT_MAX_BODY",
    "DEFAULT_RATE",
    "AdminConfig",
    "AdminConfigError",
    "BridgeSpec",
    "HubSpec",
    "Listen",
    "Role",
    "TokenSpec",
    "load_config",
    "parse_config",
]

#: What a token may do: ``admin`` reads and acts, ``readonly`` only reads.
Role = Literal["admin", "readonly"]

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"


class AdminConfigError(ConfigurationError):
    """The admin configuration is malformed, or a token's value cannot be read."""


#: Wrong tokens one client address may present by default (``limits`` notation).
DEFAULT_RATE = "10/minute"

#: The largest request body accepted by default, in bytes (1 MiB).
DEFAULT_MAX_BODY = 1024 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Listen(_Strict):
    """Where ``iq admin serve`` listens (the command line's --host/--port win)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)


class TokenSpec(_Strict):
    """One bearer token: its name (journalled with every action it makes), its role,
    and where its value is read from: exactly one of ``env`` and ``file``."""

    name: str = Field(pattern=_NAME)
    role: Role
    env: str | None = Field(default=None, min_length=1)
    file: Path | None = None

    @model_validator(mode="after")
    def _one_source(self) -> TokenSpec:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env (a variable name) and file (a path)")
        return self


class HubSpec(_Strict):
    """One hub: a broker URL and, optionally, its index store URL. What can be checked
    without connecting is checked here (the scheme, the driver, an index store for a
    broker without a default one), so a typo stops the server at start-up; a broker that
    is down is found on first use."""

    name: str = Field(pattern=_NAME)
    url: str = Field(min_length=1)
    index: str | None = None

    @field_validator("url")
    @classmethod
    def _broker(cls, value: str) -> str:
        try:
            adapter_class(value)
        except ConfigurationError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("index")
    @classmethod
    def _store(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                store_class(value)
            except ConfigurationError as exc:
                raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _has_index(self) -> HubSpec:
        if self.index is None and getattr(adapter_class(self.url), "default_index", None) is None:
            raise ValueError(
                f"the broker at {redact(self.url)} has no default index store: give the hub "
                f"an index URL (index: 'sqlite:///iqbridge-index.db' or another store)"
            )
        return self


class BridgeSpec(_Strict):
    """A bridge daemon whose health file the server reports."""

    name: str = Field(pattern=_NAME)
    health_file: Path
    max_age: float = Field(default=10.0, gt=0)


class AdminConfig(_Strict):
    """The whole admin configuration."""

    listen: Listen = Listen()
    tokens: list[TokenSpec] = Field(min_length=1)
    hubs: list[HubSpec] = Field(min_length=1)
    bridges: list[BridgeSpec] = []
    #: Wrong tokens one client address may present (``limits`` notation, e.g.
    #: ``10/minute``); past that it gets 429 until the window frees.
    failed_logins: str = DEFAULT_RATE
    #: The largest request body accepted, in bytes (413 past it).
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY, ge=1)
    #: Reverse proxies (addresses or networks) whose X-Forwarded-For and
    #: X-Forwarded-Proto are believed; none by default, so no client can choose the
    #: address its wrong tokens are counted against.
    trusted_proxies: list[str] = []

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item.strip(), strict=False)
            except ValueError:
                raise ValueError(
                    f"{item!r} is not an IP address or network: name each proxy as "
                    f"'10.0.0.5' or '10.0.0.0/24'"
                ) from None
        return [item.strip() for item in value]

    @field_validator("failed_logins")
    @classmethod
    def _rate(cls, value: str) -> str:
        from limits import parse

        try:
            parse(value)
        except ValueError:
            raise ValueError(
                f"{value!r} is not a rate: write it as '10/minute', '5 per 30 seconds' ..."
            ) from None
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> AdminConfig:
        for kind, names in (
            ("tokens", [t.name for t in self.tokens]),
            ("hubs", [h.name for h in self.hubs]),
            ("bridges", [b.name for b in self.bridges]),
        ):
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"{kind}: name(s) used twice: {', '.join(twice)}")
        return self

    def hub(self, name: str) -> HubSpec | None:
        """The hub called ``name``, or None."""
        return next((h for h in self.hubs if h.name == name), None)


_KINDS = {"tokens": "token", "hubs": "hub", "bridges": "bridge"}


def _where(data: dict[str, Any], loc: Sequence[int | str]) -> str:
    """The dotted path of a field, with the name of the token, hub or bridge it is in
    (``hubs.1.url (hub 'down')``)."""
    where = ".".join(str(p) for p in loc) or "(top level)"
    if len(loc) >= 2 and loc[0] in _KINDS and isinstance(loc[1], int):
        items = data.get(str(loc[0]))
        item = items[loc[1]] if isinstance(items, list) and loc[1] < len(items) else None
        name = item.get("name") if isinstance(item, dict) else None
        if isinstance(name, str) and name:
            where += f" ({_KINDS[str(loc[0])]} {name!r})"
    return where


def parse_config(data: Any, *, source: str = "admin config") -> AdminConfig:
    """An :class:`AdminConfig` from parsed YAML; AdminConfigError listing every problem,
    each naming its field."""
    if not isinstance(data, dict):
        raise AdminConfigError(f"{source}: expected a mapping with tokens and hubs")
    try:
        return AdminConfig.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"{_where(data, err['loc'])}: {err['msg'].removeprefix('Value error, ')}"
            for err in exc.errors(include_url=False, include_input=False)
        ]
        raise AdminConfigError(f"{source}: " + "; ".join(problems)) from None


def load_config(path: str | Path) -> AdminConfig:
    """Read and parse a ``hubs.yaml`` file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise AdminConfigError(f"cannot read admin config {p}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise AdminConfigError(f"{p}: not valid YAML{at}") from None
    return parse_config(data, source=str(p))
