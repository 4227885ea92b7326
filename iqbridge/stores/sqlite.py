"""Embedded SQLite index store (the zero-server default).

URL: ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``; options as query
parameters: ``synchronous`` (``normal``, the default, or ``full`` for durability against
power loss; WAL mode either way) and ``busy_timeout`` in seconds (default 30).

One file holds the index (messages, members, journal, subscriptions) and, with the
``sqlite`` adapter, the queue rows too, so a put, a claim or a done is one transaction.
Writers take the write lock up front (``BEGIN IMMEDIATE``): claims are serialised across
threads and processes, which is what makes a pool's compare-and-set race-free.
Each thread uses its own connection.
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
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from iqbridge.engine import Change
from iqbridge.errors import ConfigurationError, IndexUnavailable, MessageNotFound
from iqbridge.model import (
    Filter,
    JournalEntry,
    Member,
    MessageRecord,
    MessageSummary,
    Pool,
    Subscriptions,
    from_micros,
    to_micros,
)
from iqbridge.states import ActorKind, Mode, PublisherState, SubscriberState
from iqbridge.stores.base import PurgedMessage, StaleRecord

__all__ = ["SqliteDatabase", "SqliteStore", "parse_sqlite_url"]

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS iq_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS iq_queues (
    name TEXT PRIMARY KEY,
    subscriptions TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS iq_messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
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
    withdrawn INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER NOT NULL,
    lock_id TEXT,
    lock_owner TEXT,
    lock_until INTEGER,
    version INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS iq_messages_created ON iq_messages (queue, created_at);
CREATE INDEX IF NOT EXISTS iq_messages_corr ON iq_messages (correlation_id)
    WHERE correlation_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS iq_messages_pub ON iq_messages (queue, publisher);
CREATE INDEX IF NOT EXISTS iq_messages_prio ON iq_messages (queue, priority);
CREATE INDEX IF NOT EXISTS iq_messages_journalled ON iq_messages (queue, updated_at)
    WHERE publisher_state = 'JOURNALLED';
CREATE INDEX IF NOT EXISTS iq_messages_ttl ON iq_messages (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS iq_messages_lock ON iq_messages (lock_until)
    WHERE lock_until IS NOT NULL;
CREATE TABLE IF NOT EXISTS iq_members (
    seq INTEGER NOT NULL,
    subscriber TEXT NOT NULL,
    queue TEXT NOT NULL,
    priority INTEGER NOT NULL,
    pool TEXT,
    state TEXT,
    outcome TEXT,
    attempt INTEGER NOT NULL,
    lease_token TEXT,
    lease_owner TEXT,
    lease_until INTEGER,
    not_before INTEGER,
    reason TEXT,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (seq, subscriber)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS iq_members_avail ON iq_members (queue, subscriber, priority DESC, seq)
    WHERE state = 'AVAILABLE';
CREATE INDEX IF NOT EXISTS iq_members_lease ON iq_members (lease_until)
    WHERE lease_until IS NOT NULL;
CREATE TABLE IF NOT EXISTS iq_journal (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    msg_id TEXT NOT NULL,
    queue TEXT NOT NULL,
    actor TEXT NOT NULL,
    actor_kind TEXT NOT NULL,
    src TEXT,
    dst TEXT NOT NULL,
    at INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    detail TEXT
);
CREATE INDEX IF NOT EXISTS iq_journal_msg ON iq_journal (msg_id);
"""

