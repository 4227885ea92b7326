"""The transactional outbox and its relay, on SQLite (the producer's database) with the
embedded SQLite queue and the in-process broker: a message exists if and only if the
business transaction commits, and the relay publishes each row exactly once however
often it is repeated or interrupted."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import sqlalchemy as sa

import iqbridge
from iqbridge import Pool, PublisherState
from iqbridge.errors import (
    BrokerUnavailable,
    IndexUnavailable,
    InvalidArgument,
    MessageTooLarge,
    PayloadError,
)
from iqbridge.outbox import MalformedOutboxRow, Outbox, OutboxCounts, OutboxUnavailable
from iqbridge.relay import Relay
from iqbridge.states import ActorKind
from tests.conftest import FakeClock

TO = ["billing", Pool("shipping", ["ship-1", "ship-2"])]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[sa.Engine]:
    eng = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    with eng.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
    yield eng
    eng.dispose()


@pytest.fixture
def outbox(engine: sa.Engine) -> Outbox:
    return Outbox(engine)


@pytest.fixture(params=["sqlite", "memory"])
def hub(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[iqbridge.Hub]:
    url = f"sqlite:///{tmp_path / 'broker.db'}" if request.param == "sqlite" else "memory://"
    with iqbridge.connect(url) as h:
        yield h


def order(outbox: Outbox, conn: sa.Connection, n: int, **options: object) -> str:
    """A business write and its message, in the caller's transaction."""
    conn.exec_driver_sql("INSERT INTO orders (id, total) VALUES (?, ?)", (n, n * 1.5))
    opts: dict[str, object] = {"to": TO, **options}
    return outbox.put(conn, "orders", {"order": n}, **opts)  # type: ignore[arg-type]


def drain(q: iqbridge.Queue, subscriber: str) -> list[str]:
    got = []
    while (d := q.get(subscriber)) is not None:
        with d:
            got.append(d.msg_id)
    return got


def publisher_moves(hub: iqbridge.Hub) -> dict[str, list[tuple[str | None, str]]]:
    moves: dict[str, list[tuple[str | None, str]]] = {}
    after = 0
    while batch := hub.journal(after, 1000):
        for e in batch:
            if e.actor_kind is ActorKind.PUBLISHER:
                moves.setdefault(e.msg_id, []).append((e.src, e.dst))
        after = batch[-1].seq
    return moves


def set_pending(outbox: Outbox) -> None:
    """What a relay killed after its puts but before its UPDATE leaves behind."""
    with outbox.engine.begin() as conn:
        conn.execute(sa.update(outbox.table).values(state="pending", relayed_at=None))


# --- producing ----------------------------------------------------------------------------


def test_a_committed_put_is_relayed_with_everything_it_said(
    outbox: Outbox, hub: iqbridge.Hub
) -> None:
    with outbox.engine.begin() as conn:
        msg_id = order(
            outbox,
            conn,
            1,
            correlation_id="cart-7",
            priority=7,
            ordering_key="customer-1",
            parents=["01a0-parent"],
            headers={"trace": "t-1"},
            publisher="webshop",
        )
    assert outbox.counts() == OutboxCounts(pending=1, relayed=0, parked=0)
    result = Relay(outbox, hub).run_once()
    assert (result.relayed, result.parked, result.read) == (1, [], 1)
    assert outbox.counts() == OutboxCounts(pending=0, relayed=1, parked=0)

    q = hub.queue("orders")
    state = q.state(msg_id)
    assert state.publisher_state is PublisherState.REVEALED
    assert [s.value for s, _ in state.publisher_history] == ["PUT", "REVEALED"]
    assert (state.correlation_id, state.priority, state.parents) == ("cart-7", 7, ("01a0-parent",))
    assert state.publisher == "webshop"
    assert set(state.subscribers) == {"billing", "ship-1", "ship-2"}
    assert state.subscribers["ship-1"].pool == "shipping"
    env = q.peek(msg_id)
    assert env.payload() == {"order": 1}
    assert (env.content_type, env.headers, env.ordering_key) == (
        "application/json",
        {"trace": "t-1"},
        "customer-1",
    )
    with q.get("ship-2") as d:
        assert d.msg_id == msg_id and d.payload == {"order": 1}


