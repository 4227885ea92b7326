"""SQL index store on SQLAlchemy Core: PostgreSQL, MySQL/MariaDB, SQLite, Oracle.

URLs: ``postgresql://user:password@host:5432/db`` (also ``postgres://`` and
``postgresql+psycopg://``; driver psycopg 3), ``mysql://`` / ``mariadb://`` (also
``+pymysql``; driver PyMySQL), ``sql+sqlite:///index.db`` (this store on an SQLite
file, the portable twin of the ``sqlite://`` store), ``oracle://`` / ``oracle+oracledb://``
(python-oracledb). Options as query parameters: ``prefix`` (table names start with it,
default ``iq_``), ``schema`` (a PostgreSQL schema or MySQL database for the tables,
created if missing), ``pool_size``, ``max_overflow``, ``pool_timeout``, ``pool_recycle``,
``pre_ping``, ``connect_timeout``; any other option goes to the driver
(:func:`iqbridge.stores.sql_schema.parse_sql_url`).

The tables are created, or migrated, on first use (:mod:`iqbridge.stores.sql_schema`):
``messages`` (index fields, publisher state, browse lock, ``version``, ``next_due``),
``members`` (one row per message and intended subscriber: state, attempt, lease,
``not_before``, pool, reason), ``journal`` (one row per transition, numbered by an
autoincrement ``seq``), ``queues`` (standing subscriptions) and ``meta`` (schema
version, instance id). Every search field and the claim order are indexed.

A transition is a conditional ``UPDATE ... WHERE msg_id = ? AND version = ?`` of the
message row (compare-and-set: no row updated means :class:`StaleRecord`, and nothing was
written), then the member rows it changed and its journal rows, in one database
transaction. A new message is an ``INSERT`` (an existing msg_id means StaleRecord), with
its retained payload copy, if any, in ``payloads``. :meth:`SqlStore.commit_each` (the
batch path) locks the batch's message rows with one ``SELECT ... FOR UPDATE``, compares
the versions there, and writes only the changes that still hold.
:meth:`SqlStore.atomic` opens a real transaction on a connection of the calling thread;
nested calls join it.

Exactly-once with the caller's own transaction: :meth:`SqlStore.join` lends the store a
connection of the application (checked to reach this index's tables), so a transition
runs inside the application's transaction and commits or rolls back with its business
rows (see :class:`iqbridge.transaction.Transaction`).

Oracle goes through the same code and only uses what SQLAlchemy's Oracle dialect
renders (identity columns need Oracle 12c or later; Oracle stores an empty string as
NULL, so empty publisher or ordering-key names cannot be stored); it is not tested here.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from types import TracebackType
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from iqbridge.engine import Change
from iqbridge.errors import (
    ConcurrentUpdate,
    ConfigurationError,
    IndexUnavailable,
    InvalidArgument,
    IQError,
    MessageNotFound,
)
from iqbridge.model import (
    Filter,
    JournalEntry,
    Member,
    MessageRecord,
    MessageSummary,
    Retained,
    Subscriptions,
    to_micros,
)
from iqbridge.states import ActorKind, Mode, PublisherState, SubscriberState
from iqbridge.stores.base import AvailableQueries, PurgedMessage, StaleRecord
from iqbridge.stores.codec import encode, subscriptions_from_json, subscriptions_to_json, summary
from iqbridge.stores.sql_schema import SqlOptions, Tables, ensure_schema, make_tables, parse_sql_url

__all__ = ["SqlStore"]

_SUB = {s.value: s for s in SubscriberState}
_PUB = {s.value: s for s in PublisherState}
_MODE = {m.value: m for m in Mode}
_KIND = {k.value: k for k in ActorKind}
_AVAILABLE = SubscriberState.AVAILABLE.value
_JOURNALLED = PublisherState.JOURNALLED.value

#: Ids per IN (...) list (Oracle allows at most 1000).
_CHUNK = 500

#: Tries of a commit_each whose transaction the database rolled back (deadlock).
_EACH_ATTEMPTS = 3

# Deadlocks and serialisation failures: the database rolled the transaction back.
_RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
_RETRYABLE_MYSQL = frozenset({1205, 1213})

_MSG_COLS = (
    "seq",
    "msg_id",
    "queue",
    "publisher",
    "ordering_key",
    "correlation_id",
    "priority",
    "audience_mode",
    "parents",
    "native_ref",
    "content_type",
    "body_size",
    "created_at",
    "expires_at",
    "max_attempts",
    "publisher_state",
    "withdrawn",
    "updated_at",
    "lock_id",
    "lock_owner",
    "lock_until",
    "version",
)
_MEMBER_COLS = (
    "subscriber",
    "pool",
    "state",
    "outcome",
    "attempt",
    "lease_token",
    "lease_owner",
    "lease_until",
    "not_before",
    "reason",
    "updated_at",
)
_N = len(_MSG_COLS)

_live: weakref.WeakSet[SqlStore] = weakref.WeakSet()


def _forget_after_fork() -> None:
    # A forked child must never use its parent's pooled connections.
    for store in list(_live):
        store._local = threading.local()
        for engine in (store.writer, store.reader):
            engine.dispose(close=False)


os.register_at_fork(after_in_child=_forget_after_fork)


def _sqlite_events(engine: Engine, *, writer: bool) -> None:
    """pysqlite: our own BEGIN (IMMEDIATE for writers, so two writers never deadlock on
    a lock upgrade), WAL, and savepoints that work (SQLAlchemy's documented recipe)."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        if writer:
            conn.exec_driver_sql("BEGIN IMMEDIATE")


class SqlStore(AvailableQueries):
    """The index in a SQL database (see the module docstring)."""

    def __init__(self, opts: SqlOptions) -> None:
        self.options = opts
        #: The URL with its password removed.
        self.url = opts.redacted
        self.tables: Tables = make_tables(opts.prefix, opts.schema)
        self._local = threading.local()
        self._password = opts.url.password or ""
        family = opts.family
        writer_args = dict(opts.engine_args)
        reader_args = dict(opts.engine_args)
        reader_args["pool_reset_on_return"] = None
        if family == "sqlite":
            reader_args["isolation_level"] = "AUTOCOMMIT"
        else:
            # Reads outside a transaction see the latest commits; writers use READ
            # COMMITTED everywhere (MySQL's default REPEATABLE READ takes gap locks).
            reader_args["isolation_level"] = "AUTOCOMMIT"
            writer_args["isolation_level"] = "READ COMMITTED"
        try:
            self.writer: Engine = sa.create_engine(opts.url, **writer_args)
            self.reader: Engine = sa.create_engine(opts.url, **reader_args)
        except ModuleNotFoundError as exc:
            raise ConfigurationError(
                f"the SQL index {self.url} needs the {exc.name!r} driver: "
                f"pip install 'iqbridge[{opts.extra}]'"
            ) from None
        except (TypeError, sa.exc.ArgumentError) as exc:
            raise ConfigurationError(f"SQL index {self.url}: {exc}") from None
        if family == "sqlite":
            from pathlib import Path

            parent = Path(opts.url.database or "").parent
            if not parent.exists():
                raise IndexUnavailable(
                    f"cannot open the SQL index {self.url}: directory {str(parent)!r} does "
                    f"not exist; create it or choose another path"
                )
            _sqlite_events(self.writer, writer=True)
            _sqlite_events(self.reader, writer=False)
        try:
            self.instance = ensure_schema(self.writer, self.reader, self.tables, opts)
        except TypeError as exc:  # an option the driver does not take
            self.close()
            raise ConfigurationError(f"SQL index {self.url}: {exc}") from None
        except sa.exc.SQLAlchemyError as exc:
            self.close()
            raise self._unavailable(exc, "cannot open") from None
        except BaseException:
            self.close()
            raise
        self._build_statements()
        _live.add(self)

    @classmethod
    def from_url(cls, url: str) -> SqlStore:
        """Open (and on first use create) the index a SQL URL names."""
        return cls(parse_sql_url(url))

    def __repr__(self) -> str:
        return f"<SqlStore {self.url}>"

    # --- statements ------------------------------------------------------------------------

    def _build_statements(self) -> None:
        t = self.tables
        msg, mem, jr = t.messages, t.members, t.journal
        bp = sa.bindparam
        cols = [msg.c[n] for n in _MSG_COLS] + [mem.c[n] for n in _MEMBER_COLS]
        self._load = (
            sa.select(*cols)
            .select_from(msg.join(mem, mem.c.msg_id == msg.c.msg_id))
            .where(msg.c.msg_id == bp("msg_id"))
            .order_by(mem.c.position)
        )
        self._load_locked = self._load.with_for_update()
        self._load_many = (
            sa.select(*cols)
            .select_from(msg.join(mem, mem.c.msg_id == msg.c.msg_id))
            .where(msg.c.msg_id.in_(bp("ids", expanding=True)))
            .order_by(msg.c.msg_id, mem.c.position)
        )
        self._load_many_locked = self._load_many.with_for_update()
        # The batch's rows in msg_id order, locked: two batches lock rows they share in
        # the same order, so they wait for each other instead of deadlocking.
        self._versions = (
            sa.select(msg.c.msg_id, msg.c.version)
            .where(msg.c.msg_id.in_(bp("ids", expanding=True)))
            .order_by(msg.c.msg_id)
            .with_for_update()
        )
        self._set_ref = (
            msg.update().where(msg.c.msg_id == bp("b_msg_id")).values(native_ref=bp("b_ref"))
        )
        pl = t.payloads
        self._retained = sa.select(pl.c.msg_id, pl.c.body, pl.c.headers).where(
            pl.c.msg_id.in_(bp("ids", expanding=True))
        )
        self._cas = (
            msg.update()
            .where(msg.c.msg_id == bp("b_msg_id"), msg.c.version == bp("b_expected"))
            .values(
                publisher_state=bp("b_pub"),
                withdrawn=bp("b_withdrawn"),
                updated_at=bp("b_updated"),
                lock_id=bp("b_lock_id"),
                lock_owner=bp("b_lock_owner"),
                lock_until=bp("b_lock_until"),
                version=bp("b_version"),
                next_due=bp("b_due"),
            )
        )
        self._member_update = (
            mem.update()
            .where(mem.c.msg_id == bp("b_msg_id"), mem.c.subscriber == bp("b_sub"))
            .values(
                state=bp("b_state"),
                outcome=bp("b_outcome"),
                attempt=bp("b_attempt"),
                lease_token=bp("b_token"),
                lease_owner=bp("b_owner"),
                lease_until=bp("b_until"),
                not_before=bp("b_not_before"),
                reason=bp("b_reason"),
                updated_at=bp("b_updated"),
            )
        )
        self._seqs = sa.select(msg.c.msg_id, msg.c.seq).where(
            msg.c.msg_id.in_(bp("ids", expanding=True))
        )
        # claimable / redeliverable: an index range of the claim order, joined to the
        # message for its time limit and browse lock (built once: they run on every get).
        now: sa.BindParameter[int] = bp("now")
        conds = [
            mem.c.queue == bp("q"),
            mem.c.subscriber == bp("s"),
            mem.c.state == _AVAILABLE,
            sa.or_(mem.c.not_before.is_(None), mem.c.not_before <= now),
            sa.or_(msg.c.expires_at.is_(None), msg.c.expires_at > now),
        ]
        claim = (
            sa.select(msg.c.msg_id)
            .select_from(mem.join(msg, msg.c.msg_id == mem.c.msg_id))
            .order_by(mem.c.neg_priority, mem.c.seq)
            .limit(bp("lim"))
        )
        unlocked = sa.or_(msg.c.lock_id.is_(None), msg.c.lock_until <= now)
        self._claim = claim.where(*conds, unlocked)
        self._redeliver = claim.where(*conds, unlocked, mem.c.attempt >= bp("att"))
        self._claim_locked = claim.where(
            *conds,
            msg.c.lock_id == bp("lock"),
            sa.or_(msg.c.lock_until.is_(None), msg.c.lock_until > now),
        )
        jcols = [jr.c[n] for n in ("seq", "msg_id", "queue", "actor", "actor_kind")]
        jcols += [jr.c[n] for n in ("src", "dst", "at", "attempt", "detail")]
        self._journal_cols = jcols

    # --- connections and transactions ------------------------------------------------------

    def atomic(self) -> _Atomic:
        """One database transaction for everything inside, on this thread's connection.

        Nested calls join the enclosing transaction (or the application's, under
        :meth:`join`); the outermost one commits, or rolls back on an exception.
        """
        return _Atomic(self)

    @contextmanager
    def join(self, connection: Connection) -> Iterator[None]:
        """Run this thread's index work on the application's ``connection`` meanwhile.

        Transitions made inside become part of the connection's current transaction:
        they commit or roll back with it; the store never commits it. Raises
        InvalidArgument if the connection cannot reach this index's tables (another
        database, schema or prefix).
        """
        local = self._local
        if getattr(local, "conn", None) is not None:
            if local.conn is connection:
                yield
                return
            raise InvalidArgument(
                "this thread is already inside an index transaction on another connection; "
                "finish it before joining the application's"
            )
        self.check_connection(connection)
        local.conn, local.depth, local.external = connection, 1, True
        try:
            yield
        finally:
            local.conn, local.depth, local.external = None, 0, False

    def check_connection(self, connection: Connection) -> None:
        """Raise InvalidArgument unless ``connection`` reaches this very index.

        The index's tables must be visible through it (same database, schema and table
        prefix) and hold this index's instance id. The answer is remembered per DBAPI
        connection. The check runs in a savepoint, so a failure leaves the application's
        transaction usable.
        """
        if not isinstance(connection, Connection):
            raise InvalidArgument(
                f"transaction= must be a SQLAlchemy Connection (or an iqbridge Transaction), "
                f"not {type(connection).__name__}"
            )
        key = ("iqbridge.index", self.instance)
        try:
            if connection.info.get(key):
                return
            meta = self.tables.meta
            found: str | None
            with connection.begin_nested() as sp:
                try:
                    found = connection.execute(
                        sa.select(meta.c.val).where(meta.c.name == "instance")
                    ).scalar()
                except sa.exc.DBAPIError as exc:
                    if exc.connection_invalidated:
                        raise
                    sp.rollback()
                    found = None
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc, "cannot check the connection of") from None
        if found != self.instance:
            raise InvalidArgument(
                f"the connection given (to {connection.engine.url.render_as_string()}) does not "
                f"reach the SQL index {self.url}: open it on the index's database (same "
                f"schema and prefix), so the transition can commit with your transaction"
            )
        connection.info[key] = True

    @contextmanager
    def _writing(self, savepoint: bool) -> Iterator[Connection]:
        """A connection in a transaction: this thread's, or a new one committed at exit.

        ``savepoint`` wraps the work in a savepoint when it joins an enclosing transaction,
        for work that may fail after writing something (a duplicate insert, several
        changes): the enclosing transaction stays usable and keeps its earlier work.
        """
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            if not savepoint:
                yield conn
                return
            sp = conn.begin_nested()
            try:
                yield conn
            except BaseException:
                if sp.is_active:
                    with suppress(sa.exc.SQLAlchemyError):
                        sp.rollback()
                raise
            sp.commit()
            return
        with self.writer.begin() as conn:
            yield conn

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            yield conn
            return
        with self.reader.connect() as conn:
            yield conn

    def _unavailable(self, exc: BaseException, what: str = "") -> IQError:
        orig = getattr(exc, "orig", None)
        text = str(orig if orig is not None else exc).strip()
        if self._password:
            text = text.replace(self._password, "***")
        reason = " ".join(text.split()) or type(exc).__name__
        if isinstance(exc, sa.exc.DataError):
            return InvalidArgument(
                f"SQL index {self.url}: a value does not fit its column ({reason}); "
                f"see docs/index-stores.md for the column sizes"
            )
        prefix = f"{what} the SQL index" if what else "SQL index"
        return IndexUnavailable(f"{prefix} {self.url}: {reason}")

    def _translate(self, exc: sa.exc.SQLAlchemyError, msg_id: str) -> Exception:
        """What a failed write raises: StaleRecord where retrying is safe, else an IQError."""
        if _retryable(exc):
            if getattr(self._local, "conn", None) is None:
                # The whole transaction was ours and is rolled back: re-read and retry.
                return StaleRecord(msg_id)
            # The enclosing transaction is lost: only its owner can start over.
            return ConcurrentUpdate(msg_id, 1)
        return self._unavailable(exc)

    # --- commit ----------------------------------------------------------------------------

    def commit(self, change: Change) -> None:
        """Persist one change with compare-and-set (see the module docstring)."""
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
        for _ in range(_EACH_ATTEMPTS):
            for change, seq in zip(changes, seqs, strict=True):
                change.record.seq = seq  # as it was before a try that was rolled back
            try:
                with self._writing(savepoint=True) as conn:
                    return self._commit_each(conn, changes)
            except StaleRecord:
                pass  # rows changed under the lock (not expected): all was rolled back
            except sa.exc.SQLAlchemyError as exc:
                err = self._translate(exc, changes[0].msg_id)
                if not isinstance(err, StaleRecord):
                    raise err from None
        raise ConcurrentUpdate(changes[0].msg_id, _EACH_ATTEMPTS)

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
        rows = [_message_row(c.record) for c in creates]
        msg = self.tables.messages
        if len(rows) == 1:
            result = conn.execute(msg.insert(), rows[0])
            key = result.inserted_primary_key
            creates[0].record.seq = int(key[0]) if key is not None else None
        else:
            conn.execute(msg.insert(), rows)
        if any(c.record.seq is None for c in creates) or len(rows) > 1:
            seqs: dict[str, int] = {}
            ids = [c.msg_id for c in creates]
            for i in range(0, len(ids), _CHUNK):
                for mid, seq in conn.execute(self._seqs, {"ids": ids[i : i + _CHUNK]}):
                    seqs[mid] = int(seq)
            for c in creates:
                c.record.seq = seqs[c.msg_id]
        members: list[dict[str, Any]] = []
        for c in creates:
            rec = c.record
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
        payloads = [
            {
                "msg_id": c.msg_id,
                "body": bytes(c.retain.body),
                "headers": encode(dict(c.retain.headers)),
            }
            for c in creates
            if c.retain is not None
        ]
        if payloads:
            conn.execute(self.tables.payloads.insert(), payloads)

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
                        out[mid] = Retained(bytes(body), json.loads(headers))
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from None
        return out

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
        return [summary(_record([(*h, *m) for m in found.get(h[1], ())], head=h)) for h in heads]

    # --- purge, queues, subscriptions ------------------------------------------------------

    def purge(self, queue: str, before: int, limit: int = 1000) -> list[PurgedMessage]:
        """Delete journalled messages last changed before ``before``; keep the journal."""
        msg, mem, pl = self.tables.messages, self.tables.members, self.tables.payloads
        stmt = (
            sa.select(msg.c.seq, msg.c.msg_id, msg.c.native_ref)
            .where(
                msg.c.queue == queue,
                msg.c.publisher_state == _JOURNALLED,
                msg.c.updated_at < before,
            )
            .order_by(msg.c.seq)
            .limit(limit)
        )
        try:
            with self._writing(savepoint=True) as conn:
                rows = conn.execute(stmt).all()
                for i in range(0, len(rows), _CHUNK):
                    ids = [r[1] for r in rows[i : i + _CHUNK]]
                    conn.execute(mem.delete().where(mem.c.msg_id.in_(ids)))
                    conn.execute(pl.delete().where(pl.c.msg_id.in_(ids)))
                    conn.execute(msg.delete().where(msg.c.msg_id.in_(ids)))
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from None
        return [PurgedMessage(r[1], r[2]) for r in rows]

    def declare_queue(self, queue: str) -> None:
        """Make the queue known (idempotent, also between processes)."""
        q = self.tables.queues
        try:
            with self._reading() as conn:
                if conn.execute(sa.select(q.c.name).where(q.c.name == queue)).first():
                    return
            with self._writing(savepoint=True) as conn:
                conn.execute(q.insert().values(name=queue, subscriptions="{}"))
        except sa.exc.IntegrityError:
            return  # declared meanwhile by someone else
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from None

    def queues(self) -> list[str]:
        """Known queues."""
        q = self.tables.queues
        return self._ids(sa.select(q.c.name).order_by(q.c.name))

    def subscriptions(self, queue: str) -> Subscriptions:
        """Standing audience of a queue."""
        q = self.tables.queues
        try:
            with self._reading() as conn:
                body = conn.execute(sa.select(q.c.subscriptions).where(q.c.name == queue)).scalar()
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from None
        return Subscriptions() if body is None else subscriptions_from_json(body)

    def set_subscriptions(self, queue: str, subs: Subscriptions) -> None:
        """Replace the standing audience."""
        q = self.tables.queues
        body = subscriptions_to_json(subs)
        update = q.update().where(q.c.name == queue).values(subscriptions=body)
        for _ in range(3):
            try:
                with self._writing(savepoint=True) as conn:
                    if conn.execute(update).rowcount == 1:
                        return
                    conn.execute(q.insert().values(name=queue, subscriptions=body))
                    return
            except sa.exc.IntegrityError:
                continue  # inserted meanwhile: update it
            except sa.exc.SQLAlchemyError as exc:
                raise self._unavailable(exc) from None
        raise ConcurrentUpdate(f"(subscriptions of queue {queue})", 3)

    def close(self) -> None:
        """Release the connection pools."""
        _live.discard(self)
        for name in ("writer", "reader"):
            engine: Engine | None = getattr(self, name, None)
            if engine is not None:
                engine.dispose()