_MSG_COLS = (
    "seq, msg_id, queue, publisher, ordering_key, correlation_id, priority, mode, parents, "
    "native_ref, content_type, size, created_at, expires_at, max_attempts, publisher_state, "
    "withdrawn, updated_at, lock_id, lock_owner, lock_until, version"
)
_MEMBER_COLS = (
    "subscriber, pool, state, outcome, attempt, lease_token, lease_owner, lease_until, "
    "not_before, reason, updated_at"
)
_INSERT_MSG = (
    "INSERT INTO iq_messages (msg_id, queue, publisher, ordering_key, correlation_id, priority,"
    " mode, parents, native_ref, content_type, size, created_at, expires_at, max_attempts,"
    " publisher_state, withdrawn, updated_at, lock_id, lock_owner, lock_until, version)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_INSERT_MEMBER = (
    "INSERT INTO iq_members (seq, queue, priority, subscriber, pool, state, outcome, attempt,"
    " lease_token, lease_owner, lease_until, not_before, reason, updated_at)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_UPDATE_MSG = (
    "UPDATE iq_messages SET publisher_state=?, withdrawn=?, updated_at=?, lock_id=?,"
    " lock_owner=?, lock_until=?, version=? WHERE seq=? AND version=?"
)
_UPDATE_MEMBER = (
    "UPDATE iq_members SET state=?, outcome=?, attempt=?, lease_token=?, lease_owner=?,"
    " lease_until=?, not_before=?, reason=?, updated_at=? WHERE seq=? AND subscriber=?"
)
_INSERT_JOURNAL = (
    "INSERT INTO iq_journal (msg_id, queue, actor, actor_kind, src, dst, at, attempt, detail)"
    " VALUES (?,?,?,?,?,?,?,?,?)"
)


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
    sync = opts.get("synchronous", "normal").lower()
    if sync not in ("normal", "full"):
        raise ConfigurationError(f"synchronous must be normal or full, not {sync!r}")
    return Path(raw), opts


