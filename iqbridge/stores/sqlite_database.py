"""The database layer of the embedded SQLite index store (:mod:`iqbridge.stores.sqlite`):
the ``sqlite:///`` URL, the schema, and :class:`SqliteDatabase`: one file, a connection
per thread, and write transactions that nest (``BEGIN IMMEDIATE``, savepoints inside).

The ``sqlite`` adapter (:mod:`iqbridge.adapters.sqlite`) keeps its queue rows in the same
file through the same :class:`SqliteDatabase`, so a put, a claim or a done is one
transaction.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import ClassVar
from urllib.parse import parse_qs, urlsplit

from iqbridge.durations import seconds
from iqbridge.errors import ConfigurationError, IndexUnavailable
from iqbridge.redaction import redact

__all__ = ["OPTIONS", "SCHEMA_VERSION", "SqliteDatabase", "parse_sqlite_url"]

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
CREATE TABLE IF NOT EXISTS iq_purged (
    msg_id TEXT PRIMARY KEY,
    journal TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS iq_payloads (
    msg_id TEXT PRIMARY KEY,
    body BLOB NOT NULL,
    headers TEXT NOT NULL
);
"""


#: The options of a ``sqlite:///`` URL.
OPTIONS = frozenset({"synchronous", "busy_timeout"})


def parse_sqlite_url(url: str) -> tuple[Path, dict[str, str]]:
    """The database path and options of a ``sqlite:///`` URL."""
    parts = urlsplit(url)
    safe = redact(url)
    if parts.scheme != "sqlite":
        raise ConfigurationError(f"not a sqlite URL: {safe!r}")
    if parts.netloc:
        raise ConfigurationError(
            f"sqlite URL {safe!r} has a host part; use sqlite:///relative.db or "
            f"sqlite:////absolute/path.db"
        )
    raw = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not raw or raw == ":memory:":
        raise ConfigurationError(
            f"sqlite URL {safe!r} names no file; give one (sqlite:///iqbridge.db) or use "
            f"memory:// for an in-process queue"
        )
    opts = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(opts) - OPTIONS
    if unknown:
        raise ConfigurationError(
            f"unknown sqlite option(s) {sorted(unknown)} in {safe!r}; known: synchronous, "
            f"busy_timeout"
        )
    sync = opts.get("synchronous", "full").lower()
    if sync not in ("normal", "full"):
        raise ConfigurationError(f"synchronous must be normal or full, not {sync!r}")
    wait = opts.get("busy_timeout")
    if wait is not None:
        try:
            seconds(float(wait), "busy_timeout")
        except ValueError:  # not a number, or not a duration (InvalidArgument)
            raise ConfigurationError(
                f"busy_timeout must be a number of seconds, 0 or more, not {wait!r} in {url!r}"
            ) from None
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

    def transaction(self, *, savepoint: bool = True, wait_for_disk: bool = True) -> _Transaction:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` on this thread's connection.

        Nested use joins the enclosing transaction, inside a savepoint unless
        ``savepoint=False`` (for callers that fail before writing anything).

        ``wait_for_disk=False``: the commit does not wait for the disk (``synchronous=
        NORMAL`` for this transaction alone, with ``synchronous=full``). It survives a
        crash of the process at once and a power loss once the next commit that waits
        has (the write-ahead log is written in order). Only for what may be lost to a
        power loss without changing an answer: what the index can learn again (the
        broker references of messages it knows).
        """
        return _Transaction(self, savepoint, wait_for_disk)

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

    __slots__ = ("conn", "db", "lazy", "name", "savepoint")

    def __init__(self, db: SqliteDatabase, savepoint: bool, wait_for_disk: bool = True) -> None:
        self.db = db
        self.savepoint = savepoint
        self.lazy = not wait_for_disk and db.synchronous == "full"
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
            if self.lazy:
                conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            self._restore(conn)
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
            self._restore(conn)
            self.db._write_lock.release()

    def _restore(self, conn: sqlite3.Connection) -> None:
        """Back to waiting for the disk after a transaction that did not."""
        if self.lazy:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA synchronous=FULL")


class _Conn:
    __slots__ = ("__weakref__", "conn")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn


def _translate(exc: sqlite3.Error, path: Path) -> Exception:
    return IndexUnavailable(f"SQLite database {str(path)!r}: {exc}")