def test_a_rolled_back_business_transaction_leaves_no_message(
    outbox: Outbox, hub: iqbridge.Hub
) -> None:
    with outbox.engine.begin() as conn:
        kept = order(outbox, conn, 1)
    with pytest.raises(RuntimeError), outbox.engine.begin() as conn:
        order(outbox, conn, 2)
        raise RuntimeError("the business step failed")
    with outbox.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT id FROM orders").scalars().all() == [1]
    assert outbox.counts().pending == 1
    Relay(outbox, hub).run(once=True)
    assert [m.msg_id for m in hub.queue("orders").search()] == [kept]


def test_the_table_is_created_in_the_first_business_transaction(
    engine: sa.Engine, hub: iqbridge.Hub
) -> None:
    # The first put ever is rolled back, table and all; the next one creates it again.
    outbox = Outbox(engine)
    with pytest.raises(RuntimeError), engine.begin() as conn:
        order(outbox, conn, 1)
        raise RuntimeError("rolled back")
    assert not sa.inspect(engine).has_table("iq_outbox")
    with engine.begin() as conn:
        msg_id = order(outbox, conn, 2)
    with engine.begin() as conn:
        order(outbox, conn, 3)
    Relay(outbox, hub).run(once=True)
    assert hub.queue("orders").search()[0].msg_id == msg_id
    assert outbox.counts().relayed == 2


def test_create_table_is_idempotent_and_safe_from_many_threads(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'race.db'}"
    outboxes = [Outbox(url, table="race_outbox") for _ in range(6)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(outboxes))

    def create(o: Outbox) -> None:
        try:
            start.wait()
            o.create_table()
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


@pytest.mark.parametrize(
    ("kwargs", "error", "why"),
    [
        ({"priority": 10}, InvalidArgument, "priority"),
        ({"headers": {"k": 1}}, InvalidArgument, "headers"),
        ({"ttl": -1}, InvalidArgument, "ttl"),
        ({"to": []}, InvalidArgument, "names nobody"),
        ({"to": ["two words"]}, iqbridge.AudienceError, "whitespace"),
        ({"parents": [""]}, InvalidArgument, "parents"),
        ({"correlation_id": "c\udc80"}, InvalidArgument, "correlation_id .* not valid text"),
        ({"ordering_key": 5}, InvalidArgument, "ordering_key must be a str"),
        ({"headers": {"k": "v\udc80"}}, InvalidArgument, "header 'k' .* not valid text"),
        ({"publisher": "p\udc80"}, iqbridge.AudienceError, "not valid text"),
        ({"payload": {1, 2}}, PayloadError, "not JSON-serialisable"),
        ({"payload": b"x" * 101}, MessageTooLarge, "101 bytes"),
    ],
)
def test_a_bad_put_is_refused_inside_the_business_transaction(
    engine: sa.Engine, kwargs: dict[str, object], error: type[Exception], why: str
) -> None:
    outbox = Outbox(engine, max_bytes=100)
    payload = kwargs.pop("payload", "fine")
    with engine.begin() as conn, pytest.raises(error, match=why):
        outbox.put(conn, "orders", payload, **kwargs)  # type: ignore[arg-type]
    assert outbox.counts() == OutboxCounts(0, 0, 0)


def test_payloads_keep_their_bytes_and_content_type(outbox: Outbox, hub: iqbridge.Hub) -> None:
    with outbox.engine.begin() as conn:
        ids = [
            outbox.put(conn, "docs", b"\x00\xffraw", to=["s"]),
            outbox.put(conn, "docs", "text é", to=["s"]),
            outbox.put(
                conn, "docs", b'{"already": "json"}', to=["s"], content_type="application/json"
            ),
            outbox.put(conn, "docs", [1, None, "x"], to=["s"]),
        ]
    Relay(outbox, hub).run(once=True)
    q = hub.queue("docs")
    envs = [q.peek(i) for i in ids]
    assert [e.body for e in envs] == [
        b"\x00\xffraw",
        "text é".encode(),
        b'{"already": "json"}',
        b'[1,null,"x"]',
    ]
    assert [e.payload() for e in envs] == [
        b"\x00\xffraw",
        "text é",
        {"already": "json"},
        [1, None, "x"],
    ]


