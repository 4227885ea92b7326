"""A batch's done (or in process) settled where the embedded SQLite index keeps it:
the SQLite store's :meth:`~iqbridge.stores.sqlite.SqliteStore.settle_held`.

The client looked the moves up in the transition table once for the batch
(:func:`iqbridge.engine_batch.settle_plan`); here each message's row is read, its
member compared (state and lease token) and moved as the plan says, its publisher
journalled once every member is, and the row written back with its version bumped, in
one transaction: no record or change object per message, only the members' compact rows
(the ``members`` column, ``[subscriber, pool, state, outcome, attempt, lease_token,
lease_owner, lease_until, not_before, reason, updated_at]`` each, as
:func:`~iqbridge.stores.codec.members_to_json` writes them). The journal is written per
group of messages that made the same steps at the same instant, as
:meth:`~iqbridge.stores.base.IndexStore.commit_writes` writes a batch's.

A message off the common path (its member in a state the plan does not move, held under
another token, a time limit or a browse lock on it, another queue's, gone) is left as it
is and reported, for the per-message engine to decide (and raise the right error), as
``stores/lua/settle.lua`` does on Redis.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from iqbridge.engine_batch import SettlePlan
from iqbridge.states import SubscriberState
from iqbridge.stores.codec import (
    ROW_ATTEMPT,
    ROW_NAME,
    ROW_OUTCOME,
    ROW_STATE,
    ROW_TOKEN,
    ROW_UNTIL,
    ROW_UPDATED,
    leases_due,
)
from iqbridge.stores.sqlite_commit import write_batch_journal

__all__ = ["settle_rows"]

_SELECT = (
    "SELECT msg_id, seq, queue, version, members, publisher_state, publisher, updated_at,"
    " expires_at, lock_id FROM iq_messages WHERE msg_id IN ({marks})"
)
_UPDATE = (
    "UPDATE iq_messages SET publisher_state=?, updated_at=?, version=?, members=?,"
    " journal=journal || ?, next_due=? WHERE seq=? AND version=?"
)
_CHUNK = 500
_DONE = SubscriberState.DONE.value
_JOURNALLED = SubscriberState.JOURNALLED.value


def settle_rows(
    conn: sqlite3.Connection,
    queue: str,
    plan: SettlePlan,
    at: int,
    held: Sequence[tuple[str, str]],
) -> list[bool]:
    """Settle ``held`` (msg_id, lease token) of ``plan.subscriber`` in ``queue`` by
    ``plan`` at ``at`` (µs), inside the caller's write transaction ``conn``. One flag per
    message, in order: moved, or left as it was (off the common path; a msg_id repeated
    is moved once)."""
    sub = plan.subscriber
    moves = {
        src.value: (dst.value, last.value if last is not None else None, steps)
        for src, (dst, last, steps) in plan.moves.items()
    }
    pubs = {src.value: (dst.value, step) for src, (dst, step) in plan.publisher.items()}
    rows: dict[str, tuple[Any, ...]] = {}
    ids = list(dict.fromkeys(msg_id for msg_id, _ in held))
    for i in range(0, len(ids), _CHUNK):
        chunk = ids[i : i + _CHUNK]
        sql = _SELECT.format(marks=",".join("?" * len(chunk)))
        rows.update((row[0], row) for row in conn.execute(sql, chunk))
    flags: list[bool] = []
    updates: list[list[Any]] = []
    # (instant, state left, publisher moved from, publisher) -> the group's journal
    groups: dict[tuple[Any, ...], tuple[list[list[Any]], list[list[Any]]]] = {}
    for msg_id, token in held:
        row = rows.pop(msg_id, None)  # popped: a msg_id repeated is moved once
        if row is None:
            flags.append(False)
            continue
        _, seq, q, version, members, ps, publisher, updated, expires, lock = row
        if q != queue or expires is not None or lock is not None:
            flags.append(False)
            continue
        ms: list[list[Any]] = orjson.loads(members)
        mine = next((m for m in ms if m[ROW_NAME] == sub), None)
        move = moves.get(mine[ROW_STATE]) if mine is not None else None
        if mine is None or move is None or mine[ROW_TOKEN] != token:
            flags.append(False)
            continue
        dst, last, steps = move
        stamp = at if at >= updated else updated
        src = mine[ROW_STATE]
        mine[ROW_STATE] = dst
        if dst == _DONE:
            mine[ROW_UNTIL] = None
            if last is not None:
                mine[ROW_STATE] = last
                mine[ROW_OUTCOME] = dst
        mine[ROW_UPDATED] = stamp
        pub = pubs.get(ps) if last == _JOURNALLED else None
        if pub is not None and any(m[ROW_STATE] != _JOURNALLED for m in ms):
            pub = None
        due = leases_due(ms)
        key = (stamp, src, ps if pub is not None else None, publisher if pub else None)
        group = groups.get(key)
        if group is None:
            journal = list(steps)
            if pub is not None:
                journal.append([publisher, *pub[1]])
            group = groups[key] = (journal, [])
        group[1].append([msg_id, mine[ROW_ATTEMPT]])
        updates.append(
            [
                pub[0] if pub is not None else ps,
                stamp,
                version + 1,
                orjson.dumps(ms).decode(),
                msg_id,  # replaced by the journal rows below
                due,
                seq,
                version,
            ]
        )
        flags.append(True)
    if updates:
        where = write_batch_journal(
            conn, queue, ((key[0], journal, items) for key, (journal, items) in groups.items())
        )
        for u in updates:
            u[4] = "," + where[u[4]]
        conn.executemany(_UPDATE, updates)
    return flags
