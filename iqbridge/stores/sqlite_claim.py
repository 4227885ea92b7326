"""A batch claim made where the embedded SQLite index keeps the messages: the SQLite
store's :meth:`~iqbridge.stores.sqlite.SqliteStore.claim_ready`.

The client looked the claim up in the transition table once
(:func:`iqbridge.engine_batch.claim_plan`); here, in one transaction, the subscriber's
ready rows are read in claim order (priority, then put order) with their messages'
compact columns, each message on the claim's common path has its member moved as the
plan says (the ``members`` column's rows, as
:func:`~iqbridge.stores.codec.members_to_json` writes them), its row written back with
its version bumped and its ready row deleted, and the batch's journal written per
instant, as :meth:`~iqbridge.stores.base.IndexStore.commit_writes` writes a batch's. No
record or change object per message.

A message off the common path (a pool's member, not REVEALED, a time limit, a browse
lock, a retry delay still running, no broker reference yet) is not claimed here: its
msg_id is handed back for the facade's per-message engine, which knows those rules.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from iqbridge.engine_batch import ClaimPlan
from iqbridge.stores.row_moves import Claimed, RowClaims, claim_entries_in_order
from iqbridge.stores.sqlite_commit import DELETE_READY, write_batch_journal

__all__ = ["Claimed", "claim_entries", "claim_rows"]

_SELECT = (
    "SELECT r.priority, r.seq, m.msg_id, m.version, m.members, m.publisher_state,"
    " m.max_attempts, m.native_ref, m.updated_at, m.expires_at, m.lock_id"
    " FROM iq_ready r JOIN iq_messages m ON m.seq = r.seq"
    " WHERE r.queue=? AND r.subscriber=? AND (r.not_before IS NULL OR r.not_before <= ?)"
    " AND (m.expires_at IS NULL OR m.expires_at > ?)"
    " AND (m.lock_id IS NULL OR m.lock_until <= ?)"
    " ORDER BY r.priority DESC, r.seq LIMIT ?"
)
_SELECT_IDS = (
    "SELECT priority, seq, msg_id, version, members, publisher_state, max_attempts,"
    " native_ref, updated_at, expires_at, lock_id, queue FROM iq_messages WHERE msg_id IN ({})"
)
#: Ids per IN (...) list.
_CHUNK = 500
_UPDATE = (
    "UPDATE iq_messages SET updated_at=?, version=?, members=?, journal=journal || ?,"
    " next_due=? WHERE seq=? AND version=?"
)


def claim_rows(
    conn: sqlite3.Connection,
    queue: str,
    plan: ClaimPlan,
    at: int,
    tokens: Sequence[str],
) -> tuple[list[Claimed], list[str]]:
    """Claim, inside the caller's write transaction ``conn``, up to ``len(tokens)`` of
    ``plan.subscriber``'s ready messages of ``queue`` at ``at`` (µs), in claim order,
    the n-th claim under ``tokens[n]``. Returns the claims and the msg_ids of the ready
    messages read but off the common path (for the per-message engine)."""
    rows = conn.execute(_SELECT, (queue, plan.subscriber, at, at, at, len(tokens))).fetchall()
    batch = _Batch(queue, plan, at)
    claimed: list[Claimed] = []
    off: list[str] = []
    for row in rows:
        got = batch.claim(row, row[_NATIVE_REF], tokens[len(claimed)])
        if got is None:
            off.append(row[_MSG_ID])
        else:
            claimed.append(got)
    batch.write(conn)
    return claimed, off


def claim_entries(
    conn: sqlite3.Connection,
    queue: str,
    plan: ClaimPlan,
    at: int,
    entries: Sequence[tuple[str, str, str]],
    tokens: Sequence[str],
) -> list[Claimed | None]:
    """Claim, inside the caller's write transaction ``conn``, the messages of broker
    entries ``plan.subscriber``'s own consumer group delivered: ``entries`` are
    (msg_id, broker reference, ordering key), in the order the broker delivered them;
    the n-th claim is made under ``tokens[n]``. Returns, per entry, its claim, or None
    for an entry off the common path (no record, another queue's, a second entry of
    one message, another broker reference than the index's, and everything
    :func:`claim_rows` leaves to the per-message engine), and for every later entry
    of an ordering key one was None for (the per-message path decides those in
    order)."""
    ids = list(dict.fromkeys(msg_id for msg_id, _, _ in entries))
    rows: dict[str, Sequence[Any]] = {}
    for i in range(0, len(ids), _CHUNK):
        part = ids[i : i + _CHUNK]
        for row in conn.execute(_SELECT_IDS.format(",".join("?" * len(part))), part):
            rows[row[_MSG_ID]] = row
    batch = _Batch(queue, plan, at)

    def claim(msg_id: str, ref: str, token: str) -> Claimed | None:
        row = rows.get(msg_id)
        if row is None or row[_QUEUE] != queue or row[_NATIVE_REF] != ref:
            return None
        return batch.claim(row, ref, token)

    out = claim_entries_in_order(entries, tokens, claim)
    batch.write(conn)
    return out


# Positions in the rows both selects read.
_MSG_ID, _NATIVE_REF, _QUEUE = 2, 7, 11


class _Batch:
    """The claims of one batch, decided row by row (:class:`RowClaims`), written at the
    end in one statement per table and one journal row per instant."""

    __slots__ = ("claims", "queue", "ready", "updates")

    def __init__(self, queue: str, plan: ClaimPlan, at: int) -> None:
        self.queue = queue
        self.claims = RowClaims(plan, at)
        self.updates: list[list[Any]] = []
        self.ready: list[tuple[Any, ...]] = []

    def claim(self, row: Sequence[Any], ref: str | None, token: str) -> Claimed | None:
        """The claim of one message row under ``token``, or None when it is off the
        common path (nothing is written for it)."""
        priority, seq, msg_id, version, members, ps, most, _, updated, expires, lock = row[:11]
        ms: list[list[Any]] = orjson.loads(members)
        off = expires is not None or lock is not None
        got = self.claims.claim(msg_id, ms, ps, updated, off, ref, most, token)
        if got is None:
            return None
        claimed, _, stamp, due = got
        self.updates.append(
            [stamp, version + 1, orjson.dumps(ms).decode(), msg_id, due, seq, version]
        )
        self.ready.append((self.queue, self.claims.plan.subscriber, priority, seq))
        return claimed

    def write(self, conn: sqlite3.Connection) -> None:
        """Write the batch's claims: message rows, ready rows, journal."""
        if not self.updates:
            return
        where = write_batch_journal(conn, self.queue, self.claims.journal())
        for u in self.updates:
            u[3] = "," + where[u[3]]
        conn.executemany(_UPDATE, self.updates)
        conn.executemany(DELETE_READY, self.ready)
