"""Reconciliation between a queue's index and its broker (``iqbridge.recovery.reconcile``
and ``iq reconcile``), on the embedded SQLite queue, the memory broker and the real Redis
server. Every inconsistency is produced for real behind iqbridge's back (sqlite3 DELETE,
redis-py XDEL / XADD / XREADGROUP + XACK, a lost acknowledgement), then reported,
repaired, checked through ``queue.state()`` and the broker, and reported no more.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from rabbitmq_helpers import fresh_prefix as rabbit_prefix
from rabbitmq_helpers import url_with
from typer.testing import CliRunner

import iqbridge
from iqbridge import SubscriberState, engine
from iqbridge.adapters.kafka import KafkaAdapter
from iqbridge.adapters.memory import MemoryAdapter
from iqbridge.adapters.redis_streams import RedisStreamsAdapter
from iqbridge.cli import app
from iqbridge.ids import adopted_id
from iqbridge.inventory import Inventory
from iqbridge.model import Envelope
from iqbridge.recovery.reconcile import Check, Kind, reconcile
from tests.kafka_helpers import fresh_prefix as kafka_prefix
from tests.kafka_helpers import kafka_bootstrap, kafka_url
from tests.reconcile_helpers import kinds, one
from tests.redis_index_helpers import REDIS_URL, drop_streams, fresh_prefix
from tests.unit.test_cli import ok, one_error_line

S = SubscriberState


def native_ref(q: iqbridge.Queue, msg_id: str) -> str:
    ref = q.hub.store.load(msg_id).native_ref
    assert ref is not None
    return ref


def drain(q: iqbridge.Queue, subscriber: str) -> list[tuple[str, bytes]]:
    """Every message ``subscriber`` gets now, done at once."""
    out = []
    while (d := q.get(subscriber, timeout=0.2)) is not None:
        out.append((d.msg_id, d.body))
        d.done()
    return out


# --- embedded SQLite ----------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "iq.db"


def test_sqlite_consistent_queue_reports_nothing(db: Path) -> None:
    with iqbridge.connect(f"sqlite:///{db}") as hub:
        q = hub.queue("orders")
        q.subscribe("billing")
        first = q.put(b"one")
        q.put(b"two")
        d = q.get("billing")
        assert d is not None and d.msg_id == first
        d.done()
        assert isinstance(hub.adapter, Inventory)
        report = reconcile(q)
    assert report.findings == ()
    assert report.consistent
    assert (report.records, report.entries) == (2, 2)
    # The embedded queue has no acknowledgement of its own: said plainly, not a finding.
    assert [n.check for n in report.notes] == [Check.STATES]
    assert "queue orders: 2 records, 2 entries: 0 finding(s)" in report.summary()


def test_sqlite_missing_payload_with_and_without_a_retained_copy(db: Path) -> None:
    with iqbridge.connect(f"sqlite:///{db}") as hub:
        plain = hub.queue("plain")
        plain.subscribe("billing")
        lost = plain.put(b"no copy")
        kept_q = hub.queue("kept", retain=True)
        kept_q.subscribe("billing")
        kept = kept_q.put(b"with copy")
        old_ref = native_ref(kept_q, kept)
        with sqlite3.connect(db) as raw:
            raw.execute("DELETE FROM iq_queue_rows WHERE msg_id IN (?, ?)", (lost, kept))

        report = reconcile(plain, repair=True)
        f = one(report, Kind.MISSING_PAYLOAD)
        assert (f.msg_id, f.fix, f.repaired) == (lost, "no retained copy: cannot repair", False)
        assert f.index_says == "publisher REVEALED; billing AVAILABLE"
        assert f.broker_says == "entry gone"
        assert not report.consistent

        assert kinds(reconcile(kept_q)) == [(Kind.MISSING_PAYLOAD, kept, None, False)]
        report = reconcile(kept_q, repair=True)
        f = one(report, Kind.MISSING_PAYLOAD)
        assert f.repaired and f.native_ref != old_ref
        assert report.consistent
        assert native_ref(kept_q, kept) == f.native_ref
        assert kept_q.state(kept).subscribers["billing"].state is S.AVAILABLE
        assert reconcile(kept_q).findings == ()
        assert drain(kept_q, "billing") == [(kept, b"with copy")]
        assert kept_q.state(kept).subscribers["billing"].state is S.JOURNALLED


def test_sqlite_row_without_record_is_deleted_by_repair(db: Path) -> None:
    with iqbridge.connect(f"sqlite:///{db}") as hub:
        q = hub.queue("orders")
        q.subscribe("billing")
        q.put(b"known")
        # A row whose record is gone (a purge cut short between the index and the queue).
        ref = hub.adapter.send("orders", [Envelope("purged-id", b"left over")])[0]
        report = reconcile(q)
        f = one(report, Kind.UNKNOWN_ENTRY)
        assert (f.msg_id, f.native_ref, f.repaired) == ("purged-id", ref, False)
        assert reconcile(q, repair=True).consistent
        assert hub.adapter.read("orders", ref) is None
        assert reconcile(q).findings == ()


# --- memory broker (native consumer groups, in process) -----------------------------------


def test_memory_every_kind_found_and_repaired() -> None:
    with iqbridge.connect("memory://") as hub:
        broker = hub.adapter
        assert isinstance(broker, MemoryAdapter)
        q = hub.queue("orders", retain=True)
        q.subscribe("a", "b")
        m1, m2, m3 = q.put(b"one"), q.put(b"two"), q.put(b"three")
        r1, r2, r3 = (native_ref(q, m) for m in (m1, m2, m3))
        assert reconcile(q).findings == ()

        # m1: group b acknowledged it behind the index's back (b is AVAILABLE).
        got = broker.receive("orders", "b", "rogue", count=1, timeout=0)
        assert [r.native_ref for r in got] == [r1]
        broker.ack("orders", "b", [r1])
        # m2: a finished it, then the broker lost the acknowledgement (pending again).
        assert [m for m, _ in drain(q, "a")] == [m1, m2, m3]
        broker.inject("orders", "a", r2)
        # m3: the entry is gone from the broker.
        broker.delete("orders", [r3])

        report = reconcile(q)
        assert kinds(report) == sorted(
            [
                (Kind.ACKED_ON_BROKER, m1, "b", False),
                (Kind.MISSING_PAYLOAD, m3, None, False),
                (Kind.PENDING_ON_BROKER, m2, "a", False),
            ],
            key=lambda t: t[0].value,
        )
        acked = one(report, Kind.ACKED_ON_BROKER)
        assert (acked.subscriber, acked.index_says) == ("b", "b AVAILABLE")
        pending = one(report, Kind.PENDING_ON_BROKER)
        assert pending.index_says == "a JOURNALLED"
        assert not report.consistent

        report = reconcile(q, repair=True)
        assert all(f.repaired for f in report.findings) and len(report.findings) == 3
        assert report.consistent
        assert r2 not in broker.pending("orders", "a")
        assert native_ref(q, m3) != r3
        assert reconcile(q).findings == ()

        # b gets every message once, m1 included (redelivered), m3 from its new entry.
        assert sorted(drain(q, "b")) == sorted([(m1, b"one"), (m2, b"two"), (m3, b"three")])
        for m in (m1, m2, m3):
            views = q.state(m).subscribers
            assert views["a"].state is views["b"].state is S.JOURNALLED
        assert drain(q, "a") == []
        assert reconcile(q).findings == ()


def test_memory_in_doubt_pool_member_and_given_back_members() -> None:
    with iqbridge.connect("memory://") as hub:
        broker = hub.adapter
        assert isinstance(broker, MemoryAdapter)
        q = hub.queue("jobs", lease=60)
        q.subscribe_pool("workers", ["w1", "w2"])
        held_id, back_id = q.put(b"held"), q.put(b"given back")
        held = q.get("w1")
        assert held is not None and held.msg_id == held_id
        back = q.get("w2")
        assert back is not None and back.msg_id == back_id
        back.release()  # AVAILABLE on attempt 2: delivered through the index from now on
        # Both entries acknowledged behind the index's back.
        broker.ack("jobs", "workers", [native_ref(q, held_id), native_ref(q, back_id)])

        report = reconcile(q)
        # Only the member in doubt on its first attempt: the given-back one is not stuck.
        assert kinds(report) == [(Kind.ACKED_ON_BROKER, held_id, "workers", False)]
        f = report.findings[0]
        assert (f.subscriber, f.index_says) == ("w1", "w1 FETCHED")
        assert reconcile(q, repair=True).consistent
        assert native_ref(q, held_id) in broker.pending("jobs", "workers")
        assert reconcile(q).findings == ()
        held.done()  # the holder finishes: the redelivered entry is acknowledged
        assert drain(q, "w1") == [(back_id, b"given back")]
        assert drain(q, "w2") == []
        for m in (held_id, back_id):
            assert q.state(m).publisher_state is iqbridge.PublisherState.JOURNALLED
        assert reconcile(q).findings == ()


def test_memory_unrecorded_reference_and_an_orphan_still_held() -> None:
    with iqbridge.connect("memory://") as hub:
        broker = hub.adapter
        q = hub.queue("orders")
        q.subscribe("a")
        # A put cut short: the record is written, the broker took the entry, the
        # reference was never recorded.
        change = engine.new_message(
            msg_id="cut-short",
            queue="orders",
            publisher="p",
            audience=q.subscriptions().audience(),
            now=hub.now_us(),
        )
        hub.store.commit(change)
        (ref,) = broker.send("orders", [Envelope("cut-short", b"body", groups=("a",))])
        # An iqbridge entry whose record is gone, not yet read by group a.
        (ghost,) = broker.send("orders", [Envelope("ghost", b"gone", groups=("a",))])

        report = reconcile(q, repair=True)
        assert kinds(report) == [
            (Kind.UNKNOWN_ENTRY, "ghost", None, False),
            (Kind.UNRECORDED_REF, "cut-short", None, True),
        ]
        assert one(report, Kind.UNKNOWN_ENTRY).broker_says == "unacknowledged by a"
        assert native_ref(q, "cut-short") == ref
        # A get acknowledges the ghost (no record) and delivers the other message.
        assert drain(q, "a") == [("cut-short", b"body")]
        report = reconcile(q, repair=True)
        assert kinds(report) == [(Kind.UNKNOWN_ENTRY, "ghost", None, True)]
        assert broker.read("orders", ghost) is None
        assert reconcile(q).findings == ()


# --- RabbitMQ: no listing without consuming -----------------------------------------------


@pytest.mark.rabbitmq
def test_rabbitmq_says_plainly_that_it_cannot_be_checked(tmp_path: Path) -> None:
    index = f"sql+sqlite:///{tmp_path / 'index.db'}"
    with rabbit_prefix("reconcile") as prefix, iqbridge.connect(url_with(prefix), index) as hub:
        q = hub.queue("orders")
        q.subscribe("billing")
        q.put(b"one")
        assert not isinstance(hub.adapter, Inventory)
        report = reconcile(q, repair=True, adopt=True)
    assert (report.records, report.entries, report.findings) == (1, None, ())
    assert [n.check for n in report.notes] == [Check.ENTRIES, Check.PAYLOADS, Check.STATES]
    assert "cannot list a queue's entries without consuming them" in report.notes[0].text
    assert report.consistent
    assert "not checked: entries, payloads, states" in report.summary()


# --- Redis Streams (real server) ----------------------------------------------------------


@pytest.fixture
def redis_url() -> Iterator[tuple[str, str]]:
    """An iqbridge URL on a fresh index prefix and stream prefix, and the stream key."""
    with fresh_prefix("reconcile") as prefix:
        stream_prefix = f"{prefix}:"
        try:
            yield (
                f"{REDIS_URL}?prefix={prefix}&stream_prefix={stream_prefix}&read_ahead=1",
                f"{stream_prefix}orders",
            )
        finally:
            drop_streams(stream_prefix)


@pytest.mark.redis
def test_redis_streams_every_kind_found_and_repaired(redis_url: tuple[str, str]) -> None:
    url, key = redis_url
    raw = redis.Redis.from_url(REDIS_URL)
    try:
        with iqbridge.connect(url) as hub:
            assert isinstance(hub.adapter, RedisStreamsAdapter)
            q = hub.queue("orders", retain=True)
            q.subscribe("a", "b")
            m1, m2, m3 = q.put(b"one"), q.put(b"two"), q.put(b"three")
            r1, r2, r3 = (native_ref(q, m) for m in (m1, m2, m3))
            assert reconcile(q).findings == ()

            # m1: a consumer of group b outside iqbridge reads it and XACKs it.
            read = raw.xreadgroup("b", "rogue", {key: ">"}, count=1)
            assert [ref.decode() for ref, _ in read[0][1]] == [r1]
            raw.xack(key, "b", r1)
            # m2, m3: a finishes them; then m2's acknowledgement is lost (XCLAIM FORCE).
            assert [m for m, _ in drain(q, "a")] == [m1, m2, m3]
            hub.adapter.flush()
            hub.adapter.redeliver("orders", "a", r2)
            # m3: XDEL behind iqbridge's back.
            raw.xdel(key, r3)
            # A producer that knows nothing of iqbridge.
            stranger_ref = raw.xadd(key, {"payload": b"legacy"}).decode()
            stranger = adopted_id("redis-streams", key, stranger_ref)

            report = reconcile(q)
            assert kinds(report) == [
                (Kind.ACKED_ON_BROKER, m1, "b", False),
                (Kind.MISSING_PAYLOAD, m3, None, False),
                (Kind.PENDING_ON_BROKER, m2, "a", False),
                (Kind.UNKNOWN_ENTRY, stranger, None, False),
            ]
            assert one(report, Kind.UNKNOWN_ENTRY).native_ref == stranger_ref
            assert one(report, Kind.ACKED_ON_BROKER).broker_says == "acknowledged by group b"

            # Repair without adopt leaves the stranger's entry alone.
            report = reconcile(q, repair=True)
            assert kinds(report) == [
                (Kind.ACKED_ON_BROKER, m1, "b", True),
                (Kind.MISSING_PAYLOAD, m3, None, True),
                (Kind.PENDING_ON_BROKER, m2, "a", True),
                (Kind.UNKNOWN_ENTRY, stranger, None, False),
            ]
            assert r2 not in hub.adapter.pending("orders", "a")
            new_ref = native_ref(q, m3)
            assert new_ref != r3
            assert raw.xrange(key, new_ref, new_ref)[0][1][b"payload"] == b"three"

            report = reconcile(q, adopt=True)
            assert kinds(report) == [(Kind.UNKNOWN_ENTRY, stranger, None, True)]
            assert q.state(stranger).subscribers["a"].state is S.AVAILABLE
            assert reconcile(q, repair=True, adopt=True).findings == ()

            # The adopted message is delivered once per subscriber (not adopted twice);
            # b gets m1 again (redelivered) and m3 from its new entry.
            assert drain(q, "a") == [(stranger, b"legacy")]
            got_b = drain(q, "b")
            assert sorted(got_b) == sorted(
                [(m1, b"one"), (m2, b"two"), (m3, b"three"), (stranger, b"legacy")]
            )
            for m in (m1, m2, m3, stranger):
                views = q.state(m).subscribers
                assert views["a"].state is views["b"].state is S.JOURNALLED
            hub.adapter.flush()
            assert reconcile(q).findings == ()
    finally:
        raw.close()


@pytest.mark.redis
def test_redis_strangers_consumed_outside_iqbridge_are_left_alone(
    redis_url: tuple[str, str],
) -> None:
    url, key = redis_url
    raw = redis.Redis.from_url(REDIS_URL)
    try:
        with iqbridge.connect(url) as hub:
            q = hub.queue("orders")
            q.subscribe("a")
            hub.adapter.declare("orders", ["a"])
            consumed = raw.xadd(key, {"payload": b"seen by a legacy consumer"}).decode()
            waiting = raw.xadd(key, {"payload": b"nobody read it yet"}).decode()
            read = raw.xreadgroup("a", "legacy", {key: ">"}, count=1)
            assert [ref.decode() for ref, _ in read[0][1]] == [consumed]
            raw.xack(key, "a", consumed)
            new = adopted_id("redis-streams", key, waiting)

            report = reconcile(q, adopt=True)
            assert kinds(report) == [(Kind.UNKNOWN_ENTRY, new, None, True)]
            assert [n.check for n in report.notes] == [Check.ENTRIES]
            assert report.notes[0].text.startswith("1 entries without an iqbridge envelope")
            assert drain(q, "a") == [(new, b"nobody read it yet")]
            assert reconcile(q).findings == ()
    finally:
        raw.close()


# --- Kafka (Tansu, a Kafka-wire broker) -------------------------------------------------


@pytest.mark.kafka
def test_kafka_committed_offsets_and_plain_records(tmp_path: Path) -> None:
    prefix = kafka_prefix("reconcile")
    with iqbridge.connect(kafka_url(prefix), index=f"sqlite:///{tmp_path / 'i.db'}") as hub:
        adapter = hub.adapter
        assert isinstance(adapter, KafkaAdapter) and isinstance(adapter, Inventory)
        q = hub.queue("orders")  # Kafka forgets: the queue keeps retained copies
        q.subscribe("a")
        m1, m2 = q.put(b"one"), q.put(b"two")
        assert (native_ref(q, m1), native_ref(q, m2)) == ("0:0", "0:1")
        assert reconcile(q).findings == ()
        topic = adapter.topic("orders")
        # A plain producer's record, and group a's offset committed past m1 and m2
        # behind the index's back (a consumer outside iqbridge in the same group).
        producer = Producer({"bootstrap.servers": kafka_bootstrap()})
        producer.produce(topic, b"legacy")
        assert producer.flush(10) == 0
        stranger = adopted_id("kafka", topic, "0:2")
        outsider = Consumer(
            {"bootstrap.servers": kafka_bootstrap(), "group.id": adapter.group_id("orders", "a")}
        )
        outsider.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
        outsider.close()

        report = reconcile(q)
        assert report.entries == 3
        assert kinds(report) == [
            (Kind.ACKED_ON_BROKER, m1, "a", False),
            (Kind.ACKED_ON_BROKER, m2, "a", False),
            (Kind.UNKNOWN_ENTRY, stranger, None, False),
        ]
        # Kafka cannot redeliver one record to one group: m1 and m2 go on the topic again,
        # from the retained copies; the plain record is adopted as a get would.
        report = reconcile(q, repair=True, adopt=True)
        assert report.consistent and len(report.findings) == 3
        assert (native_ref(q, m1), native_ref(q, m2)) == ("0:3", "0:4")
        assert reconcile(q).findings == ()

        got: list[tuple[str, bytes]] = []
        for _ in range(3):
            d = q.get("a", timeout=20)
            assert d is not None
            got.append((d.msg_id, d.body))
            d.done()
        assert got == [(stranger, b"legacy"), (m1, b"one"), (m2, b"two")]
        assert q.get("a", timeout=0.5) is None
        for m in (m1, m2, stranger):
            assert q.state(m).subscribers["a"].state is S.JOURNALLED
        assert reconcile(q).findings == ()


# --- the command line ---------------------------------------------------------------------


def test_cli_reports_repairs_and_exit_codes(db: Path) -> None:
    url = f"sqlite:///{db}"
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders", retain=True)
        q.subscribe("billing")
        msg = q.put(b"payload")
    runner = CliRunner()
    out = ok(runner.invoke(app, ["reconcile", url, "orders"]))
    assert "0 finding(s)" in out and "note: states:" in out

    with sqlite3.connect(db) as raw:
        raw.execute("DELETE FROM iq_queue_rows WHERE msg_id = ?", (msg,))
    result = runner.invoke(app, ["reconcile", url, "orders"])
    assert result.exit_code == 3, result.output
    assert "missing payload" in result.stdout and "1 outstanding" in result.stdout

    result = runner.invoke(app, ["reconcile", url, "orders", "--json"])
    assert result.exit_code == 3, result.output
    data = json.loads(result.stdout)
    assert data["consistent"] is False
    assert [(f["kind"], f["msg_id"]) for f in data["findings"]] == [("missing payload", msg)]

    out = ok(runner.invoke(app, ["reconcile", url, "orders", "--repair"]))
    assert "1 repaired, 0 outstanding" in out
    data = json.loads(ok(runner.invoke(app, ["reconcile", url, "orders", "--json"])))
    assert data["findings"] == [] and data["consistent"] is True


def test_cli_bad_input_is_one_typed_line(db: Path) -> None:
    url = f"sqlite:///{db}"
    with iqbridge.connect(url) as hub:
        hub.queue("orders").subscribe("billing")
    runner = CliRunner()
    line = one_error_line(runner.invoke(app, ["reconcile", url, "nosuch"]), 1)
    assert "nosuch" in line
    line = one_error_line(runner.invoke(app, ["reconcile", "nosuch://x", "orders"]), 1)
    assert "nosuch" in line
    missing = f"sqlite:///{db.with_name('absent.db')}"
    line = one_error_line(runner.invoke(app, ["reconcile", missing, "orders"]), 1)
    assert "no iqbridge database" in line
    down = "redis://127.0.0.1:1/0?retry_for=0&socket_connect_timeout=0.5"
    line = one_error_line(runner.invoke(app, ["reconcile", down, "orders"]), 1)
    assert "127.0.0.1:1" in line
    one_error_line(runner.invoke(app, ["reconcile", url]), 2)
