"""Kafka as a drop-in, both directions, on the session's Tansu broker.

* A plain producer's record (no iqbridge headers) is adopted at first sight: its msg_id
  derives from topic, partition and offset, its value is the payload unchanged, its key
  the ordering key, its headers the application's; it is tracked for the queue's whole
  standing audience (each subscriber gets it once, even when the group reads the
  partition again), and a ``content-type`` header gives its content type.
* A plain consumer (confluent-kafka, its own group, nothing of iqbridge) reads the
  records iqbridge put: the value is the payload unchanged, the key is the ordering key,
  the application's headers are there as they were given.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

import iqbridge
from iqbridge.adapters.kafka import KafkaAdapter
from iqbridge.ids import adopted_id
from iqbridge.states import SubscriberState
from tests.kafka_helpers import fresh_prefix, kafka_bootstrap, kafka_url

pytestmark = pytest.mark.kafka


def _plain_producer() -> Producer:
    return Producer({"bootstrap.servers": kafka_bootstrap(), "enable.idempotence": True})


def test_a_plain_producers_records_are_adopted_once_per_subscriber(tmp_path: Path) -> None:
    prefix = fresh_prefix("legacy")
    hub = iqbridge.connect(kafka_url(prefix), index=f"sqlite:///{tmp_path / 'i.db'}")
    try:
        q = hub.queue("payments")
        q.subscribe("a")
        q.subscribe("b")
        adapter = hub.adapter
        assert isinstance(adapter, KafkaAdapter)
        topic = adapter.topic("payments")
        producer = _plain_producer()
        refs: list[tuple[int, int]] = []
        producer.produce(
            topic,
            value=b"\x00raw bytes\xff",
            key=b"acct-7",
            headers=[("source", b"mainframe")],
            on_delivery=lambda err, msg: refs.append((msg.partition(), msg.offset())),
        )
        producer.produce(
            topic,
            value=json.dumps({"amount": 12}).encode(),
            headers=[("content-type", b"application/json")],
            on_delivery=lambda err, msg: refs.append((msg.partition(), msg.offset())),
        )
        assert producer.flush(10) == 0
        (p0, o0), (p1, o1) = refs
        first_id = adopted_id("kafka", topic, f"{p0}:{o0}")
        second_id = adopted_id("kafka", topic, f"{p1}:{o1}")

        got = q.get("a", timeout=10)
        assert got is not None
        assert got.msg_id == first_id
        assert got.body == b"\x00raw bytes\xff"
        assert got.ordering_key == "acct-7"
        assert got.headers == {"source": "mainframe"}
        got.done()
        second = q.get("a", timeout=10)
        assert second is not None and second.msg_id == second_id
        assert second.payload == {"amount": 12}
        second.done()
        # The other subscriber gets both too (the queue's standing audience).
        seen_b = []
        for _ in range(2):
            d = q.get("b", timeout=10)
            assert d is not None
            seen_b.append(d.msg_id)
            d.done()
        assert seen_b == [first_id, second_id]
        state = q.state(first_id)
        assert state.publisher == "(legacy)"
        assert {s: v.state for s, v in state.subscribers.items()} == {
            "a": SubscriberState.JOURNALLED,
            "b": SubscriberState.JOURNALLED,
        }
        # The group reads the partition again (a commit lost in a crash): nothing twice.
        adapter.rewind("payments", "a", f"{p0}:{o0}")
        assert q.get("a", timeout=2) is None
        assert sum(1 for e in q.state(first_id).journal if e.dst == "DONE") == 2
    finally:
        hub.close()


def test_a_plain_consumer_reads_iqbridges_records_unchanged(tmp_path: Path) -> None:
    prefix = fresh_prefix("legacy")
    hub = iqbridge.connect(kafka_url(prefix), index=f"sqlite:///{tmp_path / 'i.db'}")
    try:
        q = hub.queue("invoices")
        q.subscribe("a")
        body = b"%PDF-1.7 \x00\x01 binary"
        msg_id = q.put(body, headers={"tenant": "eu-1"}, ordering_key="customer-9")
        q.put("text payload")
        adapter = hub.adapter
        assert isinstance(adapter, KafkaAdapter)
        consumer = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap(),
                "group.id": f"{prefix}plain",
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 2000,
                "heartbeat.interval.ms": 300,
            }
        )
        try:
            consumer.subscribe([adapter.topic("invoices")])
            records = []
            deadline = time.monotonic() + 20
            while len(records) < 2 and time.monotonic() < deadline:
                records += [m for m in consumer.consume(10, 0.2) if m.error() is None]
        finally:
            consumer.close()
        assert len(records) == 2
        first, second = records
        assert first.value() == body
        assert first.key() == b"customer-9"
        headers = dict(first.headers() or [])
        assert headers["tenant"] == b"eu-1"
        assert headers["iq-id"] == msg_id.encode()
        assert second.value() == b"text payload"
        # The plain consumer's reading changed nothing for iqbridge's subscriber.
        d = q.get("a", timeout=10)
        assert d is not None and d.msg_id == msg_id and d.body == body
        d.done()
    finally:
        hub.close()
