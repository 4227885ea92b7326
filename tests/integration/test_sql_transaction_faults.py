"""Settling in the application's own transaction when things go wrong.

- The database connection dies inside ``queue.transaction``: the caller gets a typed
  IndexUnavailable (not a raw SQLAlchemy error), nothing is committed, every delivery's
  state matches the index (FETCHED, still held), and settling again works at once.
- A batch settled in the transaction finds some leases taken over: by default it raises
  (so the business rows of the whole transaction roll back); ``partial=True`` commits
  the rest and reports the lost ones in ``Settled.lost``.

On PostgreSQL and MariaDB (where a server-side kill cuts the application's connection)
and, for the lease part, an SQLite file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from sql_workers import business_table

import iqbridge
from iqbridge import SubscriberState
from iqbridge.errors import BatchLeaseLost, IndexUnavailable, LeaseLost
from iqbridge.stores.sql import SqlStore
from iqbridge.testing import FakeClock
from tests.sql_helpers import MARIADB_URL, PG_URL, fresh_schema, sa_url

S = SubscriberState


@dataclass
class Db:
    """A SQL index in the business database, and a way to cut a connection to it."""

    broker: str
    index: str
    app: sa.Engine
    schema: str | None
    cut: Callable[[sa.Connection], None]

    def table(self) -> sa.Table:
        table = business_table(self.schema)
        table.create(self.app, checkfirst=True)
        return table

    def rows(self, table: sa.Table) -> list[str]:
        with self.app.connect() as conn:
            return [r.msg_id for r in conn.execute(sa.select(table))]


def _killer(server: str) -> Callable[[sa.Connection], None]:
    """Cut ``conn`` from the server side, as a failover or an operator would."""
    admin = sa.create_engine(sa_url(server), isolation_level="AUTOCOMMIT")

    def cut(conn: sa.Connection) -> None:
        if server.startswith("postgres"):
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            with admin.connect() as other:
                other.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid or 0)})")
        else:
            cid = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
            with admin.connect() as other:
                other.exec_driver_sql(f"KILL {int(cid or 0)}")

    return cut


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ]
)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    server, what = (
        (PG_URL, "PostgreSQL at 127.0.0.1:5432")
        if request.param == "postgres"
        else (MARIADB_URL, "MariaDB at 127.0.0.1:3306")
    )
    with fresh_schema(server, what, "iqtf") as index:
        SqlStore.from_url(index).close()  # creates the schema
        app = sa.create_engine(sa_url(server))
        try:
            yield Db(
                f"sqlite:///{tmp_path / 'queue.db'}",
                index,
                app,
                index.rsplit("=", 1)[1],
                _killer(server),
            )
        finally:
            app.dispose()


def _index_states(q: iqbridge.Queue, ids: list[str]) -> list[SubscriberState]:
    return [q.state(i).subscribers["billing"].state for i in ids]


def test_a_connection_cut_before_the_commit_raises_index_unavailable(db: Db) -> None:
    table = db.table()
    with iqbridge.connect(db.broker, index=db.index) as hub:
        q = hub.queue("orders")
        ids = q.put_many([f"order {i}" for i in range(5)], to=["billing"])
        batch = q.get_many("billing", 5)
        assert [d.msg_id for d in batch] == ids
        with pytest.raises(IndexUnavailable, match="connection"), q.transaction(db.app) as tx:
            for d in batch:
                tx.connection.execute(table.insert().values(msg_id=d.msg_id, attempt=1, pid=1))
            settled = batch.done(transaction=tx)
            assert settled.done == ids
            assert {d.state for d in batch} == {S.JOURNALLED}
            db.cut(tx.connection)
        # Nothing committed; every delivery says what the index says: still held.
        assert db.rows(table) == []
        assert _index_states(q, ids) == [S.FETCHED] * 5
        assert [d.state for d in batch] == [S.FETCHED] * 5
        # And the batch can be settled again at once, not after its lease.
        with q.transaction(db.app) as tx:
            for d in batch:
                tx.connection.execute(table.insert().values(msg_id=d.msg_id, attempt=1, pid=2))
            assert batch.done(transaction=tx).done == ids
        assert sorted(db.rows(table)) == sorted(ids)
        assert _index_states(q, ids) == [S.JOURNALLED] * 5


def test_a_connection_cut_before_done_raises_index_unavailable(db: Db) -> None:
    with iqbridge.connect(db.broker, index=db.index) as hub:
        q = hub.queue("orders")
        msg_id = q.put(b"order 1", to=["billing"])
        d = q.get("billing")
        assert d is not None
        with pytest.raises(IndexUnavailable), q.transaction(db.app) as tx:
            db.cut(tx.connection)
            d.done(transaction=tx)
        assert d.state is S.FETCHED
        assert _index_states(q, [msg_id]) == [S.FETCHED]
        d.done()
        assert _index_states(q, [msg_id]) == [S.JOURNALLED]


def test_the_application_error_is_not_hidden_by_a_dead_connection(db: Db) -> None:
    with iqbridge.connect(db.broker, index=db.index) as hub:
        q = hub.queue("orders")
        msg_id = q.put(b"order 1", to=["billing"])
        d = q.get("billing")
        assert d is not None
        with pytest.raises(RuntimeError, match="business rule"), q.transaction(db.app) as tx:
            d.done(transaction=tx)
            db.cut(tx.connection)
            raise RuntimeError("business rule broken")
        assert d.state is S.FETCHED
        assert _index_states(q, [msg_id]) == [S.FETCHED]


# --- leases lost in a batch settled in the application's transaction ---------------------


@pytest.fixture(
    params=[
        pytest.param("sqlite"),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def lease_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    broker = f"sqlite:///{tmp_path / 'queue.db'}"
    if request.param == "sqlite":
        app = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
        try:
            yield Db(broker, f"sql+sqlite:///{tmp_path / 'app.db'}", app, None, lambda c: None)
        finally:
            app.dispose()
        return
    with fresh_schema(PG_URL, "PostgreSQL at 127.0.0.1:5432", "iqtf") as index:
        SqlStore.from_url(index).close()
        app = sa.create_engine(sa_url(PG_URL))
        try:
            yield Db(broker, index, app, index.rsplit("=", 1)[1], _killer(PG_URL))
        finally:
            app.dispose()


def _batch_with_two_lost(
    hub: iqbridge.Hub, clock: FakeClock
) -> tuple[iqbridge.Queue, list[str], iqbridge.Batch]:
    """A batch of 4 whose first two deliveries' leases ran out and were taken again."""
    q = hub.queue("orders", lease=30, sweep_interval=0)
    ids = q.put_many([f"order {i}" for i in range(4)], to=["billing"])
    batch = q.get_many("billing", 4)
    assert [d.msg_id for d in batch] == ids
    for d in batch[2:]:
        d.renew(lease=120)  # the last two stay ours
    clock.advance(31)
    again = q.get_many("billing", 4)  # attempt 2 of the first two
    assert [(d.msg_id, d.attempt) for d in again] == [(ids[0], 2), (ids[1], 2)]
    return q, ids, batch


