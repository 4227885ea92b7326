"""A put cut short between the broker and the index (the process killed after the broker
took the entries, before their references were recorded) is repeated without a second
broker entry: the repeat asks the broker what it holds (``Probing.find_sent``) and sends
only the rest. Counted with each broker's own client, on real servers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition
from conftest import need_server
from kafka_helpers import FAST_GROUPS, kafka_bootstrap, kafka_url
from kafka_helpers import fresh_prefix as kafka_prefix
from rabbitmq_helpers import AMQP_URL, remember, url_with
from rabbitmq_helpers import fresh_prefix as rabbit_prefix
from redis_index_helpers import REDIS_URL, drop_streams, redis_reachable

import iqbridge
from iqbridge.errors import IndexUnavailable

IDS = [f"probe-{i}" for i in range(6)]


def _cut_short(hub: iqbridge.Hub) -> None:
    """The first put's references are never recorded (a kill right after the send)."""
    real = hub.store.set_native_refs
    calls = {"n": 0}

    def once(refs: object) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise IndexUnavailable("killed after the send (test)")
        real(refs)  # type: ignore[arg-type]

    hub.store.set_native_refs = once  # type: ignore[method-assign]


def _put_twice(hub: iqbridge.Hub, extra: list[str]) -> None:
    q = hub.queue("orders")
    q.subscribe("a")
    _cut_short(hub)
    with pytest.raises(IndexUnavailable):
        q.put_many([i.encode() for i in IDS], msg_ids=IDS)
    # The repeat (a relay's, a bridge's after restart), with one message more.
    q.put_many([i.encode() for i in IDS + extra], msg_ids=IDS + extra)
    refs = {i: hub.store.load(i).native_ref for i in IDS + extra}
    assert all(refs.values()), refs


def _assert_once(bodies: list[bytes], extra: list[str]) -> None:
    counts = Counter(b.decode() for b in bodies)
    assert counts == Counter(IDS + extra), counts


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    need_server(f"Redis at {REDIS_URL}", *redis_reachable())
    prefix = f"iqt-probe-{__import__('uuid').uuid4().hex[:8]}"
    yield prefix
    drop_streams(prefix)


@pytest.mark.redis
def test_redis_streams_repeat_sends_only_what_the_stream_lacks(
    redis_prefix: str, tmp_path: Path
) -> None:
    # An index apart from the stream's server (no atomic put): the window exists.
    url = f"{REDIS_URL}?stream_prefix={redis_prefix}:"
    with iqbridge.connect(url, index=f"sqlite:///{tmp_path}/i.db") as hub:
        _put_twice(hub, ["probe-extra"])
    client = redis.Redis.from_url(REDIS_URL)
    rows = client.xrange(f"{redis_prefix}:orders")
    _assert_once([f[b"payload"] for _, f in rows], ["probe-extra"])


@pytest.mark.rabbitmq
def test_rabbitmq_with_a_ledger_repeat_sends_only_what_the_broker_lacks(tmp_path: Path) -> None:
    with rabbit_prefix("probe") as prefix:
        with iqbridge.connect(
            url_with(prefix, ledger="true"), index=f"sqlite:///{tmp_path}/i.db"
        ) as hub:
            remember(hub.adapter)
            _put_twice(hub, ["probe-extra"])
            remember(hub.adapter)
        conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        try:
            ch = conn.channel()
            bodies = []
            while True:
                method, _props, body = ch.basic_get(f"{prefix}orders.a", auto_ack=True)
                if method is None:
                    break
                bodies.append(body)
        finally:
            conn.close()
    _assert_once(bodies, ["probe-extra"])


@pytest.mark.kafka
def test_kafka_repeat_sends_only_what_the_topic_lacks(tmp_path: Path) -> None:
    prefix = kafka_prefix("probe")
    with iqbridge.connect(kafka_url(prefix), index=f"sqlite:///{tmp_path}/i.db") as hub:
        _put_twice(hub, ["probe-extra"])
    c = Consumer(
        {"bootstrap.servers": kafka_bootstrap(), "group.id": prefix + "count", **FAST_GROUPS}
    )
    try:
        c.assign([TopicPartition(f"{prefix}orders", 0, 0)])
        bodies: list[bytes] = []
        for _ in range(20):
            got = c.consume(100, timeout=0.5)
            bodies += [m.value() for m in got if m.error() is None]
            if len(bodies) >= len(IDS) + 1 and not got:
                break
    finally:
        c.close()
    _assert_once(bodies, ["probe-extra"])
