"""The SQL index store's native ``commit_writes`` beyond the contract, on PostgreSQL,
MariaDB and the Oracle dialect (the fake python-oracledb): a fixed number of statements
per batch whatever its size, journal numbers without gaps (readers take a gap for a
commit still to come), concurrent batches over the same messages, and a put of the same
msg_id that commits while a batch runs."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from sqlalchemy import event

import iqbridge
from iqbridge import engine, engine_batch
from iqbridge.ids import new_id, new_token
from iqbridge.model import Audience, Filter, MessageRecord, Retained
from iqbridge.states import PublisherState, SubscriberState
from iqbridge.stores.sql import SqlStore
from iqbridge.writes import Writes
from tests.oracle_helpers import PASSWORD, fake_oracle_fixture  # noqa: F401
from tests.sql_helpers import MARIADB_URL, PG_URL, fresh_schema

T0 = 1_700_000_000_000_000
SEC = 1_000_000
S = SubscriberState
Moved = tuple[MessageRecord, MessageRecord]


def _schema(kind: str) -> contextlib.AbstractContextManager[str]:
    base, what = (
        (PG_URL, "PostgreSQL at 127.0.0.1:5432")
        if kind == "postgres"
        else (MARIADB_URL, "MariaDB at 127.0.0.1:3306")
    )
    return fresh_schema(base, what, "iqbw")


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ]
)
def server_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """An index URL on a schema (PostgreSQL) or database (MariaDB) of its own."""
    with _schema(request.param) as url:
        yield url


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
        pytest.param("oracle", marks=pytest.mark.oracle),
    ]
)
def store(request: pytest.FixtureRequest) -> Iterator[SqlStore]:
    """A store on an index of its own, on each dialect."""
    with contextlib.ExitStack() as stack:
        if request.param == "oracle":
            request.getfixturevalue("fake_oracle")
            url = f"oracle+oracledb://iq:{PASSWORD}@oracle.test:1521/?service_name=FREEPDB1"
        else:
            url = stack.enter_context(_schema(request.param))
        opened = SqlStore.from_url(url)
        stack.callback(opened.close)
        yield opened


def _create(store: SqlStore, count: int, to: tuple[str, ...] = ("a",)) -> list[MessageRecord]:
    items: list[engine_batch.NewItem] = [
        (new_id(), "pub", None, f"c{i}", i % 10, (), None, "text/plain", 1) for i in range(count)
    ]
    records, journal = engine_batch.create("q", Audience(to), T0, items)
    assert store.commit_writes(Writes("q", created=records, journal=journal)) == [True] * count
    return records


def _life(store: SqlStore, count: int) -> list[MessageRecord]:
    """Create ``count`` messages, claim and settle them: three batches."""
    records = _create(store, count)
    loaded = list(store.load_many([r.msg_id for r in records]).values())
    tokens = [new_token() for _ in loaded]
    moved, journal, off = engine_batch.claim(
        loaded, "a", T0 + SEC, tokens, owner="me", lease_until=T0 + 60 * SEC
    )
    assert off == []
    assert store.commit_writes(Writes("q", moved=moved, journal=journal)) == [True] * count
    settled, journal, off = engine_batch.settle(
        [a for _, a in moved], "a", tokens, "done", T0 + 2 * SEC
    )
    assert off == []
    assert store.commit_writes(Writes("q", moved=settled, journal=journal)) == [True] * count
    return records


def _statements(store: SqlStore) -> list[str]:
    """The statements the server runs for the store's writes: an ``executemany`` is one
    per parameter set (psycopg sends each, PyMySQL sends each UPDATE), except PyMySQL's
    INSERT ... VALUES, which it rewrites into one multi-row statement."""
    seen: list[str] = []
    mysql = store.options.family == "mysql"

    @event.listens_for(store.writer, "before_cursor_execute")
    def _count(
        conn: object, cursor: object, stmt: str, params: Any, context: object, many: bool
    ) -> None:
        if stmt.lstrip().upper().startswith(("SAVEPOINT", "RELEASE")):
            return
        one = not many or (mysql and stmt.lstrip().upper().startswith("INSERT"))
        seen.extend([stmt] * (1 if one else len(params)))

    return seen


def test_a_batch_is_a_fixed_number_of_statements_whatever_its_size(server_url: str) -> None:
    store = SqlStore.from_url(server_url)
    try:
        seen = _statements(store)
        _life(store, 5)
        small = len(seen)
        seen.clear()
        _life(store, 300)
        assert len(seen) == small <= 13  # create, claim, settle: lock, rows, journal
        for rec in store.search("q", Filter(limit=1000)):
            assert rec.publisher_state is PublisherState.JOURNALLED
    finally:
        store.close()


def test_the_journal_of_batches_is_numbered_without_gaps(store: SqlStore) -> None:
    records = _life(store, 250)
    _life(store, 3)
    journal = store.journal(0, 100_000)
    seqs = [e.seq or 0 for e in journal]
    assert len(journal) == 253 * 8  # PUT REVEALED AVAILABLE GET FETCHED DONE JOURNALLED x2
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    first = records[0].msg_id
    assert [e.msg_id for e in journal[:3]] == [first] * 3  # a message's steps together
    assert [e.dst for e in store.history(first)] == [
        "PUT",
        "REVEALED",
        "AVAILABLE",
        "GET",
        "FETCHED",
        "DONE",
        "JOURNALLED",
        "JOURNALLED",
    ]


def test_concurrent_batches_over_the_same_messages_have_one_winner_each(
    server_url: str,
) -> None:
    stores = [SqlStore.from_url(server_url) for _ in range(4)]
    try:
        records = _create(stores[0], 200)
        ids = [r.msg_id for r in records]
        barrier = threading.Barrier(len(stores))
        won: dict[int, list[str]] = {}
        errors: list[BaseException] = []

        def race(n: int) -> None:
            try:
                store = stores[n]
                loaded = store.load_many(ids)
                # Half the batches in the opposite order: locks taken in batch order
                # would deadlock.
                order = ids if n % 2 else ids[::-1]
                recs = [loaded[i] for i in order]
                moved, journal, _ = engine_batch.claim(
                    recs, "a", T0 + SEC, [f"t{n}"] * len(recs), owner=f"w{n}", lease_until=None
                )
                barrier.wait(10)
                flags = store.commit_writes(Writes("q", moved=moved, journal=journal))
                won[n] = [a.msg_id for (_, a), ok in zip(moved, flags, strict=True) if ok]
            except BaseException as exc:  # surfaced by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=race, args=(n,)) for n in range(len(stores))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        assert sorted(m for w in won.values() for m in w) == sorted(ids)
        for n, mine in won.items():
            for rec in stores[0].load_many(mine).values():
                assert rec.members["a"].state is S.FETCHED
                assert rec.members["a"].lease_token == f"t{n}"
                assert rec.version == 2
        claims = [e for e in stores[0].journal(0, 100_000) if e.dst == "GET"]
        assert sorted(e.msg_id for e in claims) == sorted(ids)
    finally:
        for s in stores:
            s.close()


def _waiting_on_a_lock(store: SqlStore) -> bool:
    if store.options.family == "postgresql":
        sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    else:
        sql = "SELECT count(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'"
    with store.reader.connect() as conn:
        return bool(conn.exec_driver_sql(sql).scalar())


def test_a_put_of_the_same_msg_id_committed_meanwhile_is_left_out(server_url: str) -> None:
    """The batch cannot see the rival's uncommitted row: PostgreSQL's insert (ON CONFLICT
    DO NOTHING) waits for it and skips it, MariaDB's locking read waits for it."""
    store, rival = SqlStore.from_url(server_url), SqlStore.from_url(server_url)
    try:
        taken, free = new_id(), new_id()
        items: list[engine_batch.NewItem] = [
            (i, "pub", None, None, 0, (), None, "text/plain", 1) for i in (taken, free)
        ]
        records, journal = engine_batch.create("q", Audience(("a",)), T0, items)
        writes = Writes(
            "q",
            created=records,
            retain=[Retained(b"mine"), Retained(b"free")],
            journal=journal,
        )
        theirs = engine.new_message(
            msg_id=taken, queue="q", publisher="p", audience=Audience(("a",)), now=1
        )
        theirs.retain = Retained(b"theirs")
        flags: list[bool] = []
        with rival.atomic():
            rival.commit(theirs)
            worker = threading.Thread(target=lambda: flags.extend(store.commit_writes(writes)))
            worker.start()
            deadline = time.monotonic() + 10
            while not _waiting_on_a_lock(store):
                assert time.monotonic() < deadline, "commit_writes never waited on the put"
                time.sleep(0.15)  # InnoDB refreshes INNODB_TRX 0.1 s after the last read
        worker.join(10)
        assert flags == [False, True]
        assert records[0].seq is None
        assert records[1].seq == store.load(free).seq
        assert store.retained([taken, free]) == {
            taken: Retained(b"theirs"),
            free: Retained(b"free"),
        }
        assert [(e.actor, e.dst) for e in store.history(taken)] == [
            (e.actor, e.dst) for e in theirs.journal
        ]
        assert len(store.history(free)) == 3
    finally:
        store.close()
        rival.close()


