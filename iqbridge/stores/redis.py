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
"""

from __future__ import annotations

import json
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from functools import partial
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.client import NEVER_DECODE
from redis.commands.core import Script
from redis.exceptions import AuthenticationError, NoScriptError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from iqbridge.engine import Change
from iqbridge.errors import ConfigurationError, IndexUnavailable, MessageNotFound
from iqbridge.ids import new_token
from iqbridge.model import (
    Filter,
    JournalEntry,
    MessageRecord,
    MessageSummary,
    Retained,
    Subscriptions,
)
from iqbridge.states import PublisherState, SubscriberState
from iqbridge.stores.base import PurgedMessage, StaleRecord
from iqbridge.stores.codec import (
    JOURNAL_PER_ROW,
    encode,
    entries_from_json,
    entries_to_json,
    matches,
    record_from_json,
    record_to_json,
    subscriptions_from_json,
    subscriptions_to_json,
    summary,
)

__all__ = ["DirectScripts", "RedisStore", "transient"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_AVAILABLE = SubscriberState.AVAILABLE
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
_MIN_VERSION = (6, 2)  # ZRANGE ... BYSCORE, exclusive XRANGE bounds

_SCRIPTS = ("commit", "available", "history", "page", "purge", "native_ref")


def _lua(name: str) -> str:
    return (
        resources.files("iqbridge.stores")
        .joinpath("lua")
        .joinpath(f"{name}.lua")
        .read_text("utf-8")
    )


def transient(exc: BaseException) -> bool:
    """A dropped connection or a timeout (worth another try); a refused login is not."""
    return isinstance(exc, RedisConnectionError | RedisTimeoutError) and not isinstance(
        exc, AuthenticationError
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
    if value <= 0:
        raise ConfigurationError(
            f"Redis index URL {url}: {name} must be a positive number of seconds, not {raw!r}"
        )
    return value


class _Held:
    """A thread's own connection, released to the pool when the thread is gone."""

    __slots__ = ("__weakref__", "conn", "forks")

    def __init__(self, conn: Any, forks: int) -> None:
        self.conn, self.forks = conn, forks


#: How many forks this process descends from: a connection taken before a fork belongs
#: to the parent. Counted at fork time, so a call needs no getpid() system call.
_forks = [0]


def _forked() -> None:
    _forks[0] += 1


os.register_at_fork(after_in_child=_forked)


