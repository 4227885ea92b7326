"""The RabbitMQ sides of ``benchmarks/peers.py``; its docstring describes the work, the
rules and each side. Loaded by peers.py when a RabbitMQ side first runs (it takes the
shared pieces from there, and pika helpers from ``benchmarks/rabbitmq.py``).

Every side declares a queue of its own name on the RabbitMQ at ``--amqp-url`` and
deletes it afterwards (with pika). A message left in the queue once its consumer is gone
(RabbitMQ puts unacknowledged messages back) fails the side.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from peers import STALL, BenchError, Config, Tally, Timing, iq_batch, iq_single, make_bodies
from rabbitmq import drop, drop_declared, unreachable

import iqbridge

__all__ = [
    "faststream_single",
    "iq_rabbitmq_batch",
    "iq_rabbitmq_single",
    "kombu_single",
    "unreachable",
]

#: The subscriber iq_single and iq_batch consume as.
SUBSCRIBER = "s1"


def _check_empty(url: str, queue: str) -> None:
    """Delete ``queue``; raise BenchError if it still held messages."""
    left = drop(url, queues=[queue])
    if left:
        raise BenchError(f"{left} messages were left unacknowledged in the queue")


# --- iqbridge -------------------------------------------------------------------------


@contextlib.contextmanager
def _iq_rabbitmq(cfg: Config, name: str) -> Iterator[iqbridge.Hub]:
    index = cfg.tmp / f"{name}.db"
    hub = iqbridge.connect(cfg.amqp_url, index=f"sqlite:///{index}")
    try:
        yield hub
    finally:
        try:
            drop_declared(cfg.amqp_url, hub, name, [SUBSCRIBER])
        finally:
            hub.close()
            for extra in ("", "-wal", "-shm"):
                Path(f"{index}{extra}").unlink(missing_ok=True)


def iq_rabbitmq_single(cfg: Config) -> Timing:
    name = f"peers-iq-{uuid.uuid4().hex[:10]}"
    with _iq_rabbitmq(cfg, name) as hub:
        return iq_single(hub, cfg, name)


def iq_rabbitmq_batch(cfg: Config) -> Timing:
    name = f"peers-iq-{uuid.uuid4().hex[:10]}"
    with _iq_rabbitmq(cfg, name) as hub:
        return iq_batch(hub, cfg, name)


# --- FastStream -----------------------------------------------------------------------


async def _faststream(cfg: Config, name: str) -> Timing:
    import anyio
    from faststream.rabbit import RabbitBroker, RabbitQueue
    from faststream.rabbit.annotations import RabbitMessage

    anyio.Event()  # loads anyio's asyncio backend now: the first start would import it

    queue = RabbitQueue(name, durable=True)
    bodies = make_bodies(cfg.n)
    tally = Tally(cfg.n)
    finished = asyncio.Event()
    failures: list[BaseException] = []
    last: list[Any] = []

    # No access log line per message; publisher confirms are on by default (its
    # Channel(publisher_confirms=True)): each publish returns once the broker confirmed it.
    broker = RabbitBroker(cfg.amqp_url, logger=None)  # type: ignore[arg-type]

    @broker.subscriber(queue)
    async def handle(body: bytes, message: RabbitMessage) -> None:
        try:
            tally.check(body)
        except BenchError as exc:
            failures.append(exc)
            finished.set()
            raise
        if tally.count == cfg.n:
            last.append(message.raw_message)
            finished.set()

    await broker.connect()
    try:
        await broker.declare_queue(queue)
        start = time.perf_counter()
        for body in bodies:
            await broker.publish(body, queue=queue, persist=True)
        published = time.perf_counter()
        await broker.start()
        seen = -1
        while not finished.is_set():
            if tally.count == seen:
                raise BenchError(f"FastStream stalled after {tally.count} of {cfg.n}")
            seen = tally.count
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), STALL)
        if failures:
            raise failures[0]
        # FastStream acknowledges after the handler returns: wait until the last message
        # is acknowledged, then make one round trip on its channel so the broker has it.
        raw = last[0]
        for _ in range(int(STALL / 0.001)):
            if raw.processed:
                break
            await asyncio.sleep(0.001)
        else:
            raise BenchError("FastStream did not acknowledge the last message")
        await raw.channel.queue_declare(name, passive=True)
        consumed = time.perf_counter()
        tally.finish()
    finally:
        await broker.stop()
    return Timing(published - start, consumed - published)


def faststream_single(cfg: Config) -> Timing:
    name = f"peers-fs-{uuid.uuid4().hex[:10]}"
    try:
        timing = asyncio.run(_faststream(cfg, name))
        _check_empty(cfg.amqp_url, name)
    finally:
        drop(cfg.amqp_url, queues=[name])
    return timing


# --- Kombu ----------------------------------------------------------------------------


def _kombu(cfg: Config, name: str) -> Timing:
    kombu: Any = importlib.import_module("kombu")  # Kombu ships no type hints

    bodies = make_bodies(cfg.n)
    tally = Tally(cfg.n)

    def on_message(body: object, message: Any) -> None:
        tally.check(body)
        message.ack()

    options = {"confirm_publish": True}  # each publish waits for the broker's confirm
    with kombu.Connection(cfg.amqp_url, transport_options=options) as conn:
        queue = kombu.Queue(name, routing_key=name, durable=True)
        producer = kombu.Producer(conn.channel())
        queue(producer.channel).declare()
        channel = conn.channel()
        consumer = kombu.Consumer(
            channel, queues=[queue], callbacks=[on_message], accept=["application/octet-stream"]
        )
        publish: dict[str, Any] = {
            "routing_key": name,
            "delivery_mode": 2,
            "content_type": "application/octet-stream",
            "content_encoding": "binary",
        }
        start = time.perf_counter()
        for body in bodies:
            producer.publish(body, **publish)
        published = time.perf_counter()
        with consumer:  # basic_consume now: no delivery during the publish phase
            while tally.count < cfg.n:
                try:
                    conn.drain_events(timeout=STALL)
                except TimeoutError:
                    raise BenchError(f"Kombu stalled after {tally.count} of {cfg.n}") from None
            # Acks have no reply: one round trip on their channel so the broker has them.
            channel.queue_declare(name, passive=True)
            consumed = time.perf_counter()
    tally.finish()
    return Timing(published - start, consumed - published)


def kombu_single(cfg: Config) -> Timing:
    name = f"peers-kombu-{uuid.uuid4().hex[:10]}"
    try:
        timing = _kombu(cfg, name)
        _check_empty(cfg.amqp_url, name)
    finally:
        drop(cfg.amqp_url, queues=[name])
    return timing
