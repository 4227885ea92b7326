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

The store is :class:`SqliteStore`; its database layer (the URL, the schema,
:class:`SqliteDatabase` with its connections and transactions) is in
:mod:`iqbridge.stores.sqlite_database` and its write path in
:mod:`iqbridge.stores.sqlite_commit`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from iqbridge.engine_batch import ClaimPlan, SettlePlan
from iqbridge.errors import MessageNotFound
from iqbridge.model import (
    Filter,
    JournalEntry,
    MessageRecord,
    MessageSummary,
    QueueCounts,
    Retained,
    Subscriptions,
    to_micros,
)
from iqbridge.states import Mode, PublisherState, SubscriberState
from iqbridge.stores.base import AvailableQueries, PurgedMessage
from iqbridge.stores.codec import JOURNAL_PER_ROW as _PER_ROW
from iqbridge.stores.codec import counted as _counted
from iqbridge.stores.codec import (
    entries_from_json,
    subscriptions_from_json,
    subscriptions_to_json,
)
from iqbridge.stores.codec import members_from_json as _members
from iqbridge.stores.codec import summary as _summary
from iqbridge.stores.sqlite_claim import Claimed, claim_entries, claim_rows
from iqbridge.stores.sqlite_commit import SqliteCommits
from iqbridge.stores.sqlite_database import (
    SqliteDatabase,
    _Transaction,
    _translate,
    parse_sqlite_url,
)
from iqbridge.stores.sqlite_settle import settle_rows

__all__ = [
    "SqliteDatabase",
    "SqliteStore",
    "parse_sqlite_url",
    # moved to iqbridge.stores.codec; still importable from here
    "subscriptions_from_json",
    "subscriptions_to_json",
]

_MSG_COLS = (
    "seq, msg_id, queue, publisher, ordering_key, correlation_id, priority, mode, parents, "
    "native_ref, content_type, size, created_at, expires_at, max_attempts, publisher_state, "
    "withdrawn, updated_at, lock_id, lock_owner, lock_until, version, members, journal"
)

_PUB = {s.value: s for s in PublisherState}
#: Ids per IN (...) list (older SQLite builds allow 999 parameters a statement).
_CHUNK = 500


class SqliteStore(SqliteCommits, AvailableQueries):
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

    def claim_ready(
        self, queue: str, plan: ClaimPlan, at: int, tokens: Sequence[str]
    ) -> tuple[list[Claimed], list[str]]:
        """Claim ready messages of one subscriber where they are kept, one transaction
        for the batch (:mod:`iqbridge.stores.sqlite_claim`; see
        :class:`~iqbridge.stores.base.ClaimsReady`)."""
        try:
            with self.db.transaction(savepoint=True) as conn:
                return claim_rows(conn, queue, plan, at, tokens)
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc

    def claim_received(
        self,
        queue: str,
        plan: ClaimPlan,
        at: int,
        entries: Sequence[tuple[str, str, str]],
        tokens: Sequence[str],
    ) -> list[Claimed | None]:
        """Claim the messages of a consumer group's broker entries where they are kept,
        one transaction for the batch (:func:`~iqbridge.stores.sqlite_claim.claim_entries`;
        see :class:`~iqbridge.stores.base.ClaimsReceived`)."""
        if not entries:
            return []
        try:
            with self.db.transaction(savepoint=True) as conn:
                return claim_entries(conn, queue, plan, at, entries, tokens)
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc

    def settle_held(
        self, queue: str, plan: SettlePlan, at: int, held: Sequence[tuple[str, str]]
    ) -> list[bool]:
        """Settle held messages of one subscriber where they are kept, one transaction
        for the batch (:mod:`iqbridge.stores.sqlite_settle`; see
        :class:`~iqbridge.stores.base.SettlesHeld`)."""
        if not held:
            return []
        try:
            with self.db.transaction(savepoint=True) as conn:
                return settle_rows(conn, queue, plan, at, held)
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc

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
        if len(msg_ids) == 1:  # a single get: the plain lookup
            try:
                return {msg_ids[0]: self.load(msg_ids[0])}
            except MessageNotFound:
                return {}
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
        if row is None:  # purged? its journal stays, and where to find it
            row = conn.execute("SELECT journal FROM iq_purged WHERE msg_id=?", (msg_id,)).fetchone()
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
                # A batch's row holds other messages' entries too.
                out.extend(e for e in _unpack(r) if e.msg_id == msg_id)
        return out

    def counts(self, queue: str) -> QueueCounts:
        """States counted by two grouped queries; members through ``json_each``."""
        conn = self.db.conn
        pubs = conn.execute(
            "SELECT publisher_state, COUNT(*) FROM iq_messages WHERE queue=? "
            "GROUP BY publisher_state",
            (queue,),
        ).fetchall()
        # Members are a JSON array of [subscriber, pool, state, ...] rows.
        members = conn.execute(
            "SELECT json_extract(j.value, '$[0]') AS sub, json_extract(j.value, '$[2]') AS st,"
            " COUNT(*), MIN(m.created_at) FROM iq_messages m, json_each(m.members) j"
            " WHERE m.queue=? AND st IS NOT NULL GROUP BY sub, st",
            (queue,),
        ).fetchall()
        return _counted(queue, pubs, members)

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
        if flt.parent is not None:
            where.append("EXISTS (SELECT 1 FROM json_each(parents) p WHERE p.value = ?)")
            args.append(flt.parent)
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

    def purge(
        self,
        queue: str,
        before: int,
        limit: int = 1000,
        ids: Sequence[str] | None = None,
    ) -> list[PurgedMessage]:
        """Delete journalled messages last changed before ``before`` (only ``ids``, if
        given); keep the journal, and each message's list of its entries (``iq_purged``),
        so its history can still be read."""
        if limit <= 0 or (ids is not None and not ids):
            return []
        where = "queue=? AND publisher_state='JOURNALLED' AND updated_at < ?"
        with self.db.transaction() as conn:
            if ids is None:
                rows = conn.execute(
                    f"SELECT seq, msg_id, native_ref, journal FROM iq_messages WHERE {where}"
                    " ORDER BY seq LIMIT ?",
                    (queue, before, limit),
                ).fetchall()
            else:
                unique = list(dict.fromkeys(ids))
                rows = []
                for i in range(0, len(unique), _CHUNK):
                    part = unique[i : i + _CHUNK]
                    rows += conn.execute(
                        f"SELECT seq, msg_id, native_ref, journal FROM iq_messages WHERE {where}"
                        f" AND msg_id IN ({','.join('?' * len(part))})",
                        (queue, before, *part),
                    ).fetchall()
                rows = sorted(rows)[:limit]
            conn.executemany(
                "INSERT OR REPLACE INTO iq_purged (msg_id, journal) VALUES (?, ?)",
                [(r[1], r[3]) for r in rows],
            )
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
