"""Exactly-once effect with the subscriber's own database transaction (seed 002, delivery side).

When the index is a SQL store in the subscriber's own database, the DONE transition of a
delivery (its compare-and-set and journal rows) can run on the application's connection,
inside the transaction that holds the business writes: both commit, or neither does. A
subscriber that dies before the commit leaves the message held (FETCHED) under its
lease, with no business rows; when the lease runs out the message is delivered again
(attempt + 1). A redelivery of a message whose DONE committed is never processed again.

Two ways to use it (docs/api.md, section "Exactly-once with your own transaction")::

    with queue.transaction(app_engine) as tx:       # begins; commits on a clean exit
        tx.connection.execute(invoices.insert().values(...))
        delivery.done(transaction=tx)               # DONE commits with the invoice
    # after the commit: the broker acknowledgement (brokers with consumer groups)

    with app_engine.connect() as conn:              # or your own connection and commit
        conn.execute(invoices.insert().values(...))
        delivery.done(transaction=conn)
        conn.commit()

With a bare connection iqbridge cannot see the commit, so it sends no broker
acknowledgement; a broker with consumer groups hands the entry over again later and the
once-only rule acknowledges it then, unprocessed. :meth:`Queue.transaction` acknowledges
right after the commit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from iqbridge.errors import ConfigurationError, IndexUnavailable, InvalidArgument, IQError
from iqbridge.redaction import get_logger

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from iqbridge.stores.base import IndexStore

__all__ = ["Binding", "Transaction", "driver_connection", "join"]

log = get_logger("iqbridge")

_ACTIVE = "iqbridge.transaction"


class _Joinable(Protocol):
    url: str

    def _unavailable(self, exc: BaseException, what: str = "") -> IQError: ...

    def join(self, connection: Connection) -> contextlib.AbstractContextManager[None]: ...

    def check_connection(self, connection: Connection) -> None: ...


def _joinable(store: IndexStore) -> _Joinable:
    if not (hasattr(store, "join") and hasattr(store, "check_connection")):
        raise ConfigurationError(
            f"the index {store.url} cannot join your database transaction; exactly-once "
            f"with your own transaction needs the index in your database: a SQL index "
            f"(postgresql://, mysql://, mariadb://, sql+sqlite://, oracle://)"
        )
    return store  # type: ignore[return-value]


class Transaction:
    """A transaction of the application's database that deliveries can finish in.

    Made by :meth:`iqbridge.Queue.transaction` with a SQLAlchemy ``Engine`` (a
    connection is opened, and closed at the end) or ``Connection`` (which must not have
    a transaction open yet). Entering begins the transaction; a clean exit commits it,
    an exception rolls it back and propagates. Pass it (or its connection) to
    :meth:`Delivery.done(transaction=...) <iqbridge.Delivery.done>`. Broker
    acknowledgements of the deliveries finished in it are sent after the commit; after
    a rollback the deliveries are still held, as before ``done``.

    If the database connection dies in the block, leaving raises
    :class:`~iqbridge.errors.IndexUnavailable` (when the commit fails; an exception of
    your own propagates as it is), nothing is acknowledged, and every delivery finished
    in it says again what the index says (still held, unless a commit cut short did
    take effect).
    """

    def __init__(self, store: IndexStore, target: Any) -> None:
        self._store = _joinable(store)
        self._target = target
        self._conn: Connection | None = None
        self._info: dict[Any, Any] = {}
        self._owned = False
        self._after_commit: list[Callable[[], None]] = []
        self._on_rollback: list[Callable[[], None]] = []
        #: True once a commit failed: whether it took effect is for the index to say.
        self.commit_failed = False

    @property
    def connection(self) -> Connection:
        """The connection to write your rows on (inside the ``with`` block)."""
        if self._conn is None:
            raise InvalidArgument("use the transaction inside its with block")
        return self._conn

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the transaction has committed."""
        self._after_commit.append(callback)

    def on_rollback(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` if the transaction rolls back."""
        self._on_rollback.append(callback)

    def __enter__(self) -> Transaction:
        from sqlalchemy.engine import Connection, Engine

        target = self._target
        if isinstance(target, Engine):
            conn = target.connect()
            self._owned = True
        elif isinstance(target, Connection):
            conn = target
            if conn.in_transaction():
                raise InvalidArgument(
                    "the connection already has a transaction open; commit or roll it back "
                    "before queue.transaction(connection), or pass transaction=connection to "
                    "delivery.done() and commit it yourself"
                )
        else:
            raise InvalidArgument(
                f"queue.transaction() takes a SQLAlchemy Engine or Connection, not "
                f"{type(target).__name__}"
            )
        try:
            conn.begin()
            self._store.check_connection(conn)
        except BaseException:
            if conn.in_transaction():
                conn.rollback()
            if self._owned:
                conn.close()
            raise
        # Kept apart: a connection that died cannot even show its info dict.
        self._info = conn.info
        self._info[_ACTIVE] = self
        self._conn = conn
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        from sqlalchemy.exc import SQLAlchemyError

        conn = self.connection
        self._conn = None
        self._info.pop(_ACTIVE, None)
        try:
            if exc is None:
                try:
                    conn.commit()
                except SQLAlchemyError as err:
                    self.commit_failed = True
                    self._quiet_rollback(conn)
                    raise self._lost(err) from err
                except BaseException:
                    self.commit_failed = True
                    self._quiet_rollback(conn)
                    raise
                for callback in self._after_commit:
                    callback()
            else:
                self._quiet_rollback(conn)  # the exception in flight says more
        finally:
            self._after_commit.clear()
            if self._owned:
                with contextlib.suppress(SQLAlchemyError):
                    conn.close()

    def _quiet_rollback(self, conn: Connection) -> None:
        """Roll back (a dead connection cannot, and need not: the server has), then let
        every delivery finished in the transaction go back to what the index holds."""
        from sqlalchemy.exc import SQLAlchemyError

        try:
            with contextlib.suppress(SQLAlchemyError):
                conn.rollback()
        finally:
            self._rolled_back()

    def _lost(self, err: BaseException) -> IndexUnavailable:
        # The store's own wording, its password removed.
        why = self._store._unavailable(err, "the commit of your transaction failed on")
        return IndexUnavailable(
            f"{why}; it was rolled back, or, if the connection was lost during the commit, "
            f"may have taken effect: the deliveries finished in it say what the index holds "
            f"now, and nothing was acknowledged. Settle again the deliveries still held once "
            f"the database answers"
        )

    def _rolled_back(self) -> None:
        for callback in self._on_rollback:
            callback()
        self._on_rollback.clear()


class Binding:
    """What one transition made in an application transaction may leave for later."""

    def __init__(self, tx: Transaction | None) -> None:
        self.tx = tx

    def after_commit(self, callback: Callable[[], None]) -> None:
        if self.tx is not None:
            self.tx.after_commit(callback)
        else:
            log.debug("acknowledgement left to the broker's redelivery (bare connection)")

    def on_rollback(self, callback: Callable[[], None]) -> None:
        if self.tx is not None:
            self.tx.on_rollback(callback)


@contextlib.contextmanager
def join(store: IndexStore, transaction: Any) -> Iterator[Binding]:
    """Run the index work inside on the application transaction ``transaction``.

    ``transaction`` is a :class:`Transaction` (inside its block) or a SQLAlchemy
    ``Connection``. Raises ConfigurationError if the index is not a SQL store, and
    InvalidArgument if the connection does not reach the index's tables.
    """
    joinable = _joinable(store)
    if isinstance(transaction, Transaction):
        tx: Transaction | None = transaction
        conn = transaction.connection
    else:
        conn = transaction
        info = getattr(conn, "info", None)
        tx = info.get(_ACTIVE) if isinstance(info, dict) else None
    with joinable.join(conn):
        yield Binding(tx)


def driver_connection(transaction: object) -> object | None:
    """The driver's own connection (python-oracledb's, psycopg's, ...) under the
    application transaction ``transaction`` (a :class:`Transaction` inside its block or
    a SQLAlchemy ``Connection``), or None."""
    conn = transaction.connection if isinstance(transaction, Transaction) else transaction
    pooled = getattr(conn, "connection", None)
    found: object | None = getattr(pooled, "driver_connection", None)
    return found
