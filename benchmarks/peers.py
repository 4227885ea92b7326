"""iqbridge against the libraries its users would pick instead, on the same work, in one run.

The work, the same for every side: N messages (``--messages``, default 20,000) of 100
bytes, one subscriber; publish them all, then consume them all with an acknowledgement
each. Message i's body is its index in ten digits, ten times over, so the consumer checks
every body once: intact bytes, every index exactly once, none missing. The rate is
N / (publish time + consume time), in msg/s.

Redis (one local server, ``--url``; every run on fresh keys, deleted afterwards):

* ``redis:iqbridge``: ``queue.put`` per message, then ``queue.get`` and
  ``delivery.done`` per message (Redis Streams with the Redis index, its defaults).
* ``redis:iqbridge-batch``: ``queue.put_many`` in chunks of ``--batch``, then
  ``queue.get_many(subscriber, --batch)`` and ``batch.done()`` (the whole batch settled
  in one index commit and one broker acknowledgement).
* ``redis:faststream``: FastStream's ``RedisBroker`` on a stream with a consumer group:
  ``broker.publish(body, stream=...)`` per message (one ``XADD`` each); a
  ``StreamSub(stream, group, consumer)`` handler per message, acknowledged by FastStream
  after the handler returns (one ``XACK`` each; its reads take whatever is there, it
  sets no ``COUNT`` by default).
* ``redis:faststream-batch``: FastStream's own throughput path: ``broker.publish(...,
  pipeline=pipe)`` into a Redis pipeline executed every ``--batch`` messages (its
  documented pipelining), and a ``StreamSub(..., batch=True, max_records=--batch)``
  handler that gets a list of bodies and is acknowledged with one ``XACK`` per batch.
* ``redis:kombu``: Kombu's Redis transport (lists, with its default ack emulation: an
  unacked hash and index written on delivery, removed on ``message.ack()``):
  ``producer.publish`` per message on the default exchange (one ``LPUSH``; a named
  direct exchange adds an ``SMEMBERS`` per publish), a ``Consumer`` callback that acks
  each message, driven by ``connection.drain_events``.
* ``redis:kombu-batch``: the same with ``producer.batch(max_size=--batch)``, Kombu's
  pipelined publish. Its Redis transport has no batch receive: ``prefetch_count`` only
  caps unacknowledged messages, each still comes with its own ``BRPOP``, so the consume
  phase is the single one's.

RabbitMQ (one local server, ``--amqp-url``; the sides are in ``peers_rabbitmq.py``; every
run on a queue of its own name, deleted afterwards; persistent messages on durable
queues, publisher confirms on, so a publish returns once the broker has the message on
disk; a message still in the queue once its consumer is gone fails the side):

* ``rabbitmq:iqbridge``: ``queue.put`` per message, then ``queue.get`` and
  ``delivery.done`` per message, on ``amqp://...`` with the SQLite index in a fresh file
  (``index=sqlite:///<file>``, ``synchronous=full``); the adapter's defaults (publisher
  confirms, prefetch 256, ``basic.ack`` per done).
* ``rabbitmq:iqbridge-batch``: ``queue.put_many`` in chunks of ``--batch`` (the adapter
  publishes a chunk with its confirms awaited a window at a time, not one by one), then
  ``queue.get_many(subscriber, --batch)`` and ``batch.done()`` (one index commit; the
  adapter acknowledges with ``multiple`` where the batch's delivery tags allow).
* ``rabbitmq:faststream``: FastStream's ``RabbitBroker`` (aio-pika), its default channel
  (``Channel(publisher_confirms=True)``, no prefetch limit): ``broker.publish(body,
  queue=RabbitQueue(name, durable=True), persist=True)`` per message, each awaiting its
  confirm; a subscriber handler per message, acknowledged by FastStream after the
  handler returns (its default ``AckPolicy.REJECT_ON_ERROR``: ``basic.ack`` on success).
  The consume phase ends when the last message is acknowledged and one round trip on its
  channel has followed. There is no ``rabbitmq:faststream-batch``: FastStream's RabbitMQ
  side has no batch path (``publish_batch`` raises "RabbitMQ doesn't support publishing
  in batches", and its RabbitMQ subscriber has no ``batch`` option).
* ``rabbitmq:kombu``: Kombu with py-amqp (``amqp://``), ``transport_options=
  {"confirm_publish": True}`` (each publish waits for its confirm): ``producer.publish(
  body, routing_key=name, delivery_mode=2)`` per message on the default exchange to a
  durable ``Queue``; a ``Consumer`` (no prefetch limit, Kombu's default) callback that
  calls ``message.ack()``, driven by ``connection.drain_events``, its ``basic_consume``
  after the publish phase; the consume phase ends with one round trip on the consumer's
  channel after the last ack. There is no ``rabbitmq:kombu-batch``: ``producer.batch()``
  defers publishes only on transports that implement it (Redis); on py-amqp it publishes
  each message at once, so it would measure this side again.

A prefetch of 100 for FastStream and Kombu measured the same as no limit (20,000
messages, two rounds each: within 3 %).

SQLite (a fresh file in a temporary directory per run):

* ``sqlite:iqbridge`` and ``sqlite:iqbridge-batch``: the same calls as on Redis, on
  ``sqlite:///<file>`` (the embedded default: WAL, ``synchronous=full``).
* ``sqlite:persist-queue``: persist-queue's ``SQLiteAckQueue``: ``put`` per message,
  then ``get`` and ``ack`` per message. ``auto_commit=True`` (the only setting its ack
  queue accepts: it turns ``False`` back to ``True`` with a warning) and
  ``multithreading=False`` (one connection; its docs call for ``True`` only when several
  threads share the queue). WAL, as it always opens the file, and SQLite's default
  ``synchronous`` (full): each call is one committed transaction, as for iqbridge.

Only the publish and consume phases are timed, on every side alike: connecting, declaring
the queue, stream, consumer group or subscriber beforehand, building the bodies, the
final checks and clean-up are not. FastStream runs in its own asyncio event loop per run
(``asyncio.run``); its consume phase starts its subscriber on the already open
connection (the group already exists) and ends when the last acknowledgement is in
(the group's pending list is empty). Its per-message access log is off (``logger=None``),
as iqbridge logs nothing per message either.

Rounds are interleaved (round 1 runs every side, then round 2, ...) and each side's
median over ``--rounds`` (default 3) is reported. A side whose library is not installed
is skipped with the reason (the peers come with ``pip install -e '.[bench]'``); a side
that fails prints why and is not run again, and the rest still runs. Last come, per
backend, iqbridge's best path's rate over the best peer's, and the last line is
``ratio=<number>``: the smallest of those ratios, or ``ratio=none`` when no backend had
both an iqbridge side and a peer measured. The exit code is 1 when a side failed.

Usage: python benchmarks/peers.py [--messages N] [--rounds R] [--batch B]
       [--url redis://127.0.0.1:6379/0] [--amqp-url amqp://guest:guest@127.0.0.1:5672/%2F]
       [--only SIDE[,SIDE...]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import iqbridge

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
BODY_SIZE = 100
#: Seconds a consumer waits for the next message before the run is declared stalled.
STALL = 10.0
INSTALL_HINT = "pip install -e '.[bench]'"


class BenchError(Exception):
    """A side could not do the work, or did it wrong."""


def make_body(i: int) -> bytes:
    """Message i's 100 bytes: its index in ten digits, ten times over."""
    return b"%010d" % i * (BODY_SIZE // 10)


def make_bodies(n: int) -> list[bytes]:
    """Every message's body, built before any clock starts."""
    return [make_body(i) for i in range(n)]


class Tally:
    """Checks each body once: intact, every index exactly once, none missing."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = 0
        self._seen = bytearray(n)

    def check(self, body: object) -> None:
        """Count one delivered body, or raise BenchError if it is wrong or repeated."""
        if not isinstance(body, bytes | bytearray | memoryview):
            raise BenchError(f"a body arrived as {type(body).__name__}, not bytes")
        raw = bytes(body)
        try:
            i = int(raw[:10])
        except ValueError:
            raise BenchError(f"malformed body {raw[:24]!r}") from None
        if not 0 <= i < self.n or raw != make_body(i):
            raise BenchError(f"corrupt body {raw[:24]!r}... ({len(raw)} B)")
        if self._seen[i]:
            raise BenchError(f"message {i} delivered twice")
        self._seen[i] = 1
        self.count += 1

    def finish(self) -> None:
        """Raise BenchError unless all n messages arrived."""
        if self.count != self.n:
            raise BenchError(f"{self.n - self.count} of {self.n} messages never arrived")


@dataclass(frozen=True)
class Timing:
    """Wall time of the two timed phases of one run, in seconds."""

    publish: float
    consume: float

    def rate(self, n: int) -> float:
        """Messages per second over both phases."""
        return n / (self.publish + self.consume)


@dataclass(frozen=True)
class Config:
    """What every run gets."""

    n: int
    batch: int
    url: str
    tmp: Path
    amqp_url: str = DEFAULT_AMQP_URL


@dataclass(frozen=True)
class Side:
    """One library on one backend, used one way."""

    name: str
    backend: str
    library: str
    run: Callable[[Config], Timing]
    needs: tuple[str, ...] = ()

    @property
    def short(self) -> str:
        """The name without its backend."""
        return self.name.split(":", 1)[1]

    @property
    def is_iqbridge(self) -> bool:
        return self.library == "iqbridge"


@dataclass
class Outcome:
    """A side's rounds so far."""

    side: Side
    rates: list[float] = field(default_factory=list)
    timings: list[Timing] = field(default_factory=list)
    skipped: str | None = None
    failed: str | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.rates) if self.rates and not self.failed else None


