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
from typing import Any, NamedTuple

import orjson

from iqbridge.engine_batch import ClaimPlan
from iqbridge.stores.codec import (
    ROW_ATTEMPT,
    ROW_NAME,
    ROW_NOT_BEFORE,
    ROW_OWNER,
    ROW_POOL,
    ROW_STATE,
    ROW_TOKEN,
    ROW_UNTIL,
    ROW_UPDATED,
    leases_due,
)
from iqbridge.stores.sqlite_commit import DELETE_READY, write_batch_journal

__all__ = ["Claimed", "claim_rows"]

_SELECT = (
    "SELECT r.priority, r.seq, m.msg_id, m.version, m.members, m.publisher_state,"
    " m.max_attempts, m.native_ref, m.updated_at, m.expires_at, m.lock_id"
    " FROM iq_ready r JOIN iq_messages m ON m.seq = r.seq"
    " WHERE r.queue=? AND r.subscriber=? AND (r.not_before IS NULL OR r.not_before <= ?)"
    " AND (m.expires_at IS NULL OR m.expires_at > ?)"
    " AND (m.lock_id IS NULL OR m.lock_until <= ?)"
    " ORDER BY r.priority DESC, r.seq LIMIT ?"
)
_UPDATE = (
    "UPDATE iq_messages SET updated_at=?, version=?, members=?, journal=journal || ?,"
    " next_due=? WHERE seq=? AND version=?"
)


class Claimed(NamedTuple):
    """One message claimed where it is kept: its msg_id, broker reference, the member's
    attempt, the message's max attempts and the claim's lease token."""

    msg_id: str
    native_ref: str
    attempt: int
    max_attempts: int
    token: str


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
    sub = plan.subscriber
    src, dst, revealed = plan.src.value, plan.dst.value, plan.revealed.value
    rows = conn.execute(_SELECT, (queue, sub, at, at, at, len(tokens))).fetchall()
    claimed: list[Claimed] = []
    off: list[str] = []
    updates: list[list[Any]] = []
    ready: list[tuple[Any, ...]] = []
    # instant -> [msg_id, attempt] of every claim made then
    groups: dict[int, list[list[Any]]] = {}
    for priority, seq, msg_id, version, members, ps, most, ref, updated, expires, lock in rows:
        ms: list[list[Any]] = orjson.loads(members)
        mine = next((m for m in ms if m[ROW_NAME] == sub), None)
        if (
            mine is None
            or mine[ROW_POOL] is not None
            or mine[ROW_STATE] != src
            or ps != revealed
            or expires is not None
            or lock is not None
            or ref is None
            or (mine[ROW_NOT_BEFORE] is not None and at < mine[ROW_NOT_BEFORE])
        ):
            off.append(msg_id)
            continue
        token = tokens[len(claimed)]
        stamp = at if at >= updated else updated
        mine[ROW_STATE] = dst
        mine[ROW_TOKEN] = token
        mine[ROW_OWNER] = plan.owner
        mine[ROW_UNTIL] = plan.lease_until
        mine[ROW_NOT_BEFORE] = None
        mine[ROW_UPDATED] = stamp
        due = leases_due(ms)
        groups.setdefault(stamp, []).append([msg_id, mine[ROW_ATTEMPT]])
        updates.append([stamp, version + 1, orjson.dumps(ms).decode(), msg_id, due, seq, version])
        ready.append((queue, sub, priority, seq))
        claimed.append(Claimed(msg_id, ref, mine[ROW_ATTEMPT], most, token))
    if updates:
        where = write_batch_journal(
            conn, queue, ((stamp, plan.steps, items) for stamp, items in groups.items())
        )
        for u in updates:
            u[3] = "," + where[u[3]]
        conn.executemany(_UPDATE, updates)
        conn.executemany(DELETE_READY, ready)
    return claimed, off