def test_a_batch_with_lost_leases_raises_and_commits_no_business_row(lease_db: Db) -> None:
    table = lease_db.table()
    clock = FakeClock()
    with iqbridge.connect(lease_db.broker, index=lease_db.index, clock=clock) as hub:
        q, ids, batch = _batch_with_two_lost(hub, clock)
        with pytest.raises(BatchLeaseLost) as caught, q.transaction(lease_db.app) as tx:
            for d in batch:
                tx.connection.execute(table.insert().values(msg_id=d.msg_id, attempt=1, pid=1))
            batch.done(transaction=tx)
        assert isinstance(caught.value, LeaseLost)
        assert sorted(caught.value.lost) == sorted(ids[:2])
        assert "partial=True" in str(caught.value)
        assert lease_db.rows(table) == []
        # The two still held are untouched and can be settled again.
        assert [d.state for d in batch][2:] == [S.FETCHED, S.FETCHED]
        assert _index_states(q, ids[2:]) == [S.FETCHED, S.FETCHED]
        assert batch.done().done == ids[2:]


def test_a_batch_with_lost_leases_commits_the_rest_with_partial(lease_db: Db) -> None:
    table = lease_db.table()
    clock = FakeClock()
    with iqbridge.connect(lease_db.broker, index=lease_db.index, clock=clock) as hub:
        q, ids, batch = _batch_with_two_lost(hub, clock)
        with q.transaction(lease_db.app) as tx:
            settled = batch.done(transaction=tx, partial=True)
            assert sorted(settled.lost) == sorted(ids[:2])
            for msg_id in settled.done:
                tx.connection.execute(table.insert().values(msg_id=msg_id, attempt=1, pid=1))
        assert settled.done == ids[2:]
        assert sorted(lease_db.rows(table)) == sorted(ids[2:])
        assert _index_states(q, ids[2:]) == [S.JOURNALLED, S.JOURNALLED]
        assert _index_states(q, ids[:2]) == [S.FETCHED, S.FETCHED]  # the new holder's


def test_a_batch_with_lost_leases_outside_a_transaction_still_reports(tmp_path: Path) -> None:
    clock = FakeClock()
    with iqbridge.connect(f"sqlite:///{tmp_path / 'q.db'}", clock=clock) as hub:
        _q, ids, batch = _batch_with_two_lost(hub, clock)
        settled = batch.done()  # nothing of the application's to roll back: report
        assert sorted(settled.lost) == sorted(ids[:2])
        assert settled.done == ids[2:]


@pytest.mark.postgres
def test_a_commit_cut_short_after_it_took_effect_leaves_deliveries_as_the_index_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection is lost after the server committed but before the client heard:
    the caller gets IndexUnavailable, and the deliveries say JOURNALLED, as the index."""
    import psycopg

    with fresh_schema(PG_URL, "PostgreSQL at 127.0.0.1:5432", "iqtf") as index:
        SqlStore.from_url(index).close()
        app = sa.create_engine(sa_url(PG_URL))
        real_commit = app.dialect.do_commit

        def commit_then_lose_the_answer(dbapi_connection: object) -> None:
            real_commit(dbapi_connection)
            raise psycopg.OperationalError("server closed the connection unexpectedly")

        try:
            with iqbridge.connect(f"sqlite:///{tmp_path / 'q.db'}", index=index) as hub:
                q = hub.queue("orders")
                ids = q.put_many(["a", "b", "c"], to=["billing"])
                batch = q.get_many("billing", 3)
                monkeypatch.setattr(app.dialect, "do_commit", commit_then_lose_the_answer)
                with (
                    pytest.raises(IndexUnavailable, match="may have taken effect"),
                    q.transaction(app) as tx,
                ):
                    batch.done(transaction=tx)
                monkeypatch.undo()
                assert _index_states(q, ids) == [S.JOURNALLED] * 3
                assert [d.state for d in batch] == [S.JOURNALLED] * 3
                assert batch.done() == iqbridge.Settled()  # nothing left to settle
        finally:
            app.dispose()