def chunks(items: Sequence[bytes], size: int) -> Iterator[Sequence[bytes]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _drop_redis_keys(url: str, pattern: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=pattern, count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


def _redis_unreachable(url: str) -> str | None:
    """Why the Redis at ``url`` cannot be used, or None when it answers."""
    try:
        import redis
    except ImportError:
        return "redis-py is not installed (pip install -e '.[redis]')"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except redis.RedisError as exc:
        return f"Redis at {url} is not reachable: {exc}"
    return None


# --- iqbridge ---------------------------------------------------------------------------


@contextlib.contextmanager
def _iq_redis(cfg: Config) -> Iterator[iqbridge.Hub]:
    prefix = f"peers-{uuid.uuid4().hex[:10]}"
    sep = "&" if "?" in cfg.url else "?"
    try:
        with iqbridge.connect(f"{cfg.url}{sep}prefix={prefix}&stream_prefix={prefix}:") as hub:
            yield hub
    finally:
        _drop_redis_keys(cfg.url, f"*{prefix}*")


@contextlib.contextmanager
def _iq_sqlite(cfg: Config) -> Iterator[iqbridge.Hub]:
    path = cfg.tmp / f"iq-{uuid.uuid4().hex[:10]}.db"
    try:
        with iqbridge.connect(f"sqlite:///{path}") as hub:
            yield hub
    finally:
        for extra in ("", "-wal", "-shm"):
            Path(f"{path}{extra}").unlink(missing_ok=True)


def iq_single(hub: iqbridge.Hub, cfg: Config, name: str = "bench") -> Timing:
    """put per message, then get and done per message, on ``hub``'s queue ``name``."""
    queue = hub.queue(name)
    queue.subscribe("s1")
    bodies = make_bodies(cfg.n)
    tally = Tally(cfg.n)
    start = time.perf_counter()
    for body in bodies:
        queue.put(body)
    published = time.perf_counter()
    for _ in range(cfg.n):
        delivery = queue.get("s1", timeout=STALL)
        if delivery is None:
            raise BenchError(f"queue.get found nothing after {tally.count} of {cfg.n}")
        tally.check(delivery.body)
        delivery.done()
    consumed = time.perf_counter()
    tally.finish()
    if queue.get("s1") is not None:
        raise BenchError("a message was delivered again after all were done")
    return Timing(published - start, consumed - published)


def iq_batch(hub: iqbridge.Hub, cfg: Config, name: str = "bench") -> Timing:
    """put_many in chunks, then get_many and batch.done, on ``hub``'s queue ``name``."""
    queue = hub.queue(name)
    get_many: Callable[..., Any] | None = getattr(queue, "get_many", None)
    if get_many is None:
        raise BenchError(
            "this iqbridge has no Queue.get_many (the batch consumer API): "
            "the batch path cannot be measured"
        )
    queue.subscribe("s1")
    bodies = make_bodies(cfg.n)
    tally = Tally(cfg.n)
    start = time.perf_counter()
    for chunk in chunks(bodies, cfg.batch):
        queue.put_many(chunk)
    published = time.perf_counter()
    while tally.count < cfg.n:
        batch = get_many("s1", cfg.batch, timeout=STALL)
        if batch is None or len(batch) == 0:
            raise BenchError(f"queue.get_many found nothing after {tally.count} of {cfg.n}")
        for delivery in batch:
            tally.check(delivery.body)
        batch.done()
    consumed = time.perf_counter()
    tally.finish()
    if queue.get("s1") is not None:
        raise BenchError("a message was delivered again after all were done")
    return Timing(published - start, consumed - published)


def iq_redis_single(cfg: Config) -> Timing:
    with _iq_redis(cfg) as hub:
        return iq_single(hub, cfg)


def iq_redis_batch(cfg: Config) -> Timing:
    with _iq_redis(cfg) as hub:
        return iq_batch(hub, cfg)


def iq_sqlite_single(cfg: Config) -> Timing:
    with _iq_sqlite(cfg) as hub:
        return iq_single(hub, cfg)


def iq_sqlite_batch(cfg: Config) -> Timing:
    with _iq_sqlite(cfg) as hub:
        return iq_batch(hub, cfg)


# --- FastStream ---------------------------------------------------------------------------


async def _faststream(cfg: Config, batch: bool) -> Timing:
    import anyio
    from faststream.redis import RedisBroker, StreamSub

    anyio.Event()  # loads anyio's asyncio backend now: the first start would import it

    stream = f"peers-fs-{uuid.uuid4().hex[:10]}"
    group, consumer = "bench", "c1"
    bodies = make_bodies(cfg.n)
    tally = Tally(cfg.n)
    finished = asyncio.Event()
    failures: list[BaseException] = []

    def take(body: object) -> None:
        try:
            tally.check(body)
        except BenchError as exc:
            failures.append(exc)
            finished.set()
            raise
        if tally.count == cfg.n:
            finished.set()

    # No access log line per message (FastStream's default writes two at INFO).
    broker = RedisBroker(cfg.url, logger=None)  # type: ignore[arg-type]
    if batch:

        @broker.subscriber(
            stream=StreamSub(
                stream, group=group, consumer=consumer, batch=True, max_records=cfg.batch
            )
        )
        async def handle_batch(bodies: list[bytes]) -> None:
            for body in bodies:
                take(body)

    else:

        @broker.subscriber(stream=StreamSub(stream, group=group, consumer=consumer))
        async def handle(body: bytes) -> None:
            take(body)

    client = await broker.connect()
    try:
        # The group first, from the stream's start, as iqbridge's subscribe comes first.
        await client.xgroup_create(stream, group, id="0", mkstream=True)
        start = time.perf_counter()
        if batch:
            for chunk in chunks(bodies, cfg.batch):
                async with client.pipeline() as pipe:
                    for body in chunk:
                        await broker.publish(body, stream=stream, pipeline=pipe)
                    await pipe.execute()
        else:
            for body in bodies:
                await broker.publish(body, stream=stream)
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
        # The last acknowledgement goes out after the handler returns: wait for it.
        for _ in range(int(STALL / 0.001)):
            info = await client.xpending(stream, group)
            if info["pending"] == 0:
                break
            await asyncio.sleep(0.001)
        else:
            raise BenchError("FastStream left messages unacknowledged")
        consumed = time.perf_counter()
        tally.finish()
    finally:
        await broker.stop()
        _drop_redis_keys(cfg.url, stream)
    return Timing(published - start, consumed - published)


def faststream_single(cfg: Config) -> Timing:
    return asyncio.run(_faststream(cfg, batch=False))


def faststream_batch(cfg: Config) -> Timing:
    return asyncio.run(_faststream(cfg, batch=True))


# --- Kombu --------------------------------------------------------------------------------


def _kombu(cfg: Config, batch: bool) -> Timing:
    kombu: Any = importlib.import_module("kombu")  # Kombu ships no type hints

    prefix = f"peers-kombu-{uuid.uuid4().hex[:10]}:"
    name = "bench"
    bodies = make_bodies(cfg.n)
    tally = Tally(cfg.n)

    def on_message(body: object, message: Any) -> None:
        tally.check(body)
        message.ack()

    try:
        with kombu.Connection(cfg.url, transport_options={"global_keyprefix": prefix}) as conn:
            queue = kombu.Queue(name, routing_key=name)
            producer = kombu.Producer(conn.channel())
            queue(producer.channel).declare()
            consumer = kombu.Consumer(
                conn.channel(),
                queues=[queue],
                callbacks=[on_message],
                accept=["application/octet-stream"],
            )
            options: dict[str, Any] = {
                "routing_key": name,
                "content_type": "application/octet-stream",
                "content_encoding": "binary",
            }
            with consumer:
                start = time.perf_counter()
                if batch:
                    with producer.batch(max_size=cfg.batch):
                        for body in bodies:
                            producer.publish(body, **options)
                else:
                    for body in bodies:
                        producer.publish(body, **options)
                published = time.perf_counter()
                while tally.count < cfg.n:
                    try:
                        conn.drain_events(timeout=STALL)
                    except TimeoutError:
                        raise BenchError(f"Kombu stalled after {tally.count} of {cfg.n}") from None
                consumed = time.perf_counter()
            tally.finish()
            client = conn.default_channel.client
            unacked = client.hlen(conn.default_channel.unacked_key)
            if unacked:
                raise BenchError(f"Kombu left {unacked} messages unacknowledged")
    finally:
        _drop_redis_keys(cfg.url, f"{prefix}*")
    return Timing(published - start, consumed - published)


def kombu_single(cfg: Config) -> Timing:
    return _kombu(cfg, batch=False)


def kombu_batch(cfg: Config) -> Timing:
    return _kombu(cfg, batch=True)


# --- persist-queue ------------------------------------------------------------------------


def persist_queue(cfg: Config) -> Timing:
    import shutil

    from persistqueue import SQLiteAckQueue

    path = cfg.tmp / f"pq-{uuid.uuid4().hex[:10]}"
    bodies = make_bodies(cfg.n)
    tally = Tally(cfg.n)
    q = SQLiteAckQueue(str(path), auto_commit=True, multithreading=False)
    try:
        start = time.perf_counter()
        for body in bodies:
            q.put(body)
        published = time.perf_counter()
        for _ in range(cfg.n):
            item = q.get(timeout=STALL)
            tally.check(item)
            q.ack(item)
        consumed = time.perf_counter()
        tally.finish()
        if q.acked_count() != cfg.n:
            raise BenchError(f"persist-queue acknowledged {q.acked_count()} of {cfg.n}")
    finally:
        q.close()
        shutil.rmtree(path, ignore_errors=True)
    return Timing(published - start, consumed - published)


# --- RabbitMQ (benchmarks/peers_rabbitmq.py) ----------------------------------------------


def _rabbitmq(name: str) -> Callable[[Config], Timing]:
    """The RabbitMQ side ``name`` of peers_rabbitmq, imported when it first runs."""

    def run(cfg: Config) -> Timing:
        import peers_rabbitmq

        side: Callable[[Config], Timing] = getattr(peers_rabbitmq, name)
        return side(cfg)

    run.__name__ = name
    return run


#: What every RabbitMQ side needs: pika (the adapter's driver; the clean-up uses it too).
_AMQP = ("pika",)


def _rabbitmq_unreachable(url: str) -> str | None:
    """Why the RabbitMQ at ``url`` cannot be used, or None when it answers."""
    if importlib.util.find_spec("pika") is None:
        return "pika is not installed (pip install -e '.[rabbitmq]')"
    import peers_rabbitmq

    why = peers_rabbitmq.unreachable(url)
    return f"RabbitMQ at {url} is not reachable: {why}" if why else None


SIDES: tuple[Side, ...] = (
    Side("redis:iqbridge", "redis", "iqbridge", iq_redis_single, ("redis",)),
    Side("redis:iqbridge-batch", "redis", "iqbridge", iq_redis_batch, ("redis",)),
    Side("redis:faststream", "redis", "faststream", faststream_single, ("faststream",)),
    Side("redis:faststream-batch", "redis", "faststream", faststream_batch, ("faststream",)),
    Side("redis:kombu", "redis", "kombu", kombu_single, ("kombu",)),
    Side("redis:kombu-batch", "redis", "kombu", kombu_batch, ("kombu",)),
    Side("rabbitmq:iqbridge", "rabbitmq", "iqbridge", _rabbitmq("iq_rabbitmq_single"), _AMQP),
    Side("rabbitmq:iqbridge-batch", "rabbitmq", "iqbridge", _rabbitmq("iq_rabbitmq_batch"), _AMQP),
    Side(
        "rabbitmq:faststream",
        "rabbitmq",
        "faststream",
        _rabbitmq("faststream_single"),
        ("faststream", "aio_pika", *_AMQP),
    ),
    Side("rabbitmq:kombu", "rabbitmq", "kombu", _rabbitmq("kombu_single"), ("kombu", *_AMQP)),
    Side("sqlite:iqbridge", "sqlite", "iqbridge", iq_sqlite_single),
    Side("sqlite:iqbridge-batch", "sqlite", "iqbridge", iq_sqlite_batch),
    Side("sqlite:persist-queue", "sqlite", "persist-queue", persist_queue, ("persistqueue",)),
)

#: The issues' targets: (iqbridge side, peer side, at least). Issue 28 (the state path
#: built for batches): the Redis batch at twice FastStream's pipelined batch, the single
#: paths at least the best peer on Redis and SQLite, the RabbitMQ batch at twice the best
#: peer's; the SQLite batch's from before.
TARGETS = (
    ("redis:iqbridge-batch", "redis:faststream-batch", 2.0),
    ("redis:iqbridge", "redis:faststream", 1.0),
    ("sqlite:iqbridge", "sqlite:persist-queue", 1.0),
    ("sqlite:iqbridge-batch", "sqlite:persist-queue", 3.0),
    ("rabbitmq:iqbridge-batch", "rabbitmq:kombu", 2.0),
)


def select(only: str | None) -> list[Side]:
    """The sides ``--only`` names (all by default): by full name (``redis:kombu``), name
    without backend (``iqbridge-batch``), backend (``sqlite``) or library
    (``faststream``)."""
    if not only:
        return list(SIDES)
    tokens = [t.strip() for t in only.split(",") if t.strip()]
    chosen: list[Side] = []
    for token in tokens:
        hits = [s for s in SIDES if token in (s.name, s.short, s.backend, s.library)]
        if not hits:
            names = ", ".join(s.name for s in SIDES)
            raise SystemExit(f"--only: no side matches {token!r}; the sides are {names}")
        chosen.extend(s for s in hits if s not in chosen)
    return [s for s in SIDES if s in chosen]


def _missing(side: Side) -> str | None:
    for module in side.needs:
        if importlib.util.find_spec(module) is None:
            extra = {"redis": "redis", "pika": "rabbitmq"}.get(module, "bench")
            return f"{module} is not installed (pip install -e '.[{extra}]')"
    return None


def _fmt(rate: float) -> str:
    return f"{rate:,.0f}"


def report_ratios(outcomes: Sequence[Outcome]) -> list[float]:
    """Print each backend's iqbridge-to-best-peer ratio; return the ratios computed."""
    ratios: list[float] = []
    print("iqbridge's best path / the best peer, per backend (medians)")
    backends = dict.fromkeys(o.side.backend for o in outcomes)
    width = max(7, *(len(b) + 1 for b in backends))
    for backend in backends:
        mine = [o for o in outcomes if o.side.backend == backend]
        iq = [o for o in mine if o.side.is_iqbridge and o.median is not None]
        peers = [o for o in mine if not o.side.is_iqbridge and o.median is not None]
        best_iq = max(iq, key=lambda o: o.median or 0.0, default=None)
        best_peer = max(peers, key=lambda o: o.median or 0.0, default=None)
        if best_iq is None or best_peer is None:
            missing = "no iqbridge side measured" if best_iq is None else "no peer measured"
            print(f"  {backend:<{width}}{missing}")
            continue
        assert best_iq.median is not None and best_peer.median is not None
        ratio = best_iq.median / best_peer.median
        ratios.append(ratio)
        print(
            f"  {backend:<{width}}{best_iq.side.name} {_fmt(best_iq.median)} / "
            f"{best_peer.side.name} {_fmt(best_peer.median)} = {ratio:.2f}"
        )
    return ratios


def report_targets(outcomes: Sequence[Outcome]) -> None:
    """Print the issue's targets that this run measured both sides of."""
    medians = {o.side.name: o.median for o in outcomes if o.median is not None}
    lines = []
    for mine, peer, floor in TARGETS:
        if mine in medians and peer in medians:
            got = medians[mine] / medians[peer]
            verdict = "met" if got >= floor else "NOT met"
            lines.append(f"  {mine} / {peer} = {got:.2f} (>= {floor:.1f}: {verdict})")
    if lines:
        print("targets")
        print("\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the figures; 1 if a side failed."""
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="sides: " + ", ".join(s.name for s in SIDES),
    )
    parser.add_argument("--messages", type=int, default=20_000, metavar="N")
    parser.add_argument("--rounds", type=int, default=3, metavar="R")
    parser.add_argument(
        "--batch", type=int, default=500, metavar="B", help="chunk and batch size (500)"
    )
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the Redis ({DEFAULT_URL})")
    parser.add_argument(
        "--amqp-url",
        default=DEFAULT_AMQP_URL,
        help=f"the RabbitMQ ({DEFAULT_AMQP_URL.replace('%', '%%')})",
    )
    parser.add_argument("--only", metavar="SIDE[,SIDE...]", help="run these sides only")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.rounds < 1 or args.batch < 1:
        parser.error("--messages, --rounds and --batch must be at least 1")
    outcomes = [Outcome(side) for side in select(args.only)]
    for outcome in outcomes:
        outcome.skipped = _missing(outcome.side)
    for backend, url, check in (
        ("redis", args.url, _redis_unreachable),
        ("rabbitmq", args.amqp_url, _rabbitmq_unreachable),
    ):
        if any(o.side.backend == backend and not o.skipped for o in outcomes):
            why = check(url)
            for o in outcomes:
                if why and o.side.backend == backend and not o.skipped:
                    o.failed = why
    print(
        f"peers: {args.messages:,} messages of {BODY_SIZE} B, one subscriber, publish all "
        f"then consume all (an ack each), batch {args.batch}, {args.rounds} round(s), "
        f"Redis at {args.url}"
        + (
            f", RabbitMQ at {args.amqp_url}"
            if any(o.side.backend == "rabbitmq" for o in outcomes)
            else ""
        )
    )
    width = max(len(o.side.name) for o in outcomes)
    with tempfile.TemporaryDirectory(prefix="iq-peers-") as tmp:
        cfg = Config(args.messages, args.batch, args.url, Path(tmp), args.amqp_url)
        for round_no in range(1, args.rounds + 1):
            print(f"round {round_no}/{args.rounds}")
            for o in outcomes:
                label = f"  {o.side.name:<{width}}  "
                if o.skipped:
                    print(f"{label}skipped: {o.skipped}")
                    continue
                if o.failed:
                    print(f"{label}FAILED: {o.failed}")
                    continue
                gc.collect()
                try:
                    timing = o.side.run(cfg)
                except Exception as exc:
                    o.failed = f"{type(exc).__name__}: {exc}"
                    print(f"{label}FAILED: {o.failed}", flush=True)
                    continue
                rate = timing.rate(args.messages)
                o.rates.append(rate)
                o.timings.append(timing)
                print(
                    f"{label}{_fmt(rate):>8} msg/s  (publish {timing.publish:.2f} s, "
                    f"consume {timing.consume:.2f} s)",
                    flush=True,
                )
    print(f"medians of {args.rounds} round(s), msg/s")
    for o in outcomes:
        label = f"  {o.side.name:<{width}}  "
        if o.skipped:
            print(f"{label}skipped: {o.skipped}")
        elif o.failed or o.median is None:
            print(f"{label}FAILED: {o.failed}")
        else:
            rounds = ", ".join(_fmt(r) for r in o.rates)
            print(f"{label}{_fmt(o.median):>8}  (rounds: {rounds})")
    ratios = report_ratios(outcomes)
    report_targets(outcomes)
    print(f"ratio={min(ratios):.2f}" if ratios else "ratio=none")
    return 1 if any(o.failed for o in outcomes) else 0


if __name__ == "__main__":
    # peers_rabbitmq imports its shared pieces from `peers`: let that name be this module
    # rather than a second copy of it.
    sys.modules.setdefault("peers", sys.modules[__name__])
    sys.exit(main())
