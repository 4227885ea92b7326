"""Drop-in over existing RabbitMQ traffic, both directions, on the real broker.

* A producer that knows nothing of iqbridge publishes plain messages onto a subscriber's
  queue or a pool's (through the default exchange, or through the queue's exchange with
  the group's routing key). iqbridge adopts each on first sight under a stable msg_id
  (from its ``message_id`` property, or a digest of its content without one), tracks it
  for the group whose queue it was on, and delivers it once: a redelivery by RabbitMQ,
  before or after iqbridge recorded it, and a producer's retry with the same
  ``message_id`` are not processed again.
* A consumer that knows nothing of iqbridge reads what iqbridge put: the payload bytes
  unchanged in the body, the envelope in properties and headers beside it.

Nothing is mocked: the legacy side is plain pika.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

import iqbridge
from iqbridge import SubscriberState
from iqbridge.adapters.rabbitmq import RabbitMQAdapter
from iqbridge.ids import adopted_id
from iqbridge.testing import FakeClock
from tests.rabbitmq_helpers import AMQP_URL, fresh_prefix, remember, url_with

pytestmark = pytest.mark.rabbitmq

S = SubscriberState
QUEUE = "orders"


@dataclass
class Setup:
    """One test's iqbridge URL and index, and a plain pika channel."""

    url: str
    index: str
    prefix: str
    channel: BlockingChannel
    hubs: list[iqbridge.Hub]

    def hub(self, clock: FakeClock | None = None) -> iqbridge.Hub:
        hub = iqbridge.connect(self.url, index=self.index, clock=clock)
        self.hubs.append(hub)
        return hub

    def open(self, hub: iqbridge.Hub) -> iqbridge.Queue:
        q = hub.queue(QUEUE)
        q.subscribe("billing", "audit")
        q.subscribe_pool("ship", ["ship-1", "ship-2"])
        # A subscriber's queues exist once it has read (or been put to) once.
        for s in ("billing", "audit", "ship-1"):
            assert q.get(s) is None
        return q

    def adapter(self, hub: iqbridge.Hub) -> RabbitMQAdapter:
        assert isinstance(hub.adapter, RabbitMQAdapter)
        return hub.adapter


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    with fresh_prefix("legacy") as prefix:
        conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        hubs: list[iqbridge.Hub] = []
        channel = conn.channel()
        channel.confirm_delivery()  # a publish returns once the broker has it
        try:
            yield Setup(
                url_with(prefix), f"sqlite:///{tmp_path / 'index.db'}", prefix, channel, hubs
            )
        finally:
            for hub in hubs:
                remember(hub.adapter)
                hub.close()
            conn.close()


def publish(
    setup: Setup, routing_key: str, body: bytes, exchange: str = "", **props: object
) -> None:
    setup.channel.basic_publish(
        exchange, routing_key, body, pika.BasicProperties(delivery_mode=2, **props)
    )


def drain(q: iqbridge.Queue, subscriber: str) -> list[iqbridge.Delivery]:
    got = []
    while (d := q.get(subscriber, timeout=0.3)) is not None:
        got.append(d)
        d.done()
    return got


def test_plain_messages_on_a_subscribers_queue_are_adopted_for_that_subscriber(
    setup: Setup,
) -> None:
    hub = setup.hub()
    q = setup.open(hub)
    billing = setup.adapter(hub).queue_name(QUEUE, "billing")
    publish(setup, billing, b"with an id", message_id="legacy-1", correlation_id="c-1")
    publish(setup, billing, b"without an id", headers={"origin": "mainframe", "n": 7})
    publish(setup, billing, b'{"a": 1}', content_type="application/json", priority=8)

    got = drain(q, "billing")
    assert sorted(d.body for d in got) == sorted([b"with an id", b"without an id", b'{"a": 1}'])
    by_body = {d.body: d for d in got}
    first = by_body[b"with an id"]
    assert first.msg_id == adopted_id("rabbitmq", QUEUE, "billing/id/legacy-1")
    assert first.correlation_id == "c-1"
    assert first.publisher == "(legacy)"
    assert by_body[b"without an id"].headers == {"origin": "mainframe", "n": "7"}
    assert by_body[b'{"a": 1}'].payload == {"a": 1}
    assert by_body[b'{"a": 1}'].priority == 8
    for d in got:
        state = q.state(d.msg_id)
        # Only billing's queue had it: the others are not its audience.
        assert set(state.subscribers) == {"billing"}
        assert state.subscribers["billing"].state in (S.DONE, S.JOURNALLED)
    assert drain(q, "audit") == []


