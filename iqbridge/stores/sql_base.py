"""The base of the SQL index store (:mod:`iqbridge.stores.sql`): its engines, the
statements it prepares once, and its connections and transactions (:meth:`atomic`,
:meth:`join` of the application's connection, and how driver errors are reported).

The store's write path is in :mod:`iqbridge.stores.sql_commit` and its reads in
:mod:`iqbridge.stores.sql_reads`; both build on :class:`SqlStoreBase`.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import TracebackType
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from iqbridge.errors import (
    ConcurrentUpdate,
    ConfigurationError,
    IndexUnavailable,
    InvalidArgument,
    IQError,
)
from iqbridge.states import SubscriberState
from iqbridge.stores.base import StaleRecord
from iqbridge.stores.sql_rows import _MEMBER_COLS, _MSG_COLS
from iqbridge.stores.sql_schema import SqlOptions, Tables, ensure_schema, make_tables

__all__ = ["SqlStoreBase"]

_AVAILABLE = SubscriberState.AVAILABLE.value

# Deadlocks and serialisation failures: the database rolled the transaction back.
_RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
_RETRYABLE_MYSQL = frozenset({1205, 1213})

_live: weakref.WeakSet[SqlStoreBase] = weakref.WeakSet()


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


class SqlStoreBase:
    """Engines, statements, connections and transactions of
    :class:`~iqbridge.stores.sql.SqlStore` (see :mod:`iqbridge.stores.sql`)."""

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
            self.instance = self._first_use(family)
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

    def _first_use(self, family: str) -> str:
        """Create or migrate the schema. On an SQLite file opened by several processes at
        once, a connection can find the file locked without SQLite's busy handler being
        asked (switching a new file to WAL, or while another one recovers its WAL index):
        that is retried for a few seconds, not reported."""
        deadline = time.monotonic() + 10.0
        while True:
            try:
                return ensure_schema(self.writer, self.reader, self.tables, self.options)
            except sa.exc.OperationalError as exc:
                locked = family == "sqlite" and "locked" in str(exc.orig)
                if not locked or time.monotonic() >= deadline:
                    raise
                self.writer.dispose()
                self.reader.dispose()
                time.sleep(0.05)

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

    def close(self) -> None:
        """Release the connection pools."""
        _live.discard(self)
        for name in ("writer", "reader"):
            engine: Engine | None = getattr(self, name, None)
            if engine is not None:
                engine.dispose()


class _Atomic:
    """The context manager behind :meth:`SqlStoreBase.atomic`."""

    __slots__ = ("store",)

    def __init__(self, store: SqlStoreBase) -> None:
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
