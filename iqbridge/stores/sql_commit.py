"""The write path of the SQL index store (:mod:`iqbridge.stores.sql`): one change,
an all-or-nothing batch (:meth:`~SqlCommits.commit_many`), the batch that writes what
still holds (:meth:`~SqlCommits.commit_each`: the batch's rows locked with one
``SELECT ... FOR UPDATE``), inserts of new messages with their members, journal rows and
retained payload copies, and native refs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from iqbridge.engine import Change
from iqbridge.errors import ConcurrentUpdate
from iqbridge.model import MessageRecord, Retained
from iqbridge.stores.base import StaleRecord
from iqbridge.stores.codec import encode
from iqbridge.stores.sql_base import SqlStoreBase
from iqbridge.stores.sql_rows import _CHUNK, _cas_row, _member_rows, _message_row

__all__ = ["SqlCommits"]

#: Tries of a commit_each whose transaction the database rolled back (deadlock).
_EACH_ATTEMPTS = 3

T = TypeVar("T")


class SqlCommits(SqlStoreBase):
    """Commits and native refs of :class:`~iqbridge.stores.sql.SqlStore`."""

    # --- commit ----------------------------------------------------------------------------

    def commit(self, change: Change) -> None:
        """Persist one change with compare-and-set (see :mod:`iqbridge.stores.sql`)."""
        self.commit_many((change,))

    def commit_many(self, changes: Sequence[Change]) -> None:
        """Persist several changes in one transaction, all or none."""
        if not changes:
            return
        creates = [c for c in changes if c.created]
        updates = [c for c in changes if not c.created]
        try:
            with self._writing(savepoint=bool(creates) or len(changes) > 1) as conn:
                if creates:
                    self._insert(conn, creates)
                members: list[dict[str, Any]] = []
                for change in updates:
                    result = conn.execute(self._cas, _cas_row(change))
                    if result.rowcount != 1:
                        raise StaleRecord(change.msg_id)
                    members += _member_rows(change)
                if members:
                    conn.execute(self._member_update, members)
                self._append_journal(conn, changes)
        except sa.exc.IntegrityError:
            raise StaleRecord(creates[0].msg_id if creates else changes[0].msg_id) from None
        except sa.exc.SQLAlchemyError as exc:
            raise self._translate(exc, changes[0].msg_id) from None

    def commit_each(self, changes: Sequence[Change]) -> list[bool]:
        """Persist, in one transaction, every change whose compare-and-set holds (a new
        message: whose msg_id is not taken); skip the others, and later changes of a
        message already in the batch. One flag per change: applied or not.

        The batch's message rows are read and locked with one ``SELECT ... FOR UPDATE``;
        the changes whose version matches are written with one statement per table. A
        transaction the database rolls back (a deadlock) is tried again, twice at most;
        inside an enclosing transaction that is lost too, ConcurrentUpdate is raised.
        """
        if not changes:
            return []
        seqs = [c.record.seq for c in changes]

        def run(conn: Connection) -> list[bool]:
            for change, seq in zip(changes, seqs, strict=True):
                change.record.seq = seq  # as it was before a try that was rolled back
            return self._commit_each(conn, changes)

        return self._retrying(run, changes[0].msg_id)

    def _retrying(self, run: Callable[[Connection], T], first: str) -> T:
        """``run`` in one transaction (a savepoint inside the caller's); one the database
        rolls back (a deadlock), or whose rows changed under its lock (StaleRecord), is
        tried again, twice at most; inside an enclosing transaction that is lost too,
        ConcurrentUpdate is raised (naming ``first``)."""
        for _ in range(_EACH_ATTEMPTS):
            try:
                with self._writing(savepoint=True) as conn:
                    return run(conn)
            except StaleRecord:
                pass  # rows changed under the lock (not expected): all was rolled back
            except sa.exc.SQLAlchemyError as exc:
                err = self._translate(exc, first)
                if not isinstance(err, StaleRecord):
                    raise err from None
        raise ConcurrentUpdate(first, _EACH_ATTEMPTS)

    def _commit_each(self, conn: Connection, changes: Sequence[Change]) -> list[bool]:
        first: dict[str, int] = {}
        for i, change in enumerate(changes):
            first.setdefault(change.msg_id, i)
        ids = sorted(first)
        stored: dict[str, int] = {}
        for i in range(0, len(ids), _CHUNK):
            for mid, version in conn.execute(self._versions, {"ids": ids[i : i + _CHUNK]}):
                stored[mid] = int(version)
        applied = [False] * len(changes)
        creates: list[int] = []
        updates: list[int] = []
        for i in sorted(first.values()):  # batch order: new messages get seqs in it
            change = changes[i]
            if change.created:
                if change.msg_id not in stored:
                    creates.append(i)
            elif stored.get(change.msg_id) == change.expected_version:
                updates.append(i)
        for i in self._insert_absent(conn, [changes[i] for i in creates], creates):
            applied[i] = True
        if updates:
            # The rows are locked at the versions read, so every update matches.
            result = conn.execute(self._cas, [_cas_row(changes[i]) for i in updates])
            if conn.dialect.supports_sane_multi_rowcount and result.rowcount != len(updates):
                raise StaleRecord(changes[updates[0]].msg_id)
            members = [row for i in updates for row in _member_rows(changes[i])]
            if members:
                conn.execute(self._member_update, members)
            for i in updates:
                applied[i] = True
        self._append_journal(conn, [c for c, ok in zip(changes, applied, strict=True) if ok])
        return applied

    def _insert_absent(
        self, conn: Connection, creates: list[Change], where: list[int]
    ) -> list[int]:
        """Insert new messages not in the table when it was read; return the positions
        (``where``) of those inserted. A concurrent put of one of them (not visible to
        the read) makes the batch insert fail in its savepoint; then they go one by one,
        each in a savepoint, and the taken ones are left out."""
        if not creates:
            return []
        try:
            with conn.begin_nested():
                self._insert(conn, creates)
            return where
        except sa.exc.IntegrityError:
            pass
        done: list[int] = []
        for change, i in zip(creates, where, strict=True):
            try:
                with conn.begin_nested():
                    self._insert(conn, [change])
            except sa.exc.IntegrityError:
                change.record.seq = None  # in case it was set before the failure
                continue
            done.append(i)
        return done

    def _append_journal(self, conn: Connection, changes: Sequence[Change]) -> None:
        journal = [
            {
                "msg_id": e.msg_id,
                "queue": e.queue,
                "actor": e.actor,
                "actor_kind": e.actor_kind.value,
                "src": e.src,
                "dst": e.dst,
                "at": e.at,
                "attempt": e.attempt,
                "detail": e.detail,
            }
            for c in changes
            for e in c.journal
        ]
        if journal:
            conn.execute(self.tables.journal.insert(), journal)

    def _insert(self, conn: Connection, creates: list[Change]) -> None:
        self._insert_records(conn, [c.record for c in creates], [c.retain for c in creates])

    def _insert_records(
        self, conn: Connection, recs: list[MessageRecord], keep: Sequence[Retained | None]
    ) -> None:
        """Insert new records (assigning their seq), their member rows and the retained
        payload copies of ``keep`` (one per record, or None)."""
        rows = [_message_row(rec) for rec in recs]
        msg = self.tables.messages
        if len(rows) == 1:
            result = conn.execute(msg.insert(), rows[0])
            key = result.inserted_primary_key
            recs[0].seq = int(key[0]) if key is not None else None
        else:
            conn.execute(msg.insert(), rows)
        if any(rec.seq is None for rec in recs) or len(rows) > 1:
            seqs: dict[str, int] = {}
            ids = [rec.msg_id for rec in recs]
            for i in range(0, len(ids), _CHUNK):
                for mid, seq in conn.execute(self._seqs, {"ids": ids[i : i + _CHUNK]}):
                    seqs[mid] = int(seq)
            for rec in recs:
                rec.seq = seqs[rec.msg_id]
        members: list[dict[str, Any]] = []
        for rec in recs:
            for position, m in enumerate(rec.members.values()):
                members.append(
                    {
                        "msg_id": rec.msg_id,
                        "subscriber": m.subscriber,
                        "position": position,
                        "queue": rec.queue,
                        "seq": rec.seq,
                        "neg_priority": -rec.priority,
                        "pool": m.pool,
                        "state": m.state,
                        "outcome": m.outcome,
                        "attempt": m.attempt,
                        "lease_token": m.lease_token,
                        "lease_owner": m.lease_owner,
                        "lease_until": m.lease_until,
                        "not_before": m.not_before,
                        "reason": m.reason,
                        "updated_at": m.updated_at,
                    }
                )
        conn.execute(self.tables.members.insert(), members)
        self._insert_payloads(conn, recs, keep)

    def _insert_payloads(
        self, conn: Connection, recs: list[MessageRecord], keep: Sequence[Retained | None]
    ) -> None:
        payloads = [
            {
                "msg_id": rec.msg_id,
                "body": bytes(kept.body),
                "headers": encode(dict(kept.headers)),
            }
            for rec, kept in zip(recs, keep, strict=True)
            if kept is not None
        ]
        if payloads:
            conn.execute(self.tables.payloads.insert(), payloads)

    # --- native refs -----------------------------------------------------------------------

    def set_native_refs(self, refs: Sequence[tuple[str, str]]) -> None:
        """Record where several payloads live, in one transaction (one statement);
        unknown ids are skipped."""
        if not refs:
            return
        rows = [{"b_msg_id": msg_id, "b_ref": ref} for msg_id, ref in refs]
        try:
            with self._writing(savepoint=len(rows) > 1) as conn:
                conn.execute(self._set_ref, rows)
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from None

    def set_native_ref(self, msg_id: str, native_ref: str) -> None:
        """Record where the payload lives (not a state change: the version stays)."""
        msg = self.tables.messages
        try:
            with self._writing(savepoint=False) as conn:
                conn.execute(
                    msg.update().where(msg.c.msg_id == msg_id).values(native_ref=native_ref)
                )
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from None
