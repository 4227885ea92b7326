"""The write path of the embedded SQLite index store (:mod:`iqbridge.stores.sqlite`):
one change, an all-or-nothing batch, or a batch that writes what still holds
(``commit_each``), each in one transaction: the message row (compare-and-set on its
version), the ready rows of its AVAILABLE members, journal rows and retained payload
copies; and native refs."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from iqbridge.engine import Change
from iqbridge.model import MessageRecord
from iqbridge.states import ActorKind, SubscriberState
from iqbridge.stores.base import StaleRecord
from iqbridge.stores.codec import JOURNAL_PER_ROW as _PER_ROW
from iqbridge.stores.codec import batch_entries_to_json, encode
from iqbridge.stores.codec import entries_to_json as _entries_json
from iqbridge.stores.codec import members_to_json as _members_json
from iqbridge.stores.sqlite_database import SqliteDatabase, _translate
from iqbridge.writes import Writes

__all__ = ["DELETE_READY", "SqliteCommits", "write_batch_journal"]

_INSERT_MSG = (
    "INSERT INTO iq_messages (msg_id, queue, publisher, ordering_key, correlation_id, priority,"
    " mode, parents, native_ref, content_type, size, created_at, expires_at, max_attempts,"
    " publisher_state, withdrawn, updated_at, lock_id, lock_owner, lock_until, version,"
    " members, journal, next_due) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_INSERT_ABSENT = _INSERT_MSG + " ON CONFLICT (msg_id) DO NOTHING"
_INSERT_SEQ = (
    "INSERT INTO iq_messages (seq, msg_id, queue, publisher, ordering_key, correlation_id,"
    " priority, mode, parents, native_ref, content_type, size, created_at, expires_at,"
    " max_attempts, publisher_state, withdrawn, updated_at, lock_id, lock_owner, lock_until,"
    " version, members, journal, next_due)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
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
DELETE_READY = "DELETE FROM iq_ready WHERE queue=? AND subscriber=? AND priority=? AND seq=?"
_INSERT_JOURNAL = "INSERT INTO iq_journal (seq, msg_id, queue, entries) VALUES (?,?,?,?)"
# Journal entries of one change share a row; entry seq = row seq * _PER_ROW + position.
# A batch's templated entries share a row too (msg_id ''; see codec.batch_entries_to_json).
_CHUNK = 500

_AVAILABLE = SubscriberState.AVAILABLE


class SqliteCommits:
    """Commits and native refs of :class:`~iqbridge.stores.sqlite.SqliteStore`."""

    db: SqliteDatabase

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

    def commit_writes(self, writes: Writes) -> list[bool]:
        """Commit a batch's writes in one transaction: the compare-and-set of every
        record checked under the write lock first, then one multi-row statement per table
        (message rows, ready rows, payload copies) and the templated journal entries of
        what holds in as few journal rows as they fit."""
        if not len(writes):
            return []
        try:
            with self.db.transaction(savepoint=True) as conn:
                created = self._free(conn, writes)
                moved = self._holding(conn, writes)
                ok = {r.msg_id for r, f in zip(writes.created, created, strict=True) if f}
                ok.update(a.msg_id for (_, a), f in zip(writes.moved, moved, strict=True) if f)
                seqs = self._batch_journal(conn, writes, ok)
                self._insert(conn, writes, created, seqs)
                self._update(conn, writes, moved, seqs)
                rest = self._commit(writes.changes, each=True) if writes.changes else []
        except sqlite3.IntegrityError as exc:
            raise StaleRecord(writes.created[0].msg_id if writes.created else "?") from exc
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc
        return created + moved + rest

    @staticmethod
    def _free(conn: sqlite3.Connection, writes: Writes) -> list[bool]:
        """Which new records' msg_ids are free (the first of one repeated in the batch)."""
        ids = [r.msg_id for r in writes.created]
        taken: set[str] = set()
        for i in range(0, len(ids), _CHUNK):
            chunk = ids[i : i + _CHUNK]
            marks = ",".join("?" * len(chunk))
            taken.update(
                r[0]
                for r in conn.execute(
                    f"SELECT msg_id FROM iq_messages WHERE msg_id IN ({marks})", chunk
                )
            )
        flags: list[bool] = []
        for msg_id in ids:
            flags.append(msg_id not in taken)
            taken.add(msg_id)
        return flags

    @staticmethod
    def _holding(conn: sqlite3.Connection, writes: Writes) -> list[bool]:
        """Which moved records still have the version they were moved from (the first
        move of a record moved twice in the batch)."""
        seqs = [b.seq for b, _ in writes.moved]
        current: dict[int, int] = {}
        for i in range(0, len(seqs), _CHUNK):
            chunk = seqs[i : i + _CHUNK]
            marks = ",".join("?" * len(chunk))
            current.update(
                conn.execute(f"SELECT seq, version FROM iq_messages WHERE seq IN ({marks})", chunk)
            )
        flags: list[bool] = []
        for before, _ in writes.moved:
            held = before.seq is not None and current.get(before.seq) == before.version
            if held:
                current[before.seq] = -1  # type: ignore[index]
            flags.append(held)
        return flags

    def _batch_journal(
        self, conn: sqlite3.Connection, writes: Writes, ok: set[str]
    ) -> dict[str, str]:
        """Write the templated journal of what holds (:func:`write_batch_journal`)."""
        return write_batch_journal(
            conn,
            writes.queue,
            (
                (
                    group.at,
                    [[s.actor, s.kind, s.src, s.dst, s.detail] for s in group.steps],
                    [[m, a] for m, a in group.items if m in ok],
                )
                for group in writes.journal
            ),
        )

    @staticmethod
    def _insert(
        conn: sqlite3.Connection, writes: Writes, flags: list[bool], seqs: dict[str, str]
    ) -> None:
        """Insert the new records that hold, their ready rows and payload copies."""
        if not writes.created:
            return
        row = conn.execute("SELECT max(seq) FROM iq_messages").fetchone()
        seq = int(row[0] or 0)
        rows: list[tuple[Any, ...]] = []
        ready: list[tuple[Any, ...]] = []
        payloads: list[tuple[str, bytes, str]] = []
        for i, (rec, ok) in enumerate(zip(writes.created, flags, strict=True)):
            if not ok:
                continue
            seq += 1
            rec.seq = seq
            rows.append((seq, *_message_row(rec, _members_json(rec), seqs.get(rec.msg_id, ""))))
            for m in rec.members.values():
                if m.state is _AVAILABLE:
                    ready.append((rec.queue, m.subscriber, rec.priority, seq, m.attempt, None))
            kept = writes.retain[i] if writes.retain else None
            if kept is not None:
                payloads.append((rec.msg_id, bytes(kept.body), encode(dict(kept.headers))))
        if rows:
            conn.executemany(_INSERT_SEQ, rows)
        if ready:
            conn.executemany(_INSERT_READY, ready)
        if payloads:
            conn.executemany(_INSERT_PAYLOAD, payloads)

    @staticmethod
    def _update(
        conn: sqlite3.Connection, writes: Writes, flags: list[bool], seqs: dict[str, str]
    ) -> None:
        """Update the moved records that hold, and the ready rows of their members."""
        rows: list[tuple[Any, ...]] = []
        add: list[tuple[Any, ...]] = []
        drop: list[tuple[Any, ...]] = []
        for (before, rec), ok in zip(writes.moved, flags, strict=True):
            if not ok:
                continue
            rec.seq = before.seq
            more = seqs.get(rec.msg_id)
            rows.append(
                (
                    *_moving(rec, _members_json(rec)),
                    "," + more if more else "",
                    rec.due_at(),
                    before.seq,
                    before.version,
                )
            )
            _ready_delta(before, rec, add, drop)
        if rows:
            conn.executemany(_UPDATE_MSG, rows)
        if drop:
            conn.executemany(DELETE_READY, drop)
        if add:
            conn.executemany(_INSERT_READY, add)

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
                    conn.executemany(DELETE_READY, ready_del)
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
                _INSERT_ABSENT if each else _INSERT_MSG, _message_row(rec, members, seqs)
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
                *_moving(rec, members),
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

    def set_native_ref(self, msg_id: str, native_ref: str) -> None:
        """Record where the payload lives."""
        self.set_native_refs([(msg_id, native_ref)])

    def set_native_refs(self, refs: Sequence[tuple[str, str]]) -> None:
        """Record where several payloads live, in one transaction; unknown ids are skipped.

        The commit does not wait for the disk: a reference is what the broker said it
        has, and one a power loss takes is a record without a reference, as after a crash
        between the broker's send and this commit, which the index resolves as it does
        then (the put's repeat and reconciliation ask the broker; a delivery brings its
        reference again). So a put through the broker waits for the disk once."""
        if not refs:
            return
        try:
            with self.db.transaction(wait_for_disk=False) as conn:
                conn.executemany(
                    "UPDATE iq_messages SET native_ref=? WHERE msg_id=?",
                    [(ref, msg_id) for msg_id, ref in refs],
                )
        except sqlite3.Error as exc:
            raise _translate(exc, self.db.path) from exc


