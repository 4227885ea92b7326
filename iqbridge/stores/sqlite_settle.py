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
from iqbridge.stores.row_moves import RowSettles
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
    rows: dict[str, tuple[Any, ...]] = {}
    ids = list(dict.fromkeys(msg_id for msg_id, _ in held))
    for i in range(0, len(ids), _CHUNK):
        chunk = ids[i : i + _CHUNK]
        sql = _SELECT.format(marks=",".join("?" * len(chunk)))
        rows.update((row[0], row) for row in conn.execute(sql, chunk))
    settles = RowSettles(plan, at)
    flags: list[bool] = []
    updates: list[list[Any]] = []
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
        got = settles.settle(msg_id, ms, ps, publisher, updated, token)
        if got is None:
            flags.append(False)
            continue
        updates.append(
            [
                got.publisher_state,
                got.stamp,
                version + 1,
                orjson.dumps(ms).decode(),
                msg_id,  # replaced by the journal rows below
                got.due,
                seq,
                version,
            ]
        )
        flags.append(True)
    if updates:
        where = write_batch_journal(conn, queue, settles.journal())
        for u in updates:
            u[4] = "," + where[u[4]]
        conn.executemany(_UPDATE, updates)
    return flags
