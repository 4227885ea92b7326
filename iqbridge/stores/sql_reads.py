"""The reads of the SQL index store (:mod:`iqbridge.stores.sql`): records (locked for
update on a joined connection), retained payload copies, the claim order, due work,
histories, the journal and search on index fields."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from iqbridge.errors import MessageNotFound
from iqbridge.model import (
    Filter,
    JournalEntry,
    MessageRecord,
    MessageSummary,
    QueueCounts,
    Retained,
    to_micros,
)
from iqbridge.states import PublisherState, SubscriberState
from iqbridge.stores.codec import counted, summary
from iqbridge.stores.sql_base import SqlStoreBase
from iqbridge.stores.sql_rows import _CHUNK, _KIND, _MEMBER_COLS, _MSG_COLS, _record

__all__ = ["SqlReads"]


class SqlReads(SqlStoreBase):
    """Reads of :class:`~iqbridge.stores.sql.SqlStore`."""

    # --- reads -----------------------------------------------------------------------------

    def load(self, msg_id: str) -> MessageRecord:
        """The current record of a message (locked for update on a joined connection)."""
        external = getattr(self._local, "external", False)
        try:
            with self._reading() as conn:
                rows = conn.execute(
                    self._load_locked if external else self._load, {"msg_id": msg_id}
                ).all()
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from None
        if not rows:
            raise MessageNotFound(msg_id)
        return _record(rows)

    def load_many(self, msg_ids: Sequence[str]) -> dict[str, MessageRecord]:
        """The current records of the known ones of ``msg_ids``, by msg_id (locked for
        update on a joined connection)."""
        stmt = self._load_many_locked if getattr(self._local, "external", False) else None
        ids = list(dict.fromkeys(msg_ids))
        out: dict[str, MessageRecord] = {}
        try:
            with self._reading() as conn:
                for i in range(0, len(ids), _CHUNK):
                    rows = conn.execute(
                        stmt if stmt is not None else self._load_many, {"ids": ids[i : i + _CHUNK]}
                    ).all()
                    for mid, group in itertools.groupby(rows, key=lambda r: r[1]):
                        out[mid] = _record(list(group))
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from None
        return out

    def retained(self, msg_ids: Sequence[str]) -> dict[str, Retained]:
        """The retained payload copies of those of ``msg_ids`` that have one."""
        ids = list(dict.fromkeys(msg_ids))
        out: dict[str, Retained] = {}
        try:
            with self._reading() as conn:
                for i in range(0, len(ids), _CHUNK):
                    for mid, body, headers in conn.execute(
                        self._retained, {"ids": ids[i : i + _CHUNK]}
                    ):
                        out[mid] = Retained(bytes(body or b""), json.loads(headers))
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from None
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
        params: dict[str, Any] = {"q": queue, "s": subscriber, "now": now, "lim": limit}
        if lock_id is not None:
            stmt = self._claim_locked
            params["lock"] = lock_id
        elif min_attempt > 1:
            stmt = self._redeliver
            params["att"] = min_attempt
        else:
            stmt = self._claim
        try:
            with self._reading() as conn:
                return [r[0] for r in conn.execute(stmt, params)]
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from None

    def _ids(self, stmt: sa.Select[Any]) -> list[str]:
        try:
            with self._reading() as conn:
                return [r[0] for r in conn.execute(stmt)]
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from None

    def due(self, queue: str | None, now: int, limit: int) -> list[str]:
        """Ids with a lapsed lease, time limit or browse lock."""
        msg = self.tables.messages
        stmt = sa.select(msg.c.msg_id).where(msg.c.next_due <= now)
        if queue:
            stmt = stmt.where(msg.c.queue == queue)
        return self._ids(stmt.order_by(msg.c.next_due).limit(limit))

    def history(self, msg_id: str) -> list[JournalEntry]:
        """Every journal entry of one message, in order (kept after a purge)."""
        jr = self.tables.journal
        stmt = sa.select(*self._journal_cols).where(jr.c.msg_id == msg_id).order_by(jr.c.seq)
        out = self._entries(stmt)
        if not out:
            raise MessageNotFound(msg_id)
        return out

    def journal(self, after: int = 0, limit: int = 1000) -> list[JournalEntry]:
        """Journal entries with seq greater than ``after``, oldest first.

        Sequence numbers are handed out when a transaction writes, so a reader running
        while writers commit can see a later number before an earlier one commits;
        readers that must miss nothing re-read a short window behind their cursor.
        """
        jr = self.tables.journal
        stmt = sa.select(*self._journal_cols).where(jr.c.seq > after).order_by(jr.c.seq)
        return self._entries(stmt.limit(limit))

    def _entries(self, stmt: sa.Select[Any]) -> list[JournalEntry]:
        try:
            with self._reading() as conn:
                rows = conn.execute(stmt).all()
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from None
        return [
            JournalEntry(r[1], r[2], r[3], _KIND[r[4]], r[5], r[6], r[7], r[8], r[9], int(r[0]))
            for r in rows
        ]

    def search(self, queue: str, flt: Filter) -> list[MessageSummary]:
        """Filter on index fields only; never touches payloads."""
        msg, mem = self.tables.messages, self.tables.members
        conds: list[Any] = [msg.c.queue == queue]
        for column, value in (
            (msg.c.msg_id, flt.msg_id),
            (msg.c.correlation_id, flt.correlation_id),
            (msg.c.publisher, flt.publisher),
            (msg.c.lock_id, flt.lock_id),
        ):
            if value is not None:
                conds.append(column == value)
        if flt.priority is not None:
            lo, hi = (
                flt.priority if isinstance(flt.priority, tuple) else (flt.priority, flt.priority)
            )
            conds.append(msg.c.priority.between(lo, hi))
        if flt.since is not None:
            conds.append(msg.c.created_at >= to_micros(flt.since))
        if flt.until is not None:
            conds.append(msg.c.created_at < to_micros(flt.until))
        if flt.parent is not None:
            # parents holds a JSON array: its element is the id JSON-encoded, quotes and
            # all; LIKE's own wildcards in it are escaped.
            token = json.dumps(flt.parent)
            token = token.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            conds.append(msg.c.parents.like(f"%{token}%", escape="\\"))
        if isinstance(flt.state, PublisherState):
            conds.append(msg.c.publisher_state == flt.state.value)
        member_state = flt.state if isinstance(flt.state, SubscriberState) else None
        if flt.subscriber is not None or member_state is not None:
            sub = [mem.c.msg_id == msg.c.msg_id]
            if flt.subscriber is not None:
                sub.append(mem.c.subscriber == flt.subscriber)
            if member_state is not None:
                sub.append(mem.c.state == member_state.value)
            conds.append(sa.exists().where(*sub))
        cols = [msg.c[n] for n in _MSG_COLS]
        stmt = sa.select(*cols).where(*conds).order_by(msg.c.seq).limit(flt.limit)
        try:
            with self._reading() as conn:
                heads = conn.execute(stmt).all()
                ids = [h[1] for h in heads]
                found: dict[str, list[Any]] = {}
                mcols = [mem.c.msg_id] + [mem.c[n] for n in _MEMBER_COLS]
                for i in range(0, len(ids), _CHUNK):
                    rows = conn.execute(
                        sa.select(*mcols)
                        .where(mem.c.msg_id.in_(ids[i : i + _CHUNK]))
                        .order_by(mem.c.msg_id, mem.c.position)
                    )
                    for r in rows:
                        found.setdefault(r[0], []).append(r[1:])
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from None
        out = [summary(_record([(*h, *m) for m in found.get(h[1], ())], head=h)) for h in heads]
        if flt.parent is not None:  # exact, whatever the column's collation
            out = [s for s in out if flt.parent in s.parents]
        return out

    def counts(self, queue: str) -> QueueCounts:
        """States counted by two grouped queries (no row is read back)."""
        msg, mem = self.tables.messages, self.tables.members
        by_pub = (
            sa.select(msg.c.publisher_state, sa.func.count())
            .where(msg.c.queue == queue)
            .group_by(msg.c.publisher_state)
        )
        by_member = (
            sa.select(mem.c.subscriber, mem.c.state, sa.func.count(), sa.func.min(msg.c.created_at))
            .select_from(mem.join(msg, mem.c.msg_id == msg.c.msg_id))
            .where(mem.c.queue == queue, mem.c.state.is_not(None))
            .group_by(mem.c.subscriber, mem.c.state)
        )
        try:
            with self._reading() as conn:
                pubs = conn.execute(by_pub).all()
                members = conn.execute(by_member).all()
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from None
        return counted(queue, pubs, members)
