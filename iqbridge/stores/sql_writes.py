"""A batch's writes in the SQL index store (:mod:`iqbridge.stores.sql`):
:meth:`SqlWrites.commit_writes` of a :class:`~iqbridge.writes.Writes`.

One transaction, a fixed number of statements whatever the batch size:

1. The batch's message rows are locked with one ``SELECT ... FOR UPDATE`` in msg_id
   order (two batches sharing rows wait for each other instead of deadlocking) and their
   versions compared: a created record holds where its msg_id is free, a moved one where
   the version is still the one it was moved from.
2. The records that hold are written with one statement per transition, the
   compare-and-set inside it again (``version`` = the one moved from):

   * PostgreSQL: ``INSERT ... SELECT FROM unnest(...) ON CONFLICT (msg_id) DO NOTHING
     RETURNING`` with the member rows and payload copies in the same statement (data-
     modifying CTEs), and ``UPDATE ... FROM unnest(...)`` of the message and member rows
     in one statement; parameters are one array per column.
   * MariaDB/MySQL: ``UPDATE ... JOIN JSON_TABLE(...)`` of each table, the rows as one
     compact JSON parameter; new rows by PyMySQL's multi-row ``INSERT``.
   * Other dialects (Oracle, SQLite): ``executemany`` of the per-row statements.

3. The journal: one row per message per transition, as every reader expects (history,
   search, the metrics' journal tail, the export, the Spark jobs), written by one
   ``INSERT ... SELECT`` that expands the batch's templates (:class:`~iqbridge.writes.Steps`)
   inside the database: the messages of a group joined to its steps, in the order
   :meth:`Writes.flat <iqbridge.writes.Writes.flat>` gives them (``executemany`` of the
   expanded rows on other dialects).

The per-message changes of the batch (``Writes.changes``) follow in the same transaction
through :meth:`~iqbridge.stores.sql_commit.SqlCommits.commit_each`'s path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from iqbridge.engine import Change
from iqbridge.errors import ConcurrentUpdate
from iqbridge.model import MessageRecord, Retained
from iqbridge.states import ActorKind
from iqbridge.stores.base import StaleRecord
from iqbridge.stores.codec import encode
from iqbridge.stores.sql_commit import _EACH_ATTEMPTS, SqlCommits
from iqbridge.stores.sql_rows import _CHUNK, _message_row
from iqbridge.writes import Writes

__all__ = ["SqlWrites"]

_PUBLISHER = ActorKind.PUBLISHER

Moved = list[tuple[MessageRecord, MessageRecord]]


class SqlWrites(SqlCommits):
    """:meth:`commit_writes` of :class:`~iqbridge.stores.sql.SqlStore`."""

    _batch_sql: dict[str, sa.TextClause] | None = None

    def commit_writes(self, writes: Writes) -> list[bool]:
        """Commit a batch's writes in one transaction (see the module docstring): every
        record whose compare-and-set holds, with its journal entries; the others write
        nothing. One flag per record, in the order ``created``, ``moved``, ``changes``.

        A transaction the database rolls back (a deadlock) is tried again, twice at
        most; inside an enclosing transaction that is lost too, ConcurrentUpdate is
        raised."""
        if not len(writes):
            return []
        changes = writes.changes
        seqs = [c.record.seq for c in changes]
        first = (
            writes.created[0].msg_id
            if writes.created
            else writes.moved[0][1].msg_id
            if writes.moved
            else changes[0].msg_id
        )
        for _ in range(_EACH_ATTEMPTS):
            for rec in writes.created:
                rec.seq = None  # as it was before a try that was rolled back
            for change, seq in zip(changes, seqs, strict=True):
                change.record.seq = seq
            try:
                with self._writing(savepoint=True) as conn:
                    return self._commit_writes(conn, writes)
            except StaleRecord:
                pass  # rows changed under the lock (not expected): all was rolled back
            except sa.exc.SQLAlchemyError as exc:
                err = self._translate(exc, first)
                if not isinstance(err, StaleRecord):
                    raise err from None
        raise ConcurrentUpdate(first, _EACH_ATTEMPTS)

    def _commit_writes(self, conn: Connection, writes: Writes) -> list[bool]:
        ids = {r.msg_id for r in writes.created}
        ids.update(b.msg_id for b, _ in writes.moved)
        ids.update(c.msg_id for c in writes.changes)  # locked in the same order, now
        stored = self._lock(conn, sorted(ids))
        created: list[bool] = []
        for rec in writes.created:
            created.append(rec.msg_id not in stored)
            stored[rec.msg_id] = -1  # taken: a repeat in the batch is not free
        moved: list[bool] = []
        for before, _ in writes.moved:
            held = stored.get(before.msg_id) == before.version
            if held:
                stored[before.msg_id] = -1  # a second move of it in the batch fails
            moved.append(held)
        if any(created):
            created = self._create(conn, writes, created)
        if any(moved):
            self._move(conn, [m for m, ok in zip(writes.moved, moved, strict=True) if ok])
        ok = {r.msg_id for r, f in zip(writes.created, created, strict=True) if f}
        ok.update(a.msg_id for (_, a), f in zip(writes.moved, moved, strict=True) if f)
        if ok and writes.journal:
            self._journal_batch(conn, writes, ok)
        rest = self._commit_each(conn, writes.changes) if writes.changes else []
        return created + moved + rest

    # --- statements --------------------------------------------------------------------------

    def _sql(self) -> dict[str, sa.TextClause]:
        """The dialect's batch statements, made once (table names as the dialect quotes
        them, schema included)."""
        if self._batch_sql is None:
            family = self.options.family
            fmt = self.writer.dialect.identifier_preparer.format_table
            t = self.tables
            names = {
                "msg": fmt(t.messages),
                "mem": fmt(t.members),
                "jr": fmt(t.journal),
                "pl": fmt(t.payloads),
            }
            made: dict[str, str] = {}
            if family == "postgresql":
                made = {k: v.format(**names) for k, v in _PG.items()}
            elif family == "mysql":
                made = {k: v.format(**names) for k, v in _MY.items()}
            self._batch_sql = {k: sa.text(v) for k, v in made.items()}
        return self._batch_sql

    def _lock(self, conn: Connection, ids: list[str]) -> dict[str, int]:
        """Lock the rows of ``ids`` (sorted) and read their versions."""
        stored: dict[str, int] = {}
        sql = self._sql().get("lock")
        if sql is not None:
            for mid, version in conn.execute(sql, {"ids": ids}):
                stored[mid] = int(version)
            return stored
        for i in range(0, len(ids), _CHUNK):
            for mid, version in conn.execute(self._versions, {"ids": ids[i : i + _CHUNK]}):
                stored[mid] = int(version)
        return stored

    # --- created -------------------------------------------------------------------------------

    def _create(self, conn: Connection, writes: Writes, flags: list[bool]) -> list[bool]:
        """Insert the created records whose flag holds, with their member rows and payload
        copies; the flags of those inserted (a concurrent put of one, not visible to the
        lock's read, leaves it out)."""
        recs = writes.created
        keep = writes.retain or [None] * len(recs)
        pick = [i for i, f in enumerate(flags) if f]
        if self.options.family != "postgresql":
            creates = [recs[i] for i in pick]
            done = self._insert_absent_records(conn, creates, [keep[i] for i in pick], pick)
            inserted = [False] * len(recs)
            for i in done:
                inserted[i] = True
            return inserted
        got = self._pg_insert(conn, [recs[i] for i in pick], [keep[i] for i in pick])
        out: list[bool] = []
        for rec, f in zip(recs, flags, strict=True):
            seq = got.pop(rec.msg_id, None) if f else None
            if seq is not None:
                rec.seq = seq
            out.append(seq is not None)
        return out

    def _pg_insert(
        self, conn: Connection, recs: Sequence[MessageRecord], keep: Sequence[Retained | None]
    ) -> dict[str, int]:
        """PostgreSQL: insert new records, their member rows and payload copies in one
        statement, leaving out those whose msg_id is taken; the seqs of those inserted."""
        cols: dict[str, list[Any]] = {k: [] for k in _PG_MSG}
        mem: dict[str, list[Any]] = {k: [] for k in _PG_MEM}
        pl: dict[str, list[Any]] = {"p_id": [], "p_body": [], "p_headers": []}
        for rec, kept in zip(recs, keep, strict=True):
            row = _message_row(rec)
            for k, c in _PG_MSG.items():
                cols[k].append(row[c])
            for position, m in enumerate(rec.members.values()):
                mem["u_id"].append(rec.msg_id)
                mem["u_sub"].append(m.subscriber)
                mem["u_pos"].append(position)
                mem["u_pool"].append(m.pool)
                mem["u_state"].append(m.state)
                mem["u_outcome"].append(m.outcome)
                mem["u_attempt"].append(m.attempt)
                mem["u_token"].append(m.lease_token)
                mem["u_owner"].append(m.lease_owner)
                mem["u_until"].append(m.lease_until)
                mem["u_nb"].append(m.not_before)
                mem["u_reason"].append(m.reason)
                mem["u_updated"].append(m.updated_at)
            if kept is not None:
                pl["p_id"].append(rec.msg_id)
                pl["p_body"].append(bytes(kept.body))
                pl["p_headers"].append(encode(dict(kept.headers)))
        result = conn.execute(self._sql()["create"], {**cols, **mem, **pl})
        return {mid: int(seq) for mid, seq in result}

    def _insert_records(
        self, conn: Connection, recs: list[MessageRecord], keep: Sequence[Retained | None]
    ) -> None:
        """Insert new records (see :meth:`SqlCommits._insert_records`); on PostgreSQL in one
        statement, an IntegrityError if a msg_id is taken (the caller's savepoint then
        undoes the others, as a failed multi-row INSERT would have)."""
        if self.options.family != "postgresql":
            super()._insert_records(conn, recs, keep)
            return
        got = self._pg_insert(conn, recs, keep)
        if len(got) != len(recs):  # taken, or repeated in the batch
            missing = [r.msg_id for r in recs if r.msg_id not in got]
            taken = missing[0] if missing else recs[0].msg_id
            raise sa.exc.IntegrityError("INSERT", None, ValueError(f"msg_id {taken} is taken"))
        for rec in recs:
            rec.seq = got[rec.msg_id]

    def _insert_absent_records(
        self,
        conn: Connection,
        recs: list[MessageRecord],
        keep: list[Any],
        where: list[int],
    ) -> list[int]:
        """Insert new records in a savepoint; if one was put meanwhile by someone else,
        one at a time, each in its own savepoint, leaving the taken ones out. The
        positions (``where``) of those inserted."""
        try:
            with conn.begin_nested():
                self._insert_records(conn, recs, keep)
            return where
        except sa.exc.IntegrityError:
            pass
        done: list[int] = []
        for rec, kept, i in zip(recs, keep, where, strict=True):
            try:
                with conn.begin_nested():
                    self._insert_records(conn, [rec], [kept])
            except sa.exc.IntegrityError:
                rec.seq = None
                continue
            done.append(i)
        return done

    def _append_journal(self, conn: Connection, changes: Sequence[Change]) -> None:
        """The journal entries of per-message changes; on PostgreSQL one ``INSERT ...
        SELECT FROM unnest(...)`` (one array per column) in their order."""
        if self.options.family != "postgresql":
            super()._append_journal(conn, changes)
            return
        entries = [e for c in changes for e in c.journal]
        if not entries:
            return
        params = {
            "e_id": [e.msg_id for e in entries],
            "e_queue": [e.queue for e in entries],
            "e_actor": [e.actor for e in entries],
            "e_kind": [e.actor_kind.value for e in entries],
            "e_src": [e.src for e in entries],
            "e_dst": [e.dst for e in entries],
            "e_at": [e.at for e in entries],
            "e_att": [e.attempt for e in entries],
            "e_detail": [e.detail for e in entries],
        }
        conn.execute(self._sql()["entries"], params)

    # --- native refs ---------------------------------------------------------------------------

    def set_native_refs(self, refs: Sequence[tuple[str, str]]) -> None:
        """Record where several payloads live, in one transaction and one statement
        (``UPDATE ... FROM unnest`` on PostgreSQL, ``UPDATE ... JOIN JSON_TABLE`` on
        MariaDB); unknown ids are skipped."""
        sql = self._sql().get("refs")
        if sql is None or len(refs) < 2:
            super().set_native_refs(refs)
            return
        if self.options.family == "postgresql":
            params: dict[str, Any] = {
                "r_id": [m for m, _ in refs],
                "r_ref": [r for _, r in refs],
            }
        else:
            params = {"doc": encode(list(refs))}
        try:
            with self._writing(savepoint=True) as conn:
                conn.execute(sql, params)
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from None

    # --- moved ---------------------------------------------------------------------------------

    def _move(self, conn: Connection, moved: Moved) -> None:
        """Update the message rows of the moves that hold (compare-and-set on the version
        moved from) and the member rows they changed."""
        family = self.options.family
        msg_rows = [
            (
                a.msg_id,
                b.version,
                a.publisher_state,
                int(a.withdrawn),
                a.updated_at,
                a.lock_id,
                a.lock_owner,
                a.lock_until,
                a.version,
                a.due_at(),
            )
            for b, a in moved
        ]
        mem_rows = [
            (
                a.msg_id,
                name,
                m.state,
                m.outcome,
                m.attempt,
                m.lease_token,
                m.lease_owner,
                m.lease_until,
                m.not_before,
                m.reason,
                m.updated_at,
            )
            for b, a in moved
            for name, m in a.members.items()
            if m is not b.members.get(name)
        ]
        if family == "postgresql":
            params: dict[str, Any] = {k: [r[i] for r in msg_rows] for i, k in enumerate(_V_MSG)}
            params.update({k: [r[i] for r in mem_rows] for i, k in enumerate(_V_MEM)})
            count = conn.execute(self._sql()["move"], params).scalar()
            if count != len(moved):
                raise StaleRecord(moved[0][1].msg_id)
            return
        if family == "mysql":
            sql = self._sql()
            result = conn.execute(sql["move"], {"doc": encode(msg_rows)})
            if result.rowcount != len(moved):
                raise StaleRecord(moved[0][1].msg_id)
            if mem_rows:
                conn.execute(sql["move_members"], {"doc": encode(mem_rows)})
            return
        rows = [dict(zip(_CAS_KEYS, r, strict=True)) for r in msg_rows]
        result = conn.execute(self._cas, rows)
        if conn.dialect.supports_sane_multi_rowcount and result.rowcount != len(rows):
            raise StaleRecord(moved[0][1].msg_id)
        if mem_rows:
            conn.execute(
                self._member_update, [dict(zip(_MEMBER_KEYS, r, strict=True)) for r in mem_rows]
            )

    # --- journal -------------------------------------------------------------------------------

    def _journal_batch(self, conn: Connection, writes: Writes, ok: set[str]) -> None:
        """The templated journal entries of the records that hold: one row per message per
        transition, numbered in :meth:`Writes.flat` order."""
        family = self.options.family
        if family not in ("postgresql", "mysql"):
            rows = [
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
                for mid, e in writes.flat()
                if mid in ok
            ]
            if rows:
                conn.execute(self.tables.journal.insert(), rows)
            return
        items: list[tuple[int, str, int]] = []
        steps: list[tuple[Any, ...]] = []
        for g, group in enumerate(writes.journal):
            n = len(items)
            items += [(g, mid, attempt) for mid, attempt in group.items if mid in ok]
            if len(items) == n:
                continue
            steps += [
                (g, s.actor, s.kind.value, s.src, s.dst, s.detail, group.at, s.kind is _PUBLISHER)
                for s in group.steps
            ]
        if not items or not steps:
            return
        if family == "postgresql":
            params: dict[str, Any] = {k: [r[i] for r in items] for i, k in enumerate(_J_ITEMS)}
            params.update({k: [r[i] for r in steps] for i, k in enumerate(_J_STEPS)})
            params["queue"] = writes.queue
        else:
            params = {"items": encode(items), "steps": encode(steps), "queue": writes.queue}
        conn.execute(self._sql()["journal"], params)


_CAS_KEYS = (
    "b_msg_id",
    "b_expected",
    "b_pub",
    "b_withdrawn",
    "b_updated",
    "b_lock_id",
    "b_lock_owner",
    "b_lock_until",
    "b_version",
    "b_due",
)
_MEMBER_KEYS = (
    "b_msg_id",
    "b_sub",
    "b_state",
    "b_outcome",
    "b_attempt",
    "b_token",
    "b_owner",
    "b_until",
    "b_not_before",
    "b_reason",
    "b_updated",
)

# --- PostgreSQL: one array parameter per column --------------------------------------------

#: parameter -> message column, of a created record (in the INSERT's column order).
_PG_MSG = {
    "m_id": "msg_id",
    "m_queue": "queue",
    "m_pub": "publisher",
    "m_okey": "ordering_key",
    "m_corr": "correlation_id",
    "m_prio": "priority",
    "m_mode": "audience_mode",
    "m_parents": "parents",
    "m_ref": "native_ref",
    "m_ctype": "content_type",
    "m_size": "body_size",
    "m_created": "created_at",
    "m_expires": "expires_at",
    "m_max": "max_attempts",
    "m_pstate": "publisher_state",
    "m_wd": "withdrawn",
    "m_updated": "updated_at",
    "m_lid": "lock_id",
    "m_lown": "lock_owner",
    "m_luntil": "lock_until",
    "m_version": "version",
    "m_due": "next_due",
}
_PG_MSG_TYPES = {
    "m_prio": "SMALLINT",
    "m_size": "BIGINT",
    "m_created": "BIGINT",
    "m_expires": "BIGINT",
    "m_max": "INTEGER",
    "m_wd": "SMALLINT",
    "m_updated": "BIGINT",
    "m_luntil": "BIGINT",
    "m_version": "BIGINT",
    "m_due": "BIGINT",
}
_PG_MEM = {
    "u_id": "VARCHAR",
    "u_sub": "VARCHAR",
    "u_pos": "SMALLINT",
    "u_pool": "VARCHAR",
    "u_state": "VARCHAR",
    "u_outcome": "VARCHAR",
    "u_attempt": "INTEGER",
    "u_token": "VARCHAR",
    "u_owner": "VARCHAR",
    "u_until": "BIGINT",
    "u_nb": "BIGINT",
    "u_reason": "TEXT",
    "u_updated": "BIGINT",
}


def _unnest(params: dict[str, str]) -> str:
    return ", ".join(f"CAST(:{k} AS {t}[])" for k, t in params.items())


_V_MSG_TYPES = {
    "v_id": "VARCHAR",
    "v_expected": "BIGINT",
    "v_pub": "VARCHAR",
    "v_wd": "SMALLINT",
    "v_upd": "BIGINT",
    "v_lid": "VARCHAR",
    "v_lown": "VARCHAR",
    "v_luntil": "BIGINT",
    "v_ver": "BIGINT",
    "v_due": "BIGINT",
}
_V_MSG = tuple(_V_MSG_TYPES)
_V_MEM_TYPES = {
    "w_id": "VARCHAR",
    "w_sub": "VARCHAR",
    "w_state": "VARCHAR",
    "w_outcome": "VARCHAR",
    "w_attempt": "INTEGER",
    "w_token": "VARCHAR",
    "w_owner": "VARCHAR",
    "w_until": "BIGINT",
    "w_nb": "BIGINT",
    "w_reason": "TEXT",
    "w_upd": "BIGINT",
}
_V_MEM = tuple(_V_MEM_TYPES)
_J_ITEM_TYPES = {"j_g": "INTEGER", "j_id": "VARCHAR", "j_att": "INTEGER"}
_J_STEP_TYPES = {
    "s_g": "INTEGER",
    "s_actor": "VARCHAR",
    "s_kind": "VARCHAR",
    "s_src": "VARCHAR",
    "s_dst": "VARCHAR",
    "s_detail": "TEXT",
    "s_at": "BIGINT",
    "s_pub": "BOOLEAN",
}
_J_ITEMS = tuple(_J_ITEM_TYPES)
_E_TYPES = {
    "e_id": "VARCHAR",
    "e_queue": "VARCHAR",
    "e_actor": "VARCHAR",
    "e_kind": "VARCHAR",
    "e_src": "VARCHAR",
    "e_dst": "VARCHAR",
    "e_at": "BIGINT",
    "e_att": "INTEGER",
    "e_detail": "TEXT",
}
_J_STEPS = tuple(_J_STEP_TYPES)

_PG_MSG_COLS = ", ".join(_PG_MSG.values())
_PG = {
    "lock": (
        "SELECT msg_id, version FROM {msg} WHERE msg_id = ANY(CAST(:ids AS VARCHAR[]))"
        " ORDER BY msg_id FOR UPDATE"
    ),
    "create": (
        "WITH v AS (SELECT * FROM unnest("
        + _unnest({k: _PG_MSG_TYPES.get(k, "VARCHAR") for k in _PG_MSG})
        + ") WITH ORDINALITY AS v("
        + _PG_MSG_COLS
        + ", o)), ins AS (INSERT INTO {msg} ("
        + _PG_MSG_COLS
        + ") SELECT "
        + _PG_MSG_COLS
        + " FROM v ORDER BY o ON CONFLICT (msg_id) DO NOTHING"
        " RETURNING msg_id, seq, queue, priority),"
        " mem AS (INSERT INTO {mem} (msg_id, subscriber, position, queue, seq, neg_priority,"
        " pool, state, outcome, attempt, lease_token, lease_owner, lease_until, not_before,"
        " reason, updated_at) SELECT u.msg_id, u.subscriber, u.position, ins.queue, ins.seq,"
        " -ins.priority, u.pool, u.state, u.outcome, u.attempt, u.lease_token, u.lease_owner,"
        " u.lease_until, u.not_before, u.reason, u.updated_at FROM unnest("
        + _unnest(_PG_MEM)
        + ") AS u(msg_id, subscriber, position, pool, state, outcome, attempt, lease_token,"
        " lease_owner, lease_until, not_before, reason, updated_at)"
        " JOIN ins ON ins.msg_id = u.msg_id),"
        " pl AS (INSERT INTO {pl} (msg_id, body, headers) SELECT p.msg_id, p.body, p.headers"
        " FROM unnest(CAST(:p_id AS VARCHAR[]), CAST(:p_body AS BYTEA[]),"
        " CAST(:p_headers AS TEXT[])) AS p(msg_id, body, headers)"
        " JOIN ins ON ins.msg_id = p.msg_id)"
        " SELECT msg_id, seq FROM ins"
    ),
    "move": (
        "WITH v AS (SELECT * FROM unnest("
        + _unnest(_V_MSG_TYPES)
        + ") AS v(id, expected, pub, wd, upd, lid, lown, luntil, ver, due)),"
        " m AS (UPDATE {msg} t SET publisher_state = v.pub, withdrawn = v.wd,"
        " updated_at = v.upd, lock_id = v.lid, lock_owner = v.lown, lock_until = v.luntil,"
        " version = v.ver, next_due = v.due FROM v"
        " WHERE t.msg_id = ANY(CAST(:v_id AS VARCHAR[])) AND t.msg_id = v.id"
        " AND t.version = v.expected RETURNING 1),"
        " u AS (UPDATE {mem} t SET state = w.state, outcome = w.outcome, attempt = w.attempt,"
        " lease_token = w.token, lease_owner = w.owner, lease_until = w.until,"
        " not_before = w.nb, reason = w.reason, updated_at = w.upd FROM unnest("
        + _unnest(_V_MEM_TYPES)
        + ") AS w(id, sub, state, outcome, attempt, token, owner, until, nb, reason, upd)"
        " WHERE t.msg_id = ANY(CAST(:w_id AS VARCHAR[])) AND t.msg_id = w.id"
        " AND t.subscriber = w.sub)"
        " SELECT count(*) FROM m"
    ),
    "entries": (
        "INSERT INTO {jr} (msg_id, queue, actor, actor_kind, src, dst, at, attempt, detail)"
        " SELECT e.id, e.queue, e.actor, e.kind, e.src, e.dst, e.at, e.att, e.detail"
        " FROM unnest("
        + _unnest(_E_TYPES)
        + ") WITH ORDINALITY AS e(id, queue, actor, kind, src, dst, at, att, detail, o)"
        " ORDER BY e.o"
    ),
    "refs": (
        "UPDATE {msg} t SET native_ref = r.ref FROM unnest(CAST(:r_id AS VARCHAR[]),"
        " CAST(:r_ref AS VARCHAR[])) AS r(id, ref)"
        " WHERE t.msg_id = ANY(CAST(:r_id AS VARCHAR[])) AND t.msg_id = r.id"
    ),
    "journal": (
        "INSERT INTO {jr} (msg_id, queue, actor, actor_kind, src, dst, at, attempt, detail)"
        " SELECT m.id, :queue, s.actor, s.kind, s.src, s.dst, s.at,"
        " CASE WHEN s.pub THEN 1 ELSE m.att END, s.detail FROM unnest("
        + _unnest(_J_ITEM_TYPES)
        + ") WITH ORDINALITY AS m(g, id, att, o) JOIN unnest("
        + _unnest(_J_STEP_TYPES)
        + ") WITH ORDINALITY AS s(g, actor, kind, src, dst, detail, at, pub, o)"
        " ON s.g = m.g ORDER BY m.o, s.o"
    ),
}

# --- MariaDB / MySQL: the rows as one JSON parameter -----------------------------------------

_BIN = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"


def _json_table(param: str, cols: Sequence[tuple[str, str]], ordinality: bool = False) -> str:
    out = ["o FOR ORDINALITY"] if ordinality else []
    for i, (name, kind) in enumerate(cols):
        text = kind.startswith(("VARCHAR", "TEXT"))
        out.append(f"{name} {kind}{' ' + _BIN if text else ''} PATH '$[{i}]'")
    return f"JSON_TABLE(:{param}, '$[*]' COLUMNS ({', '.join(out)}))"


_MY = {
    "refs": (
        "UPDATE {msg} t JOIN "
        + _json_table("doc", (("id", "VARCHAR(128)"), ("ref", "VARCHAR(1024)")))
        + " r ON t.msg_id = r.id SET t.native_ref = r.ref"
    ),
    "move": (
        "UPDATE {msg} t JOIN "
        + _json_table(
            "doc",
            (
                ("id", "VARCHAR(128)"),
                ("expected", "BIGINT"),
                ("pub", "VARCHAR(16)"),
                ("wd", "SMALLINT"),
                ("upd", "BIGINT"),
                ("lid", "VARCHAR(128)"),
                ("lown", "VARCHAR(512)"),
                ("luntil", "BIGINT"),
                ("ver", "BIGINT"),
                ("due", "BIGINT"),
            ),
        )
        + " v ON t.msg_id = v.id AND t.version = v.expected SET t.publisher_state = v.pub,"
        " t.withdrawn = v.wd, t.updated_at = v.upd, t.lock_id = v.lid, t.lock_owner = v.lown,"
        " t.lock_until = v.luntil, t.version = v.ver, t.next_due = v.due"
    ),
    "move_members": (
        "UPDATE {mem} t JOIN "
        + _json_table(
            "doc",
            (
                ("id", "VARCHAR(128)"),
                ("sub", "VARCHAR(200)"),
                ("state", "VARCHAR(16)"),
                ("outcome", "VARCHAR(16)"),
                ("attempt", "INT"),
                ("token", "VARCHAR(128)"),
                ("owner", "VARCHAR(512)"),
                ("until", "BIGINT"),
                ("nb", "BIGINT"),
                ("reason", "TEXT"),
                ("upd", "BIGINT"),
            ),
        )
        + " w ON t.msg_id = w.id AND t.subscriber = w.sub SET t.state = w.state,"
        " t.outcome = w.outcome, t.attempt = w.attempt, t.lease_token = w.token,"
        " t.lease_owner = w.owner, t.lease_until = w.until, t.not_before = w.nb,"
        " t.reason = w.reason, t.updated_at = w.upd"
    ),
    "journal": (
        "INSERT INTO {jr} (msg_id, queue, actor, actor_kind, src, dst, at, attempt, detail)"
        " SELECT m.id, :queue, s.actor, s.kind, s.src, s.dst, s.at,"
        " CASE WHEN s.pub THEN 1 ELSE m.att END, s.detail FROM "
        + _json_table("items", (("g", "INT"), ("id", "VARCHAR(128)"), ("att", "INT")), True)
        + " m JOIN "
        + _json_table(
            "steps",
            (
                ("g", "INT"),
                ("actor", "VARCHAR(200)"),
                ("kind", "VARCHAR(16)"),
                ("src", "VARCHAR(16)"),
                ("dst", "VARCHAR(16)"),
                ("detail", "TEXT"),
                ("at", "BIGINT"),
                ("pub", "BOOLEAN"),
            ),
            True,
        )
        + " s ON s.g = m.g ORDER BY m.o, s.o"
    ),
}
