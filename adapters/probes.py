"""Finding what reached a broker after a put was cut short (``Probing.find_sent``).

A put writes the index first, then the broker, then the entries' references. A process
killed after the broker took the entries but before the references were recorded leaves
records without one; the idempotent repeat (a relay, a bridge after its restart) asks
here which of them the broker holds and sends only the rest. Each broker is searched
from shortly before the put began (``put_at``) to its end, by the ``iq-id`` every
iqbridge entry carries: a bounded read of the broker's tail, not a scan of all of it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from iqbridge.redaction import get_logger

__all__ = [
    "kafka_find_sent",
    "ledger_name",
    "ledger_steps",
    "rabbitmq_find_sent",
    "redis_find_sent",
    "redis_take_over",
]

log = get_logger("iqbridge")

#: Entries are looked for from this long before the put began (clock skew between the
#: putting host and the broker).
SKEW_MS = 2_000
_PAGE = 1000
#: How long a ledger read may take at most.
_PROBE_TIMEOUT = 10.0


def redis_find_sent(
    call: Callable[[Callable[[], Any]], Any], client: Any, key: str, sent: Sequence[tuple[str, int]]
) -> dict[str, str]:
    """Stream entries (``XRANGE`` from the earliest put time on, by pages) whose
    ``iq-id`` is one of ``sent``'s msg_ids: msg_id -> entry id."""
    want = {m for m, _ in sent}
    found: dict[str, str] = {}
    start = f"{max(0, min(at for _, at in sent) // 1000 - SKEW_MS)}-0"
    while want - found.keys():
        page = functools.partial(client.xrange, key, start, "+", count=_PAGE)
        rows: Any = call(page)
        for ref, fields in rows:
            mid = fields.get(b"iq-id")
            ref_s = ref.decode() if isinstance(ref, bytes) else str(ref)
            if mid is not None and mid.decode() in want:
                found.setdefault(mid.decode(), ref_s)
        if len(rows) < _PAGE:
            break
        last = rows[-1][0]
        last_s = last.decode() if isinstance(last, bytes) else str(last)
        start = "(" + last_s
    return found