def write_batch_journal(
    conn: sqlite3.Connection,
    queue: str,
    groups: Iterable[tuple[int, list[list[Any]], list[list[Any]]]],
) -> dict[str, str]:
    """Write a batch's templated journal, ``groups`` of (instant, steps as ``[actor,
    kind, src, dst, detail]``, ``[msg_id, attempt]`` of every message that made them),
    in journal rows of fewer than ``_PER_ROW`` entries; the row numbers each message's
    entries went to (comma-separated, for its ``journal`` column), by msg_id."""
    rows: list[list[Any]] = [[]]
    size = 0
    for at, steps, group_items in groups:
        per = max(len(steps), 1)
        items = list(group_items)
        while items:
            room = (_PER_ROW - 1 - size) // per
            if room <= 0:
                rows.append([])
                size = 0
                continue
            part, items = items[:room], items[room:]
            rows[-1].append([at, steps, part])
            size += per * len(part)
    rows = [r for r in rows if r]
    if not rows:
        return {}
    row = conn.execute("SELECT max(seq) FROM iq_journal").fetchone()
    first = int(row[0] or 0) + 1
    where: dict[str, list[str]] = {}
    for n, row_groups in enumerate(rows):
        for _, _, items in row_groups:
            for msg_id, _ in items:
                rows_of = where.setdefault(msg_id, [])
                if not rows_of or rows_of[-1] != str(first + n):
                    rows_of.append(str(first + n))
    conn.executemany(
        _INSERT_JOURNAL,
        [(first + n, "", queue, batch_entries_to_json(g)) for n, g in enumerate(rows)],
    )
    return {msg_id: ",".join(v) for msg_id, v in where.items()}