class _Atomic:
    """The context manager behind :meth:`SqlStore.atomic`."""

    __slots__ = ("store",)

    def __init__(self, store: SqlStore) -> None:
        self.store = store

    def __enter__(self) -> None:
        store = self.store
        local = store._local
        if getattr(local, "conn", None) is not None:
            local.depth += 1
            return
        try:
            conn = store.writer.connect()
            conn.begin()
        except sa.exc.SQLAlchemyError as exc:
            raise store._unavailable(exc) from None
        local.conn, local.depth, local.external = conn, 1, False

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        store = self.store
        local = store._local
        local.depth -= 1
        if local.depth > 0:
            return
        conn: Connection = local.conn
        local.conn = None
        try:
            if exc is None:
                try:
                    conn.commit()
                except sa.exc.SQLAlchemyError as err:
                    if _retryable(err):
                        raise ConcurrentUpdate("(transaction)", 1) from None
                    raise store._unavailable(err) from None
            else:
                with suppress(sa.exc.SQLAlchemyError):  # the original exception says more
                    conn.rollback()
        finally:
            with suppress(sa.exc.SQLAlchemyError):
                conn.close()


def _retryable(exc: sa.exc.SQLAlchemyError) -> bool:
    orig = getattr(exc, "orig", None)
    if orig is None:
        return False
    if getattr(orig, "sqlstate", None) in _RETRYABLE_SQLSTATES:
        return True
    args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
    return bool(args) and args[0] in _RETRYABLE_MYSQL