def test_a_deadlock_is_tried_again_and_nothing_is_written_twice(server_url: str) -> None:
    """A batch whose transaction the database rolls back is tried again from the start:
    the records' seqs are as before, and the journal has each entry once."""
    store = SqlStore.from_url(server_url)
    try:
        records = _create(store, 3)
        loaded = list(store.load_many([r.msg_id for r in records]).values())
        moved, journal, _ = engine_batch.claim(
            loaded, "a", T0 + SEC, ["t0", "t1", "t2"], owner="me", lease_until=None
        )
        calls = 0
        real = store._move

        def flaky(conn: sa.engine.Connection, rows: list[Moved], journal: Any) -> None:
            nonlocal calls
            calls += 1
            real(conn, rows, journal)  # written (with its journal on PostgreSQL), then lost
            if calls == 1:
                orig = type("Deadlock", (Exception,), {"sqlstate": "40P01", "args": (1213,)})()
                raise sa.exc.OperationalError("UPDATE", None, orig)

        store._move = flaky  # type: ignore[method-assign]
        assert store.commit_writes(Writes("q", moved=moved, journal=journal)) == [True] * 3
        assert calls == 2
        gets = [e for e in store.journal(0, 1000) if e.dst == "GET"]
        assert sorted(e.msg_id for e in gets) == sorted(r.msg_id for r in records)
        assert all(store.load(r.msg_id).version == 2 for r in records)
    finally:
        store.close()