# --- relaying exactly once ----------------------------------------------------------------


def test_relaying_again_creates_no_duplicates(outbox: Outbox, hub: iqbridge.Hub) -> None:
    with outbox.engine.begin() as conn:
        ids = [order(outbox, conn, n) for n in range(25)]
    relay = Relay(outbox, hub, batch=10)
    assert relay.run(once=True).relayed == 25
    # Killed after its puts, before its UPDATE: every row is pending again.
    set_pending(outbox)
    assert Relay(outbox, hub, batch=7).run(once=True).relayed == 25
    q = hub.queue("orders")
    assert [m.msg_id for m in q.search(limit=1000)] == ids
    moves = publisher_moves(hub)
    assert all(moves[i] == [(None, "PUT"), ("PUT", "REVEALED")] for i in ids)
    assert drain(q, "billing") == ids
    pool = drain(q, "ship-1") + drain(q, "ship-2")
    assert sorted(pool) == sorted(ids)


def test_rows_are_relayed_in_put_order_across_queues(outbox: Outbox, hub: iqbridge.Hub) -> None:
    with outbox.engine.begin() as conn:
        ids = [
            outbox.put(conn, "a" if n % 3 else "b", {"n": n}, to=["s"], correlation_id=str(n // 2))
            for n in range(30)
        ]
    Relay(outbox, hub, batch=4).run(once=True)
    created = sorted((hub.store.load(i).created_at, hub.store.load(i).seq or 0, i) for i in ids)
    assert [i for *_, i in created] == ids


def test_a_broker_failure_mid_round_keeps_what_was_done(tmp_path: Path) -> None:
    with iqbridge.connect("memory://") as hub:
        outbox = Outbox(f"sqlite:///{tmp_path / 'app.db'}")
        with outbox.engine.begin() as conn:
            ids = [outbox.put(conn, "orders", n, to=["s"], correlation_id=str(n)) for n in range(6)]
        real = hub.adapter.send
        calls = [0]

        def flaky(queue: str, envelopes: list[iqbridge.Envelope]) -> list[str]:
            calls[0] += 1
            if calls[0] == 4:
                raise BrokerUnavailable("broker went away")
            return real(queue, envelopes)

        hub.adapter.send = flaky  # type: ignore[method-assign]
        relay = Relay(outbox, hub)
        with pytest.raises(BrokerUnavailable):
            relay.run_once()
        # Three published and marked; the fourth is in the index without a broker entry.
        assert outbox.counts() == OutboxCounts(pending=3, relayed=3, parked=0)
        assert hub.store.load(ids[3]).native_ref is None
        assert relay.run(once=True).relayed == 6
        q = hub.queue("orders")
        assert drain(q, "s") == ids
        assert len(hub.adapter.broker.queues["orders"].log) == 6  # type: ignore[attr-defined]
        outbox.close()


def test_a_lost_reference_gives_a_second_broker_entry_but_one_delivery(outbox: Outbox) -> None:
    with iqbridge.connect("memory://") as hub:
        with outbox.engine.begin() as conn:
            ids = [order(outbox, conn, n) for n in range(3)]
        real = hub.store.set_native_refs
        calls = [0]

        def lost(refs: Sequence[tuple[str, str]]) -> None:
            calls[0] += 1
            if calls[0] == 1:
                raise IndexUnavailable("the reply was lost")
            real(refs)

        hub.store.set_native_refs = lost  # type: ignore[method-assign]
        with pytest.raises(IndexUnavailable):
            Relay(outbox, hub).run_once()
        Relay(outbox, hub).run(once=True)
        # The three rows went in one send; none of their references was recorded, so the
        # repeat sends all three again.
        assert len(hub.adapter.broker.queues["orders"].log) == 6  # type: ignore[attr-defined]
        q = hub.queue("orders")
        assert sorted(drain(q, "billing")) == sorted(ids)
        assert sorted(drain(q, "ship-1") + drain(q, "ship-2")) == sorted(ids)
        assert drain(q, "billing") == []
        assert all(q.state(i).publisher_state is PublisherState.JOURNALLED for i in ids)


# --- rows that cannot be relayed ----------------------------------------------------------


def test_a_malformed_row_is_parked_named_and_kept(outbox: Outbox, hub: iqbridge.Hub) -> None:
    with outbox.engine.begin() as conn:
        ids = [order(outbox, conn, n) for n in range(5)]
        conn.execute(
            sa.update(outbox.table).where(outbox.table.c.msg_id == ids[2]).values(audience="{bad")
        )
    relay = Relay(outbox, hub)
    result = relay.run_once()
    assert result.relayed == 4
    [bad] = result.parked
    assert isinstance(bad, MalformedOutboxRow)
    assert (bad.seq, bad.msg_id, bad.table) == (3, ids[2], "iq_outbox")
    text = str(bad)
    assert "outbox row 3" in text and ids[2] in text and "JSONDecodeError" in text
    assert "parked" in text and "retry_parked" in text and "not lost" in text
    assert outbox.counts() == OutboxCounts(pending=0, relayed=4, parked=1)
    [parked] = outbox.parked()
    assert (parked.seq, parked.msg_id, parked.queue) == (3, ids[2], "orders")
    assert "JSONDecodeError" in parked.error
    # Fixed and retried, it goes through, once.
    with outbox.engine.begin() as conn:
        conn.execute(
            sa.update(outbox.table)
            .where(outbox.table.c.seq == 3)
            .values(audience=json.dumps(["billing"]))
        )
    assert outbox.retry_parked() == 1
    assert relay.run(once=True).relayed == 5
    assert [m.msg_id for m in hub.queue("orders").search()] == [*ids[:2], *ids[3:], ids[2]]
    assert relay.stats.parked == 1


def test_only_the_bad_row_of_a_batch_is_parked(outbox: Outbox, hub: iqbridge.Hub) -> None:
    # Same options: one put_many for the run; the queue refuses one payload as too large.
    with outbox.engine.begin() as conn:
        ids = [outbox.put(conn, "small", "x" * n, to=["s"]) for n in (10, 500, 20)]
    relay = Relay(outbox, hub, open_queue=lambda name: hub.queue(name, max_bytes=100))
    result = relay.run_once()
    assert result.relayed == 2
    [bad] = result.parked
    assert bad.msg_id == ids[1] and "MessageTooLarge" in bad.reason
    assert drain(hub.queue("small"), "s") == [ids[0], ids[2]]


def test_a_queue_without_audience_parks_with_what_to_do(outbox: Outbox, hub: iqbridge.Hub) -> None:
    with outbox.engine.begin() as conn:
        msg_id = outbox.put(conn, "nobody", "x")
    relay = Relay(outbox, hub)
    [bad] = relay.run_once().parked
    assert bad.msg_id == msg_id and "subscribe" in bad.reason
    hub.queue("nobody").subscribe("late")
    assert outbox.retry_parked([bad.seq]) == 1
    # The same relay sees the new subscriber at once (no stale cached subscriptions).
    assert relay.run(once=True).relayed == 1
    assert drain(hub.queue("nobody"), "late") == [msg_id]


# --- time, running, housekeeping -----------------------------------------------------------


def test_ttl_counts_from_the_business_commit(engine: sa.Engine, clock: FakeClock) -> None:
    with iqbridge.connect("memory://", clock=clock) as hub:
        outbox = Outbox(engine, clock=clock)
        with engine.begin() as conn:
            msg_id = outbox.put(conn, "orders", "x", to=["s"], ttl=10)
        clock.advance(4)
        Relay(outbox, hub).run(once=True)
        rec = hub.store.load(msg_id)
        assert rec.expires_at == int((clock.now + 6) * 1_000_000)


def test_run_stops_on_stop_and_relays_what_arrives(outbox: Outbox, hub: iqbridge.Hub) -> None:
    relay = Relay(outbox, hub, poll=0.01)
    thread = threading.Thread(target=relay.run)
    thread.start()
    try:
        with outbox.engine.begin() as conn:
            msg_id = order(outbox, conn, 1)
        q = hub.queue("orders")
        assert q.get("billing", timeout=5) is not None
        assert hub.store.load(msg_id).native_ref is not None
    finally:
        relay.stop()
        thread.join(5)
    assert not thread.is_alive()
    assert relay.stats.relayed == 1


def test_a_failure_after_the_first_round_is_retried(outbox: Outbox) -> None:
    with iqbridge.connect("memory://") as hub:
        with outbox.engine.begin() as conn:
            first = order(outbox, conn, 1)
        real = hub.adapter.send
        calls = [0]

        def flaky(queue: str, envelopes: list[iqbridge.Envelope]) -> list[str]:
            calls[0] += 1
            if calls[0] in (2, 3):
                raise BrokerUnavailable("broker restarting")
            return real(queue, envelopes)

        hub.adapter.send = flaky  # type: ignore[method-assign]
        relay = Relay(outbox, hub, poll=0.01, max_backoff=0.01)
        thread = threading.Thread(target=relay.run)
        thread.start()
        try:
            q = hub.queue("orders")
            assert q.get("billing", timeout=5) is not None
            with outbox.engine.begin() as conn:
                second = order(outbox, conn, 2)
            delivery = q.get("billing", timeout=5)
            assert delivery is not None and delivery.msg_id == second
        finally:
            relay.stop()
            thread.join(5)
        assert (relay.stats.relayed, relay.stats.failures, relay.stats.last_error) == (2, 2, None)
        assert first != second


def test_a_failure_in_the_first_round_is_raised(outbox: Outbox) -> None:
    with iqbridge.connect("memory://") as hub:
        with outbox.engine.begin() as conn:
            order(outbox, conn, 1)

        def down(queue: str, envelopes: list[iqbridge.Envelope]) -> list[str]:
            raise BrokerUnavailable("no broker here")

        hub.adapter.send = down  # type: ignore[method-assign]
        with pytest.raises(BrokerUnavailable, match="no broker here"):
            Relay(outbox, hub).run()
        assert outbox.counts().pending == 1


def test_until_idle_returns(outbox: Outbox, hub: iqbridge.Hub) -> None:
    stats = Relay(outbox, hub, poll=0.01).run(until_idle=0.3)  # several polls, even when slow
    assert (stats.relayed, stats.rounds > 1) == (0, True)


def test_purge_deletes_only_old_relayed_rows(outbox: Outbox, hub: iqbridge.Hub) -> None:
    with outbox.engine.begin() as conn:
        order(outbox, conn, 1)
    Relay(outbox, hub).run(once=True)
    with outbox.engine.begin() as conn:
        order(outbox, conn, 2)
    assert outbox.purge(3600) == 0
    assert outbox.purge(0) == 1
    assert outbox.counts() == OutboxCounts(pending=1, relayed=0, parked=0)


def test_an_unreachable_outbox_is_a_typed_error_without_password() -> None:
    outbox = Outbox("postgresql://app:s3cret@127.0.0.1:1/shop")
    with pytest.raises(OutboxUnavailable) as info:
        outbox.counts()
    assert "s3cret" not in str(info.value)
    assert "s3cret" not in repr(outbox)
    outbox.close()


def test_bad_relay_options_are_refused(outbox: Outbox, hub: iqbridge.Hub) -> None:
    with pytest.raises(InvalidArgument, match="batch"):
        Relay(outbox, hub, batch=0)