def _cas_row(change: Change) -> dict[str, Any]:
    """The parameters of the compare-and-set update of a change's message row."""
    rec = change.record
    return {
        "b_msg_id": rec.msg_id,
        "b_expected": change.expected_version,
        "b_pub": rec.publisher_state,
        "b_withdrawn": int(rec.withdrawn),
        "b_updated": rec.updated_at,
        "b_lock_id": rec.lock_id,
        "b_lock_owner": rec.lock_owner,
        "b_lock_until": rec.lock_until,
        "b_version": rec.version,
        "b_due": rec.due_at(),
    }


def _member_rows(change: Change) -> list[dict[str, Any]]:
    """The parameters of the updates of the member rows a change moved."""
    rec = change.record
    rows = []
    for name in sorted(change.dirty):
        m = rec.members[name]
        rows.append(
            {
                "b_msg_id": rec.msg_id,
                "b_sub": name,
                "b_state": m.state,
                "b_outcome": m.outcome,
                "b_attempt": m.attempt,
                "b_token": m.lease_token,
                "b_owner": m.lease_owner,
                "b_until": m.lease_until,
                "b_not_before": m.not_before,
                "b_reason": m.reason,
                "b_updated": m.updated_at,
            }
        )
    return rows


def _message_row(rec: MessageRecord) -> dict[str, Any]:
    return {
        "msg_id": rec.msg_id,
        "queue": rec.queue,
        "publisher": rec.publisher,
        "ordering_key": rec.ordering_key,
        "correlation_id": rec.correlation_id,
        "priority": rec.priority,
        "audience_mode": rec.mode.value,
        "parents": json.dumps(list(rec.parents)) if rec.parents else None,
        "native_ref": rec.native_ref,
        "content_type": rec.content_type,
        "body_size": rec.size,
        "created_at": rec.created_at,
        "expires_at": rec.expires_at,
        "max_attempts": rec.max_attempts,
        "publisher_state": rec.publisher_state,
        "withdrawn": int(rec.withdrawn),
        "updated_at": rec.updated_at,
        "lock_id": rec.lock_id,
        "lock_owner": rec.lock_owner,
        "lock_until": rec.lock_until,
        "version": rec.version,
        "next_due": rec.due_at(),
    }