def test_odd_text_round_trips_through_the_batch_statements(store: SqlStore) -> None:
    """Quotes, backslashes, percent signs, NUL-free control characters and non-ASCII text
    in every kind of column a batch writes (on MariaDB the rows travel as literals)."""
    odd = 'o\'brien \\ "q" %s 100% é ☃ \n\t;--'
    items: list[engine_batch.NewItem] = [
        (new_id(), f"pub{odd}", f"key{odd}", f"corr{i}{odd}", 3, (f"p{odd}",), None, "t/x", 1)
        for i in range(3)
    ]
    records, journal = engine_batch.create("q", Audience((f"sub{odd}",)), T0, items)
    kept = [Retained(odd.encode(), {"h": odd}) for _ in records]
    writes = Writes("q", created=records, retain=kept, journal=journal)
    assert store.commit_writes(writes) == [True] * 3
    loaded = store.load_many([r.msg_id for r in records])
    withdraw = engine.withdraw(loaded[records[2].msg_id], T0 + SEC, f"why {odd}")
    moved, journal, _ = engine_batch.claim(
        [loaded[r.msg_id] for r in records[:2]],
        f"sub{odd}",
        T0 + SEC,
        [f"tok{odd}", "t2"],
        owner=f"owner {odd}",
        lease_until=None,
    )
    assert (
        store.commit_writes(Writes("q", moved=moved, journal=journal, changes=[withdraw]))
        == [True] * 3
    )
    store.commit_many([engine.withdraw(store.load(records[1].msg_id), T0 + 2 * SEC, odd)])
    store.set_native_refs([(r.msg_id, f"ref{odd}{i}") for i, r in enumerate(records)])
    got = store.load(records[0].msg_id)
    assert (got.publisher, got.ordering_key, got.parents) == (
        f"pub{odd}",
        f"key{odd}",
        (f"p{odd}",),
    )
    assert got.correlation_id == f"corr0{odd}"
    assert got.native_ref == f"ref{odd}0"
    member = got.members[f"sub{odd}"]
    assert (member.lease_token, member.lease_owner) == (f"tok{odd}", f"owner {odd}")
    assert store.history(records[0].msg_id)[3].detail == f"by owner {odd}"
    assert store.history(records[1].msg_id)[-1].detail == odd
    assert any(e.detail == f"why {odd}" for e in store.history(records[2].msg_id))
    assert store.retained([records[0].msg_id])[records[0].msg_id] == Retained(
        odd.encode(), {"h": odd}
    )


