"""Embedded SQLite queue: ``sqlite:///path/file.db`` (relative) or ``sqlite:////abs/path.db``.

Features: queue rows in the same SQLite file (WAL) as the index, so a put, a claim or a
done is one transaction; safe across threads and processes; index-driven delivery in
priority then put (rowid) order; payloads kept after consumption until purged
(journalled retention). No server needed: this is the default backend.

Options (query parameters): ``synchronous=full|normal`` (default full: whatever a call
acknowledged survives power loss; normal: faster, survives a crash of the process but may
lose the last commits on power loss), ``busy_timeout`` in seconds (default 30). Its
default index is the SQLite store on the same file.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

from iqbridge.adapter import Capabilities
from iqbridge.errors import ConfigurationError, IndexUnavailable
from iqbridge.inventory import Entry, Unacked
from iqbridge.model import Envelope, Received
from iqbridge.stores.sqlite import SqliteDatabase, SqliteStore

__all__ = ["SqliteAdapter"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS iq_queue_rows (
    ref INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    msg_id TEXT NOT NULL,
    body BLOB NOT NULL,
    content_type TEXT NOT NULL,
    headers TEXT,
    publisher TEXT NOT NULL,
    correlation_id TEXT,
    priority INTEGER NOT NULL,
    ordering_key TEXT NOT NULL,
    parents TEXT,
    put_at INTEGER NOT NULL
);
"""

_READ_CHUNK = 500

