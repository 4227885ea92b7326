"""How iqbridge's states land in Oracle AQ, looked at inside the fake database: the
recipients of each message, the LOCKED dequeue that holds a delivery, REMOVE and commit
on DONE, a rollback when the holder goes, the dead-letter queue, priority and expiration,
retention and purge, adoption of a plain AQ producer's message, and an instance that
goes down and comes back."""

from __future__ import annotations

import threading

import pytest

import iqbridge
from iqbridge import Pool
from iqbridge.adapters.oracle_aq import OracleAQAdapter
from iqbridge.errors import BrokerUnavailable
from iqbridge.stores.memory import MemoryStore
from iqbridge.testing import FakeClock
from iqbridge.testing.fakes import oracledb as fake
from tests.oracle_helpers import PASSWORD, URL, fake_oracle_fixture  # noqa: F401 (a fixture)

pytestmark = pytest.mark.oracle


def _adapter(hub: iqbridge.Hub) -> OracleAQAdapter:
    assert isinstance(hub.adapter, OracleAQAdapter)
    return hub.adapter


def _message(db: fake.Database, hub: iqbridge.Hub, queue: str, msg_id: str) -> fake._Message:
    ref = hub.store.load(msg_id).native_ref
    assert ref is not None
    (m,) = [m for m in db.queue(_adapter(hub).queue_name(queue)).messages if m.msgid.hex() == ref]
    return m


def test_recipients_are_the_subscribers_and_pools(fake_oracle: fake.Database) -> None:
    with iqbridge.connect(URL, index="memory://") as hub:
        q = hub.queue("orders")
        msg_id = q.put(b"x", to=["billing", Pool("packers", ["p1", "p2"])])
        a = _adapter(hub)
        m = _message(fake_oracle, hub, "orders", msg_id)
        assert set(m.consumers) == {a.consumer_name("billing"), a.consumer_name("packers")}
        assert m.priority == 9 - 4 and m.payload.endswith(b"x")
        with q.get("p2") as d:
            assert d.payload == b"x"
        assert m.consumers[a.consumer_name("packers")].state == fake.MSG_PROCESSED
        assert m.consumers[a.consumer_name("billing")].state == fake.MSG_READY


def test_a_delivery_holds_a_lock_until_done(fake_oracle: fake.Database) -> None:
    with iqbridge.connect(URL, index="memory://") as hub:
        q = hub.queue("orders")
        msg_id = q.put(b"x", to=["a"])
        a = _adapter(hub)
        d = q.get("a")
        assert d is not None
        c = _message(fake_oracle, hub, "orders", msg_id).consumers[a.consumer_name("a")]
        assert c.locked_by is not None and not c.removing
        other = fake.connect(user="iq", password=PASSWORD, dsn="oracle.test:1521/FREEPDB1")
        aq = other.queue(a.queue_name("orders"))
        aq.deqoptions.consumername = a.consumer_name("a")
        aq.deqoptions.wait = fake.DEQ_NO_WAIT
        assert aq.deqone() is None  # locked by the hub's session: skipped
        d.done()
        assert c.state == fake.MSG_PROCESSED and c.locked_by is None
        assert a.read("orders", hub.store.load(msg_id).native_ref or "") is not None  # retained


def test_a_closed_hub_gives_what_it_held_back(fake_oracle: fake.Database) -> None:
    store = MemoryStore()
    clock = FakeClock()
    hub = iqbridge.connect(URL, index=store, clock=clock)
    q = hub.queue("orders", lease=30)
    msg_id = q.put(b"x", to=["a"])
    assert q.get("a") is not None
    m = _message(fake_oracle, hub, "orders", msg_id)
    hub.close()  # as a crash: Oracle rolls the session back
    assert all(c.locked_by is None and c.state == fake.MSG_READY for c in m.consumers.values())
    clock.advance(31)
    with iqbridge.connect(URL, index=store, clock=clock) as again:
        d = again.queue("orders", lease=30).get("a")
        assert d is not None and d.msg_id == msg_id and d.attempt == 2
        d.done()