def _message_row(rec: MessageRecord, members: str, journal: str) -> tuple[Any, ...]:
    """A new record's ``iq_messages`` values after ``seq``, in the table's column order."""
    return (
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
        *_moving(rec, members),
        journal,
        rec.due_at(),
    )


def _moving(rec: MessageRecord, members: str) -> tuple[Any, ...]:
    """A record's ``iq_messages`` values that change as it moves (``publisher_state`` to
    ``members``), in the table's column order and ``_UPDATE_MSG``'s."""
    return (
        rec.publisher_state,
        int(rec.withdrawn),
        rec.updated_at,
        rec.lock_id,
        rec.lock_owner,
        rec.lock_until,
        rec.version,
        members,
    )


def _ready_delta(
    before: MessageRecord,
    after: MessageRecord,
    add: list[tuple[Any, ...]],
    drop: list[tuple[Any, ...]],
) -> None:
    """The ready rows a move changes: those of members that left or entered AVAILABLE."""
    for name, m in after.members.items():
        old = before.members.get(name)
        if m is old:
            continue
        key = (after.queue, name, after.priority, after.seq)
        if m.state is _AVAILABLE:
            add.append((*key, m.attempt, m.not_before))
        elif old is not None and old.state is _AVAILABLE:
            drop.append(key)