def _record(rows: Sequence[Sequence[Any]], head: Sequence[Any] | None = None) -> MessageRecord:
    """A record from rows of message columns followed by one member's columns each."""
    r = head if head is not None else rows[0]
    members: dict[str, Member] = {}
    for row in rows:
        m = Member.__new__(Member)
        m.__dict__.update(
            subscriber=row[_N],
            pool=row[_N + 1],
            state=_SUB[row[_N + 2]] if row[_N + 2] else None,
            outcome=_SUB[row[_N + 3]] if row[_N + 3] else None,
            attempt=row[_N + 4],
            lease_token=row[_N + 5],
            lease_owner=row[_N + 6],
            lease_until=row[_N + 7],
            not_before=row[_N + 8],
            reason=row[_N + 9],
            updated_at=row[_N + 10],
        )
        members[m.subscriber] = m
    rec = MessageRecord.__new__(MessageRecord)
    rec.__dict__.update(
        seq=int(r[0]),
        msg_id=r[1],
        queue=r[2],
        publisher=r[3],
        ordering_key=r[4],
        correlation_id=r[5],
        priority=r[6],
        mode=_MODE[r[7]],
        parents=tuple(json.loads(r[8])) if r[8] else (),
        native_ref=r[9],
        content_type=r[10],
        size=r[11],
        created_at=r[12],
        expires_at=r[13],
        max_attempts=r[14],
        publisher_state=_PUB[r[15]] if r[15] else None,
        withdrawn=bool(r[16]),
        updated_at=r[17],
        lock_id=r[18],
        lock_owner=r[19],
        lock_until=r[20],
        version=r[21],
        members=members,
    )
    return rec
