"""Listing a Kafka topic without consuming it for any group (``Inventory``, for
reconciliation).

* entries: a throw-away consumer (its own group id, nothing committed, never subscribed)
  reads every partition from its low watermark to its high watermark;
* a group's view: its committed offsets (``OffsetFetch``; the group is not joined, its
  consumers are not disturbed). A record at or past the committed offset is reported
  unread: the broker does not know which of them a consumer holds in process, and the
  adapter commits the lowest offset not settled, so the records from there are read
  again after a restart and the index skips those finished. A record below it was
  settled by the group.

Kept apart from :mod:`iqbridge.adapters.kafka`, whose methods call these.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaException, TopicPartition

from iqbridge.inventory import Entry, Unacked

from .kafka_wire import decode, ref  # noqa: TID251

if TYPE_CHECKING:
    from .kafka import KafkaAdapter  # noqa: TID251

__all__ = ["kafka_entries", "kafka_unacked"]

_BATCH = 500


def _consumer(adapter: KafkaAdapter, group_id: str) -> Consumer:
    config = adapter._client_config("consumer", **{"group.id": group_id})
    config["enable.auto.commit"] = False
    return Consumer(config)


def _bounds(adapter: KafkaAdapter, consumer: Consumer, topic: str) -> dict[int, tuple[int, int]]:
    """Each partition's (low, high) watermark; none for a topic that does not exist."""
    meta = consumer.list_topics(topic, timeout=adapter.connect_timeout)
    found = meta.topics.get(topic)
    if found is None or found.error is not None:
        return {}
    out: dict[int, tuple[int, int]] = {}
    for p in sorted(found.partitions):
        lo, hi = consumer.get_watermark_offsets(
            TopicPartition(topic, p), timeout=adapter.connect_timeout
        )
        out[p] = (int(lo), int(hi))
    return out


def kafka_entries(adapter: KafkaAdapter, queue: str) -> Iterator[Entry]:
    """Every record the topic still holds, partition by partition, with the msg_id the
    facade knows it by (a plain producer's record: the id its adoption derives)."""
    topic = adapter.topic(queue)
    consumer = _consumer(adapter, f"iq-inventory-{uuid.uuid4().hex}")
    out: list[Entry] = []
    try:
        bounds = _bounds(adapter, consumer, topic)
        todo = {p: hi for p, (lo, hi) in bounds.items() if hi > lo}
        if todo:
            consumer.assign([TopicPartition(topic, p, bounds[p][0]) for p in todo])
        deadline = time.monotonic() + max(adapter.retry_for, adapter.connect_timeout)
        while todo:
            if time.monotonic() > deadline:
                raise adapter._unavailable(f"listing topic {topic}: timed out")
            for msg in consumer.consume(_BATCH, 0.5):
                if msg.error() is not None:
                    continue
                p, off = int(msg.partition() or 0), int(msg.offset() or 0)
                ts = msg.timestamp()[1]
                env, stranger = decode(
                    topic, p, off, msg.key(), msg.value(), msg.headers(), int(ts)
                )
                out.append(Entry(ref(p, off), env.msg_id, stranger, env if stranger else None))
            # Done with a partition once its position reaches the high watermark (a
            # transaction marker may hold the last offset: no record comes for it).
            for tp in consumer.position([TopicPartition(topic, p) for p in todo]):
                if tp.offset >= todo[tp.partition]:
                    del todo[tp.partition]
    except KafkaException as exc:
        raise adapter._wrap(exc, f"listing topic {topic}") from exc
    finally:
        consumer.close()
    return iter(sorted(out, key=lambda e: tuple(int(x) for x in e.native_ref.split(":"))))


def kafka_unacked(adapter: KafkaAdapter, queue: str, group: str) -> Unacked:
    """The records at or past the group's committed offsets, as unread (a group that
    committed nothing starts at the earliest record: everything is unread)."""
    topic = adapter.topic(queue)
    consumer = _consumer(adapter, adapter.group_id(queue, group))
    unread: set[str] = set()
    try:
        bounds = _bounds(adapter, consumer, topic)
        if bounds:
            committed = consumer.committed(
                [TopicPartition(topic, p) for p in bounds], timeout=adapter.connect_timeout
            )
            for tp in committed:
                lo, hi = bounds[tp.partition]
                start = tp.offset if tp.offset >= 0 else lo
                unread.update(ref(tp.partition, o) for o in range(max(start, lo), hi))
    except KafkaException as exc:
        raise adapter._wrap(exc, f"reading the committed offsets of {group}") from exc
    finally:
        consumer.close()
    return Unacked(frozenset(), frozenset(unread))
