"""Kafka when the connection is reset in the middle of producing (issue 27, point 15): a
Tansu of the test's own that tells clients to connect through a
:class:`~iqbridge.testing.proxy.FaultProxy` in front of it, so every connection of the
producer goes through the proxy and can be reset.

The idempotent producer retries what a lost connection left unacknowledged itself, with
the same producer id and sequence numbers, so the broker keeps each record once; no
iqbridge-level retry produces a batch again. Counted with confluent-kafka, read from the
start of every partition: every msg_id once, each key (one partition) in put order.

The one retry iqbridge makes itself, with a new producer after librdkafka declared the
old one fatally broken, produces again only what the old one did not confirm (and what
the topic does not hold): the fatal error is injected after the real producer delivered
half a batch (librdkafka has no way to cause one on demand against a real broker).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka_helpers import FAST_GROUPS, Tansu, free_port, kafka_url, tansu_binary

import iqbridge
from iqbridge.adapters import kafka as kafka_adapter
from iqbridge.adapters.kafka import KafkaAdapter
from iqbridge.putting import Outgoing
from iqbridge.testing.proxy import FaultProxy

pytestmark = pytest.mark.kafka

KEYS = ("k0", "k1", "k2", "k3")


@pytest.fixture
def behind_proxy() -> Iterator[FaultProxy]:
    """A Tansu of this test's own, reached (bootstrap and advertised) through a proxy."""
    if tansu_binary() is None:
        kafka_url()  # skips, or fails under CI=true, with the reason
    port = free_port()
    with FaultProxy("127.0.0.1", port) as proxy:
        broker = Tansu(port, advertised_port=proxy.port).start()
        try:
            yield proxy
        finally:
            broker.stop()


def _records(
    bootstrap: str, topic: str, partitions: int, total: int
) -> list[tuple[int, str, dict[str, object]]]:
    """(partition, iq-id, value) of every record of the topic, partition by partition:
    read until ``total`` came and then nothing more for a second."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "count", **FAST_GROUPS})
    out: list[tuple[int, str, dict[str, object]]] = []
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        quiet = 0
        deadline = time.monotonic() + 30
        while quiet < 2 and time.monotonic() < deadline:
            got = [m for m in c.consume(500, timeout=0.5) if m.error() is None]
            for msg in got:
                headers = dict(msg.headers() or [])
                out.append((msg.partition(), headers["iq-id"].decode(), orjson.loads(msg.value())))
            quiet = quiet + 1 if not got and len(out) >= total else 0
    finally:
        c.close()
    return out


def _url(address: str) -> str:
    opts = {**FAST_GROUPS, "prefix": "resets-", "retry_for": "30"}
    return f"kafka://{address}?" + "&".join(f"{k}={v}" for k, v in opts.items())


def _assert_once_in_order(records: list[tuple[int, str, dict[str, object]]], ids: set[str]) -> None:
    copies = Counter(mid for _, mid, _ in records)
    twice = {m: n for m, n in copies.items() if n > 1}
    assert not twice, f"{len(twice)} messages are in the topic more than once"
    assert set(copies) == ids, f"missing {sorted(ids - set(copies))}"
    last: dict[object, int] = {}
    for _, _, body in records:
        n = body["n"]
        assert isinstance(n, int)
        assert n > last.get(body["k"], -1), f"key {body['k']} out of order at {body}"
        last[body["k"]] = n


def _batch(window: int, seq: dict[str, int], size: int = 100) -> list[Outgoing]:
    batch = []
    for i in range(size):
        k = KEYS[i % len(KEYS)]
        batch.append(Outgoing({"k": k, "n": seq[k]}, msg_id=f"w{window}-{i}", ordering_key=k))
        seq[k] += 1
    return batch


def test_resets_while_producing_leave_one_record_of_each_message_in_key_order(
    behind_proxy: FaultProxy, tmp_path: Path
) -> None:
    proxy = behind_proxy
    seq = dict.fromkeys(KEYS, 0)
    ids = {"warm-up"}
    with iqbridge.connect(_url(proxy.address), index=f"sqlite:///{tmp_path}/index.db") as hub:
        q = hub.queue("orders")
        q.subscribe("a")
        adapter = hub.adapter
        assert isinstance(adapter, KafkaAdapter)
        q.put({"k": "warm-up", "n": 0}, msg_id="warm-up")  # topic made before the cuts
        size = 0
        for window in range(10):
            batch = _batch(window, seq)
            if window % 2:
                # Cut after 10% to 70% of a window's bytes (as the first one measured).
                proxy.cut_after(size * (1 + (window * 3) % 7) // 10)
            before = proxy.client_bytes
            q.put_each(batch)
            if window == 0:
                size = proxy.client_bytes - before
            ids |= {o.msg_id or "" for o in batch}
        cuts = proxy.cuts
        topic, partitions = adapter.topic("orders"), adapter.partitions
    print(f"{cuts} connections cut while producing {len(ids)} records")
    assert cuts == 5
    _assert_once_in_order(_records(proxy.address, topic, partitions, len(ids)), ids)


def test_after_a_fatal_producer_error_only_what_was_not_confirmed_is_produced_again(
    behind_proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """librdkafka declares the producer fatally broken after it delivered the first half
    of a batch of 100: the new producer produces the other half only. Before the fix it
    produced the whole batch again, and the first half was in the topic twice."""
    proxy = behind_proxy
    seq = dict.fromkeys(KEYS, 0)
    with iqbridge.connect(_url(proxy.address), index=f"sqlite:///{tmp_path}/index.db") as hub:
        q = hub.queue("orders")
        q.subscribe("a")
        adapter = hub.adapter
        assert isinstance(adapter, KafkaAdapter)
        real = adapter._produce_once
        calls: list[int] = []

        def fatal_after_half(topic: str, items: Any, *rest: Any) -> list[str]:
            calls.append(len(items))
            if len(calls) == 1:
                real(topic, items[:50], *rest)  # really delivered, then the producer breaks
                raise kafka_adapter._Fatal("test: fatal error after 50 records")
            return real(topic, items, *rest)

        monkeypatch.setattr(adapter, "_produce_once", fatal_after_half)
        batch = _batch(0, seq)
        q.put_each(batch)
        topic, partitions = adapter.topic("orders"), adapter.partitions
    ids = {o.msg_id or "" for o in batch}
    _assert_once_in_order(_records(proxy.address, topic, partitions, len(ids)), ids)
    assert calls == [100, 50]
