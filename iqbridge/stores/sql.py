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
:meth:`SqlStore.commit_writes` (a batch's writes with its journal as templates, see
:mod:`iqbridge.stores.sql_writes`) locks the same way and then writes each table with one
statement per batch, the rows as one JSON parameter (PostgreSQL, MariaDB), and expands
the journal templates to one row per message per transition in the database. A batch's
claim or settle is made where the messages are kept, by a plan from the transition table
and without a record per message (:mod:`iqbridge.stores.sql_claim`).
:meth:`SqlStore.atomic` opens a real transaction on a connection of the calling thread;
nested calls join it.

Exactly-once with the caller's own transaction: :meth:`SqlStore.join` lends the store a
connection of the application (checked to reach this index's tables), so a transition
runs inside the application's transaction and commits or rolls back with its business
rows (see :class:`iqbridge.transaction.Transaction`).

Oracle goes through the same code and only uses what SQLAlchemy's Oracle dialect
renders (identity columns need Oracle 12c or later; Oracle stores an empty string or
RAW as NULL: an empty retained body reads back as ``b""``, and the facade never stores an
empty ordering key). Here it runs against the fake python-oracledb
(:mod:`iqbridge.testing.fakes.oracledb_sql`), live only under Docker.

The store is :class:`SqlStore`, composed of its parts: engines, statements, connections
and transactions (:mod:`iqbridge.stores.sql_base`), the write path
(:mod:`iqbridge.stores.sql_commit`, and for batches :mod:`iqbridge.stores.sql_writes`
with the statements of :mod:`iqbridge.stores.sql_statements`), the reads
(:mod:`iqbridge.stores.sql_reads`), the claims and settles made in place
(:mod:`iqbridge.stores.sql_claim`) and the row conversions (:mod:`iqbridge.stores.sql_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from iqbridge.errors import ConcurrentUpdate
from iqbridge.model import Subscriptions
from iqbridge.states import PublisherState
from iqbridge.stores.base import AvailableQueries, PurgedMessage
from iqbridge.stores.codec import subscriptions_from_json, subscriptions_to_json
from iqbridge.stores.sql_claim import SqlClaims
from iqbridge.stores.sql_reads import SqlReads
from iqbridge.stores.sql_rows import _CHUNK
from iqbridge.stores.sql_schema import parse_sql_url

__all__ = ["SqlStore"]

_JOURNALLED = PublisherState.JOURNALLED.value


class SqlStore(SqlClaims, SqlReads, AvailableQueries):
    """The index in a SQL database (see the module docstring)."""

    #: Gaps in the journal's sequence may fill for this long (LateJournal): sequence
    #: numbers come from an identity column, taken when a transaction writes.
    journal_settle_seconds = 60.0

    @classmethod
    def from_url(cls, url: str) -> SqlStore:
        """Open (and on first use create) the index a SQL URL names."""
        return cls(parse_sql_url(url))

    def __repr__(self) -> str:
        return f"<SqlStore {self.url}>"

    # --- purge, queues, subscriptions ------------------------------------------------------

    def purge(
        self,
        queue: str,
        before: int,
        limit: int = 1000,
        ids: Sequence[str] | None = None,
    ) -> list[PurgedMessage]:
        """Delete journalled messages last changed before ``before`` (only ``ids``, if
        given); keep the journal.

        The candidates' rows are locked (``SELECT ... FOR UPDATE``, in msg_id order, as
        the batch commits lock theirs) and checked again before they are deleted, so a
        message a concurrent commit moved out of JOURNALLED (a re-reveal) is kept.
        """
        if limit <= 0 or (ids is not None and not ids):
            return []
        msg, mem, pl = self.tables.messages, self.tables.members, self.tables.payloads
        purgeable = (
            msg.c.queue == queue,
            msg.c.publisher_state == _JOURNALLED,
            msg.c.updated_at < before,
        )
        try:
            with self._writing(savepoint=True) as conn:
                if ids is None:
                    oldest = (
                        sa.select(msg.c.msg_id).where(*purgeable).order_by(msg.c.seq).limit(limit)
                    )
                    candidates = sorted(r[0] for r in conn.execute(oldest))
                else:
                    candidates = sorted(set(ids))
                rows: list[tuple[int, str, str | None]] = []
                for i in range(0, len(candidates), _CHUNK):
                    locked = (
                        sa.select(msg.c.seq, msg.c.msg_id, msg.c.native_ref)
                        .where(msg.c.msg_id.in_(candidates[i : i + _CHUNK]), *purgeable)
                        .order_by(msg.c.msg_id)
                        .with_for_update()
                    )
                    rows.extend((seq, mid, ref) for seq, mid, ref in conn.execute(locked))
                rows = sorted(rows, key=lambda r: r[0])[:limit]
                for i in range(0, len(rows), _CHUNK):
                    gone = [r[1] for r in rows[i : i + _CHUNK]]
                    conn.execute(mem.delete().where(mem.c.msg_id.in_(gone)))
                    conn.execute(pl.delete().where(pl.c.msg_id.in_(gone)))
                    conn.execute(msg.delete().where(msg.c.msg_id.in_(gone)))
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
