"""Adapters and index stores found by URL scheme.

One alias table per kind maps a scheme to ``module:Class``; the class has a ``from_url``
classmethod. Third-party brokers register an adapter under the ``iqbridge.adapters``
entry-point group. An unknown scheme raises :class:`~iqbridge.errors.UnknownSchemeError`
with a "did you mean" hint; a known scheme whose driver is not installed raises
:class:`~iqbridge.errors.ConfigurationError` naming the extra to install.
"""

from __future__ import annotations

import difflib
import importlib
import math
from importlib.metadata import entry_points
from typing import Any

from iqbridge.adapter import Adapter
from iqbridge.errors import ConfigurationError, UnknownSchemeError
from iqbridge.redaction import redact, remember, scrub, url_secrets
from iqbridge.stores.base import IndexStore

__all__ = [
    "ADAPTERS",
    "STORES",
    "adapter_class",
    "open_adapter",
    "open_store",
    "redact",
    "store_class",
    "url_secrets",
]

#: scheme -> (import path, extra that installs its driver)
ADAPTERS: dict[str, tuple[str, str | None]] = {
    "memory": ("iqbridge.adapters.memory:MemoryAdapter", None),
    "sqlite": ("iqbridge.adapters.sqlite:SqliteAdapter", None),
    "redis": ("iqbridge.adapters.redis_streams:RedisStreamsAdapter", "redis"),
    "rediss": ("iqbridge.adapters.redis_streams:RedisStreamsAdapter", "redis"),
    "amqp": ("iqbridge.adapters.rabbitmq:RabbitMQAdapter", "rabbitmq"),
    "amqps": ("iqbridge.adapters.rabbitmq:RabbitMQAdapter", "rabbitmq"),
    "kafka": ("iqbridge.adapters.kafka:KafkaAdapter", "kafka"),
    "ibmmq": ("iqbridge.adapters.ibmmq:IbmMqAdapter", "ibmmq"),
    "oracle+aq": ("iqbridge.adapters.oracle_aq:OracleAQAdapter", "oracle"),
}

STORES: dict[str, tuple[str, str | None]] = {
    "memory": ("iqbridge.stores.memory:MemoryStore", None),
    "sqlite": ("iqbridge.stores.sqlite:SqliteStore", None),
    "redis": ("iqbridge.stores.redis:RedisStore", "redis"),
    "rediss": ("iqbridge.stores.redis:RedisStore", "redis"),
    # SQLAlchemy Core: any of its URLs with a dialect of PostgreSQL, MySQL/MariaDB,
    # SQLite (``sql+sqlite:///file.db``: the portable SQL store on an SQLite file) or Oracle.
    "postgresql": ("iqbridge.stores.sql:SqlStore", "sql"),
    "postgresql+psycopg": ("iqbridge.stores.sql:SqlStore", "sql"),
    "postgres": ("iqbridge.stores.sql:SqlStore", "sql"),
    "mysql": ("iqbridge.stores.sql:SqlStore", "sql"),
    "mysql+pymysql": ("iqbridge.stores.sql:SqlStore", "sql"),
    "mariadb": ("iqbridge.stores.sql:SqlStore", "sql"),
    "mariadb+pymysql": ("iqbridge.stores.sql:SqlStore", "sql"),
    "sql+sqlite": ("iqbridge.stores.sql:SqlStore", "sql"),
    "oracle": ("iqbridge.stores.sql:SqlStore", "oracle"),
    "oracle+oracledb": ("iqbridge.stores.sql:SqlStore", "oracle"),
}

_EP_GROUP = "iqbridge.adapters"


def url_number(
    opts: dict[str, str], name: str, default: float, *, low: float = 0.0, url: str
) -> float:
    """The number a URL option gives (``default`` when absent); ConfigurationError naming
    the option and ``url`` (a description holding the URL, redacted here again) when it
    is not a number of at least ``low``."""
    try:
        value = float(opts.get(name, default))
    except ValueError:
        value = low - 1
    if not math.isfinite(value) or value < low:
        raise ConfigurationError(
            f"{scrub(url)}: {name} must be a number >= {low:g}, not {opts.get(name)!r}"
        )
    return value


def _scheme(url: str, kind: str) -> str:
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"{kind} URL {redact(str(url))!r} has no scheme; write it like "
            f"sqlite:///iqbridge.db, memory://, redis://localhost:6379/0"
        )
    return url.split("://", 1)[0].lower()


def _load(target: str, scheme: str, extra: str | None) -> Any:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if extra and exc.name and not exc.name.startswith("iqbridge"):
            raise ConfigurationError(
                f"the {scheme}:// backend needs the {exc.name!r} driver: "
                f"pip install 'iqbridge[{extra}]'"
            ) from exc
        raise
    return getattr(module, attr)


def _plugins() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=_EP_GROUP)}


def adapter_class(url: str) -> Any:
    """The adapter class a broker URL names, found without connecting: the checks a
    configuration can have before start-up (UnknownSchemeError with a "did you mean",
    ConfigurationError for no scheme or a driver not installed)."""
    scheme = _scheme(url, "broker")
    if scheme in ADAPTERS:
        target, extra = ADAPTERS[scheme]
        return _load(target, scheme, extra)
    plugins = _plugins()
    if scheme not in plugins:
        known = sorted(set(ADAPTERS) | set(plugins))
        close = difflib.get_close_matches(scheme, known, n=1)
        raise UnknownSchemeError(scheme, known, close[0] if close else None)
    return plugins[scheme].load()


def store_class(url: str) -> Any:
    """The index store class an index URL names, found without connecting (the errors
    of :func:`adapter_class`)."""
    scheme = _scheme(url, "index")
    if scheme not in STORES:
        close = difflib.get_close_matches(scheme, list(STORES), n=1)
        raise UnknownSchemeError(scheme, list(STORES), close[0] if close else None)
    target, extra = STORES[scheme]
    return _load(target, scheme, extra)


def open_adapter(url: str) -> Adapter:
    """The adapter for a broker URL (its secrets are scrubbed from every log line from
    now on)."""
    remember(url)
    adapter: Adapter = adapter_class(url).from_url(url)
    return adapter


def open_store(url: str) -> IndexStore:
    """The index store for an index URL (its secrets are scrubbed from every log line
    from now on)."""
    remember(url)
    store: IndexStore = store_class(url).from_url(url)
    return store
