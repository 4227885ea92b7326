"""Redis index store: message states, indexes and the journal in Redis.

URL: ``redis://[[user]:password@]host[:port][/db][?options]``, or ``rediss://`` for TLS.
Options (query parameters):

* ``prefix``: names this index inside the database (default ``default``); every key
  starts with ``{iq:<prefix>}:``, so several indexes share one Redis apart.
* ``retries``: attempts of a call that meets a dropped connection or a timeout before
  :class:`~iqbridge.errors.IndexUnavailable` is raised (default 4, with exponential
  backoff and jitter from 50 ms up to 1 s).
* ``socket_timeout``, ``socket_connect_timeout``: seconds (default 10 and 5).
* passed to redis-py as they are: ``client_name``, ``max_connections``,
  ``health_check_interval``, ``ssl_cert_reqs``, ``ssl_ca_certs``, ``ssl_certfile``,
  ``ssl_keyfile``, ``ssl_check_hostname``.

Every transition is one Lua script (``stores/lua/commit.lua``, run by EVALSHA): it
checks the record's version (compare-and-set), rewrites the record, moves it between
its secondary indexes (claim order per subscriber, due time, correlation id, lock id,
publisher state, queue in put order) and appends the change's journal entries to a
stream, all or nothing. :meth:`RedisStore.commit_many` sends a whole batch in one call;
:meth:`RedisStore.commit_each` too, writing the changes whose compare-and-set holds and
skipping the others. A new message's retained payload copy (``Change.retain``) is
written by the same script, in the hash ``b:<msg_id>``.
Redis has no interactive transactions, so :meth:`RedisStore.atomic` is a no-op and
compare-and-set alone keeps writers apart. Every key of one index shares a hash tag,
so the scripts run on Redis Cluster too (the whole index then lives on one shard).

A call that loses its connection is retried; a commit whose reply was lost is
recognised by the write id it leaves on the record (or, once another writer replaced
that, by its journal entries in the record's history), and is never applied twice; a
``commit_each`` leaves its reply under ``done:<write id>`` for a while instead. The key
layout is described in docs/index-stores.md (section Redis).

The store is :class:`RedisStore`, composed of its parts: the client, keys and call
plumbing (:mod:`iqbridge.stores.redis_base`), the writes
(:mod:`iqbridge.stores.redis_commit`), the reads (:mod:`iqbridge.stores.redis_reads`),
and the script plumbing with its RESP packer (:mod:`iqbridge.stores.redis_scripts`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from iqbridge.errors import ConfigurationError
from iqbridge.ids import new_token
from iqbridge.model import Subscriptions
from iqbridge.states import PublisherState
from iqbridge.stores.base import PurgedMessage
from iqbridge.stores.codec import subscriptions_from_json, subscriptions_to_json
from iqbridge.stores.redis_base import transient
from iqbridge.stores.redis_reads import RedisReads
from iqbridge.stores.redis_scripts import DirectScripts, _pack
from iqbridge.stores.redis_writes import RedisWrites

__all__ = [
    "DirectScripts",
    "RedisStore",
    "transient",
    # moved to iqbridge.stores.redis_scripts; still importable from here
    "_pack",
]

_JOURNALLED = PublisherState.JOURNALLED

#: Options of the URL read by the store itself; the second set goes to redis-py.
_OWN_OPTIONS = frozenset({"prefix", "retries", "socket_timeout", "socket_connect_timeout"})
_DRIVER_OPTIONS = frozenset(
    {
        "client_name",
        "max_connections",
        "health_check_interval",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_check_hostname",
    }
)


def _int_option(opts: dict[str, str], name: str, default: int, url: str) -> int:
    raw = opts.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigurationError(
            f"Redis index URL {url}: {name} must be a positive integer, not {raw!r}"
        )
    return value


def _float_option(opts: dict[str, str], name: str, default: float, url: str) -> float:
    raw = opts.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(
            f"Redis index URL {url}: {name} must be a positive number of seconds, not {raw!r}"
        )
    return value


class RedisStore(RedisWrites, RedisReads):
    """The index in Redis (see the module docstring). Thread-safe; fork-safe."""

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        """Open the index a ``redis://`` or ``rediss://`` URL names; check it answers."""
        from iqbridge.registry import redact

        safe = redact(url)
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ConfigurationError(f"not a Redis URL: {safe!r}; write redis://host:6379/0")
        opts = dict(parse_qsl(parts.query, keep_blank_values=True))
        unknown = set(opts) - _OWN_OPTIONS - _DRIVER_OPTIONS
        if unknown:
            known = ", ".join(sorted(_OWN_OPTIONS | _DRIVER_OPTIONS))
            raise ConfigurationError(
                f"unknown Redis index option(s) {sorted(unknown)} in {safe}; known: {known}"
            )
        path = parts.path.strip("/")
        if path and not path.isdigit():
            raise ConfigurationError(
                f"Redis index URL {safe}: the path must be a database number (/0 to /15), "
                f"not {path!r}"
            )
        driver_query = urlencode({k: v for k, v in opts.items() if k in _DRIVER_OPTIONS})
        driver_url = urlunsplit(parts._replace(query=driver_query, fragment=""))
        try:
            client = redis.Redis.from_url(
                driver_url,
                decode_responses=True,
                socket_timeout=_float_option(opts, "socket_timeout", 10.0, safe),
                socket_connect_timeout=_float_option(opts, "socket_connect_timeout", 5.0, safe),
                # Retries are ours (tenacity): the driver's own would re-send a commit
                # script blindly after a lost reply.
                retry=Retry(NoBackoff(), 0),
                # RESP2: redis-py's pure-Python parser reads the scripts' nested replies
                # in about three quarters of the time RESP3's takes.
                protocol=2,
            )
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"Redis index URL {safe}: {exc}") from exc
        store = cls(
            client,
            url=url,
            prefix=opts.get("prefix", "default"),
            retries=_int_option(opts, "retries", 4, safe),
        )
        try:
            store._check_server()
        except BaseException:
            store.close()
            raise
        return store

    # --- purge, queues, subscriptions --------------------------------------------------

    def purge(
        self,
        queue: str,
        before: int,
        limit: int = 1000,
        ids: Sequence[str] | None = None,
    ) -> list[PurgedMessage]:
        """Delete journalled messages last changed before ``before`` (only ``ids``, if
        given: each is looked up in the queue's JOURNALLED index, nothing is scanned);
        keep the journal."""
        if limit <= 0 or (ids is not None and not ids):
            return []
        listed = list(dict.fromkeys(ids)) if ids is not None else []
        request = new_token()
        # A purge whose reply was lost left its answer behind.
        rows = self._run_keeping_reply(
            self._purge,
            [f"{self.keyspace}p:{queue}/{_JOURNALLED.value}"],
            [self.keyspace, str(before), str(limit), request, *listed],
            request,
            lambda kept: json.loads(kept) or [],
        )
        return [PurgedMessage(msg_id, ref or None) for msg_id, ref in rows]

    def declare_queue(self, queue: str) -> None:
        """Make the queue known (idempotent)."""
        self._call(lambda: self._r.sadd(self._queues_key, queue))

    def subscriptions(self, queue: str) -> Subscriptions:
        """The queue's standing audience."""
        body = self._call(lambda: self._r.hget(self._subs_key, queue))
        return Subscriptions() if body is None else subscriptions_from_json(body)

    def set_subscriptions(self, queue: str, subs: Subscriptions) -> None:
        """Replace the queue's standing audience."""
        body = subscriptions_to_json(subs)

        def write() -> None:
            pipe = self._r.pipeline(transaction=True)
            pipe.sadd(self._queues_key, queue)
            pipe.hset(self._subs_key, queue, body)
            pipe.execute()

        self._call(write)

    def close(self) -> None:
        """Release the connection pool."""
        self._r.close()

    def __repr__(self) -> str:
        return f"<RedisStore {self.url} prefix={self.prefix!r}>"
