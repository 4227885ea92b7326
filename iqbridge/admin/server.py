"""How ``iq admin serve`` runs the app under uvicorn: which proxies' forwarding headers
are believed (none unless ``trusted_proxies`` names them) and an access log that never
shows a credential passed in a query string.

Uvicorn by default believes ``X-Forwarded-For`` from 127.0.0.1 (or from the addresses in
``$FORWARDED_ALLOW_IPS``): any local client could then choose the address its wrong
tokens are counted against, and escape the limit. And its access log prints each
request's whole target, query string included, so ``GET /api/hubs?token=...`` would
write the token to the log even though the request is refused.
"""

from __future__ import annotations

import copy
import logging
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_plus

from iqbridge.admin.config import AdminConfig

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp

__all__ = ["CredentialQueryFilter", "log_config", "scrub_target", "server_config"]

#: Query parameter names that carry a credential (matched case-insensitively, anywhere
#: in the name: ``access_token``, ``X-Api-Key``, ``client_secret``...).
_SECRET_NAME = re.compile(
    r"token|passw|pwd|secret|api[-_.]?key|auth|credential|session|csrf|signature|private"
    r"|^(key|sig|pass)$",
    re.IGNORECASE,
)
_SEPARATOR = re.compile(r"([&;])")
MASK = "***"


def scrub_target(target: str) -> str:
    """A request target with the value of every credential-like query parameter
    replaced by ``***`` (``/api/hubs?token=abc&x=1`` -> ``/api/hubs?token=***&x=1``)."""
    path, sep, query = target.partition("?")
    if not sep:
        return target
    parts = []
    for part in _SEPARATOR.split(query):
        name, eq, _ = part.partition("=")
        secret = eq and _SECRET_NAME.search(unquote_plus(name))
        parts.append(f"{name}={MASK}" if secret else part)
    return f"{path}?{''.join(parts)}"


class CredentialQueryFilter(logging.Filter):
    """Masks credential-like query parameters in every request target among a log
    record's arguments (uvicorn's access line is ``client - "METHOD target HTTP/v"
    status``, the target an argument); never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Scrub the record in place; keep it."""
        if isinstance(record.args, tuple) and record.args:
            record.args = tuple(
                scrub_target(a) if isinstance(a, str) and a.startswith("/") and "?" in a else a
                for a in record.args
            )
        return True


def log_config() -> dict[str, Any]:
    """Uvicorn's default logging configuration with :class:`CredentialQueryFilter` on
    its access and error loggers and their handlers."""
    from uvicorn.config import LOGGING_CONFIG

    cfg = copy.deepcopy(LOGGING_CONFIG)
    name = "iqbridge_scrub_query"
    cfg.setdefault("filters", {})[name] = {"()": f"{__name__}.CredentialQueryFilter"}
    for handler in cfg["handlers"].values():
        handler.setdefault("filters", []).append(name)
    for logger in ("uvicorn.access", "uvicorn.error"):
        cfg["loggers"].setdefault(logger, {}).setdefault("filters", []).append(name)
    return cfg


def server_config(
    app: ASGIApp, config: AdminConfig, *, host: str | None = None, port: int | None = None
) -> uvicorn.Config:
    """The uvicorn configuration ``iq admin serve`` runs ``app`` with: the file's listen
    address unless ``host``/``port`` are given; forwarding headers believed only from
    ``config.trusted_proxies`` (never from ``$FORWARDED_ALLOW_IPS``); the access log
    scrubbed of query-string credentials; no ``Server`` header."""
    import uvicorn

    proxies = list(config.trusted_proxies)
    return uvicorn.Config(
        app,
        host=host or config.listen.host,
        port=port or config.listen.port,
        log_level="info",
        access_log=True,
        log_config=log_config(),
        server_header=False,
        proxy_headers=bool(proxies),
        forwarded_allow_ips=proxies,
    )
