"""Embedded SQLite index store (the zero-server default).

URL: ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``; options as query
parameters: ``synchronous`` (``full``, the default: a put, get or done that returned
survives power loss; or ``normal``: faster, survives a crash of the process but may lose
the last commits on power loss; WAL mode either way) and ``busy_timeout`` in seconds
(default 30).

One file holds the index and, with the ``sqlite`` adapter, the queue rows too, so a put,
a claim or a done is one transaction. Writers take the write lock up front
(``BEGIN IMMEDIATE``): claims are serialised across threads and processes, which is what
makes a pool's compare-and-set race-free. Each thread uses its own connection.

Layout, chosen so that each transition dirties few B-tree pages (every page a commit
touches is written to the WAL, and that is what a commit costs):

* ``iq_messages``: one row per message: index fields, publisher state, every member's
  state as a compact JSON array, the journal sequence numbers of its history, and
  ``next_due`` (when a lease, time limit or lock lapses; partially indexed).
* ``iq_ready``: one row per member that is AVAILABLE: the claim index, in priority then
  put order. Rows come and go with that one state.
* ``iq_journal``: append-only, one row per committed change holding that change's
  transitions (JSON), ordered by ``seq``; an entry's journal sequence number is
  ``row seq * 65536 + its position`` (increasing, as the contract asks). A message's
  history is read by the row seqs its message row lists, so the journal needs no
  secondary index.
* ``iq_payloads``: the retained payload copy of a message put with one
  (:attr:`~iqbridge.engine.Change.retain`): body bytes and headers (JSON), written in
  the transaction that creates the record, deleted with it by a purge.

Searches on ``msg_id`` and ``correlation_id`` use indexes; other filters scan the queue's
rows (never payloads).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from iqbridge.engine import Change
from iqbridge.errors import ConfigurationError, IndexUnavailable, MessageNotFound
from iqbridge.model import (
    Filter,
    JournalEntry,
    MessageRecord,
    MessageSummary,
    Retained,
    Subscriptions,
    to_micros,
)
from iqbridge.states import ActorKind, Mode, PublisherState, SubscriberState
from iqbridge.stores.base import AvailableQueries, PurgedMessage, StaleRecord
from iqbridge.stores.codec import JOURNAL_PER_ROW as _PER_ROW
from iqbridge.stores.codec import (
    encode,
    entries_from_json,
    subscriptions_from_json,
    subscriptions_to_json,
)
from iqbridge.stores.codec import entries_to_json as _entries_json
from iqbridge.stores.codec import members_from_json as _members
from iqbridge.stores.codec import members_to_json as _members_json
from iqbridge.stores.codec import summary as _summary

__all__ = [
    "SqliteDatabase",
    "SqliteStore",
    "parse_sqlite_url",
    # moved to iqbridge.stores.codec; still importable from here
    "subscriptions_from_json",
    "subscriptions_to_json",
]

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS iq_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS iq_queues (
    name TEXT PRIMARY KEY,
    subscriptions TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS iq_messages (
    seq INTEGER PRIMARY KEY,
    msg_id TEXT NOT NULL UNIQUE,
    queue TEXT NOT NULL,
    publisher TEXT NOT NULL,
    ordering_key TEXT NOT NULL,
    correlation_id TEXT,
    priority INTEGER NOT NULL,
    mode TEXT NOT NULL,
    parents TEXT,
    native_ref TEXT,
    content_type TEXT NOT NULL,
    size INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    max_attempts INTEGER NOT NULL,
    publisher_state TEXT,
    withdrawn INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    lock_id TEXT,
    lock_owner TEXT,
    lock_until INTEGER,
    version INTEGER NOT NULL,
    members TEXT NOT NULL,
    journal TEXT NOT NULL,
    next_due INTEGER
);
CREATE INDEX IF NOT EXISTS iq_messages_corr ON iq_messages (correlation_id)
    WHERE correlation_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS iq_messages_due ON iq_messages (next_due)
    WHERE next_due IS NOT NULL;
CREATE TABLE IF NOT EXISTS iq_ready (
    queue TEXT NOT NULL,
    subscriber TEXT NOT NULL,
    priority INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    not_before INTEGER,
    PRIMARY KEY (queue, subscriber, priority DESC, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS iq_journal (
    seq INTEGER PRIMARY KEY,
    msg_id TEXT NOT NULL,
    queue TEXT NOT NULL,
    entries TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS iq_payloads (
    msg_id TEXT PRIMARY KEY,
    body BLOB NOT NULL,
    headers TEXT NOT NULL
);
"""