_INSERT = (
    "INSERT INTO iq_queue_rows (queue, msg_id, body, content_type, headers, publisher,"
    " correlation_id, priority, ordering_key, parents, put_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)


_INSERT_REF = (
    "INSERT INTO iq_queue_rows (ref, queue, msg_id, body, content_type, headers, publisher,"
    " correlation_id, priority, ordering_key, parents, put_at)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
)


def _next_ref(conn: sqlite3.Connection) -> int:
    """The reference the next queue row gets (as AUTOINCREMENT would number it)."""
    used = conn.execute("SELECT max(ref) FROM iq_queue_rows").fetchone()[0] or 0
    row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name='iq_queue_rows'").fetchone()
    return int(max(used, row[0] if row else 0)) + 1


class SqliteAdapter:
    """The embedded queue: payload rows beside the index in one SQLite file."""

    capabilities = Capabilities(
        native_groups=False,
        read_by_ref=True,
        shares_index_transaction=True,
        max_payload_bytes=512 * 1024 * 1024,
    )

    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        self.url = f"sqlite:///{db.path}"
        with db.connect() as conn:
            conn.executescript(_SCHEMA)

    @classmethod
    def from_url(cls, url: str) -> SqliteAdapter:
        """Open the queue file a ``sqlite:///`` URL names (created if missing)."""
        return cls(SqliteDatabase.shared(url))

    def default_index(self) -> SqliteStore:
        """The index in the same file: one transaction covers queue rows and states."""
        return SqliteStore(self.db.acquire())

    def declare(self, queue: str, groups: Sequence[str]) -> None:
        """Nothing to create: rows carry their queue name."""

    def send(self, queue: str, envelopes: Sequence[Envelope]) -> list[str]:
        """Insert queue rows; joins the caller's transaction if one is open."""
        rows = [
            (
                queue,
                e.msg_id,
                e.body,
                e.content_type,
                json.dumps(e.headers) if e.headers else None,
                e.publisher,
                e.correlation_id,
                e.priority,
                e.ordering_key,
                json.dumps(list(e.parents)) if e.parents else None,
                e.put_at,
            )
            for e in envelopes
        ]
        try:
            # One row fails before writing anything: no savepoint needed for it.
            with self.db.transaction(savepoint=len(rows) > 1) as conn:
                if len(rows) == 1:
                    return [str(conn.execute(_INSERT, rows[0]).lastrowid)]
                # Under the write lock the next references are ours: numbered here, the
                # rows go in with one statement (AUTOINCREMENT: never below a used one).
                first = _next_ref(conn)
                conn.executemany(_INSERT_REF, [(first + i, *row) for i, row in enumerate(rows)])
                return [str(first + i) for i in range(len(rows))]
        except sqlite3.Error as exc:
            raise IndexUnavailable(f"SQLite queue {str(self.db.path)!r}: {exc}") from exc

    def receive(
        self,
        queue: str,
        group: str,
        consumer: str,
        *,
        count: int,
        timeout: float,
        min_idle: float | None = None,
    ) -> list[Received]:
        """Not used: delivery on the embedded queue is index-driven."""
        raise ConfigurationError(
            "the sqlite adapter is index-driven; the facade never calls receive"
        )

    def ack(self, queue: str, group: str, refs: Sequence[str]) -> None:
        """Nothing to do: the index state is the acknowledgement."""

    def requeue(self, queue: str, group: str, ref: str) -> None:
        """Nothing to do: AVAILABLE in the index makes it deliverable again."""

    def dead_letter(self, queue: str, group: str, ref: str, reason: str) -> None:
        """Nothing to do: UNUSABLE in the index is the dead-letter state."""

    def read(self, queue: str, ref: str) -> Envelope | None:
        """The stored envelope at a row reference."""
        try:
            row = self.db.conn.execute(
                "SELECT msg_id, body, content_type, headers, publisher, correlation_id,"
                " priority, ordering_key, parents, put_at FROM iq_queue_rows WHERE ref=?",
                (int(ref),),
            ).fetchone()
        except sqlite3.Error as exc:
            raise IndexUnavailable(f"SQLite queue {str(self.db.path)!r}: {exc}") from exc
        return _envelope(row) if row is not None else None

    def read_many(self, queue: str, refs: Sequence[str]) -> list[Envelope | None]:
        """The stored envelopes at several row references, in order: one query per
        500 references."""
        if len(refs) == 1:
            return [self.read(queue, refs[0])]
        found: dict[int, Envelope] = {}
        keys = [int(r) for r in refs]
        try:
            for i in range(0, len(keys), _READ_CHUNK):
                part = keys[i : i + _READ_CHUNK]
                rows = self.db.conn.execute(
                    "SELECT ref, msg_id, body, content_type, headers, publisher, correlation_id,"
                    " priority, ordering_key, parents, put_at FROM iq_queue_rows WHERE ref IN"
                    f" ({','.join('?' * len(part))})",
                    part,
                ).fetchall()
                found.update((row[0], _envelope(row[1:])) for row in rows)
        except sqlite3.Error as exc:
            raise IndexUnavailable(f"SQLite queue {str(self.db.path)!r}: {exc}") from exc
        return [found.get(k) for k in keys]

    def delete(self, queue: str, refs: Sequence[str]) -> None:
        """Delete queue rows (purge)."""
        with self.db.transaction() as conn:
            conn.executemany("DELETE FROM iq_queue_rows WHERE ref=?", [(int(r),) for r in refs])

    # --- Inventory (reconciliation) ------------------------------------------------------

    def entries(self, queue: str) -> Iterator[Entry]:
        """Every queue row of the queue, in put (rowid) order."""
        try:
            rows = self.db.conn.execute(
                "SELECT ref, msg_id FROM iq_queue_rows WHERE queue=? ORDER BY ref", (queue,)
            ).fetchall()
        except sqlite3.Error as exc:
            raise IndexUnavailable(f"SQLite queue {str(self.db.path)!r}: {exc}") from exc
        for ref, msg_id in rows:
            yield Entry(str(ref), msg_id)

    def unacked(self, queue: str, group: str) -> Unacked | None:
        """None: the embedded queue keeps no acknowledgement; the index is the only one."""
        return None

    def redeliver(self, queue: str, group: str, ref: str) -> bool:
        """Nothing to do: AVAILABLE in the index makes a row deliverable."""
        return True

    def close(self) -> None:
        """Close the file's connections."""
        self.db.close()


def _envelope(row: Sequence[Any]) -> Envelope:
    return Envelope(
        msg_id=row[0],
        body=bytes(row[1]),
        content_type=row[2],
        headers=json.loads(row[3]) if row[3] else {},
        publisher=row[4],
        correlation_id=row[5],
        priority=row[6],
        ordering_key=row[7],
        parents=tuple(json.loads(row[8])) if row[8] else (),
        put_at=row[9],
    )
