"""The base of the Redis index store (:mod:`iqbridge.stores.redis`): the client, its
key names and registered scripts, and the plumbing every call goes through: retries with
backoff on a dropped connection or a timeout (:func:`transient`), the errors raised when
Redis cannot be reached, the server check, and a message's history as the scripts keep
it (read by the store and by a commit checking whether a lost reply had applied).

The store's writes are in :mod:`iqbridge.stores.redis_commit` and its reads in
:mod:`iqbridge.stores.redis_reads`; both build on :class:`RedisStoreBase`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.commands.core import Script
from redis.exceptions import AuthenticationError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from iqbridge.errors import ConfigurationError, IndexUnavailable, MessageNotFound
from iqbridge.model import JournalEntry
from iqbridge.redaction import get_logger
from iqbridge.stores.codec import entries_from_json
from iqbridge.stores.redis_scripts import _SCRIPTS, DirectScripts, lua_fragment

__all__ = ["RedisStoreBase", "transient"]

# The store's logger, named for the module the store is imported from.
log = get_logger("iqbridge.stores.redis")

T = TypeVar("T")

_MIN_VERSION = (6, 2)  # ZRANGE ... BYSCORE, exclusive XRANGE bounds


def transient(exc: BaseException) -> bool:
    """A dropped connection or a timeout (worth another try); a refused login is not."""
    return isinstance(exc, RedisConnectionError | RedisTimeoutError) and not isinstance(
        exc, AuthenticationError
    )


class RedisStoreBase:
    """Client, keys, scripts and call plumbing of :class:`~iqbridge.stores.redis.RedisStore`
    (see :mod:`iqbridge.stores.redis`)."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        url: str,
        prefix: str = "default",
        retries: int = 4,
    ) -> None:
        from iqbridge.registry import redact

        if not prefix or any(c in prefix for c in "{} \t\r\n"):
            raise ConfigurationError(
                f"Redis index prefix {prefix!r} must be non-empty, without braces or spaces"
            )
        self.url = redact(url)
        self.prefix = prefix
        self.retries = retries
        #: Seconds to keep retrying a dropped connection, instead of ``retries`` attempts:
        #: the Redis Streams adapter gives its default index its own ``retry_for``, so the
        #: index rides out the same server restart as the broker.
        self.retry_for: float | None = None
        # Typed Any: redis-py types every reply as bytes | str; this client decodes to str.
        self._r: Any = client
        #: Every key of this index starts with this; the braces are its hash tag.
        self.keyspace = f"{{iq:{prefix}}}:"
        k = self.keyspace
        self._seq_key = k + "seq"
        self._journal_key = k + "journal"
        self._queues_key = k + "queues"
        self._subs_key = k + "subs"
        scripts: dict[str, Script] = {n: client.register_script(lua_fragment(n)) for n in _SCRIPTS}
        self._commit = scripts["commit"]
        self._writes = scripts["writes"]
        self._put = scripts["put"]
        self._settle = scripts["settle"]
        self._claim = scripts["claim"]
        self._available = scripts["available"]
        self._history = scripts["history"]
        self._page = scripts["page"]
        self._purge = scripts["purge"]
        self._native_ref = scripts["native_ref"]
        self._direct = DirectScripts(client)

    @property
    def client(self) -> redis.Redis:
        """The redis-py client (decoding replies to str); the Redis Streams adapter asks
        it where the index lives, to run both in one round trip when they share a server."""
        client: redis.Redis = self._r
        return client

    # --- plumbing ----------------------------------------------------------------------

    def _unavailable(self, exc: RedisError) -> IndexUnavailable:
        if isinstance(exc, AuthenticationError):
            return IndexUnavailable(
                f"the Redis index at {self.url} refused the login ({exc}); check the user "
                f"name and password in the index URL"
            )
        if transient(exc):
            tried = (
                f"tried {self.retries} times"
                if self.retry_for is None
                else f"retried for {self.retry_for:g} s"
            )
            return IndexUnavailable(
                f"cannot reach the Redis index at {self.url} ({type(exc).__name__}: {exc}; "
                f"{tried}); check that Redis is running there and that the URL's host, port "
                f"and database are right"
            )
        return IndexUnavailable(
            f"the Redis index at {self.url} failed a command ({type(exc).__name__}: {exc}); "
            f"check that the server is a writable Redis 6.2 or later primary"
        )

    def _call(self, fn: Callable[[], T]) -> T:
        """``fn()``, retried with backoff on a dropped connection or a timeout.

        Only for calls that are safe to repeat (reads, idempotent writes, and calls that
        check first whether an earlier try already applied).
        """
        limit = self.retry_for
        try:
            return fn()
        except RedisError as exc:
            if not transient(exc) or (self.retries <= 1 if limit is None else limit <= 0):
                raise self._unavailable(exc) from exc
            log.warning("Redis index %s: %s; retrying", self.url, exc)
        retrying = Retrying(
            retry=retry_if_exception(transient),
            stop=stop_after_attempt(self.retries - 1) if limit is None else stop_after_delay(limit),
            wait=wait_exponential(multiplier=0.05, max=1.0) + wait_random(0, 0.05),
            before_sleep=before_sleep_log(log, logging.WARNING),
            reraise=True,
        )
        try:
            return retrying(fn)
        except RedisError as exc:
            raise self._unavailable(exc) from exc

    def _run_keeping_reply(
        self,
        script: Script,
        keys: list[str],
        args: list[Any],
        request: str,
        kept: Callable[[str], Any],
    ) -> Any:
        """Run a script that keeps its reply under "done:<request>" (a write that must
        not be made twice), retried as :meth:`_call` does: a retry reads the kept reply
        first (``kept`` parses it back), since the lost try may have applied."""
        done_key = f"{self.keyspace}done:{request}"
        tried = False

        def attempt() -> Any:
            nonlocal tried
            if tried:
                reply = self._r.get(done_key)
                if reply is not None:
                    return kept(reply)
            tried = True
            return self._direct.run(script, keys, args)

        return self._call(attempt)

    def _check_server(self) -> None:
        info = self._call(lambda: self._r.info("server"))
        version = str(info.get("redis_version", "0"))
        parsed = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
        if parsed < _MIN_VERSION:
            raise ConfigurationError(
                f"the Redis index at {self.url} runs Redis {version}; the index store needs "
                f"6.2 or later"
            )

    def _record_key(self, msg_id: str) -> str:
        return f"{self.keyspace}m:{msg_id}"

    def _read_history(self, msg_id: str) -> list[JournalEntry]:
        kept = f"{self.keyspace}h:{msg_id}"  # a purged message's list of entries
        rows = self._history(keys=[self._record_key(msg_id), self._journal_key, kept])
        if rows is None:
            raise MessageNotFound(msg_id)
        out: list[JournalEntry] = []
        for n, flat in rows:
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            entries = entries_from_json(int(n), fields["m"], fields["q"], fields["e"])
            if fields["m"]:
                out.extend(entries)
            else:  # a batch's row: other messages' entries too
                out.extend(e for e in entries if e.msg_id == msg_id)
        return out