@pytest.mark.slow
def test_batch_traffic_exports_one_row_per_transition_and_audits_clean(
    server_url: str, spark: Any, tmp_path: Path
) -> None:
    """put_many / get_many / batch.done through a queue with a SQL index: the export
    holds one row per message per transition, with no gap awaiting late commits, and
    the Spark audit finds only the one delivery left in doubt."""
    from iqbridge.analytics.audit import audit
    from iqbridge.analytics.export import export_journal

    with iqbridge.connect(f"sqlite:///{tmp_path / 'q.db'}", index=server_url) as hub:
        queue = hub.queue("batches")
        queue.subscribe("a", "b")
        ids = queue.put_many([f"m{i}".encode() for i in range(120)])
        for sub in ("a", "b"):
            while batch := queue.get_many(sub, 50, timeout=0):
                batch.done()
        queue.put(b"held")
        held = queue.get("a", timeout=0)
        assert held is not None
        store = hub.store
        journal = store.journal(0, 100_000)
        # PUT REVEALED AVAILABLE x2, then GET FETCHED DONE JOURNALLED per member, the
        # publisher's JOURNALLED; the held one: PUT REVEALED AVAILABLE x2 GET FETCHED.
        assert len(journal) == 120 * 13 + 6
        for mid in ids[:3]:
            assert len(store.history(mid)) == 13
        result = export_journal(store, tmp_path / "out", page_size=500)
        assert (result.rows, result.gaps) == (len(journal), 0)
    rows = ds.dataset(str(tmp_path / "out" / "journal")).to_table().to_pylist()
    assert sorted((r["msg_id"], r["seq"]) for r in rows) == sorted(
        (e.msg_id, e.seq) for e in journal
    )
    found = audit(
        spark,
        tmp_path / "out",
        tmp_path / "audit",
        as_of=datetime.now(UTC) + timedelta(seconds=1),
        stuck_after=timedelta(0),
        lost_after=timedelta(0),
        collect=10,
    )
    assert [(f.finding, f.count) for f in found.findings if f.count] == [("stuck", 1)]
    assert [r["msg_id"] for r in found.rows["stuck"]] == [held.msg_id]


def _refs_and_claims_at_once(stores: list[SqlStore], round_: int) -> None:
    records = _create(stores[0], 150)
    ids = [r.msg_id for r in records]
    barrier = threading.Barrier(len(stores))
    errors: list[BaseException] = []
    won: list[str] = []

    def refs(n: int) -> None:
        try:
            order = ids if n % 2 else ids[::-1]
            barrier.wait(10)
            stores[n].set_native_refs([(m, f"r{round_}:{m}") for m in order])
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    def claim(n: int) -> None:
        try:
            loaded = stores[n].load_many(ids)
            order = ids if n % 2 else ids[::-1]
            moved, journal, _ = engine_batch.claim(
                [loaded[i] for i in order],
                "a",
                T0 + SEC,
                [f"t{n}"] * len(order),
                owner=f"w{n}",
                lease_until=None,
            )
            barrier.wait(10)
            flags = stores[n].commit_writes(Writes("q", moved=moved, journal=journal))
            won.extend(a.msg_id for (_, a), ok in zip(moved, flags, strict=True) if ok)
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=refs if n < 2 else claim, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sorted(won) == sorted(ids)
    loaded = stores[0].load_many(ids)
    assert all(loaded[m].native_ref == f"r{round_}:{m}" for m in ids)


def test_native_refs_and_claims_of_the_same_messages_at_once_do_not_deadlock(
    server_url: str,
) -> None:
    """set_native_refs locks its rows in the order a batch commit does: run both, over
    the same messages listed in opposite orders, many times; neither fails."""
    stores = [SqlStore.from_url(server_url) for _ in range(4)]
    try:
        for round_ in range(5):
            _refs_and_claims_at_once(stores, round_)
    finally:
        for s in stores:
            s.close()


def test_older_servers_get_statements_they_know(server_url: str) -> None:
    """PostgreSQL before 12 (no MATERIALIZED) and MariaDB before 10.6 (no JSON_TABLE):
    the same batches, by the statements such a server has."""
    store = SqlStore.from_url(server_url)
    try:
        with store.writer.connect():
            pass  # the dialect reads the server's version on its first connection
        postgres = store.options.family == "postgresql"
        store.writer.dialect.server_version_info = (11, 9) if postgres else (10, 5, 8)
        store._batch_sql = None
        seen = _statements(store)
        records = _life(store, 40)
        text = " ".join(seen)
        assert "MATERIALIZED" not in text
        assert ("jsonb_array_elements" in text) is postgres
        assert "JSON_TABLE" not in text
        assert [e.dst for e in store.history(records[-1].msg_id)][-3:] == [
            "DONE",
            "JOURNALLED",
            "JOURNALLED",
        ]
        seqs = [e.seq or 0 for e in store.journal(0, 10_000)]
        assert seqs == list(range(seqs[0], seqs[0] + 40 * 8))
    finally:
        store.close()
