"""A batch's writes in the SQL index store (:mod:`iqbridge.stores.sql`):
:meth:`SqlWrites.commit_writes` of a :class:`~iqbridge.writes.Writes`.

One transaction, a fixed number of statements whatever the batch size:

1. The batch's message rows are locked with one ``SELECT ... FOR UPDATE`` in msg_id
   order (two batches sharing rows wait for each other instead of deadlocking) and their
   versions compared: a created record holds where its msg_id is free, a moved one where
   the version is still the one it was moved from.
2. The records that hold are written with one statement per table, the compare-and-set
   inside it again (``version`` = the one moved from; a row count short of the batch
   means a concurrent change slipped past the lock, and the whole try is rolled back
   and made again). The rows travel as one compact JSON parameter per table:

   * PostgreSQL (``jsonb_array_elements``): new messages by ``INSERT ... SELECT ... ON
     CONFLICT (msg_id) DO NOTHING RETURNING``, their member rows and payload copies in
     the same statement (data-modifying CTEs joined to what was inserted); moves by one
     ``UPDATE ... FROM`` of the message rows and one of the member rows, in one
     statement.
   * MariaDB/MySQL (``JSON_TABLE``): moves by ``UPDATE ... JOIN JSON_TABLE(...)`` of
     each table; new rows by multi-row ``INSERT ... VALUES`` of literals.
   * Other dialects (Oracle, SQLite): ``executemany`` of the per-row statements.

3. The journal: one row per message per transition, as every reader expects (history,
   search, the metrics' journal tail and its LateJournal holes, the export, the Spark
   jobs), numbered without gaps. PostgreSQL expands the batch's templates
   (:class:`~iqbridge.writes.Steps`) itself, by an ``INSERT ... SELECT`` joining each
   group's messages to its steps in the order :meth:`Writes.flat
   <iqbridge.writes.Writes.flat>` gives them, inside the statement of the rows (joined
   to what it inserted or updated): a batch transition is the lock and one statement.
   MariaDB gets the expanded rows as one multi-row ``INSERT ... VALUES``: InnoDB numbers
   an ``INSERT ... SELECT`` in chunks and drops the unused numbers, gaps a reader would
   wait out as commits to come.

   (The SQLite store's batch rows, ``{"b": [[at, steps, items]...]}`` numbered ``row *
   65536 + position``, would be cheaper still to write, about 3 µs instead of 20-30 µs
   per message per claim measured here, but every reader of a store with late commits
   counts the numbers between two rows as holes to wait for, and history would need a
   per-message list of rows kept through purges: a schema change for another day.)

The per-message changes of the batch (``Writes.changes``) follow in the same transaction
through :meth:`~iqbridge.stores.sql_commit.SqlCommits.commit_each`'s path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from iqbridge.engine import Change
from iqbridge.model import MessageRecord, Retained
from iqbridge.states import ActorKind
from iqbridge.stores.base import StaleRecord
from iqbridge.stores.codec import encode, member_moves
from iqbridge.stores.sql_commit import SqlCommits
from iqbridge.stores.sql_rows import _CHUNK, _message_row
from iqbridge.stores.sql_statements import NEW_COLS, statements
from iqbridge.writes import Writes

__all__ = ["SqlWrites"]

_PUBLISHER = ActorKind.PUBLISHER
#: Text of one multi-row INSERT at most, about (MariaDB's max_allowed_packet is 16 MiB).
_STATEMENT_BYTES = 1 << 20
_NO_PARAMS: Any = {"no_parameters": True}
#: No journal in a statement that can carry one.
_NO_JOURNAL: dict[str, Any] = {"items": "[]", "steps": "[]", "queue": ""}

Moved = list[tuple[MessageRecord, MessageRecord]]


class SqlWrites(SqlCommits):
    """:meth:`commit_writes` of :class:`~iqbridge.stores.sql.SqlStore`."""

    _batch_sql: dict[str, sa.TextClause] | None = None
    _journal_rows: str | None = None
    _prefixes: dict[str, str]

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

        def run(conn: Connection) -> list[bool]:
            for rec in writes.created:
                rec.seq = None  # as it was before a try that was rolled back
            for change, seq in zip(changes, seqs, strict=True):
                change.record.seq = seq
            return self._commit_writes(conn, writes)

        return self._retrying(run, first)

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
        # PostgreSQL writes the journal in the statement of the rows, when there is one.
        fold = self.options.family == "postgresql" and not (writes.created and writes.moved)
        if any(created):
            picked = {r.msg_id for r, f in zip(writes.created, created, strict=True) if f}
            created = self._create(conn, writes, created, _journal(writes, picked, fold))
        if any(moved):
            holding = [m for m, ok in zip(writes.moved, moved, strict=True) if ok]
            self._move(conn, holding, _journal(writes, {a.msg_id for _, a in holding}, fold))
        ok = {r.msg_id for r, f in zip(writes.created, created, strict=True) if f}
        ok.update(a.msg_id for (_, a), f in zip(writes.moved, moved, strict=True) if f)
        if ok and writes.journal and not fold:
            self._journal_batch(conn, writes, ok)
        rest = self._commit_each(conn, writes.changes) if writes.changes else []
        return created + moved + rest

    # --- statements --------------------------------------------------------------------------

    def _sql(self) -> dict[str, sa.TextClause]:
        """The dialect's batch statements (:mod:`iqbridge.stores.sql_statements`), made
        once; none on dialects without them."""
        if self._batch_sql is None:
            fmt = self.writer.dialect.identifier_preparer.format_table
            t = self.tables
            names = {
                "msg": fmt(t.messages),
                "mem": fmt(t.members),
                "jr": fmt(t.journal),
                "pl": fmt(t.payloads),
            }
            dialect = self.writer.dialect
            version = dialect.server_version_info or self.reader.dialect.server_version_info
            if version is None:  # no connection made yet: one tells
                with self.reader.connect():
                    version = self.reader.dialect.server_version_info
            made = statements(
                self.options.family,
                names,
                tuple(v for v in version or () if isinstance(v, int)),
                bool(getattr(dialect, "is_mariadb", False)),
            )
            self._batch_sql = {k: sa.text(v) for k, v in made.items() if not k.endswith("_rows")}
            self._prefixes = {k: v for k, v in made.items() if k.endswith("_rows")}
            self._journal_rows = made.get("journal_rows")
        return self._batch_sql

    def _insert_journal_rows(self, conn: Connection, rows: list[tuple[Any, ...]]) -> None:
        """Journal rows ``(msg_id, queue, actor, actor_kind, src, dst, at, attempt,
        detail)`` by multi-row ``INSERT ... VALUES`` (MariaDB)."""
        self._insert_rows(conn, "journal_rows", rows)

    def _insert_rows(self, conn: Connection, kind: str, rows: list[tuple[Any, ...]]) -> None:
        """MariaDB: ``rows`` by multi-row ``INSERT ... VALUES`` statements of the values
        as literals, each distinct string escaped once (by the driver's own escaping,
        which follows the session's sql_mode), up to about 1 MB of text a statement. One
        statement per batch for the usual batch sizes; a simple insert, so InnoDB numbers
        its rows consecutively, leaving no gap."""
        self._sql()  # made once, with the prefixes
        prefix = self._prefixes[kind]
        escape = conn.connection.dbapi_connection.escape  # type: ignore[union-attr]
        cache: dict[str, str] = {}
        parts: list[str] = []
        size = 0
        for row in rows:
            values = []
            for v in row:
                if v is None:
                    values.append("NULL")
                elif isinstance(v, str):
                    lit = cache.get(v)
                    if lit is None:
                        lit = cache[v] = escape(str(v))
                    values.append(lit)
                elif isinstance(v, int):
                    values.append(str(int(v)))
                else:
                    # Only text, integers and NULL go as literals: anything else (bytes,
                    # floats) would need a quoting of its own, so it is refused, not guessed.
                    raise TypeError(f"no SQL literal for a {type(v).__name__} in {kind}")
            text = "(" + ",".join(values) + ")"
            parts.append(text)
            size += len(text) + 1
            if size > _STATEMENT_BYTES:
                conn.exec_driver_sql(prefix + ",".join(parts), execution_options=_NO_PARAMS)
                parts, size = [], 0
        if parts:
            conn.exec_driver_sql(prefix + ",".join(parts), execution_options=_NO_PARAMS)

    def _lock(self, conn: Connection, ids: list[str]) -> dict[str, int]:
        """Lock the rows of ``ids`` (sorted) and read their versions."""
        stored: dict[str, int] = {}
        sql = self._sql().get("lock")
        if sql is not None:
            for mid, version in conn.execute(sql, {"ids": encode(ids)}):
                stored[mid] = int(version)
            return stored
        for i in range(0, len(ids), _CHUNK):
            for mid, version in conn.execute(self._versions, {"ids": ids[i : i + _CHUNK]}):
                stored[mid] = int(version)
        return stored

    # --- created -------------------------------------------------------------------------------

    def _create(
        self, conn: Connection, writes: Writes, flags: list[bool], journal: dict[str, Any]
    ) -> list[bool]:
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
        got = self._pg_insert(conn, [recs[i] for i in pick], [keep[i] for i in pick], journal)
        out: list[bool] = []
        for rec, f in zip(recs, flags, strict=True):
            seq = got.pop(rec.msg_id, None) if f else None
            if seq is not None:
                rec.seq = seq
            out.append(seq is not None)
        return out

    def _pg_insert(
        self,
        conn: Connection,
        recs: Sequence[MessageRecord],
        keep: Sequence[Retained | None],
        journal: dict[str, Any] = _NO_JOURNAL,
    ) -> dict[str, int]:
        """PostgreSQL: insert new records, their member rows, payload copies and
        ``journal`` (templates, see :func:`_journal`) in one statement, leaving out those
        whose msg_id is taken; the seqs of those inserted."""
        rows: list[tuple[Any, ...]] = []
        members: list[tuple[Any, ...]] = []
        pl: dict[str, list[Any]] = {"p_id": [], "p_body": [], "p_headers": []}
        for rec, kept in zip(recs, keep, strict=True):
            row = _message_row(rec)
            rows.append(tuple(row[c] for c, _ in NEW_COLS))
            for position, m in enumerate(rec.members.values()):
                members.append((rec.msg_id, m.subscriber, position, m.pool, *member_moves(m)))
            if kept is not None:
                pl["p_id"].append(rec.msg_id)
                pl["p_body"].append(bytes(kept.body))
                pl["p_headers"].append(encode(dict(kept.headers)))
        params = {"doc": encode(rows), "members": encode(members), **pl, **journal}
        return {mid: int(seq) for mid, seq in conn.execute(self._sql()["create"], params)}

    def _insert_records(
        self, conn: Connection, recs: list[MessageRecord], keep: Sequence[Retained | None]
    ) -> None:
        """Insert new records (see :meth:`SqlCommits._insert_records`); on PostgreSQL in one
        statement, an IntegrityError if a msg_id is taken (the caller's savepoint then
        undoes the others, as a failed multi-row INSERT would have)."""
        family = self.options.family
        if family == "mysql" and len(recs) > 1:
            self._my_insert(conn, recs, keep)
            return
        if family != "postgresql":
            super()._insert_records(conn, recs, keep)
            return
        got = self._pg_insert(conn, recs, keep)
        if len(got) != len(recs):  # taken, or repeated in the batch
            missing = [r.msg_id for r in recs if r.msg_id not in got]
            taken = missing[0] if missing else recs[0].msg_id
            raise sa.exc.IntegrityError("INSERT", None, ValueError(f"msg_id {taken} is taken"))
        for rec in recs:
            rec.seq = got[rec.msg_id]

    def _my_insert(
        self, conn: Connection, recs: list[MessageRecord], keep: Sequence[Retained | None]
    ) -> None:
        """MariaDB: new records by multi-row INSERTs of literals (messages, then their
        seqs read back, then members), payload copies by the driver."""
        rows = [tuple(row[c] for c, _ in NEW_COLS) for row in map(_message_row, recs)]
        self._insert_rows(conn, "message_rows", rows)
        ids = [rec.msg_id for rec in recs]
        seqs: dict[str, int] = {}
        for i in range(0, len(ids), _CHUNK):
            for mid, seq in conn.execute(self._seqs, {"ids": ids[i : i + _CHUNK]}):
                seqs[mid] = int(seq)
        members: list[tuple[Any, ...]] = []
        for rec in recs:
            rec.seq = seqs[rec.msg_id]
            for position, m in enumerate(rec.members.values()):
                members.append(
                    (
                        rec.msg_id,
                        m.subscriber,
                        position,
                        rec.queue,
                        rec.seq,
                        -rec.priority,
                        m.pool,
                        *member_moves(m),
                    )
                )
        self._insert_rows(conn, "member_rows", members)
        self._insert_payloads(conn, recs, keep)

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
        sql = self._sql().get("entries")
        if sql is None and self._journal_rows is None:
            super()._append_journal(conn, changes)
            return
        rows = [
            (
                e.msg_id,
                e.queue,
                e.actor,
                e.actor_kind.value,
                e.src,
                e.dst,
                e.at,
                e.attempt,
                e.detail,
            )
            for c in changes
            for e in c.journal
        ]
        if not rows:
            return
        if sql is not None:
            conn.execute(sql, {"doc": encode(rows)})
        else:
            self._insert_journal_rows(conn, rows)

    # --- native refs ---------------------------------------------------------------------------

    def set_native_refs(self, refs: Sequence[tuple[str, str]]) -> None:
        """Record where several payloads live, in one transaction: the rows locked in
        msg_id order as a batch commit locks them (a claim of the same messages meanwhile
        waits, it cannot deadlock with this), then one ``UPDATE ... FROM`` (PostgreSQL) or
        ``UPDATE ... JOIN JSON_TABLE`` (MariaDB); unknown ids are skipped. A transaction
        the database rolls back anyway is tried again, twice at most."""
        sql = self._sql().get("refs")
        if sql is None or len(refs) < 2:
            super().set_native_refs(refs)
            return
        ids = sorted({m for m, _ in refs})

        def run(conn: Connection) -> None:
            self._lock(conn, ids)
            conn.execute(sql, {"doc": encode(list(refs))})

        self._retrying(run, ids[0])

    # --- moved ---------------------------------------------------------------------------------

    def _move(self, conn: Connection, moved: Moved, journal: dict[str, Any]) -> None:
        """Update the message rows of the moves that hold (compare-and-set on the version
        moved from) and the member rows they changed; on PostgreSQL with ``journal``
        (templates, see :func:`_journal`) in the same statement."""
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
            (a.msg_id, name, *member_moves(m))
            for b, a in moved
            for name, m in a.members.items()
            if m is not b.members.get(name)
        ]
        self._move_rows(conn, msg_rows, mem_rows, journal)

    def _move_rows(
        self,
        conn: Connection,
        msg_rows: Sequence[Sequence[Any]],
        mem_rows: Sequence[Sequence[Any]],
        journal: dict[str, Any],
    ) -> None:
        """Update message rows (``MOVE_COLS``: compare-and-set on the version moved from;
        one short raises StaleRecord) and member rows (``MOVED_MEMBER_COLS``); on
        PostgreSQL with ``journal`` (templates, see :func:`_journal`) in the same
        statement."""
        family = self.options.family
        first = msg_rows[0][0]
        if family == "postgresql":
            params = {"doc": encode(msg_rows), "members": encode(mem_rows), **journal}
            count = conn.execute(self._sql()["move"], params).scalar()
            if count != len(msg_rows):
                raise StaleRecord(first)
            return
        sql = self._sql()
        if family == "mysql" and "move" in sql:
            result = conn.execute(sql["move"], {"doc": encode(msg_rows)})
            if result.rowcount != len(msg_rows):
                raise StaleRecord(first)
            if mem_rows:
                conn.execute(sql["move_members"], {"members": encode(mem_rows)})
            return
        rows = [dict(zip(_CAS_KEYS, r, strict=True)) for r in msg_rows]
        result = conn.execute(self._cas, rows)
        if conn.dialect.supports_sane_multi_rowcount and result.rowcount != len(rows):
            raise StaleRecord(first)
        if mem_rows:
            conn.execute(
                self._member_update, [dict(zip(_MEMBER_KEYS, r, strict=True)) for r in mem_rows]
            )

    # --- journal -------------------------------------------------------------------------------

    def _journal_batch(self, conn: Connection, writes: Writes, ok: set[str]) -> None:
        """The templated journal entries of the records that hold: one row per message per
        transition, numbered in :meth:`Writes.flat` order."""
        sql = self._sql().get("journal")
        if sql is None and self._journal_rows is not None:
            queue = writes.queue
            expanded = [
                (mid, queue, e.actor, e.actor_kind.value, e.src, e.dst, e.at, e.attempt, e.detail)
                for mid, e in writes.flat()
                if mid in ok
            ]
            if expanded:
                self._insert_journal_rows(conn, expanded)
            return
        if sql is None:
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
        params = _journal(writes, ok, True)
        if params["items"] != "[]":
            conn.execute(sql, params)


def _journal(writes: Writes, ok: set[str], wanted: bool) -> dict[str, Any]:
    """The parameters of a batch's templated journal (PostgreSQL, MariaDB): each group's
    messages in ``ok`` (``items``: group, msg_id, attempt) and the steps of the groups
    that have some (``steps``: group, actor, kind, src, dst, detail, at, publisher's);
    none unless ``wanted``."""
    if not wanted:
        return _NO_JOURNAL
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
    return {"items": encode(items), "steps": encode(steps), "queue": writes.queue}


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
