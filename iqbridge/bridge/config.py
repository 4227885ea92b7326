"""The bridge's configuration: a YAML file validated on load (pydantic).

Every error names the route, the field and what is wrong; URLs may take secrets from
the environment (``${RABBIT_PASSWORD}``), and no error or log line ever shows one::

    bridge:
      name: orders
      state: sqlite:///bridge-state.db
    routes:
      - name: in-to-out
        source: {url: "sqlite:///in.db", queue: orders, subscriber: bridge}
        destination: {url: "redis://127.0.0.1:6379/0", queue: orders, to: [billing]}
        workers: 4
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from iqbridge.durations import seconds
from iqbridge.errors import ConfigurationError, InvalidArgument
from iqbridge.redaction import url_secrets

__all__ = [
    "BridgeConfig",
    "BridgeSettings",
    "Correlate",
    "Destination",
    "Envelope",
    "HeaderMap",
    "RetrySettings",
    "Route",
    "Source",
    "load_config",
    "parse_config",
]

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$"
_DOTTED = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

Name = Annotated[str, Field(pattern=_NAME)]
Dotted = Annotated[str, Field(pattern=_DOTTED)]


def _duration(*, positive: bool) -> AfterValidator:
    """Seconds, checked as every duration of the API is (:mod:`iqbridge.durations`)."""

    def check(value: float) -> float:
        try:
            return seconds(value, "duration", positive=positive)
        except InvalidArgument as exc:  # pydantic names the field; the text need not
            raise ValueError(str(exc).removeprefix("duration ")) from None

    return AfterValidator(check)


Seconds = Annotated[float, _duration(positive=False)]
PositiveSeconds = Annotated[float, _duration(positive=True)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Model):
    """Where a route reads: a queue on a broker, as one subscriber (or pool member)."""

    url: str
    index: str | None = None
    queue: Name
    subscriber: Name = "bridge"
    #: Subscribe ``subscriber`` to the queue on start (for a queue the bridge reads
    #: alone); set false when the publisher's audience names it already.
    subscribe: bool = True


class Destination(_Model):
    """Where a route writes: a queue on a broker, for an audience (default: the
    queue's standing subscriptions)."""

    url: str
    index: str | None = None
    queue: Name
    to: list[Name] | None = None


class HeaderMap(_Model):
    """Header mapping: ``rename`` (old: new), ``drop`` (names), ``set`` (name: value);
    ``keep: false`` starts from no headers at all."""

    keep: bool = True
    rename: dict[str, str] = {}
    drop: list[str] = []
    set: dict[str, str] = {}


class Envelope(_Model):
    """Where the child's envelope fields come from: ``keep`` (the parent's),
    ``header:NAME`` (a header of the parent) or, for the correlation id, ``msg_id``
    (the parent's msg_id); a fixed priority is a number 0-9."""

    correlation_id: str = "keep"
    ordering_key: str = "keep"
    priority: int | Literal["keep"] = "keep"

    @field_validator("correlation_id", "ordering_key")
    @classmethod
    def _source(cls, v: str) -> str:
        if v in ("keep", "msg_id", "correlation_id") or (v.startswith("header:") and len(v) > 7):
            return v
        raise ValueError("must be 'keep', 'msg_id', 'correlation_id' or 'header:NAME'")

    @field_validator("priority")
    @classmethod
    def _priority(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 0 <= v <= 9:
            raise ValueError("must be 'keep' or 0 to 9")
        return v


class Correlate(_Model):
    """Combine the messages sharing a key into one (seed 000): complete on ``count``
    messages, on ``complete`` (a dotted path to ``fn(messages) -> bool``) or after
    ``timeout`` seconds from the group's first message. ``key`` is ``correlation_id``
    (default), ``ordering_key``, ``header:NAME`` or a dotted path ``fn(message) -> str``.
    ``combine`` (dotted path, ``fn(messages) -> payload``) makes the aggregate; the
    default is a JSON list of the inputs' payloads. ``max_groups`` and ``max_bytes``
    bound what the route holds: past either, the oldest group completes early."""

    key: str = "correlation_id"
    count: int | None = Field(default=None, ge=1, le=100_000)
    complete: Dotted | None = None
    timeout: PositiveSeconds | None = None
    combine: Dotted | None = None
    max_groups: int = Field(default=10_000, ge=1)
    max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        if v in ("correlation_id", "ordering_key") or v.startswith("header:"):
            return v
        if re.match(_DOTTED, v):
            return v
        raise ValueError(
            "must be 'correlation_id', 'ordering_key', 'header:NAME' or a dotted path "
            "'package.module:function'"
        )

    @model_validator(mode="after")
    def _completes(self) -> Correlate:
        if self.count is None and self.complete is None and self.timeout is None:
            raise ValueError("give count, complete or timeout: a group must be able to complete")
        return self


class RetrySettings(_Model):
    """How often a failing message is tried before it goes UNUSABLE."""

    max_attempts: int = Field(default=5, ge=1)
    initial_delay: Seconds = 0.5
    multiplier: float = Field(default=2.0, ge=1, allow_inf_nan=False)
    max_delay: Seconds = 30.0


class Route(_Model):
    """One route: a source, a destination, and what happens on the way."""

    name: Name
    source: Source
    destination: Destination
    workers: int = Field(default=4, ge=1, le=256)
    batch: int = Field(default=200, ge=1, le=10_000)
    lease: PositiveSeconds = 30.0
    content_type: Literal["keep", "bytes", "text", "json"] = "keep"
    headers: HeaderMap = HeaderMap()
    envelope: Envelope = Envelope()
    transform: Dotted | None = None
    correlate: Correlate | None = None
    retry: RetrySettings = RetrySettings()
    #: The publisher name children are put under (default ``bridge.<route>``).
    publisher: Name | None = None


class BridgeSettings(_Model):
    """The daemon: its name, where its own state lives (route leases and pending
    aggregations; a hub URL shared by every process of the bridge: ``sqlite:///`` on one
    host, ``redis://`` across hosts) and its health file."""

    name: Name = "bridge"
    state: str = "sqlite:///iq-bridge-state.db"
    health_file: str | None = None
    #: Seconds between lease renewals and health records.
    heartbeat: PositiveSeconds = 1.0


class BridgeConfig(_Model):
    """A bridge configuration file."""

    bridge: BridgeSettings = BridgeSettings()
    routes: list[Route] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> BridgeConfig:
        seen: set[str] = set()
        for r in self.routes:
            if r.name in seen:
                raise ValueError(f"route name {r.name!r} is used twice; give each route its own")
            seen.add(r.name)
        return self

    def secrets(self) -> list[str]:
        """The secrets of every URL of the configuration, to scrub from output."""
        out: list[str] = []
        urls = [self.bridge.state]
        for r in self.routes:
            urls += [
                r.source.url,
                r.destination.url,
                r.source.index or "",
                r.destination.index or "",
            ]
        for url in urls:
            out += url_secrets(url)
        return out


def _expand(value: Any, missing: list[str]) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            got = os.environ.get(name)
            if got is None:
                missing.append(name)
                return ""
            return got

        return _ENV.sub(sub, value)
    if isinstance(value, list):
        return [_expand(v, missing) for v in value]
    if isinstance(value, dict):
        return {k: _expand(v, missing) for k, v in value.items()}
    return value


def _where(raw: Any, loc: tuple[int | str, ...]) -> str:
    """'route "name", field source.url' for an error location."""
    if len(loc) >= 2 and loc[0] == "routes" and isinstance(loc[1], int):
        name = None
        routes = raw.get("routes") if isinstance(raw, dict) else None
        if isinstance(routes, list) and loc[1] < len(routes) and isinstance(routes[loc[1]], dict):
            name = routes[loc[1]].get("name")
        who = f"route {name!r}" if isinstance(name, str) else f"route #{loc[1] + 1}"
        rest = ".".join(str(p) for p in loc[2:])
        return f"{who}, field {rest}" if rest else who
    return "field " + ".".join(str(p) for p in loc) if loc else "the file"


def parse_config(raw: Any, origin: str = "bridge config") -> BridgeConfig:
    """Validate a configuration already read (a dict); raise ConfigurationError naming
    the route, the field and what is wrong."""
    if not isinstance(raw, dict):
        raise ConfigurationError(
            f"{origin}: expected a mapping with 'routes', got {type(raw).__name__}"
        )
    missing: list[str] = []
    expanded = _expand(raw, missing)
    if missing:
        names = ", ".join(sorted(set(missing)))
        raise ConfigurationError(
            f"{origin}: environment variable(s) {names} not set; "
            f"the config refers to them as ${{NAME}}"
        )
    try:
        return BridgeConfig.model_validate(expanded)
    except ValidationError as exc:
        lines = []
        for err in exc.errors(include_url=False, include_input=False):
            msg = err["msg"]
            lines.append(f"{_where(raw, tuple(err['loc']))}: {msg}")
        raise ConfigurationError(f"{origin}: " + "; ".join(lines)) from None


def load_config(path: str | Path) -> BridgeConfig:
    """Read and validate a bridge YAML file (see the module documentation)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read bridge config {p}: {exc.strerror or exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigurationError(f"bridge config {p} is not valid YAML{where}") from None
    return parse_config(raw, f"bridge config {p}")
