"""Exactly-once with the subscriber's own transaction (seed 002, delivery side).

With the index in the subscriber's database (the SQL store), ``delivery.done`` can run
inside the transaction that holds the business rows: both commit or neither does. The
functional tests run on PostgreSQL, MariaDB and an SQLite file; the crash test kills
subscriber processes 200 times between their business write and their commit while
they work through 10,000 messages, and then finds every business row exactly once.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from sql_workers import MAX_ATTEMPTS, QUEUE, SUBSCRIBER, business_table, work

import iqbridge
from iqbridge import JournalEntry, PublisherState, RetryPolicy, SubscriberState
from iqbridge.errors import ConfigurationError, InvalidArgument, LeaseLost
from iqbridge.states import ActorKind
from iqbridge.stores.sql import SqlStore
from iqbridge.testing import FakeClock
from tests.sql_helpers import MARIADB_URL, PG_URL, fresh_schema, sa_url

S = SubscriberState


@dataclass
class Setup:
    """A broker (the embedded SQLite queue), a SQL index, and the business database."""

    broker: str
    index: str
    app: sa.Engine
    schema: str | None

    def hub(self, clock: FakeClock | None = None) -> iqbridge.Hub:
        return iqbridge.connect(self.broker, index=self.index, clock=clock)

    def table(self) -> sa.Table:
        table = business_table(self.schema)
        table.create(self.app, checkfirst=True)
        return table


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
        pytest.param("sqlite"),
    ]
)
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Setup]:
    broker = f"sqlite:///{tmp_path / 'queue.db'}"
    if request.param == "sqlite":
        app = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
        try:
            yield Setup(broker, f"sql+sqlite:///{tmp_path / 'app.db'}", app, None)
        finally:
            app.dispose()
        return
    server, what = (
        (PG_URL, "PostgreSQL at 127.0.0.1:5432")
        if request.param == "postgres"
        else (MARIADB_URL, "MariaDB at 127.0.0.1:3306")
    )
    with fresh_schema(server, what, "iqeo") as index:
        SqlStore.from_url(index).close()  # creates the schema
        app = sa.create_engine(sa_url(server))
        try:
            yield Setup(broker, index, app, index.rsplit("=", 1)[1])
        finally:
            app.dispose()


def _rows(setup: Setup, table: sa.Table) -> list[tuple[str, int]]:
    with setup.app.connect() as conn:
        return [(r.msg_id, r.attempt) for r in conn.execute(sa.select(table))]


def test_done_commits_with_the_business_rows(setup: Setup) -> None:
    table = setup.table()
    with setup.hub() as hub:
        q = hub.queue("orders")
        msg_id = q.put(b"order 1", to=["billing"])
        d = q.get("billing")
        assert d is not None
        with q.transaction(setup.app) as tx:
            tx.connection.execute(table.insert().values(msg_id=d.msg_id, attempt=1, pid=1))
            d.done(transaction=tx)
            assert d.state is S.JOURNALLED  # DONE, then journalled at once
        assert _rows(setup, table) == [(msg_id, 1)]
        member = q.state(msg_id).subscribers["billing"]
        assert [s for s, _ in member.history][-2:] == [S.DONE, S.JOURNALLED]
        assert q.get("billing") is None


def test_an_exception_rolls_back_the_rows_and_done(setup: Setup) -> None:
    table = setup.table()
    with setup.hub() as hub:
        q = hub.queue("orders")
        msg_id = q.put(b"order 1", to=["billing"])
        d = q.get("billing")
        assert d is not None
        with pytest.raises(RuntimeError, match="business rule"), q.transaction(setup.app) as tx:
            tx.connection.execute(table.insert().values(msg_id=d.msg_id, attempt=1, pid=1))
            d.done(transaction=tx)
            raise RuntimeError("business rule broken")
        assert _rows(setup, table) == []
        assert d.state is S.FETCHED
        assert q.state(msg_id).subscribers["billing"].state is S.FETCHED
        d.done()  # still held by this delivery: it can finish another way
        assert q.state(msg_id).subscribers["billing"].state is S.JOURNALLED


def test_a_bare_connection_commits_or_rolls_back_with_its_owner(setup: Setup) -> None:
    table = setup.table()
    with setup.hub() as hub:
        q = hub.queue("orders")
        msg_id = q.put(b"order 1", to=["billing"])
        d = q.get("billing")
        assert d is not None
        with setup.app.connect() as conn:
            conn.execute(table.insert().values(msg_id=d.msg_id, attempt=1, pid=1))
            d.done(transaction=conn)
            conn.rollback()
            assert q.state(msg_id).subscribers["billing"].state is S.FETCHED
            conn.execute(table.insert().values(msg_id=d.msg_id, attempt=1, pid=2))
            d.done(transaction=conn)
            conn.commit()
        assert _rows(setup, table) == [(msg_id, 1)]
        assert q.state(msg_id).subscribers["billing"].state is S.JOURNALLED


def test_a_connection_that_does_not_reach_the_index_is_refused(
    setup: Setup, tmp_path: Path
) -> None:
    elsewhere = sa.create_engine(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    with setup.hub() as hub:
        q = hub.queue("orders")
        msg_id = q.put(b"order 1", to=["billing"])
        d = q.get("billing")
        assert d is not None
        with pytest.raises(InvalidArgument, match="does not reach the SQL index"):
            q.transaction(elsewhere).__enter__()
        with elsewhere.connect() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
            with pytest.raises(InvalidArgument, match="does not reach the SQL index"):
                d.done(transaction=conn)
            conn.commit()  # the refusal left the caller's transaction usable
            assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar() == 1
        with pytest.raises(InvalidArgument, match="SQLAlchemy Connection"):
            d.done(transaction="not a connection")
        assert q.state(msg_id).subscribers["billing"].state is S.FETCHED
    elsewhere.dispose()


@pytest.mark.postgres
def test_another_postgres_database_is_refused(tmp_path: Path) -> None:
    with fresh_schema(PG_URL, "PostgreSQL at 127.0.0.1:5432", "iqeo") as index:
        other = sa.create_engine(sa_url(PG_URL).rsplit("/", 1)[0] + "/postgres")
        with iqbridge.connect(f"sqlite:///{tmp_path / 'q.db'}", index=index) as hub:
            q = hub.queue("orders")
            q.put(b"x", to=["billing"])
            d = q.get("billing")
            assert d is not None
            with pytest.raises(InvalidArgument, match="does not reach"), q.transaction(other):
                pass
            d.done()
        other.dispose()


def test_an_index_outside_sql_is_refused(tmp_path: Path) -> None:
    app = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    with iqbridge.connect(f"sqlite:///{tmp_path / 'q.db'}") as hub:
        q = hub.queue("orders")
        q.put(b"x", to=["billing"])
        d = q.get("billing")
        assert d is not None
        with pytest.raises(ConfigurationError, match="needs the index in your database"):
            q.transaction(app)
        with app.connect() as conn, pytest.raises(ConfigurationError, match="SQL index"):
            d.done(transaction=conn)
        assert d.state is S.FETCHED
    app.dispose()


def test_a_lost_lease_rolls_the_business_rows_back(setup: Setup) -> None:
    table = setup.table()
    clock = FakeClock()
    with setup.hub(clock) as hub:
        q = hub.queue("orders", lease=30, sweep_interval=0)
        msg_id = q.put(b"order 1", to=["billing"])
        late = q.get("billing")
        assert late is not None
        clock.advance(31)
        again = q.get("billing")  # the lease ran out: delivered again, attempt 2
        assert again is not None and again.attempt == 2
        with pytest.raises(LeaseLost), q.transaction(setup.app) as tx:
            tx.connection.execute(table.insert().values(msg_id=msg_id, attempt=1, pid=1))
            late.done(transaction=tx)
        with q.transaction(setup.app) as tx:
            tx.connection.execute(table.insert().values(msg_id=msg_id, attempt=2, pid=1))
            again.done(transaction=tx)
        assert _rows(setup, table) == [(msg_id, 2)]


def test_the_broker_is_acknowledged_after_the_commit(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = setup.table()
    with iqbridge.connect("memory://", index=setup.index) as hub:  # consumer groups
        acked: list[str] = []
        real_ack = hub.adapter.ack

        def ack(queue: str, group: str, refs: list[str]) -> None:
            acked.extend(refs)
            real_ack(queue, group, refs)

        monkeypatch.setattr(hub.adapter, "ack", ack)
        q = hub.queue("orders")
        q.subscribe("billing")
        first, second = q.put(b"one"), q.put(b"two")
        d = q.get("billing")
        assert d is not None and d.msg_id == first
        with pytest.raises(RuntimeError), q.transaction(setup.app) as tx:
            d.done(transaction=tx)
            raise RuntimeError("rolled back")
        assert acked == []
        with q.transaction(setup.app) as tx:
            tx.connection.execute(table.insert().values(msg_id=first, attempt=1, pid=1))
            d.done(transaction=tx)
            assert acked == []
        assert acked == [hub.store.load(first).native_ref]
        nxt = q.get("billing")
        assert nxt is not None and nxt.msg_id == second


@pytest.mark.redis
@pytest.mark.postgres
def test_redis_streams_is_acknowledged_only_after_the_commit(tmp_path: Path) -> None:
    from tests.redis_index_helpers import REDIS_URL, drop_streams, fresh_prefix

    with (
        fresh_schema(PG_URL, "PostgreSQL at 127.0.0.1:5432", "iqeo") as index,
        fresh_prefix("eo") as prefix,
    ):
        app = sa.create_engine(sa_url(PG_URL))
        try:
            with iqbridge.connect(f"{REDIS_URL}?stream_prefix={prefix}:", index=index) as hub:
                q = hub.queue("orders")
                q.subscribe("billing")
                msg_id = q.put(b"one")
                d = q.get("billing")
                assert d is not None and d.msg_id == msg_id
                ref = hub.store.load(msg_id).native_ref
                pending, flush = hub.adapter.pending, hub.adapter.flush  # Redis Streams' own
                with pytest.raises(RuntimeError), q.transaction(app) as tx:
                    d.done(transaction=tx)
                    raise RuntimeError("rolled back")
                flush()
                assert set(pending("orders", "billing")) == {ref}
                with q.transaction(app) as tx:
                    d.done(transaction=tx)
                    flush()
                    assert set(pending("orders", "billing")) == {ref}  # not before the commit
                flush()
                assert pending("orders", "billing") == {}
                assert q.state(msg_id).subscribers["billing"].state is S.JOURNALLED
        finally:
            app.dispose()
            drop_streams(f"{prefix}:")


# --- the crash test ----------------------------------------------------------------------

N_MESSAGES = 10_000
KILLS = 200
WORKERS = 3
#: A killing worker finishes up to this many messages before it dies on the next one.
MAX_BEFORE_KILL = 80
PUT_BATCH = 1_000


def _whole_journal(hub: iqbridge.Hub) -> list[JournalEntry]:
    entries: list[JournalEntry] = []
    after = 0
    while batch := hub.journal(after=after, limit=20_000):
        entries.extend(batch)
        after = batch[-1].seq or 0
    return entries


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_subscribers_killed_before_commit_leave_each_business_row_exactly_once(
    tmp_path: Path,
) -> None:
    with fresh_schema(PG_URL, "PostgreSQL at 127.0.0.1:5432", "iqeo") as index:
        _crash_run(tmp_path, index, index.rsplit("=", 1)[1])


def _crash_run(tmp_path: Path, index: str, schema: str) -> None:
    t0 = time.monotonic()
    broker = f"sqlite:///{tmp_path / 'q.db'}?synchronous=normal"
    app_url = sa_url(PG_URL)
    kill_log = tmp_path / "kills.log"
    with iqbridge.connect(broker, index=index) as hub:
        q = hub.queue(QUEUE, retry=RetryPolicy(max_attempts=MAX_ATTEMPTS))
        app = sa.create_engine(app_url)
        invoices = business_table(schema)
        invoices.create(app)
        ids: list[str] = []
        for start in range(0, N_MESSAGES, PUT_BATCH):
            ids += q.put_many(
                [f"order {i}" for i in range(start, start + PUT_BATCH)], to=[SUBSCRIBER]
            )
        put_s = time.monotonic() - t0

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["iqbridge", "sqlalchemy", "psycopg", "sql_workers"])
        rng = random.Random(2024)
        procs: list[multiprocessing.process.BaseProcess] = []
        started_killers = killed = 0

        def start() -> None:
            nonlocal started_killers
            kill_after: int | None = None
            if started_killers < KILLS:
                kill_after = rng.randrange(MAX_BEFORE_KILL)
                started_killers += 1
            p = ctx.Process(
                target=work,
                args=(broker, index, app_url, schema, kill_after, str(kill_log)),
                daemon=True,
            )
            p.start()
            procs.append(p)

        def invoice_count() -> int:
            with app.connect() as conn:
                return int(conn.execute(sa.select(sa.func.count()).select_from(invoices)).scalar())

        for _ in range(WORKERS):
            start()
        deadline = time.monotonic() + 240
        try:
            while killed < KILLS or invoice_count() < N_MESSAGES:
                assert time.monotonic() < deadline, f"stuck after {killed} kills"
                time.sleep(0.02)
                while killed < KILLS and not any(p.exitcode is not None for p in procs):
                    assert time.monotonic() < deadline, f"stuck after {killed} kills"
                    time.sleep(0.02)
                for p in list(procs):
                    if p.exitcode is None:
                        continue
                    procs.remove(p)
                    p.join()
                    assert p.exitcode == -signal.SIGKILL, f"worker exited with {p.exitcode}"
                    killed += 1
                    start()
        finally:
            for p in procs:
                if p.exitcode is None:
                    os.kill(p.pid or 0, signal.SIGKILL)
                p.join()
        run_s = time.monotonic() - t0 - put_s

        # Every message has its business row exactly once ...
        with app.connect() as conn:
            rows = conn.execute(sa.select(invoices.c.msg_id, invoices.c.attempt)).all()
        per_message = Counter(r.msg_id for r in rows)
        assert set(per_message) == set(ids)
        assert [m for m, n in per_message.items() if n != 1] == []
        committed = {r.msg_id: r.attempt for r in rows}
        # ... none written by a killed transaction ...
        kills = [line.split() for line in kill_log.read_text().splitlines()]
        assert len(kills) == KILLS
        assert Counter(point for _, _, point in kills).keys() == {"before-done", "after-done"}
        for msg_id, attempt, _ in kills:
            assert committed[msg_id] > int(attempt), f"{msg_id}: a killed transaction committed"
        # ... and is DONE exactly once, by the attempt whose transaction committed.
        journal = _whole_journal(hub)
        done = [
            e
            for e in journal
            if e.actor_kind is ActorKind.SUBSCRIBER
            and e.dst == S.DONE.value
            and e.msg_id in committed
        ]
        assert Counter(e.msg_id for e in done) == Counter(ids)
        assert {e.msg_id: e.attempt for e in done} == committed
        finished = q.search(state=PublisherState.JOURNALLED, limit=2 * N_MESSAGES)
        assert len(finished) == N_MESSAGES
        redelivered = sum(1 for a in committed.values() if a > 1)
        assert redelivered >= len({m for m, _, _ in kills})
        app.dispose()
    print(
        f"\nexactly-once crash test: {N_MESSAGES} messages, {KILLS} SIGKILLs before commit "
        f"({Counter(p for _, _, p in kills)}), {redelivered} messages redelivered, "
        f"put {put_s:.1f} s, processing {run_s:.1f} s"
    )