class DirectScripts:
    """Runs Lua scripts on a connection each thread takes from the client's pool once.

    ``client.evalsha`` takes a connection from the pool and gives it back on every call:
    a lock, a process-id check, a poll of the socket and a few events, about 30 µs of
    CPU a call on the CI machine, a quarter of a loopback round trip. The hot path (the
    index's commit script, the adapter's receive script) runs often enough to skip that.
    Nothing else changes: the same connection settings, health checks and errors
    (a broken connection is closed by redis-py and reconnects on the next call); a
    script the server lost (a restart) is loaded again. A thread's connection goes back
    to the pool when the thread ends, a forked child takes new ones, and closing the
    client closes them all.
    """

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._local = threading.local()

    def _connection(self) -> Any:
        held: _Held | None = getattr(self._local, "held", None)
        if held is None or held.forks != _forks[0]:
            conn = self._pool.get_connection()
            held = _Held(conn, _forks[0])
            weakref.finalize(held, self._pool.release, conn)
            self._local.held = held
        return held.conn

    def run(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """``EVALSHA`` the script with its keys and arguments; the parsed reply."""
        conn = self._connection()
        command = [_pack(["EVALSHA", script.sha, len(keys), *keys, *args])]
        try:
            conn.send_packed_command(command)
            return conn.read_response()
        except NoScriptError:
            conn.send_command("SCRIPT", "LOAD", script.script)
            conn.read_response()
            conn.send_packed_command(command)
            return conn.read_response()


def _pack(args: Sequence[str | bytes | int]) -> bytes:
    """A command in the Redis protocol (RESP): what redis-py's pure-Python packer makes
    of str (UTF-8), bytes and int arguments, in a fifth of the time for the scripts'
    few dozen arguments.

    Text is joined as str and encoded once (an ASCII argument's length in bytes is its
    length in characters); a bytes argument (a payload) ends the text run before it.
    """
    text = [f"*{len(args)}\r\n"]
    done: list[bytes] | None = None
    for arg in args:
        if type(arg) is str:
            size = len(arg) if arg.isascii() else len(arg.encode())
            text.append(f"${size}\r\n{arg}\r\n")
        elif type(arg) is int:
            digits = str(arg)
            text.append(f"${len(digits)}\r\n{digits}\r\n")
        else:
            data = _bulk(arg)
            if done is None:
                done = []
            done.append("".join(text).encode())
            text = []
            done.append(b"$%d\r\n%b\r\n" % (len(data), data))
    if done is None:
        return "".join(text).encode()
    done.append("".join(text).encode())
    return b"".join(done)


def _retain_args(change: Change) -> list[Any]:
    """commit.lua's values for a new message's retained payload copy (none otherwise)."""
    kept = change.retain
    if kept is None or not change.created:
        return [0]
    return [2, bytes(kept.body), encode(dict(kept.headers))]


def _bulk(arg: object) -> bytes:
    """A bytes argument, or a subclass of str, bytes or int, as the bytes redis-py sends."""
    if isinstance(arg, bytes):
        return bytes(arg)
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, int) and not isinstance(arg, bool):
        return b"%d" % arg
    raise TypeError(f"a script argument must be str, bytes or int, not {arg!r}")


