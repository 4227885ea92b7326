"""Batches moved where the SQL index keeps the messages, without records: the SQL store's
:meth:`~SqlClaims.claim_ready`, :meth:`~SqlClaims.claim_received` and
:meth:`~SqlClaims.settle_held` (:class:`~iqbridge.stores.base.ClaimsReady`,
:class:`~iqbridge.stores.base.ClaimsReceived`, :class:`~iqbridge.stores.base.SettlesHeld`).

The client looked the moves up in the transition table once for the batch
(:func:`iqbridge.engine_batch.claim_plan`, :func:`~iqbridge.engine_batch.settle_plan`).
Here, in one transaction:

1. The batch's message rows are locked in msg_id order, as every batch write of this
   store locks them (two batches sharing rows wait for each other instead of
   deadlocking), and read with their member rows, compact columns only: one
   ``SELECT ... FOR UPDATE`` (a claim of ready messages first reads its candidates in
   claim order, unlocked, as :meth:`claimable` does).
2. Each message is decided on its rows (:mod:`iqbridge.stores.row_moves`, the rules the
   SQLite store applies too): on the common path the subscriber's member row moves as
   the plan says, and the message row gets its version bumped and its next due time;
   off it, nothing is written and the message is handed back for the per-message engine.
3. The moved rows are written with the statements of a batch's moves
   (:meth:`~iqbridge.stores.sql_writes.SqlWrites._move_rows`: on PostgreSQL one
   statement with the journal in it, on MariaDB one per table and the journal as one
   multi-row insert, elsewhere ``executemany``), the compare-and-set on the version
   inside them again; the journal one row per message per transition, from one template
   per group of messages that made the same steps at the same instant.

No record, change or journal-entry object is made per message.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from iqbridge.engine_batch import ClaimPlan, SettlePlan
from iqbridge.stores.codec import encode
from iqbridge.stores.row_moves import (
    Claimed,
    Journal,
    RowClaims,
    RowSettles,
    as_steps,
    claim_entries_in_order,
)
from iqbridge.stores.sql_rows import _CHUNK
from iqbridge.stores.sql_statements import LOCK_HEAD, LOCK_MEMBER
from iqbridge.stores.sql_writes import _NO_JOURNAL, SqlWrites, _journal
from iqbridge.writes import Writes

__all__ = ["SqlClaims"]


#: The message columns read for a move in place, then every member column.
_HEAD, _MEMBER = LOCK_HEAD, LOCK_MEMBER
_N = len(_HEAD)
(_ID, _QUEUE, _VERSION, _PUBLISHER, _PS, _WITHDRAWN, _MOST, _REF, _UPDATED) = range(9)
_EXPIRES, _LOCK, _PRIORITY, _SEQ = 9, 10, 11, 12

#: One locked message: its compact columns and its member rows (mutable, moved in place).
Locked = tuple[Sequence[Any], list[list[Any]]]


class SqlClaims(SqlWrites):
    """Claims and settles of a batch made where the SQL index keeps the messages (see the
    module docstring)."""

    _compact: sa.Select[Any] | None = None

    def claim_ready(
        self, queue: str, plan: ClaimPlan, at: int, tokens: Sequence[str]
    ) -> tuple[list[Claimed], list[str]]:
        """Claim ready messages of one subscriber where they are kept, one transaction
        for the batch (see :class:`~iqbridge.stores.base.ClaimsReady`). A candidate
        another consumer claimed between the read and the lock is handed back with those
        off the common path: the per-message engine finds it taken and reads on."""
        params = {"q": queue, "s": plan.subscriber, "now": at, "lim": len(tokens)}

        def run(conn: Connection) -> tuple[list[Claimed], list[str]]:
            ids = [r[0] for r in conn.execute(self._claim, params)]
            if not ids:
                return [], []
            found = self._lock_rows(conn, ids)
            order = sorted(found.values(), key=lambda f: (-f[0][_PRIORITY], f[0][_SEQ]))
            claims = RowClaims(plan, at)
            moved: list[tuple[Locked, int, int | None]] = []
            claimed: list[Claimed] = []
            off: list[str] = []
            for head, members in order:
                got = self._claim_one(
                    claims, queue, head, members, head[_REF], tokens[len(claimed)]
                )
                if got is None:
                    off.append(head[_ID])
                    continue
                claimed.append(got[0])
                moved.append(((head, members), got[1], got[2]))
            self._write(conn, queue, plan.subscriber, moved, claims.journal())
            return claimed, off

        return self._retrying(run, "(claim)")

    def claim_received(
        self,
        queue: str,
        plan: ClaimPlan,
        at: int,
        entries: Sequence[tuple[str, str, str]],
        tokens: Sequence[str],
    ) -> list[Claimed | None]:
        """Claim the messages of a consumer group's broker entries where they are kept,
        one transaction for the batch (see
        :class:`~iqbridge.stores.base.ClaimsReceived`): an entry off the common path,
        and every later entry of its ordering key, is None, for the per-message path."""
        if not entries:
            return []

        def run(conn: Connection) -> list[Claimed | None]:
            found = self._lock_rows(conn, [msg_id for msg_id, _, _ in entries])
            claims = RowClaims(plan, at)
            moved: list[tuple[Locked, int, int | None]] = []

            def claim(msg_id: str, ref: str, token: str) -> Claimed | None:
                locked = found.get(msg_id)
                if locked is None or locked[0][_REF] != ref:
                    return None
                got = self._claim_one(claims, queue, *locked, ref, token)
                if got is None:
                    return None
                moved.append((locked, got[1], got[2]))
                return got[0]

            out = claim_entries_in_order(entries, tokens, claim)
            self._write(conn, queue, plan.subscriber, moved, claims.journal())
            return out

        return self._retrying(run, entries[0][0])

    def settle_held(
        self, queue: str, plan: SettlePlan, at: int, held: Sequence[tuple[str, str]]
    ) -> list[bool]:
        """Settle held messages of one subscriber where they are kept, one transaction
        for the batch (see :class:`~iqbridge.stores.base.SettlesHeld`): one flag per
        message, moved or left for the per-message engine (a msg_id repeated moves once)."""
        if not held:
            return []

        def run(conn: Connection) -> list[bool]:
            found = self._lock_rows(conn, [msg_id for msg_id, _ in held])
            settles = RowSettles(plan, at)
            moved: list[tuple[Locked, int, int | None]] = []
            flags: list[bool] = []
            for msg_id, token in held:
                locked = found.pop(msg_id, None)  # popped: a msg_id repeated moves once
                got = None
                if locked is not None:
                    head, members = locked
                    if head[_QUEUE] == queue and head[_EXPIRES] is None and head[_LOCK] is None:
                        got = settles.settle(
                            msg_id, members, head[_PS], head[_PUBLISHER], head[_UPDATED], token
                        )
                if got is None:
                    flags.append(False)
                    continue
                assert locked is not None
                moved.append(
                    ((_with_state(locked[0], got.publisher_state), locked[1]), got.stamp, got.due)
                )
                flags.append(True)
            self._write(conn, queue, plan.subscriber, moved, settles.journal())
            return flags

        return self._retrying(run, held[0][0])

    # --- the parts -------------------------------------------------------------------------

    @staticmethod
    def _claim_one(
        claims: RowClaims,
        queue: str,
        head: Sequence[Any],
        members: list[list[Any]],
        ref: str | None,
        token: str,
    ) -> tuple[Claimed, int, int | None] | None:
        """One message's claim (another queue's, with a time limit or a browse lock: off
        the common path): the claim, its instant and the message's next due time."""
        if head[_QUEUE] != queue:
            return None
        off = head[_EXPIRES] is not None or head[_LOCK] is not None
        got = claims.claim(
            head[_ID], members, head[_PS], head[_UPDATED], off, ref, head[_MOST], token
        )
        if got is None:
            return None
        claimed, _, stamp, due = got
        return claimed, stamp, due

    def _lock_rows(self, conn: Connection, ids: Sequence[str]) -> dict[str, Locked]:
        """Lock the message rows of ``ids`` in msg_id order and read them with their
        member rows: by msg_id, the compact columns and the member rows. (PostgreSQL:
        each message, then each message's members, looked up by key, the ids as one JSON
        array; elsewhere one ``SELECT ... FOR UPDATE`` of the join, which locks and reads
        again both.)

        Every writer of a member row holds its message row's lock (a batch write locks
        the messages first, a single change updates the message row first), so once the
        messages are locked their members are what the last writer committed."""
        found: dict[str, Locked] = {}
        sql = self._sql()
        if "lock_read" in sql:
            doc = {"ids": encode(sorted(set(ids)))}
            heads = {row[0]: row for row in conn.execute(sql["lock_read"], doc)}
            for row in conn.execute(sql["member_read"], doc):
                head = heads.get(row[0])
                if head is not None:
                    got = found.get(row[0])
                    if got is None:
                        found[row[0]] = (head, [list(row[1:])])
                    else:
                        got[1].append(list(row[1:]))
            return found
        stmt = self._compact
        if stmt is None:
            msg, mem = self.tables.messages, self.tables.members
            stmt = self._compact = (
                sa.select(*(msg.c[n] for n in _HEAD), *(mem.c[n] for n in _MEMBER))
                .select_from(msg.join(mem, mem.c.msg_id == msg.c.msg_id))
                .where(msg.c.msg_id.in_(sa.bindparam("ids", expanding=True)))
                .order_by(msg.c.msg_id, mem.c.position)
                .with_for_update()
            )
        unique = sorted(set(ids))
        for i in range(0, len(unique), _CHUNK):
            self._gather(found, conn.execute(stmt, {"ids": unique[i : i + _CHUNK]}))
        return found

    @staticmethod
    def _gather(found: dict[str, Locked], rows: Iterable[Sequence[Any]]) -> None:
        """Rows of messages joined to members, gathered by msg_id into ``found``."""
        for row in rows:
            got = found.get(row[0])
            if got is None:
                found[row[0]] = (row[:_N], [list(row[_N:])])
            else:
                got[1].append(list(row[_N:]))

    def _write(
        self,
        conn: Connection,
        queue: str,
        subscriber: str,
        moved: Sequence[tuple[Locked, int, int | None]],
        journal: Journal,
    ) -> None:
        """Write the moved messages (``((head, members), instant, next due)``): message
        rows with their version bumped, the subscriber's member rows, the journal."""
        if not moved:
            return
        msg_rows = []
        mem_rows = []
        for (head, members), stamp, due in moved:
            msg_id = head[_ID]
            msg_rows.append(
                (
                    msg_id,
                    head[_VERSION],
                    head[_PS],
                    head[_WITHDRAWN],
                    stamp,
                    None,  # no browse lock: a locked message is off the common path
                    None,
                    None,
                    head[_VERSION] + 1,
                    due,
                )
            )
            mine = next(m for m in members if m[0] == subscriber)
            mem_rows.append((msg_id, mine[0], *mine[2:]))
        writes = Writes(queue, journal=as_steps(journal))
        ok = {row[0] for row in msg_rows}
        fold = self.options.family == "postgresql"
        self._move_rows(
            conn, msg_rows, mem_rows, _journal(writes, ok, True) if fold else _NO_JOURNAL
        )
        if not fold:
            self._journal_batch(conn, writes, ok)


def _with_state(head: Sequence[Any], publisher_state: str) -> Sequence[Any]:
    """``head`` with the publisher state a settle moved it to."""
    if head[_PS] == publisher_state:
        return head
    out = list(head)
    out[_PS] = publisher_state
    return out