def kafka_find_sent(
    consumer: Any,
    topic_partition: Any,
    topic: str,
    partitions: int,
    sent: Sequence[tuple[str, int]],
    timeout: float,
) -> dict[str, str]:
    """Records of ``topic`` (every partition, from the earliest put time on, up to the
    end as it is now) whose ``iq-id`` is one of ``sent``'s msg_ids: msg_id ->
    ``<partition>:<offset>``. ``consumer`` is a fresh confluent-kafka consumer that is
    assigned partitions here and never commits."""
    want = {m for m, _ in sent}
    found: dict[str, str] = {}
    since = max(0, min(at for _, at in sent) // 1000 - SKEW_MS)
    tps = [topic_partition(topic, p, since) for p in range(partitions)]
    starts = consumer.offsets_for_times(tps, timeout=timeout)
    ends: dict[int, int] = {}
    assign = []
    for tp in starts:
        _, high = consumer.get_watermark_offsets(
            topic_partition(topic, tp.partition), timeout=timeout
        )
        start = tp.offset if tp.offset >= 0 else high
        if start < high:
            ends[tp.partition] = high
            assign.append(topic_partition(topic, tp.partition, start))
    if not assign:
        return found
    consumer.assign(assign)
    deadline = time.monotonic() + timeout
    while ends and want - found.keys() and time.monotonic() < deadline:
        for msg in consumer.consume(_PAGE, timeout=0.5):
            if msg.error() is not None:
                continue
            p, o = msg.partition(), msg.offset()
            for name, value in msg.headers() or ():
                if name == "iq-id" and value is not None and value.decode() in want:
                    found.setdefault(value.decode(), f"{p}:{o}")
            if p in ends and o + 1 >= ends[p]:
                del ends[p]
    if ends and want - found.keys():
        raise TimeoutError(f"reading {topic} back took more than {timeout} s")
    return found


def ledger_name(adapter: Any, queue: str) -> str:
    """The RabbitMQ stream queue that records every publish to ``queue``'s exchange."""
    return f"{adapter.exchange(queue)}/ledger"


def ledger_steps(adapter: Any, queue: str, group: str | None) -> list[Any]:
    """Declare steps of the ledger (``ledger=true``): the stream queue itself (group
    None), or its binding for one group's routing key. A stream keeps what it recorded
    for ``x-max-age`` (a week) whatever is consumed from the groups' queues."""
    if not adapter.ledger:
        return []
    name = ledger_name(adapter, queue)
    if group is None:
        args = {"x-queue-type": "stream", "x-max-age": "7D"}
        return [lambda ch, cb: ch.queue_declare(name, durable=True, arguments=args, callback=cb)]
    exchange = adapter.exchange(queue)
    return [lambda ch, cb: ch.queue_bind(name, exchange, routing_key=group, callback=cb)]


def rabbitmq_find_sent(
    adapter: Any, queue: str, sent: Sequence[tuple[str, int]], *, strict: bool = False
) -> dict[str, str]:
    """Messages of ``sent`` the queue's ledger recorded: msg_id -> msg_id (RabbitMQ's
    reference). Read from shortly before the earliest put until every one is found or
    a marker this call publishes to the ledger first comes back (the end as it was).

    A ledger that cannot be read to its end is logged and what was found returned, or,
    ``strict``, raised (TimeoutError when the end did not come within the time limit):
    the caller then asks again rather than send what it could not rule out."""
    from datetime import UTC, datetime

    import pika

    want = {m for m, _ in sent}
    found: dict[str, str] = {}
    since = max(0, min(at for _, at in sent) // 1000 - SKEW_MS) / 1000
    state: dict[str, Any] = {"marker": None, "done": False}
    conn = adapter._blocking(strict=strict)

    def on_message(ch: Any, method: Any, props: Any, _body: bytes) -> None:
        mid = getattr(props, "message_id", None)
        if mid in want:
            found[mid] = mid
        elif mid == state["marker"]:
            state["done"] = True
        if method.delivery_tag % 500 == 0:  # a stream consumer gets credit back by acks
            ch.basic_ack(method.delivery_tag, multiple=True)

    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=2 * _PAGE)
        args = {"x-stream-offset": datetime.fromtimestamp(since, UTC)}
        # Read up to the stream's end as it is now: a marker published to the ledger
        # before reading comes after every entry already there.
        name = ledger_name(adapter, queue)
        marker = f"iq-probe-{uuid.uuid4().hex}"
        ch.basic_publish("", name, b"", pika.BasicProperties(message_id=marker))
        state["marker"] = marker
        ch.basic_consume(name, on_message, arguments=args)
        deadline = time.monotonic() + _PROBE_TIMEOUT
        while want - found.keys() and not state["done"] and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        if strict and want - found.keys() and not state["done"]:
            raise TimeoutError(f"the ledger's end did not come within {_PROBE_TIMEOUT:g} s")
    except Exception as exc:  # pika's errors: no ledger (yet), a closed channel
        if strict:
            raise
        log.warning(
            "RabbitMQ at %s: ledger of %r unreadable (%s); what it did not show is sent again",
            adapter.url,
            queue,
            exc,
        )
    finally:
        # Closing cancels the consumer, and pika rejects the deliveries it buffered,
        # which a stream refuses by closing the connection: harmless here (all is
        # read), so that close is not logged as an error.
        quiet = _ThisThread()
        pika_log = logging.getLogger("pika.adapters.blocking_connection")
        pika_log.addFilter(quiet)
        try:
            with contextlib.suppress(Exception):
                conn.close()
        finally:
            pika_log.removeFilter(quiet)
    return found


class _ThisThread(logging.Filter):
    """Drops the records of the thread that made it."""

    def __init__(self) -> None:
        super().__init__()
        self.ident = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.ident


def redis_take_over(
    call: Callable[[Callable[[], Any]], Any], client: Any, key: str, group: str, to: str
) -> int:
    """``XAUTOCLAIM`` every pending entry of ``group`` (idle or not) for consumer ``to``
    (the adapter's requeue consumer, whose entries the next receive hands out first, in
    id order); returns how many moved."""
    moved = 0
    start = "0-0"
    while True:
        # Not JUSTID: redis-py drops the cursor from a JUSTID reply.
        claim = functools.partial(client.xautoclaim, key, group, to, 0, start, count=_PAGE)
        reply: Any = call(claim)
        moved += len(reply[1])
        nxt = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        if nxt == "0-0":
            return moved
        start = nxt
