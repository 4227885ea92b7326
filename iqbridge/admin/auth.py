"""Bearer tokens: read once at start from the environment or a file, compared in
constant time, never logged.

:class:`TokenRing` holds the configured tokens; :meth:`TokenRing.check` compares the
presented value with *every* token using :func:`hmac.compare_digest` (no early exit), so
the time taken does not tell which token, or how much of one, matched.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from iqbridge.admin.config import AdminConfig, AdminConfigError, Role

__all__ = ["MIN_TOKEN_LENGTH", "Principal", "TokenRing"]

#: The shortest token value accepted: shorter ones are guessable.
MIN_TOKEN_LENGTH = 16


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the token's name and role (never its value)."""

    name: str
    role: Role

    @property
    def is_admin(self) -> bool:
        """Whether this caller may act (not only read)."""
        return self.role == "admin"


@dataclass(frozen=True, slots=True)
class _Token:
    principal: Principal
    value: bytes = field(repr=False)


class TokenRing:
    """The configured tokens, each with its value; compares presented ones."""

    def __init__(self, tokens: Sequence[tuple[str, Role, str]]) -> None:
        if not tokens:
            raise AdminConfigError("at least one token is needed")
        self._tokens = [_Token(Principal(n, r), v.encode("utf-8")) for n, r, v in tokens]

    def __repr__(self) -> str:
        names = ", ".join(t.principal.name for t in self._tokens)
        return f"TokenRing({names})"

    @classmethod
    def from_config(
        cls, config: AdminConfig, environ: Mapping[str, str] | None = None
    ) -> TokenRing:
        """Read every token's value from its variable or file. The error names the
        token and where it was looked for, never a value."""
        env = os.environ if environ is None else environ
        out: list[tuple[str, Role, str]] = []
        for spec in config.tokens:
            if spec.env is not None:
                value = env.get(spec.env, "").strip()
                where = f"environment variable {spec.env}"
            else:
                assert spec.file is not None
                where = f"file {spec.file}"
                try:
                    value = spec.file.read_text(encoding="utf-8").strip()
                except (OSError, UnicodeDecodeError) as exc:
                    why = getattr(exc, "strerror", None) or type(exc).__name__
                    raise AdminConfigError(
                        f"token {spec.name!r}: cannot read its {where}: {why}"
                    ) from None
            if not value:
                raise AdminConfigError(f"token {spec.name!r}: its {where} is empty or unset")
            if len(value) < MIN_TOKEN_LENGTH or not value.isprintable():
                raise AdminConfigError(
                    f"token {spec.name!r}: the value in its {where} must be at least "
                    f"{MIN_TOKEN_LENGTH} printable characters (e.g. `openssl rand -hex 32`)"
                )
            out.append((spec.name, spec.role, value))
        values = [v for _, _, v in out]
        if len(set(values)) != len(values):
            raise AdminConfigError("two tokens have the same value: give each its own")
        return cls(out)

    def check(self, presented: str | None) -> Principal | None:
        """The principal whose token equals ``presented``, or None. Every token is
        compared, whatever matched first."""
        if not presented:
            return None
        given = presented.encode("utf-8", "surrogateescape")
        found: Principal | None = None
        for token in self._tokens:
            if hmac.compare_digest(given, token.value) and found is None:
                found = token.principal
        return found

    def secrets(self) -> list[str]:
        """Every token value (to scrub them from any text shown or logged)."""
        return [t.value.decode("utf-8") for t in self._tokens]