def test_unusable_goes_to_the_dead_letter_queue(fake_oracle: fake.Database) -> None:
    with iqbridge.connect(URL, index="memory://") as hub:
        q = hub.queue("orders")
        msg_id = q.put(b"poison", to=["a"])
        d = q.get("a")
        assert d is not None
        d.unusable("cannot parse")
        a = _adapter(hub)
        (dead,) = fake_oracle.queue(a.queue_name("orders") + "_DL").messages
        assert dead.correlation == "cannot parse"
        assert list(dead.consumers) == [a.consumer_name("a")]
        assert (
            _message(fake_oracle, hub, "orders", msg_id).consumers[a.consumer_name("a")].state
            == fake.MSG_PROCESSED
        )


def test_priority_correlation_and_expiration(fake_oracle: fake.Database) -> None:
    with iqbridge.connect(URL, index="memory://") as hub:
        q = hub.queue("orders")
        msg_id = q.put(b"x", to=["a"], priority=9, correlation_id="order-7", ttl=90)
        m = _message(fake_oracle, hub, "orders", msg_id)
        assert (m.priority, m.correlation, m.expiration) == (0, "order-7", 90)


def test_purge_removes_journalled_messages_from_the_queue_table(
    fake_oracle: fake.Database,
) -> None:
    clock = FakeClock()
    with iqbridge.connect(URL, index="memory://", clock=clock) as hub:
        q = hub.queue("orders")
        msg_id = q.put(b"x", to=["a"])
        with q.get("a"):
            pass
        ref = hub.store.load(msg_id).native_ref or ""
        assert _adapter(hub).read("orders", ref) is not None
        clock.advance(10)
        assert q.purge(older_than=1) == 1
        assert _adapter(hub).read("orders", ref) is None
        assert fake_oracle.queue(_adapter(hub).queue_name("orders")).messages == []


def test_a_plain_aq_producers_message_is_adopted(fake_oracle: fake.Database) -> None:
    with iqbridge.connect(URL, index="memory://") as hub:
        q = hub.queue("orders")
        q.subscribe("a")
        a = _adapter(hub)
        plain = fake.connect(user="iq", password=PASSWORD, dsn="oracle.test:1521/FREEPDB1")
        plain.queue(a.queue_name("orders")).enqone(
            plain.msgproperties(payload=b"legacy bytes", correlation="c-1")
        )  # no recipients: the queue's subscribers, which declare() added
        plain.commit()
        with q.get("a") as d:
            assert d.payload == b"legacy bytes"
            assert q.state(d.msg_id).correlation_id == "c-1"


def test_instance_down_and_back(fake_oracle: fake.Database) -> None:
    with iqbridge.connect(URL, index="memory://") as hub:
        q = hub.queue("orders")
        first = q.put(b"1", to=["a"])
        fake_oracle.stop()
        with pytest.raises(BrokerUnavailable) as info:
            q.put(b"2", to=["a"])
        assert "oracle+aq://iq@oracle.test:1521/FREEPDB1" in str(info.value)
        assert PASSWORD not in str(info.value)
        fake_oracle.start()
        third = q.put(b"3", to=["a"])
        got = []
        while (d := q.get("a")) is not None:
            got.append(d.msg_id)
            d.done()
        assert got == [first, third]


def test_two_hubs_and_eight_threads_process_each_message_once(
    fake_oracle: fake.Database,
) -> None:
    """A pool of eight members, in two hubs (two adapters, many sessions) over one
    index: every message is done exactly once, and AQ ends with each one removed."""
    store = MemoryStore()
    members = [f"m{i}" for i in range(8)]
    hubs = [iqbridge.connect(URL, index=store) for _ in range(2)]
    try:
        q0 = hubs[0].queue("work")
        q0.subscribe_pool("workers", members)
        ids = q0.put_many([f"job-{i}".encode() for i in range(200)])
        done: list[str] = []
        lock = threading.Lock()

        def work(hub: iqbridge.Hub, member: str) -> None:
            q = hub.queue("work")
            while batch := q.get_many(member, max=5):
                for d in batch:
                    with lock:
                        done.append(d.msg_id)
                batch.done()

        threads = [
            threading.Thread(target=work, args=(hubs[i % 2], m)) for i, m in enumerate(members)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(done) == sorted(ids)
        a = _adapter(hubs[0])
        name = a.consumer_name("workers")
        msgs = fake_oracle.queue(a.queue_name("work")).messages
        assert len(msgs) == 200
        assert all(m.consumers[name].state == fake.MSG_PROCESSED for m in msgs)
    finally:
        for hub in hubs:
            hub.close()