class SqliteDatabase:
    """One SQLite file, a connection per thread, and transactions that nest."""

    def __init__(self, path: Path, *, synchronous: str = "normal", busy_timeout: float = 30.0):
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._all: weakref.WeakSet[_Conn] = weakref.WeakSet()
        self._all_lock = threading.Lock()
        self._closed = False
        self._users = 0
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
                    synchronous=opts.get("synchronous", "normal").lower(),
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

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` on this thread's connection; nests."""
        conn = self.conn
        depth: int = getattr(self._local, "depth", 0)
        if depth:
            # Nested: a savepoint, so a failed inner step leaves no half-written rows in
            # the outer transaction.
            name = f"iq_sp{depth}"
            conn.execute(f"SAVEPOINT {name}")
            self._local.depth = depth + 1
            try:
                yield conn
            except BaseException:
                conn.execute(f"ROLLBACK TO {name}")
                conn.execute(f"RELEASE {name}")
                raise
            finally:
                self._local.depth = depth
            conn.execute(f"RELEASE {name}")
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc
        self._local.depth = 1
        try:
            yield conn
        except BaseException:
            self._local.depth = 0
            conn.execute("ROLLBACK")
            raise
        self._local.depth = 0
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK")
            raise _translate(exc, self.path) from exc

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
    SqliteDatabase._shared = weakref.WeakValueDictionary()
    SqliteDatabase._shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


class _Conn:
    __slots__ = ("__weakref__", "conn")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn


def _translate(exc: sqlite3.Error, path: Path) -> Exception:
    return IndexUnavailable(f"SQLite database {str(path)!r}: {exc}")


def _member_row(rec: MessageRecord, m: Member) -> tuple[Any, ...]:
    return (
        m.state.value if m.state else None,
        m.outcome.value if m.outcome else None,
        m.attempt,
        m.lease_token,
        m.lease_owner,
        m.lease_until,
        m.not_before,
        m.reason,
        m.updated_at,
        rec.seq,
        m.subscriber,
    )


def _journal_rows(journal: Sequence[JournalEntry]) -> list[tuple[Any, ...]]:
    return [
        (e.msg_id, e.queue, e.actor, e.actor_kind.value, e.src, e.dst, e.at, e.attempt, e.detail)
        for e in journal
    ]


class SqliteStore:
    """The index in a SQLite file (see the module docstring)."""

    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        self.url = f"sqlite:///{db.path}"

    @classmethod
    def from_url(cls, url: str) -> SqliteStore:
        """Open the store a ``sqlite:///`` URL names."""
        return cls(SqliteDatabase.shared(url))

    def atomic(self) -> Any:
        """One write transaction for everything inside."""
        return self.db.transaction()

    def commit(self, change: Change) -> None:
        """Persist one change with compare-and-set."""
        self.commit_many((change,))

    def commit_many(self, changes: Sequence[Change]) -> None:
        """Persist several changes in one transaction, all or none."""
        try:
            with self.db.transaction() as conn:
                journal: list[JournalEntry] = []
                for change in changes:
                    self._write(conn, change)
                    journal.extend(change.journal)
                conn.executemany(_INSERT_JOURNAL, _journal_rows(journal))
        except sqlite3.IntegrityError as exc:
            raise StaleRecord(changes[0].msg_id if changes else "?") from exc
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc

    def _write(self, conn: sqlite3.Connection, change: Change) -> None:
        rec = change.record
        if change.created:
            cur = conn.execute(
                _INSERT_MSG,
                (
                    rec.msg_id,
                    rec.queue,
                    rec.publisher,
                    rec.ordering_key,
                    rec.correlation_id,
                    rec.priority,
                    rec.mode.value,
                    json.dumps(list(rec.parents)) if rec.parents else None,
                    rec.native_ref,
                    rec.content_type,
                    rec.size,
                    rec.created_at,
                    rec.expires_at,
                    rec.max_attempts,
                    rec.publisher_state.value if rec.publisher_state else None,
                    int(rec.withdrawn),
                    rec.updated_at,
                    rec.lock_id,
                    rec.lock_owner,
                    rec.lock_until,
                    rec.version,
                ),
            )
            rec.seq = cur.lastrowid
            conn.executemany(
                _INSERT_MEMBER,
                [
                    (
                        rec.seq,
                        rec.queue,
                        rec.priority,
                        m.subscriber,
                        m.pool,
                        m.state.value if m.state else None,
                        m.outcome.value if m.outcome else None,
                        m.attempt,
                        m.lease_token,
                        m.lease_owner,
                        m.lease_until,
                        m.not_before,
                        m.reason,
                        m.updated_at,
                    )
                    for m in rec.members.values()
                ],
            )
            return
        cur = conn.execute(
            _UPDATE_MSG,
            (
                rec.publisher_state.value if rec.publisher_state else None,
                int(rec.withdrawn),
                rec.updated_at,
                rec.lock_id,
                rec.lock_owner,
                rec.lock_until,
                rec.version,
                rec.seq,
                change.expected_version,
            ),
        )
        if cur.rowcount != 1:
            raise StaleRecord(rec.msg_id)
        if change.dirty:
            conn.executemany(
                _UPDATE_MEMBER, [_member_row(rec, rec.members[s]) for s in change.dirty]
            )

    def load(self, msg_id: str) -> MessageRecord:
        """The current record of a message."""
        conn = self.db.conn
        try:
            row = conn.execute(
                f"SELECT {_MSG_COLS} FROM iq_messages WHERE msg_id=?", (msg_id,)
            ).fetchone()
            if row is None:
                raise MessageNotFound(msg_id)
            members = conn.execute(
                f"SELECT {_MEMBER_COLS} FROM iq_members WHERE seq=?", (row[0],)
            ).fetchall()
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc
        return _record(row, members)

    def set_native_ref(self, msg_id: str, native_ref: str) -> None:
        """Record where the payload lives."""
        with self.db.transaction() as conn:
            conn.execute("UPDATE iq_messages SET native_ref=? WHERE msg_id=?", (native_ref, msg_id))

    def claimable(
        self, queue: str, subscriber: str, now: int, limit: int, lock_id: str | None = None
    ) -> list[str]:
        """Available ids for a subscriber: priority first, then put order."""
        return self._available(queue, subscriber, now, limit, lock_id, 1)

    def redeliverable(self, queue: str, subscriber: str, now: int, limit: int) -> list[str]:
        """Available ids on attempt 2 or later."""
        return self._available(queue, subscriber, now, limit, None, 2)

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
            "SELECT m.msg_id FROM iq_members b JOIN iq_messages m ON m.seq = b.seq"
            " WHERE b.queue=? AND b.subscriber=? AND b.state='AVAILABLE'"
            " AND (b.not_before IS NULL OR b.not_before <= ?)"
            " AND (m.expires_at IS NULL OR m.expires_at > ?)"
            f" AND {lock_sql}"
            + (" AND b.attempt >= ?" if min_attempt > 1 else "")
            + " ORDER BY b.priority DESC, b.seq LIMIT ?"
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
        qsql = " AND m.queue = ?" if queue else ""
        qarg = [queue] if queue else []
        sql = (
            "SELECT m.msg_id FROM iq_members b JOIN iq_messages m ON m.seq = b.seq"
            f" WHERE b.lease_until IS NOT NULL AND b.lease_until <= ?{qsql}"
            " UNION SELECT m.msg_id FROM iq_messages m"
            f" WHERE m.expires_at IS NOT NULL AND m.expires_at <= ?{qsql}"
            " AND (m.publisher_state = 'PUT' OR EXISTS (SELECT 1 FROM iq_members b"
            "  WHERE b.seq = m.seq AND (b.state IS NULL OR b.state = 'AVAILABLE')))"
            " UNION SELECT m.msg_id FROM iq_messages m"
            f" WHERE m.lock_until IS NOT NULL AND m.lock_until <= ?{qsql}"
            " LIMIT ?"
        )
        params = [now, *qarg, now, *qarg, now, *qarg, limit]
        try:
            return [r[0] for r in self.db.conn.execute(sql, params)]
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc

    def history(self, msg_id: str) -> list[JournalEntry]:
        """Every journal entry of one message."""
        rows = self.db.conn.execute(
            "SELECT seq, msg_id, queue, actor, actor_kind, src, dst, at, attempt, detail"
            " FROM iq_journal WHERE msg_id=? ORDER BY seq",
            (msg_id,),
        ).fetchall()
        if not rows:
            raise MessageNotFound(msg_id)
        return [_entry(r) for r in rows]

    def search(self, queue: str, flt: Filter) -> list[MessageSummary]:
        """Filter on index fields only; never touches payloads."""
        where = ["m.queue = ?"]
        args: list[Any] = [queue]
        if flt.msg_id is not None:
            where.append("m.msg_id = ?")
            args.append(flt.msg_id)
        if flt.correlation_id is not None:
            where.append("m.correlation_id = ?")
            args.append(flt.correlation_id)
        if flt.publisher is not None:
            where.append("m.publisher = ?")
            args.append(flt.publisher)
        if flt.priority is not None:
            lo, hi = (
                flt.priority if isinstance(flt.priority, tuple) else (flt.priority, flt.priority)
            )
            where.append("m.priority BETWEEN ? AND ?")
            args.extend((lo, hi))
        if flt.lock_id is not None:
            where.append("m.lock_id = ?")
            args.append(flt.lock_id)
        if flt.since is not None:
            where.append("m.created_at >= ?")
            args.append(to_micros(flt.since))
        if flt.until is not None:
            where.append("m.created_at < ?")
            args.append(to_micros(flt.until))
        if isinstance(flt.state, PublisherState):
            where.append("m.publisher_state = ?")
            args.append(flt.state.value)
            if flt.subscriber is not None:
                where.append(
                    "EXISTS (SELECT 1 FROM iq_members b WHERE b.seq=m.seq AND b.subscriber=?)"
                )
                args.append(flt.subscriber)
        elif isinstance(flt.state, SubscriberState) or flt.subscriber is not None:
            sub_where = ["b.seq = m.seq"]
            if flt.subscriber is not None:
                sub_where.append("b.subscriber = ?")
                args.append(flt.subscriber)
            if isinstance(flt.state, SubscriberState):
                sub_where.append("b.state = ?")
                args.append(flt.state.value)
            where.append(f"EXISTS (SELECT 1 FROM iq_members b WHERE {' AND '.join(sub_where)})")
        sql = (
            f"SELECT {_MSG_COLS} FROM iq_messages m WHERE {' AND '.join(where)}"
            " ORDER BY m.seq LIMIT ?"
        )
        args.append(flt.limit)
        conn = self.db.conn
        try:
            rows = conn.execute(sql, args).fetchall()
            out: list[MessageSummary] = []
            for row in rows:
                members = conn.execute(
                    "SELECT subscriber, state FROM iq_members WHERE seq=?", (row[0],)
                ).fetchall()
                out.append(_summary(row, members))
            return out
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc

    def journal(self, after: int = 0, limit: int = 1000) -> list[JournalEntry]:
        """Journal entries after a sequence number, oldest first."""
        rows = self.db.conn.execute(
            "SELECT seq, msg_id, queue, actor, actor_kind, src, dst, at, attempt, detail"
            " FROM iq_journal WHERE seq > ? ORDER BY seq LIMIT ?",
            (after, limit),
        ).fetchall()
        return [_entry(r) for r in rows]

    def purge(self, queue: str, before: int, limit: int = 1000) -> list[PurgedMessage]:
        """Delete journalled messages last changed before ``before``; keep the journal."""
        with self.db.transaction() as conn:
            rows = conn.execute(
                "SELECT seq, msg_id, native_ref FROM iq_messages WHERE queue=?"
                " AND publisher_state='JOURNALLED' AND updated_at < ? ORDER BY seq LIMIT ?",
                (queue, before, limit),
            ).fetchall()
            seqs = [(r[0],) for r in rows]
            conn.executemany("DELETE FROM iq_members WHERE seq=?", seqs)
            conn.executemany("DELETE FROM iq_messages WHERE seq=?", seqs)
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


def subscriptions_to_json(subs: Subscriptions) -> str:
    """Serialised subscriptions (shared by the SQL-backed stores)."""
    return json.dumps(
        {
            "subscribers": list(subs.subscribers),
            "pools": [{"name": p.name, "members": list(p.members)} for p in subs.pools],
            "adhoc_pools": [{"name": p.name, "members": list(p.members)} for p in subs.adhoc_pools],
        }
    )


def subscriptions_from_json(text: str) -> Subscriptions:
    """Subscriptions from :func:`subscriptions_to_json` output."""
    data = json.loads(text)
    return Subscriptions(
        tuple(data.get("subscribers", ())),
        tuple(Pool(p["name"], p["members"]) for p in data.get("pools", ())),
        tuple(Pool(p["name"], p["members"]) for p in data.get("adhoc_pools", ())),
    )


def _record(row: Sequence[Any], members: Sequence[Sequence[Any]]) -> MessageRecord:
    rec = MessageRecord(
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
        publisher_state=PublisherState(row[15]) if row[15] else None,
        withdrawn=bool(row[16]),
        updated_at=row[17],
        lock_id=row[18],
        lock_owner=row[19],
        lock_until=row[20],
        version=row[21],
    )
    for m in members:
        rec.members[m[0]] = Member(
            subscriber=m[0],
            pool=m[1],
            state=SubscriberState(m[2]) if m[2] else None,
            outcome=SubscriberState(m[3]) if m[3] else None,
            attempt=m[4],
            lease_token=m[5],
            lease_owner=m[6],
            lease_until=m[7],
            not_before=m[8],
            reason=m[9],
            updated_at=m[10],
        )
    return rec


def _summary(row: Sequence[Any], members: Sequence[Sequence[Any]]) -> MessageSummary:
    return MessageSummary(
        msg_id=row[1],
        queue=row[2],
        publisher=row[3],
        correlation_id=row[5],
        priority=row[6],
        mode=Mode(row[7]),
        publisher_state=PublisherState(row[15]) if row[15] else None,
        created_at=from_micros(row[12]),
        subscribers={m[0]: SubscriberState(m[1]) if m[1] else None for m in members},
        parents=tuple(json.loads(row[8])) if row[8] else (),
    )


def _entry(r: Sequence[Any]) -> JournalEntry:
    return JournalEntry(
        seq=r[0],
        msg_id=r[1],
        queue=r[2],
        actor=r[3],
        actor_kind=ActorKind(r[4]),
        src=r[5],
        dst=r[6],
        at=r[7],
        attempt=r[8],
        detail=r[9],
    )