class RedisStore:
    """The index in Redis (see the module docstring). Thread-safe; fork-safe."""

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
        scripts: dict[str, Script] = {n: client.register_script(_lua(n)) for n in _SCRIPTS}
        self._commit = scripts["commit"]
        self._available = scripts["available"]
        self._history = scripts["history"]
        self._page = scripts["page"]
        self._purge = scripts["purge"]
        self._native_ref = scripts["native_ref"]
        self._direct = DirectScripts(client)

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

    # --- writes ------------------------------------------------------------------------

    def atomic(self) -> nullcontext[None]:
        """A no-op: Redis has no interactive transactions; compare-and-set suffices."""
        return nullcontext()

    def commit(self, change: Change) -> None:
        """Persist one change with compare-and-set (one script call)."""
        self.commit_many((change,))

    def commit_many(self, changes: Sequence[Change]) -> None:
        """Persist several changes in one script call, all or none."""
        self._commit_batch(changes, None, ())

    def commit_with_entries(
        self,
        changes: Sequence[Change],
        stream: str,
        entries: Sequence[Sequence[bytes | str]],
    ) -> list[str]:
        """Commit new messages and ``XADD`` one entry each (flat field/value lists) to
        ``stream`` on this server, in one script call: the records and the entries appear
        together or not at all, and each record keeps its entry id as native ref.

        Returns the entry ids. Raises StaleRecord (nothing written) if a record exists.
        """
        return self._commit_batch(changes, stream, entries)

    def commit_each(self, changes: Sequence[Change]) -> list[bool]:
        """Persist, in one script call, every change whose compare-and-set holds (a new
        message: whose msg_id is not taken); skip the others, and later changes of a
        message already in the batch. One flag per change: applied or not.

        The script keeps its reply under ``done:<write id>`` for a while, so a retry
        after a lost reply reads what was applied instead of committing again; when the
        reply is not there, the script never ran and runs again.
        """
        if not changes:
            return []
        write_id = new_token()
        args: list[Any] = [self.keyspace, write_id, "each", self._done_ttl(), len(changes)]
        for change in changes:
            args += self._change_args(change)
        done_key = f"{self.keyspace}done:{write_id}"
        tried = False

        def attempt() -> Any:
            nonlocal tried
            if tried:
                kept = self._r.get(done_key)
                if kept is not None:
                    return ["ok", *kept.split(",")]
            tried = True
            return self._direct.run(self._commit, [self._seq_key], args)

        result = self._call(attempt)
        applied: list[bool] = []
        for change, seq in zip(changes, result[1 : 1 + len(changes)], strict=True):
            ok = int(seq) > 0
            if ok and change.created:
                change.record.seq = int(seq)
            applied.append(ok)
        return applied

    def _done_ttl(self) -> int:
        """Seconds to keep a commit_each reply: longer than a call's retries can last."""
        if self.retry_for is None:
            return 120
        return max(120, int(self.retry_for) + 60)

    def _commit_batch(
        self,
        changes: Sequence[Change],
        stream: str | None,
        entries: Sequence[Sequence[bytes | str]],
    ) -> list[str]:
        if not changes:
            return []
        write_id = new_token()
        keys = [self._seq_key] if stream is None else [self._seq_key, stream]
        if stream is not None and len(entries) != len(changes):
            raise ValueError(f"{len(entries)} broker entries for {len(changes)} changes")
        args: list[Any] = [self.keyspace, write_id, "all", 0, len(changes)]
        for i, change in enumerate(changes):
            args += self._change_args(change, entries[i] if stream is not None else ())
        tried = False

        def attempt() -> Any:
            nonlocal tried
            if tried:
                # The last try may have applied before its reply was lost: ask the record.
                applied = self._applied(changes, write_id)
                if applied is not None:
                    seqs, refs = applied
                    return ["ok", *seqs, *(refs if stream is not None else ())]
            tried = True
            return self._direct.run(self._commit, keys, args)

        result = self._call(attempt)
        if result[0] == "stale":
            raise StaleRecord(str(result[1]))
        n = len(changes)
        refs = [str(ref) for ref in result[1 + n :]]
        for i, (change, seq) in enumerate(zip(changes, result[1 : 1 + n], strict=True)):
            if change.created:
                change.record.seq = int(seq)
            if refs and refs[i]:
                change.record.native_ref = refs[i]
        return refs

    def _applied(
        self, changes: Sequence[Change], write_id: str
    ) -> tuple[list[int], list[str]] | None:
        """The seqs and native refs of a batch if it was committed under ``write_id``,
        else None.

        Another writer may have committed to the record since (a member of the same
        message moved on): then the write id on it is theirs, and the batch applied if the
        record's history holds the first change's journal entries (the script appends them
        with the record, all or nothing; they carry actor, states and microseconds).
        """
        pipe = self._r.pipeline(transaction=False)
        for change in changes:
            pipe.hmget(self._record_key(change.msg_id), "w", "s", "n")
        rows = pipe.execute()
        if rows[0][0] is None:
            return None
        if rows[0][0] != write_id and not self._in_history(changes[0]):
            return None
        return [int(row[1]) for row in rows], [row[2] or "" for row in rows]

    def _in_history(self, change: Change) -> bool:
        mine = [e._replace(seq=None) for e in change.journal]
        if not mine:
            return False
        try:
            history = [e._replace(seq=None) for e in self._read_history(change.msg_id)]
        except MessageNotFound:
            return False
        return any(history[i : i + len(mine)] == mine for i in range(len(history)))

    def _layout(
        self, rec: MessageRecord
    ) -> tuple[list[str], list[str], int | None, dict[str, str]]:
        """Where a record stands: its index keys scored by put order and by claim order,
        its due time, and its optional hash fields (what the scripts filter on)."""
        k, q = self.keyspace, rec.queue
        by_seq = [f"{k}q:{q}"]
        if rec.publisher_state is not None:
            by_seq.append(f"{k}p:{q}/{rec.publisher_state}")
        if rec.correlation_id is not None:
            by_seq.append(f"{k}k:{q}/{rec.correlation_id}")
        if rec.lock_id is not None:
            by_seq.append(f"{k}l:{q}/{rec.lock_id}")
        opt: dict[str, str] = {}
        if rec.expires_at is not None:
            opt["x"] = str(rec.expires_at)
        if rec.lock_id is not None:
            opt["lk"] = rec.lock_id
            if rec.lock_until is not None:
                opt["lu"] = str(rec.lock_until)
        by_claim: list[str] = []
        for m in rec.members.values():
            if m.state is _AVAILABLE:
                by_claim.append(f"{k}c:{q}/{m.subscriber}")
                if m.attempt >= 2:
                    by_claim.append(f"{k}r:{q}/{m.subscriber}")
                if m.not_before is not None:
                    opt[f"b:{m.subscriber}"] = str(m.not_before)
        return by_seq, by_claim, rec.due_at(), opt

    def _change_args(self, change: Change, entry: Sequence[bytes | str] = ()) -> list[Any]:
        """A change as the positional values stores/lua/commit.lua reads: what to write
        and, from the record the change started from, which index entries and fields to
        add or take away; with a co-located put, the broker entry's field/value values;
        for a new message, its retained payload copy."""
        rec = change.record
        by_seq, by_claim, due, opt = self._layout(rec)
        before = None if change.created else change.before
        if before is None and not change.created:
            raise ValueError(
                f"change of message {change.msg_id} lacks the record it started from "
                f"(Change.before); make changes with iqbridge.engine"
            )
        if before is None:
            old_seq: list[str] = []
            old_claim: list[str] = []
            old_due: int | None = None
            old_opt: dict[str, str] = {}
        else:
            old_seq, old_claim, old_due, old_opt = self._layout(before)
        due_key = f"{self.keyspace}d:{rec.queue}"
        ix = [*by_seq, *by_claim]
        if due is not None:
            ix.append(due_key)
        gone = [key for key in old_seq if key not in by_seq]
        gone += [key for key in old_claim if key not in by_claim]
        if old_due is not None and due is None:
            gone.append(due_key)
        fields = ["u", str(rec.updated_at)]
        for name, value in opt.items():
            fields += [name, value]
        unset = [name for name in old_opt if name not in opt]
        add_seq = [key for key in by_seq if key not in old_seq]
        add_claim = [key for key in by_claim if key not in old_claim]
        entries = change.journal
        journal = [
            entries_to_json(entries[i : i + JOURNAL_PER_ROW])
            for i in range(0, len(entries), JOURNAL_PER_ROW)
        ]
        return [
            rec.msg_id,
            "1" if change.created else "0",
            str(change.expected_version),
            str(rec.version),
            rec.queue,
            str(rec.priority),
            rec.native_ref or "",
            record_to_json(rec),
            encode(ix),
            str(due) if due is not None and due != old_due else "",
            len(fields),
            *fields,
            len(unset),
            *unset,
            len(add_seq),
            *add_seq,
            len(add_claim),
            *add_claim,
            len(gone),
            *gone,
            len(journal),
            *journal,
            len(entry),
            *entry,
            *_retain_args(change),
        ]

    def set_native_ref(self, msg_id: str, native_ref: str) -> None:
        """Record where the broker keeps the payload (not a state change)."""
        found = self._call(
            lambda: self._native_ref(keys=[self._record_key(msg_id)], args=[native_ref])
        )
        if not found:
            raise MessageNotFound(msg_id)

    def set_native_refs(self, refs: Sequence[tuple[str, str]]) -> None:
        """Record where several payloads live, in one script call; unknown ids are
        skipped."""
        if not refs:
            return
        keys = [self._record_key(msg_id) for msg_id, _ in refs]
        args = [ref for _, ref in refs]
        self._call(lambda: self._native_ref(keys=keys, args=args))

    # --- reads -------------------------------------------------------------------------

    def load(self, msg_id: str) -> MessageRecord:
        """The current record of a message."""
        key = self._record_key(msg_id)
        v, s, n, r = self._call(lambda: self._r.hmget(key, "v", "s", "n", "r"))
        if v is None:
            raise MessageNotFound(msg_id)
        return record_from_json(msg_id, r, version=int(v), seq=int(s), native_ref=n)

    def load_many(self, msg_ids: Sequence[str]) -> dict[str, MessageRecord]:
        """The current records of the known ones of ``msg_ids``, by msg_id (one
        pipelined round trip)."""
        ids = list(dict.fromkeys(msg_ids))
        if not ids:
            return {}

        def read() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            for msg_id in ids:
                pipe.hmget(self._record_key(msg_id), "v", "s", "n", "r")
            rows: list[Any] = pipe.execute()
            return rows

        out: dict[str, MessageRecord] = {}
        for msg_id, (v, s, n, r) in zip(ids, self._call(read), strict=True):
            if v is not None:
                out[msg_id] = record_from_json(msg_id, r, version=int(v), seq=int(s), native_ref=n)
        return out

    def retained(self, msg_ids: Sequence[str]) -> dict[str, Retained]:
        """The retained payload copies of those of ``msg_ids`` that have one (one
        pipelined round trip; bodies as the bytes they were put with)."""
        ids = list(dict.fromkeys(msg_ids))
        if not ids:
            return {}

        def read() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            for msg_id in ids:
                # NEVER_DECODE: this client decodes replies as UTF-8; bodies are bytes.
                pipe.execute_command(
                    "HMGET", f"{self.keyspace}b:{msg_id}", "b", "h", **{NEVER_DECODE: True}
                )
            rows: list[Any] = pipe.execute()
            return rows

        out: dict[str, Retained] = {}
        for msg_id, (body, headers) in zip(ids, self._call(read), strict=True):
            if body is not None:
                out[msg_id] = Retained(bytes(body), json.loads(headers or b"{}"))
        return out

    def claimable(
        self, queue: str, subscriber: str, now: int, limit: int, lock_id: str | None = None
    ) -> list[str]:
        """Ids available to a subscriber now: priority first, then put order."""
        k = self.keyspace
        keys = [f"{k}c:{queue}/{subscriber}"]
        if lock_id is not None:
            keys.append(f"{k}l:{queue}/{lock_id}")
        args = [k, subscriber, str(now), str(limit), lock_id or ""]
        return list(self._call(lambda: self._available(keys=keys, args=args)))

    def redeliverable(self, queue: str, subscriber: str, now: int, limit: int) -> list[str]:
        """Available ids on attempt 2 or later."""
        k = self.keyspace
        keys = [f"{k}r:{queue}/{subscriber}"]
        args = [k, subscriber, str(now), str(limit), ""]
        return list(self._call(lambda: self._available(keys=keys, args=args)))

    def due(self, queue: str | None, now: int, limit: int) -> list[str]:
        """Ids with a lapsed lease, time limit or browse lock (earliest first)."""
        queues = [queue] if queue else self.queues()
        found: list[tuple[float, str]] = []
        for name in queues:
            key = f"{self.keyspace}d:{name}"
            rows = self._call(
                partial(
                    self._r.zrange,
                    key,
                    "-inf",
                    now,
                    byscore=True,
                    offset=0,
                    num=limit,
                    withscores=True,
                )
            )
            found += [(score, msg_id) for msg_id, score in rows]
        found.sort()
        return [msg_id for _, msg_id in found[:limit]]

    def history(self, msg_id: str) -> list[JournalEntry]:
        """Every journal entry of one message, in order."""
        return self._call(lambda: self._read_history(msg_id))

    def _read_history(self, msg_id: str) -> list[JournalEntry]:
        rows = self._history(keys=[self._record_key(msg_id), self._journal_key])
        if rows is None:
            raise MessageNotFound(msg_id)
        out: list[JournalEntry] = []
        for n, flat in rows:
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            out.extend(entries_from_json(int(n), fields["m"], fields["q"], fields["e"]))
        return out

    def search(self, queue: str, flt: Filter) -> list[MessageSummary]:
        """Filter on index fields only, never payloads; in put order.

        Reads the narrowest index the filter allows (msg_id, correlation id, lock id,
        publisher state, else the queue) and checks the rest on each record.
        """
        if flt.limit <= 0:
            return []
        if flt.msg_id is not None:
            try:
                rec = self.load(flt.msg_id)
            except MessageNotFound:
                return []
            return [summary(rec)] if rec.queue == queue and matches(rec, flt) else []
        out: list[MessageSummary] = []
        for rec in self._scan(self._search_index(queue, flt), max(100, min(flt.limit * 2, 1000))):
            if matches(rec, flt):
                out.append(summary(rec))
                if len(out) >= flt.limit:
                    break
        return out

    def _search_index(self, queue: str, flt: Filter) -> str:
        k = self.keyspace
        if flt.correlation_id is not None:
            return f"{k}k:{queue}/{flt.correlation_id}"
        if flt.lock_id is not None:
            return f"{k}l:{queue}/{flt.lock_id}"
        if isinstance(flt.state, PublisherState):
            return f"{k}p:{queue}/{flt.state.value}"
        return f"{k}q:{queue}"

    def _scan(self, index: str, page: int) -> Iterator[MessageRecord]:
        """Records listed in a put-order index, a page per round trip."""
        after = "0"
        while True:
            scanned, last, rows = self._call(
                partial(self._page, keys=[index], args=[self.keyspace, after, page])
            )
            for msg_id, v, s, n, r in rows:
                yield record_from_json(msg_id, r, version=int(v), seq=int(s), native_ref=n)
            if scanned < page:
                return
            after = last

    def journal(self, after: int = 0, limit: int = 1000) -> list[JournalEntry]:
        """Journal entries with seq greater than ``after``, oldest first."""
        out: list[JournalEntry] = []
        start = f"{after // JOURNAL_PER_ROW}-0"
        count = max(16, min(limit, 5000))
        while len(out) < limit:
            rows = self._call(
                partial(self._r.xrange, self._journal_key, min=start, max="+", count=count)
            )
            if not rows:
                break
            for stream_id, fields in rows:
                n = int(stream_id.split("-", 1)[0])
                entries = entries_from_json(n, fields["m"], fields["q"], fields["e"])
                out.extend(e for e in entries if (e.seq or 0) > after)
            start = "(" + rows[-1][0]
        return out[:limit]

    # --- purge, queues, subscriptions --------------------------------------------------

    def purge(self, queue: str, before: int, limit: int = 1000) -> list[PurgedMessage]:
        """Delete journalled messages last changed before ``before``; keep the journal."""
        if limit <= 0:
            return []
        request = new_token()
        done_key = f"{self.keyspace}done:{request}"
        tried = False

        def attempt() -> Any:
            nonlocal tried
            if tried:
                # A purge whose reply was lost left its answer behind.
                kept = self._r.get(done_key)
                if kept is not None:
                    return json.loads(kept) or []
            tried = True
            return self._purge(
                keys=[f"{self.keyspace}p:{queue}/{_JOURNALLED.value}"],
                args=[self.keyspace, str(before), str(limit), request],
            )

        rows = self._call(attempt)
        return [PurgedMessage(msg_id, ref or None) for msg_id, ref in rows]

    def declare_queue(self, queue: str) -> None:
        """Make the queue known (idempotent)."""
        self._call(lambda: self._r.sadd(self._queues_key, queue))

    def queues(self) -> list[str]:
        """Every known queue name."""
        return sorted(self._call(lambda: self._r.smembers(self._queues_key)))

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
