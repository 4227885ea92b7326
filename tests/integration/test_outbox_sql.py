"""The outbox in a real producer database: PostgreSQL and MariaDB (a schema or database of
its own per test, dropped afterwards). Business rollback, types, concurrent table
creation, and two relays on one outbox taking turns in order."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

import iqbridge
from iqbridge.outbox import Outbox, OutboxCounts
from iqbridge.relay import Relay
from tests.conftest import need_server

PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MARIADB = "mysql+pymysql://root@127.0.0.1:3306/test"


def _reachable(url: str) -> tuple[bool, str]:
    try:
        eng = sa.create_engine(url, connect_args={"connect_timeout": 3})
        with eng.connect():
            pass
        eng.dispose()
    except sa.exc.SQLAlchemyError as exc:
        return False, str(exc.orig if hasattr(exc, "orig") else exc).splitlines()[0]
    return True, ""


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ]
)
def db(request: pytest.FixtureRequest) -> Iterator[tuple[sa.Engine, str | None]]:
    """An engine and the schema to use, on a schema/database made for this test."""
    name = f"iqob_{uuid.uuid4().hex[:12]}"
    if request.param == "postgres":
        ok, why = _reachable(PG)
        need_server("PostgreSQL at 127.0.0.1:5432", ok, why)
        admin = sa.create_engine(PG)
        with admin.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {name}")
        engine, schema = admin, name
        try:
            yield engine, schema
        finally:
            with admin.begin() as conn:
                conn.exec_driver_sql(f"DROP SCHEMA {name} CASCADE")
            admin.dispose()
    else:
        ok, why = _reachable(MARIADB)
        need_server("MariaDB at 127.0.0.1:3306", ok, why)
        admin = sa.create_engine(MARIADB)
        with admin.begin() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        engine = sa.create_engine(f"mysql+pymysql://root@127.0.0.1:3306/{name}")
        try:
            yield engine, None
        finally:
            engine.dispose()
            with admin.begin() as conn:
                conn.exec_driver_sql(f"DROP DATABASE {name}")
            admin.dispose()


def business_table(engine: sa.Engine, schema: str | None) -> sa.Table:
    table = sa.Table(
        "orders",
        sa.MetaData(schema=schema),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    )
    table.create(engine)
    return table


def test_commit_and_rollback(db: tuple[sa.Engine, str | None]) -> None:
    engine, schema = db
    orders = business_table(engine, schema)
    outbox = Outbox(engine, schema=schema)
    kept = []
    for n in range(6):
        try:
            with engine.begin() as conn:
                conn.execute(orders.insert(), {"id": n})
                msg_id = outbox.put(conn, "orders", b"\x00bin\xff" * (n + 1), to=["s"])
                if n % 2:
                    raise RuntimeError("business failure")
                kept.append(msg_id)
        except RuntimeError:
            pass
    assert outbox.counts() == OutboxCounts(pending=3, relayed=0, parked=0)
    with iqbridge.connect("memory://") as hub:
        assert Relay(outbox, hub).run(once=True).relayed == 3
        q = hub.queue("orders")
        assert [m.msg_id for m in q.search()] == kept
        assert [q.peek(i).body for i in kept] == [b"\x00bin\xff" * n for n in (1, 3, 5)]
    assert outbox.counts() == OutboxCounts(pending=0, relayed=3, parked=0)


def test_a_large_payload_fits(db: tuple[sa.Engine, str | None]) -> None:
    engine, schema = db
    outbox = Outbox(engine, schema=schema)
    body = bytes(range(256)) * 4096  # 1 MiB, more than a MySQL BLOB holds
    with engine.begin() as conn:
        msg_id = outbox.put(conn, "big", body, to=["s"])
    with iqbridge.connect("memory://") as hub:
        Relay(outbox, hub).run(once=True)
        assert hub.queue("big").peek(msg_id).body == body


def test_concurrent_table_creation(db: tuple[sa.Engine, str | None]) -> None:
    engine, schema = db
    outboxes = [Outbox(engine.url, schema=schema, table="raced") for _ in range(4)]
    start = threading.Barrier(len(outboxes))
    errors: list[BaseException] = []

    def create(o: Outbox) -> None:
        try:
            start.wait()
            o.create_table()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(o,)) for o in outboxes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert outboxes[0].counts() == OutboxCounts(0, 0, 0)
    for o in outboxes:
        o.close()


def test_two_relays_take_turns_in_order(db: tuple[sa.Engine, str | None]) -> None:
    engine, schema = db
    outbox = Outbox(engine, schema=schema)
    with engine.begin() as conn:
        ids = [outbox.put(conn, "orders", n, to=["s"], correlation_id=str(n)) for n in range(300)]
    with iqbridge.connect("memory://") as hub:
        relays = [Relay(outbox, hub, batch=25) for _ in range(2)]
        threads = [threading.Thread(target=r.run, kwargs={"once": True}) for r in relays]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sum(r.stats.relayed for r in relays) == 300
        log = hub.adapter.broker.queues["orders"].log  # type: ignore[attr-defined]
        assert [e.msg_id for e in log] == ids  # no second entry, and in put order
    assert outbox.counts() == OutboxCounts(pending=0, relayed=300, parked=0)