def test_plain_message_to_a_pool_reaches_one_member_once(setup: Setup) -> None:
    hub = setup.hub()
    q = setup.open(hub)
    exchange = setup.adapter(hub).exchange(QUEUE)
    for i in range(10):
        publish(setup, "ship", f"parcel {i}".encode(), exchange=exchange, message_id=f"p-{i}")
    got = drain(q, "ship-1") + drain(q, "ship-2")
    assert sorted(d.body for d in got) == sorted(f"parcel {i}".encode() for i in range(10))
    for d in got:
        assert set(q.state(d.msg_id).subscribers) == {"ship-1", "ship-2"}
    assert drain(q, "billing") == []


def test_a_producer_retry_with_the_same_message_id_is_processed_once(setup: Setup) -> None:
    hub = setup.hub()
    q = setup.open(hub)
    billing = setup.adapter(hub).queue_name(QUEUE, "billing")
    publish(setup, billing, b"order 1", message_id="o-1")
    assert [d.body for d in drain(q, "billing")] == [b"order 1"]
    publish(setup, billing, b"order 1", message_id="o-1")  # the producer retries
    publish(setup, billing, b"same body, no id")
    publish(setup, billing, b"same body, no id")  # byte-identical, no id: one message
    assert [d.body for d in drain(q, "billing")] == [b"same body, no id"]
    msg_id = adopted_id("rabbitmq", QUEUE, "billing/id/o-1")
    journal = q.state(msg_id).journal
    assert sum(1 for e in journal if e.actor == "billing" and e.dst == S.DONE.value) == 1


def test_redelivered_before_iqbridge_recorded_it(setup: Setup) -> None:
    """A plain consumer takes the message and dies without an ack: RabbitMQ redelivers it
    (redelivered flag) to iqbridge, which has never seen it: adopted once, processed once."""
    hub = setup.hub()
    q = hub.queue(QUEUE)
    q.subscribe("billing")
    setup.adapter(hub).declare(QUEUE, ["billing"])  # no iqbridge consumer on it yet
    billing = setup.adapter(hub).queue_name(QUEUE, "billing")
    publish(setup, billing, b"taken and dropped", message_id="r-1")
    other = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    ch = other.channel()
    method, _props, body = ch.basic_get(billing, auto_ack=False)
    assert body == b"taken and dropped" and method is not None
    other.close()  # no ack: back to the queue, redelivered
    got = drain(q, "billing")
    assert [d.body for d in got] == [b"taken and dropped"]
    assert got[0].msg_id == adopted_id("rabbitmq", QUEUE, "billing/id/r-1")
    assert drain(q, "billing") == []


def test_redelivered_after_iqbridge_recorded_it(setup: Setup) -> None:
    """iqbridge adopted and claimed the message, then its connection died without an
    ack: another process gets the redelivery; the lease decides, once."""
    clock = FakeClock()
    first = setup.hub(clock)
    q1 = setup.open(first)
    billing = setup.adapter(first).queue_name(QUEUE, "billing")
    publish(setup, billing, b"claimed, never finished", message_id="r-2")
    d = q1.get("billing", timeout=2)
    assert d is not None and d.attempt == 1
    first.adapter.close()  # the process dies: RabbitMQ requeues its unacked delivery
    second = setup.hub(clock)
    q2 = second.queue(QUEUE)
    assert q2.get("billing", timeout=0.5) is None  # the first one's lease still holds
    clock.advance(31)
    again = q2.get("billing", timeout=2)
    assert again is not None
    assert (again.msg_id, again.attempt, again.body) == (d.msg_id, 2, d.body)
    again.done()
    assert drain(q2, "billing") == []
    journal = q2.state(d.msg_id).journal
    assert sum(1 for e in journal if e.actor == "billing" and e.dst == S.DONE.value) == 1


def test_a_plain_consumer_reads_what_iqbridge_put(setup: Setup) -> None:
    hub = setup.hub()
    q = hub.queue(QUEUE)
    q.subscribe("billing")
    body = bytes(range(256)) * 4
    msg_id = q.put(
        body,
        correlation_id="corr-9",
        priority=6,
        headers={"origin": "web", "x-iq-at": "an app header named like ours"},
    )
    billing = setup.adapter(hub).queue_name(QUEUE, "billing")
    method, props, got = setup.channel.basic_get(billing, auto_ack=True)
    assert method is not None
    assert got == body
    assert props.message_id == msg_id
    assert props.correlation_id == "corr-9"
    assert props.priority == 6
    assert props.content_type == "application/octet-stream"
    assert props.delivery_mode == 2
    assert props.headers["origin"] == "web"
    assert props.headers["x-iq-h-x-iq-at"] == "an app header named like ours"