_MSG_COLS = (
    "seq, msg_id, queue, publisher, ordering_key, correlation_id, priority, mode, parents, "
    "native_ref, content_type, size, created_at, expires_at, max_attempts, publisher_state, "
    "withdrawn, updated_at, lock_id, lock_owner, lock_until, version, members, journal"
)
_INSERT_MSG = (
    "INSERT INTO iq_messages (msg_id, queue, publisher, ordering_key, correlation_id, priority,"
    " mode, parents, native_ref, content_type, size, created_at, expires_at, max_attempts,"
    " publisher_state, withdrawn, updated_at, lock_id, lock_owner, lock_until, version,"
    " members, journal, next_due) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_INSERT_ABSENT = _INSERT_MSG + " ON CONFLICT (msg_id) DO NOTHING"
_INSERT_PAYLOAD = "INSERT OR REPLACE INTO iq_payloads (msg_id, body, headers) VALUES (?,?,?)"
_UPDATE_MSG = (
    "UPDATE iq_messages SET publisher_state=?, withdrawn=?, updated_at=?, lock_id=?,"
    " lock_owner=?, lock_until=?, version=?, members=?, journal=journal || ?,"
    " next_due=? WHERE seq=? AND version=?"
)
_INSERT_READY = (
    "INSERT OR REPLACE INTO iq_ready (queue, subscriber, priority, seq, attempt, not_before)"
    " VALUES (?,?,?,?,?,?)"
)
_DELETE_READY = "DELETE FROM iq_ready WHERE queue=? AND subscriber=? AND priority=? AND seq=?"
_INSERT_JOURNAL = "INSERT INTO iq_journal (seq, msg_id, queue, entries) VALUES (?,?,?,?)"
# Journal entries of one change share a row; entry seq = row seq * _PER_ROW + position.

_PUB = {s.value: s for s in PublisherState}
_AVAILABLE = SubscriberState.AVAILABLE
#: Ids per IN (...) list (older SQLite builds allow 999 parameters a statement).
_CHUNK = 500


def parse_sqlite_url(url: str) -> tuple[Path, dict[str, str]]:
    """The database path and options of a ``sqlite:///`` URL."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise ConfigurationError(f"not a sqlite URL: {url!r}")
    if parts.netloc:
        raise ConfigurationError(
            f"sqlite URL {url!r} has a host part; use sqlite:///relative.db or "
            f"sqlite:////absolute/path.db"
        )
    raw = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not raw or raw == ":memory:":
        raise ConfigurationError(
            f"sqlite URL {url!r} names no file; give one (sqlite:///iqbridge.db) or use "
            f"memory:// for an in-process queue"
        )
    opts = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(opts) - {"synchronous", "busy_timeout"}
    if unknown:
        raise ConfigurationError(
            f"unknown sqlite option(s) {sorted(unknown)} in {url!r}; known: synchronous, "
            f"busy_timeout"
        )
    sync = opts.get("synchronous", "full").lower()
    if sync not in ("normal", "full"):
        raise ConfigurationError(f"synchronous must be normal or full, not {sync!r}")
    return Path(raw), opts


class SqliteDatabase:
    """One SQLite file, a connection per thread, and transactions that nest."""

    def __init__(self, path: Path, *, synchronous: str = "full", busy_timeout: float = 30.0):
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._all: weakref.WeakSet[_Conn] = weakref.WeakSet()
        self._all_lock = threading.Lock()
        self._closed = False
        self._users = 0
        # Writers of this process queue here rather than in SQLite's busy handler, which
        # sleeps in millisecond steps; other processes still meet at the file lock.
        self._write_lock = threading.Lock()
        if not path.parent.exists():
            raise IndexUnavailable(
                f"cannot open SQLite database {str(path)!r}: directory "
                f"{str(path.parent)!r} does not exist; create it or choose another path"
            )
        with self.connect() as conn:
            conn.executescript(_SCHEMA)
            conn.execute(
                "INSERT OR IGNORE INTO iq_meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )

    _shared: ClassVar[weakref.WeakValueDictionary[Path, SqliteDatabase]] = (
        weakref.WeakValueDictionary()
    )
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls, url: str) -> SqliteDatabase:
        """The one open database of this process for the file a ``sqlite:///`` URL names.

        The queue rows and the index of one file must use the same connections, or a
        put would wait on its own write lock.
        """
        path, opts = parse_sqlite_url(url)
        key = path.resolve()
        with cls._shared_lock:
            db = cls._shared.get(key)
            if db is None or db._closed:
                db = cls(
                    path,
                    synchronous=opts.get("synchronous", "full").lower(),
                    busy_timeout=float(opts.get("busy_timeout", "30")),
                )
                cls._shared[key] = db
            db._users += 1
            return db

    def acquire(self) -> SqliteDatabase:
        """Count one more user; each user calls close() once."""
        with SqliteDatabase._shared_lock:
            self._users += 1
        return self

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """A raw connection for setup work, outside the per-thread pool."""
        conn = self._open()
        try:
            yield conn
        finally:
            conn.close()

    def _open(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=self.busy_timeout,
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
            conn.execute("PRAGMA foreign_keys=OFF")
        except sqlite3.Error as exc:
            raise IndexUnavailable(
                f"cannot open SQLite database {str(self.path)!r}: {exc}"
            ) from exc
        return conn

    @property
    def conn(self) -> sqlite3.Connection:
        """This thread's connection."""
        holder: _Conn | None = getattr(self._local, "holder", None)
        if holder is None:
            if self._closed:
                raise IndexUnavailable(f"SQLite database {str(self.path)!r} was closed")
            holder = _Conn(self._open())
            self._local.holder = holder
            with self._all_lock:
                self._all.add(holder)
        return holder.conn

    def transaction(self, *, savepoint: bool = True) -> _Transaction:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` on this thread's connection.

        Nested use joins the enclosing transaction, inside a savepoint unless
        ``savepoint=False`` (for callers that fail before writing anything).
        """
        return _Transaction(self, savepoint)

    def close(self) -> None:
        """Close every thread's connection, once the last user of a shared one is done."""
        with SqliteDatabase._shared_lock:
            self._users -= 1
            if self._users > 0:
                return
        self._closed = True
        with self._all_lock:
            for holder in list(self._all):
                holder.conn.close()
            self._all.clear()
        self._local = threading.local()


def _forget_after_fork() -> None:
    # A forked child must never touch its parent's SQLite connections.
    for db in list(SqliteDatabase._shared.values()):
        db._local = threading.local()
        db._all = weakref.WeakSet()
        db._write_lock = threading.Lock()
    SqliteDatabase._shared = weakref.WeakValueDictionary()
    SqliteDatabase._shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


class _Transaction:
    """The context manager behind :meth:`SqliteDatabase.transaction` (a class: it is on
    every hot path, and a generator-based one costs more)."""

    __slots__ = ("conn", "db", "name", "savepoint")

    def __init__(self, db: SqliteDatabase, savepoint: bool) -> None:
        self.db = db
        self.savepoint = savepoint
        self.name: str | None = None
        self.conn: sqlite3.Connection | None = None

    def __enter__(self) -> sqlite3.Connection:
        db = self.db
        conn = self.conn = db.conn
        local = db._local
        depth: int = getattr(local, "depth", 0)
        if depth:
            if self.savepoint:
                self.name = f"iq_sp{depth}"
                conn.execute(f"SAVEPOINT {self.name}")
            local.depth = depth + 1
            return conn
        db._write_lock.acquire()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            db._write_lock.release()
            raise _translate(exc, db.path) from exc
        local.depth = 1
        return conn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        local = self.db._local
        depth: int = local.depth
        local.depth = depth - 1
        conn = self.conn
        assert conn is not None
        if depth > 1:
            if self.name is not None:
                if exc is not None:
                    conn.execute(f"ROLLBACK TO {self.name}")
                conn.execute(f"RELEASE {self.name}")
            return
        try:
            if exc is not None:
                conn.execute("ROLLBACK")
                return
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as err:
                conn.execute("ROLLBACK")
                raise _translate(err, self.db.path) from err
        finally:
            self.db._write_lock.release()


class _Conn:
    __slots__ = ("__weakref__", "conn")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn


def _translate(exc: sqlite3.Error, path: Path) -> Exception:
    return IndexUnavailable(f"SQLite database {str(path)!r}: {exc}")


class SqliteStore(AvailableQueries):
    """The index in a SQLite file (see the module docstring)."""

    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        self.url = f"sqlite:///{db.path}"

    @classmethod
    def from_url(cls, url: str) -> SqliteStore:
        """Open the store a ``sqlite:///`` URL names."""
        return cls(SqliteDatabase.shared(url))

    def atomic(self) -> _Transaction:
        """One write transaction for everything inside."""
        return self.db.transaction()

    def commit(self, change: Change) -> None:
        """Persist one change with compare-and-set."""
        self.commit_many((change,))

    def commit_many(self, changes: Sequence[Change]) -> None:
        """Persist several changes in one transaction, all or none."""
        self._commit(changes, each=False)

    def commit_each(self, changes: Sequence[Change]) -> list[bool]:
        """Persist, in one transaction, every change whose compare-and-set holds (a new
        message: whose msg_id is not taken); skip the others, and later changes of a
        message already in the batch. One flag per change: applied or not."""
        return self._commit(changes, each=True)

    def _commit(self, changes: Sequence[Change], *, each: bool) -> list[bool]:
        applied: list[bool] = []
        try:
            # A lone change fails (StaleRecord) before it writes anything, so it needs no
            # savepoint inside an enclosing transaction; several changes do.
            with self.db.transaction(savepoint=len(changes) > 1) as conn:
                row = conn.execute("SELECT max(seq) FROM iq_journal").fetchone()
                next_seq = (row[0] or 0) + 1
                journal: list[tuple[Any, ...]] = []
                ready_add: list[tuple[Any, ...]] = []
                ready_del: list[tuple[Any, ...]] = []
                payloads: list[tuple[str, bytes, str]] = []
                seen: set[str] = set()
                for change in changes:
                    if each and change.msg_id in seen:
                        applied.append(False)
                        continue
                    seen.add(change.msg_id)
                    entries = change.journal
                    seqs = []
                    rows = []
                    for i in range(0, max(len(entries), 1), _PER_ROW - 1):
                        part = entries[i : i + _PER_ROW - 1]
                        if not part:
                            break
                        rows.append(
                            (next_seq, change.msg_id, change.record.queue, _entries_json(part))
                        )
                        seqs.append(str(next_seq))
                        next_seq += 1
                    ok = self._write(conn, change, ",".join(seqs), ready_add, ready_del, each)
                    applied.append(ok)
                    if not ok:
                        next_seq -= len(rows)  # nothing written: the numbers are free again
                        continue
                    journal += rows
                    if change.created and change.retain is not None:
                        kept = change.retain
                        payloads.append(
                            (change.msg_id, bytes(kept.body), encode(dict(kept.headers)))
                        )
                if ready_del:
                    conn.executemany(_DELETE_READY, ready_del)
                if ready_add:
                    conn.executemany(_INSERT_READY, ready_add)
                if len(journal) == 1:
                    conn.execute(_INSERT_JOURNAL, journal[0])
                elif journal:
                    conn.executemany(_INSERT_JOURNAL, journal)
                if payloads:
                    conn.executemany(_INSERT_PAYLOAD, payloads)
        except sqlite3.IntegrityError as exc:
            raise StaleRecord(changes[0].msg_id if changes else "?") from exc
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc
        return applied

    def _write(
        self,
        conn: sqlite3.Connection,
        change: Change,
        seqs: str,
        ready_add: list[tuple[Any, ...]],
        ready_del: list[tuple[Any, ...]],
        each: bool,
    ) -> bool:
        """Write one change's record and collect its ready-table rows; False when its
        compare-and-set failed and ``each`` (then nothing was written), else StaleRecord."""
        rec = change.record
        members = _members_json(rec)
        if change.created:
            cur = conn.execute(
                _INSERT_ABSENT if each else _INSERT_MSG,
                (
                    rec.msg_id,
                    rec.queue,
                    rec.publisher,
                    rec.ordering_key,
                    rec.correlation_id,
                    rec.priority,
                    rec.mode,
                    json.dumps(rec.parents) if rec.parents else None,
                    rec.native_ref,
                    rec.content_type,
                    rec.size,
                    rec.created_at,
                    rec.expires_at,
                    rec.max_attempts,
                    rec.publisher_state,
                    int(rec.withdrawn),
                    rec.updated_at,
                    rec.lock_id,
                    rec.lock_owner,
                    rec.lock_until,
                    rec.version,
                    members,
                    seqs,
                    rec.due_at(),
                ),
            )
            if cur.rowcount != 1:
                return False  # each: the msg_id is taken (else IntegrityError was raised)
            rec.seq = cur.lastrowid
            for m in rec.members.values():
                if m.state is _AVAILABLE:
                    ready_add.append(
                        (rec.queue, m.subscriber, rec.priority, rec.seq, m.attempt, m.not_before)
                    )
            return True
        cur = conn.execute(
            _UPDATE_MSG,
            (
                rec.publisher_state,
                int(rec.withdrawn),
                rec.updated_at,
                rec.lock_id,
                rec.lock_owner,
                rec.lock_until,
                rec.version,
                members,
                "," + seqs if seqs else "",
                rec.due_at(),
                rec.seq,
                change.expected_version,
            ),
        )
        if cur.rowcount != 1:
            if each:
                return False
            raise StaleRecord(rec.msg_id)
        # The ready table mirrors exactly the members that are AVAILABLE now.
        left: set[str] = set()
        for e in change.journal:
            if e.src == "AVAILABLE" and e.actor_kind is ActorKind.SUBSCRIBER:
                left.add(e.actor)
        for name in change.dirty:
            m = rec.members[name]
            key = (rec.queue, name, rec.priority, rec.seq)
            if m.state is _AVAILABLE:
                ready_add.append((*key, m.attempt, m.not_before))
            elif name in left:
                ready_del.append(key)
        return True

    def load(self, msg_id: str) -> MessageRecord:
        """The current record of a message."""
        try:
            row = self.db.conn.execute(
                f"SELECT {_MSG_COLS} FROM iq_messages WHERE msg_id=?", (msg_id,)
            ).fetchone()
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc
        if row is None:
            raise MessageNotFound(msg_id)
        return _record(row)

    def load_many(self, msg_ids: Sequence[str]) -> dict[str, MessageRecord]:
        """The current records of the known ones of ``msg_ids``, by msg_id."""
        out: dict[str, MessageRecord] = {}
        ids = list(dict.fromkeys(msg_ids))
        try:
            conn = self.db.conn
            for i in range(0, len(ids), _CHUNK):
                chunk = ids[i : i + _CHUNK]
                marks = ",".join("?" * len(chunk))
                for row in conn.execute(
                    f"SELECT {_MSG_COLS} FROM iq_messages WHERE msg_id IN ({marks})", chunk
                ):
                    out[row[1]] = _record(row)
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc
        return out

    def set_native_ref(self, msg_id: str, native_ref: str) -> None:
        """Record where the payload lives."""
        with self.db.transaction() as conn:
            conn.execute("UPDATE iq_messages SET native_ref=? WHERE msg_id=?", (native_ref, msg_id))

    def set_native_refs(self, refs: Sequence[tuple[str, str]]) -> None:
        """Record where several payloads live, in one transaction; unknown ids are skipped."""
        if not refs:
            return
        try:
            with self.db.transaction() as conn:
                conn.executemany(
                    "UPDATE iq_messages SET native_ref=? WHERE msg_id=?",
                    [(ref, msg_id) for msg_id, ref in refs],
                )
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc

    def retained(self, msg_ids: Sequence[str]) -> dict[str, Retained]:
        """The retained payload copies of those of ``msg_ids`` that have one."""
        out: dict[str, Retained] = {}
        ids = list(dict.fromkeys(msg_ids))
        try:
            conn = self.db.conn
            for i in range(0, len(ids), _CHUNK):
                chunk = ids[i : i + _CHUNK]
                marks = ",".join("?" * len(chunk))
                for msg_id, body, headers in conn.execute(
                    f"SELECT msg_id, body, headers FROM iq_payloads WHERE msg_id IN ({marks})",
                    chunk,
                ):
                    out[msg_id] = Retained(bytes(body), json.loads(headers))
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc
        return out

    def _available(
        self,
        queue: str,
        subscriber: str,
        now: int,
        limit: int,
        lock_id: str | None,
        min_attempt: int,
    ) -> list[str]:
        if lock_id is None:
            lock_sql = "(m.lock_id IS NULL OR m.lock_until <= ?)"
            args: list[Any] = [now]
        else:
            lock_sql = "m.lock_id = ? AND (m.lock_until IS NULL OR m.lock_until > ?)"
            args = [lock_id, now]
        sql = (
            "SELECT m.msg_id FROM iq_ready r JOIN iq_messages m ON m.seq = r.seq"
            " WHERE r.queue=? AND r.subscriber=?"
            " AND (r.not_before IS NULL OR r.not_before <= ?)"
            " AND (m.expires_at IS NULL OR m.expires_at > ?)"
            f" AND {lock_sql}"
            + (" AND r.attempt >= ?" if min_attempt > 1 else "")
            + " ORDER BY r.priority DESC, r.seq LIMIT ?"
        )
        params: list[Any] = [queue, subscriber, now, now, *args]
        if min_attempt > 1:
            params.append(min_attempt)
        params.append(limit)
        try:
            return [r[0] for r in self.db.conn.execute(sql, params)]
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc

    def due(self, queue: str | None, now: int, limit: int) -> list[str]:
        """Ids with a lapsed lease, time limit or browse lock."""
        sql = "SELECT msg_id FROM iq_messages WHERE next_due IS NOT NULL AND next_due <= ?"
        params: list[Any] = [now]
        if queue:
            sql += " AND queue = ?"
            params.append(queue)
        params.append(limit)
        try:
            return [r[0] for r in self.db.conn.execute(sql + " LIMIT ?", params)]
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc

    def history(self, msg_id: str) -> list[JournalEntry]:
        """Every journal entry of one message, in order."""
        conn = self.db.conn
        row = conn.execute("SELECT journal FROM iq_messages WHERE msg_id=?", (msg_id,)).fetchone()
        if row is None:
            raise MessageNotFound(msg_id)
        seqs = sorted(int(x) for x in row[0].split(",") if x)
        out: list[JournalEntry] = []
        for i in range(0, len(seqs), 500):
            chunk = seqs[i : i + 500]
            marks = ",".join("?" * len(chunk))
            rows = conn.execute(
                f"SELECT seq, msg_id, queue, entries FROM iq_journal WHERE seq IN ({marks})"
                " ORDER BY seq",
                chunk,
            )
            for r in rows:
                out.extend(_unpack(r))
        return out

    def search(self, queue: str, flt: Filter) -> list[MessageSummary]:
        """Filter on index fields only; never touches payloads."""
        where = ["queue = ?"]
        args: list[Any] = [queue]
        for column, value in (
            ("msg_id", flt.msg_id),
            ("correlation_id", flt.correlation_id),
            ("publisher", flt.publisher),
            ("lock_id", flt.lock_id),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if flt.priority is not None:
            lo, hi = (
                flt.priority if isinstance(flt.priority, tuple) else (flt.priority, flt.priority)
            )
            where.append("priority BETWEEN ? AND ?")
            args.extend((lo, hi))
        if flt.since is not None:
            where.append("created_at >= ?")
            args.append(to_micros(flt.since))
        if flt.until is not None:
            where.append("created_at < ?")
            args.append(to_micros(flt.until))
        if isinstance(flt.state, PublisherState):
            where.append("publisher_state = ?")
            args.append(flt.state.value)
        member_state = flt.state if isinstance(flt.state, SubscriberState) else None
        if flt.subscriber is not None or member_state is not None:
            # Members are a JSON array of [subscriber, pool, state, ...] rows.
            conds = []
            if flt.subscriber is not None:
                conds.append("json_extract(j.value, '$[0]') = ?")
                args.append(flt.subscriber)
            if member_state is not None:
                conds.append("json_extract(j.value, '$[2]') = ?")
                args.append(member_state.value)
            where.append(f"EXISTS (SELECT 1 FROM json_each(members) j WHERE {' AND '.join(conds)})")
        sql = (
            f"SELECT {_MSG_COLS} FROM iq_messages WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?"
        )
        args.append(flt.limit)
        try:
            return [_summary(_record(row)) for row in self.db.conn.execute(sql, args)]
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc

    def journal(self, after: int = 0, limit: int = 1000) -> list[JournalEntry]:
        """Journal entries with seq greater than ``after``, oldest first."""
        out: list[JournalEntry] = []
        row_seq = after // _PER_ROW
        conn = self.db.conn
        while len(out) < limit:
            rows = conn.execute(
                "SELECT seq, msg_id, queue, entries FROM iq_journal WHERE seq >= ?"
                " ORDER BY seq LIMIT ?",
                (row_seq, max(limit // 2, 16)),
            ).fetchall()
            if not rows:
                break
            for r in rows:
                out.extend(e for e in _unpack(r) if (e.seq or 0) > after)
            row_seq = rows[-1][0] + 1
        return out[:limit]

    def purge(self, queue: str, before: int, limit: int = 1000) -> list[PurgedMessage]:
        """Delete journalled messages last changed before ``before``; keep the journal."""
        with self.db.transaction() as conn:
            rows = conn.execute(
                "SELECT seq, msg_id, native_ref FROM iq_messages WHERE queue=?"
                " AND publisher_state='JOURNALLED' AND updated_at < ? ORDER BY seq LIMIT ?",
                (queue, before, limit),
            ).fetchall()
            conn.executemany("DELETE FROM iq_messages WHERE seq=?", [(r[0],) for r in rows])
            conn.executemany("DELETE FROM iq_payloads WHERE msg_id=?", [(r[1],) for r in rows])
        return [PurgedMessage(r[1], r[2]) for r in rows]

    def declare_queue(self, queue: str) -> None:
        """Make the queue known."""
        with self.db.transaction() as conn:
            conn.execute("INSERT OR IGNORE INTO iq_queues (name) VALUES (?)", (queue,))

    def queues(self) -> list[str]:
        """Known queues."""
        return [r[0] for r in self.db.conn.execute("SELECT name FROM iq_queues ORDER BY name")]

    def subscriptions(self, queue: str) -> Subscriptions:
        """Standing audience of a queue."""
        row = self.db.conn.execute(
            "SELECT subscriptions FROM iq_queues WHERE name=?", (queue,)
        ).fetchone()
        if row is None:
            return Subscriptions()
        return subscriptions_from_json(row[0])

    def set_subscriptions(self, queue: str, subs: Subscriptions) -> None:
        """Replace the standing audience."""
        body = subscriptions_to_json(subs)
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT INTO iq_queues (name, subscriptions) VALUES (?, ?)"
                " ON CONFLICT(name) DO UPDATE SET subscriptions=excluded.subscriptions",
                (queue, body),
            )

    def close(self) -> None:
        """Close the database's connections."""
        self.db.close()


def _record(row: Sequence[Any]) -> MessageRecord:
    rec = MessageRecord.__new__(MessageRecord)
    rec.__dict__.update(
        seq=row[0],
        msg_id=row[1],
        queue=row[2],
        publisher=row[3],
        ordering_key=row[4],
        correlation_id=row[5],
        priority=row[6],
        mode=Mode(row[7]),
        parents=tuple(json.loads(row[8])) if row[8] else (),
        native_ref=row[9],
        content_type=row[10],
        size=row[11],
        created_at=row[12],
        expires_at=row[13],
        max_attempts=row[14],
        publisher_state=_PUB[row[15]] if row[15] else None,
        withdrawn=bool(row[16]),
        updated_at=row[17],
        lock_id=row[18],
        lock_owner=row[19],
        lock_until=row[20],
        version=row[21],
        members=_members(row[22]),
    )
    return rec


def _unpack(row: Sequence[Any]) -> list[JournalEntry]:
    return entries_from_json(row[0], row[1], row[2], row[3])
