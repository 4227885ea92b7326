"""RabbitMQ: iqbridge facade (SQLite index) against raw pika, in the same run.

The workload, on both sides: N messages (``--messages``) of 100 bytes, one subscriber;
publish them all, then consume them all with an acknowledgement each. Message i's body is
its index in ten digits, ten times over, and every body is checked once on arrival
(intact bytes, every index exactly once, none missing). The rate is N / (publish time +
consume time); connecting and declaring beforehand and the clean-up are not timed.

* iqbridge: ``hub = iqbridge.connect(url, index=sqlite:///<file in a temporary
  directory>)``, ``queue = hub.queue(<unique name>)``, ``queue.subscribe("s")``, then
  ``queue.put(body)`` per message, then ``queue.get("s")`` and ``delivery.done()`` per
  message: full state tracking in the SQLite index (its default ``synchronous=full``:
  every transition a synced transaction), the adapter's defaults unchanged.
* raw pika (the same library the adapter stands on), its asynchronous
  ``SelectConnection`` on one channel: a durable queue, persistent messages
  (``delivery_mode=2``) to the default exchange, publisher confirms in windows: publish
  ``--window`` messages, wait until the broker has confirmed all of them (``Basic.Ack``,
  single or ``multiple``; a ``Basic.Nack`` fails the run), then the next window. Then
  ``basic_qos(prefetch_count=--prefetch)``, ``basic_consume`` with manual acks and a
  ``basic_ack`` per message. The consume phase ends when the broker answers a
  ``basic_cancel`` sent after the last ack (a channel's frames are handled in order, so
  every ack is in); the queue's ``queue_delete`` must then report no message left.
* raw pika, a confirm per publish: the same with a window of one, printed but left out
  of the ratio (``--no-single-confirm`` drops it). It waits for each message's confirm
  before the next publish, as ``queue.put`` does (a put returns once the broker has the
  message): for a persistent message on a durable queue, RabbitMQ confirms once it is on
  disk, so this shows what that guarantee costs on its own.
* ``--batch B`` adds another side, printed but left out of the ratio: iqbridge's batch
  API, ``queue.put_many`` in chunks of B, then ``queue.get_many("s", B)`` and
  ``batch.done()``.

Runs alternate between the sides (raw, raw with a confirm per publish, iqbridge[, its
batch API], raw, ...); each run's rates and each side's median are printed. Every run
uses a queue of its own name and deletes what it declared afterwards (iqbridge's with
the adapter's ``drop``). The last line is ``ratio=<iqbridge/raw>``: iqbridge's
put+get+done over raw pika with confirms per window (medians), or ``ratio=none`` when
RabbitMQ cannot be reached (exit code 0, with the reason) or a side failed (exit code 1,
with the reason).

Usage: python benchmarks/rabbitmq.py [--url amqp://guest:guest@127.0.0.1:5672/%2F]
       [--messages N] [--runs R] [--window W] [--prefetch P] [--batch B]
       [--no-single-confirm]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika

# The same body, checks and timing as the peers benchmark (a script beside this one).
from peers import BenchError, Tally, Timing, make_body
from pika import spec

import iqbridge

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
BODY_SIZE = 100
#: Seconds without progress after which a run is declared stalled.
STALL = 10.0
SUBSCRIBER = "s"


def unreachable(url: str) -> str | None:
    """Why the RabbitMQ at ``url`` cannot be used, or None when it answers."""
    params = pika.URLParameters(url)
    params.socket_timeout = 2
    params.connection_attempts = 1
    try:
        pika.BlockingConnection(params).close()
    except (pika.exceptions.AMQPError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}".rstrip(": ")
    return None


def drop(url: str, queues: Sequence[str] = (), exchanges: Sequence[str] = ()) -> int:
    """Delete these queues and exchanges (absent ones are no error); return how many
    messages the deleted queues still held."""
    left = 0
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for kind, names in (("queue", queues), ("exchange", exchanges)):
            for name in names:
                try:
                    if kind == "queue":
                        left += channel.queue_delete(name).method.message_count
                    else:
                        channel.exchange_delete(name)
                except pika.exceptions.ChannelClosedByBroker:
                    channel = connection.channel()  # the broker closed it: take another
    finally:
        connection.close()
    return left


# --- raw pika ---------------------------------------------------------------------------


class RawPika:
    """One run of the raw side: a state machine driven by pika's SelectConnection."""

    PROPERTIES = pika.BasicProperties(delivery_mode=2)

    def __init__(self, url: str, n: int, window: int, prefetch: int) -> None:
        self.url, self.n, self.window, self.prefetch = url, n, window, prefetch
        self.queue = f"bench-raw-{uuid.uuid4().hex[:10]}"
        self.bodies = [make_body(i) for i in range(n)]
        self.tally = Tally(n)
        self.sent = 0
        self.outstanding: set[int] = set()
        self.marks: dict[str, float] = {}
        self.error: BaseException | None = None
        self.left: int | None = None
        self.progress = 0
        self.channel: Any = None
        self.connection = pika.SelectConnection(
            pika.URLParameters(url),
            on_open_callback=self._guard(self._on_open),
            on_open_error_callback=self._on_open_error,
            on_close_callback=lambda connection, _reason: connection.ioloop.stop(),
        )

    def run(self) -> Timing:
        self.connection.ioloop.call_later(STALL, self._watch)
        self.connection.ioloop.start()
        if self.error is not None:
            raise self.error
        self.tally.finish()
        if self.left != 0:
            raise BenchError(f"the queue still held {self.left} messages at the end")
        return Timing(
            self.marks["published"] - self.marks["start"],
            self.marks["consumed"] - self.marks["published"],
        )

    def _guard(self, step: Callable[..., None]) -> Callable[..., None]:
        def guarded(*args: Any) -> None:
            try:
                step(*args)
            except Exception as exc:
                self._fail(exc)

        return guarded

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        if self.connection.is_open:
            self.connection.close()
        else:
            self.connection.ioloop.stop()

    def _on_open_error(self, _connection: Any, exc: BaseException) -> None:
        self.error = BenchError(f"cannot connect: {exc}")
        self.connection.ioloop.stop()

    def _watch(self) -> None:
        done = self.sent - len(self.outstanding) + self.tally.count
        if "consumed" not in self.marks and done == self.progress:
            self._fail(BenchError(f"stalled: {self.sent} sent, {self.tally.count} consumed"))
            return
        self.progress = done
        self.connection.ioloop.call_later(STALL, self._watch)

    def _on_open(self, connection: Any) -> None:
        connection.channel(on_open_callback=self._guard(self._on_channel))

    def _on_channel(self, channel: Any) -> None:
        self.channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.confirm_delivery(
            ack_nack_callback=self._guard(self._on_confirm),
            callback=self._guard(self._on_confirm_mode),
        )

    def _on_channel_closed(self, _channel: Any, reason: BaseException) -> None:
        if "consumed" not in self.marks or self.left is None:
            self._fail(BenchError(f"the channel closed: {reason}"))

    def _on_confirm_mode(self, _frame: Any) -> None:
        self.channel.queue_declare(
            self.queue, durable=True, callback=self._guard(self._on_declared)
        )

    def _on_declared(self, _frame: Any) -> None:
        self.marks["start"] = time.perf_counter()
        self._publish_window()

    def _publish_window(self) -> None:
        end = min(self.sent + self.window, self.n)
        for i in range(self.sent, end):
            self.channel.basic_publish("", self.queue, self.bodies[i], self.PROPERTIES)
            self.outstanding.add(i + 1)  # delivery tags count from 1 after Confirm.Select
        self.sent = end

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        if not isinstance(method, spec.Basic.Ack):
            raise BenchError(f"the broker refused a message: {method}")
        if method.multiple:
            self.outstanding = {t for t in self.outstanding if t > method.delivery_tag}
        else:
            self.outstanding.discard(method.delivery_tag)
        if self.outstanding:
            return
        if self.sent < self.n:
            self._publish_window()
            return
        self.marks["published"] = time.perf_counter()
        self.channel.basic_qos(prefetch_count=self.prefetch, callback=self._guard(self._on_qos))

    def _on_qos(self, _frame: Any) -> None:
        self.channel.basic_consume(
            self.queue, self._guard(self._on_message), auto_ack=False, consumer_tag="bench"
        )

    def _on_message(self, channel: Any, method: Any, _properties: Any, body: bytes) -> None:
        self.tally.check(body)
        channel.basic_ack(method.delivery_tag)
        if self.tally.count == self.n:
            channel.basic_cancel("bench", callback=self._guard(self._on_cancelled))

    def _on_cancelled(self, _frame: Any) -> None:
        self.marks["consumed"] = time.perf_counter()
        self.channel.queue_delete(self.queue, callback=self._guard(self._on_deleted))

    def _on_deleted(self, frame: Any) -> None:
        self.left = frame.method.message_count
        self.connection.close()


def run_raw(url: str, n: int, window: int, prefetch: int) -> Timing:
    """The raw pika side: windowed confirmed publishes, then consume with an ack each."""
    bench = RawPika(url, n, window, prefetch)
    try:
        return bench.run()
    finally:
        if bench.left is None:  # did not get as far as its own queue_delete
            drop(url, queues=[bench.queue])


# --- iqbridge -------------------------------------------------------------------------


def drop_declared(url: str, hub: iqbridge.Hub, queue: str, groups: Sequence[str]) -> None:
    """Delete what iqbridge declared for ``queue``: with the adapter's ``drop`` when it
    has one, else by name with pika (exchange ``<queue>``, queues ``<queue>.<group>``,
    exchange and queue ``<queue>/dead``)."""
    own = getattr(hub.adapter, "drop", None)
    if callable(own):
        own(queue, groups)
        return
    dead = f"{queue}/dead"
    drop(url, queues=[*(f"{queue}.{g}" for g in groups), dead], exchanges=[queue, dead])


def run_iqbridge(url: str, n: int, tmp: Path, batch: int | None = None) -> Timing:
    """The iqbridge side: put/get/done per message, or with ``batch`` its batch API."""
    name = f"bench-iq-{uuid.uuid4().hex[:10]}"
    index = tmp / f"{name}.db"
    bodies = [make_body(i) for i in range(n)]
    tally = Tally(n)
    hub = iqbridge.connect(url, index=f"sqlite:///{index}")
    try:
        queue = hub.queue(name)
        queue.subscribe(SUBSCRIBER)
        start = time.perf_counter()
        if batch is None:
            for body in bodies:
                queue.put(body)
        else:
            for first in range(0, n, batch):
                queue.put_many(bodies[first : first + batch])
        published = time.perf_counter()
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
                if got is None or len(got) == 0:
                    raise BenchError(f"queue.get_many found nothing after {tally.count} of {n}")
                for delivery in got:
                    tally.check(delivery.body)
                got.done()
        consumed = time.perf_counter()
        tally.finish()
        if queue.get(SUBSCRIBER) is not None:
            raise BenchError("a message was delivered again after all were done")
    finally:
        try:
            drop_declared(url, hub, name, [SUBSCRIBER])
        finally:
            hub.close()
            for extra in ("", "-wal", "-shm"):
                Path(f"{index}{extra}").unlink(missing_ok=True)
    return Timing(published - start, consumed - published)


# --- the series ---------------------------------------------------------------------------


@dataclass(eq=False)
class Series:
    """One side's runs so far."""

    label: str
    run: Callable[[], Timing]
    rates: list[float] = field(default_factory=list)
    failed: str | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.rates) if self.rates and not self.failed else None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the figures; the exit code is 1 when a side failed."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--messages", type=int, default=2000, metavar="N")
    parser.add_argument("--runs", "--rounds", type=int, default=5, metavar="R")
    parser.add_argument("--window", type=int, default=128, help="raw: publishes per confirm wait")
    parser.add_argument("--prefetch", type=int, default=100, help="raw: basic_qos prefetch_count")
    parser.add_argument(
        "--no-single-confirm",
        action="store_true",
        help="leave out the raw side that waits for each publish's confirm",
    )
    parser.add_argument("--batch", type=int, default=0, metavar="B", help="add the batch side")
    args = parser.parse_args(argv)
    if min(args.messages, args.runs, args.window, args.prefetch) < 1 or args.batch < 0:
        parser.error("--messages, --runs, --window and --prefetch must be at least 1")
    n = args.messages
    print(
        f"RabbitMQ: {n} messages of {BODY_SIZE} B, one subscriber, publish all then consume "
        f"all (an ack each), {args.runs} run(s); raw: window {args.window}, prefetch "
        f"{args.prefetch}"
    )
    why = unreachable(args.url)
    if why:
        print(f"skipped: RabbitMQ at {args.url} is not reachable ({why})")
        print("ratio=none")
        return 0
    with tempfile.TemporaryDirectory(prefix="iq-rabbitmq-") as tmp:
        raw = Series(
            f"raw pika, confirms per {args.window}",
            lambda: run_raw(args.url, n, args.window, args.prefetch),
        )
        raw1 = Series(
            "raw pika, a confirm per publish", lambda: run_raw(args.url, n, 1, args.prefetch)
        )
        iq = Series("iqbridge put+get+done", lambda: run_iqbridge(args.url, n, Path(tmp)))
        batch = Series(
            f"iqbridge put_many+get_many+done ({args.batch})",
            lambda: run_iqbridge(args.url, n, Path(tmp), args.batch),
        )
        series = [raw, raw1, iq, batch]
        if args.window == 1 or args.no_single_confirm:
            series.remove(raw1)
        if not args.batch:
            series.remove(batch)
        width = max(38, *(len(s.label) for s in series))
        for run_no in range(1, args.runs + 1):
            print(f"run {run_no}/{args.runs}")
            for s in series:
                if s.failed:
                    continue
                try:
                    timing = s.run()
                except Exception as exc:
                    s.failed = f"{type(exc).__name__}: {exc}"
                    print(f"  {s.label:<{width}}  FAILED: {s.failed}", flush=True)
                    continue
                s.rates.append(timing.rate(n))
                print(
                    f"  {s.label:<{width}}  {timing.rate(n):8.0f} msg/s  (publish "
                    f"{timing.publish:.2f} s, consume {timing.consume:.2f} s)",
                    flush=True,
                )
    print(f"medians of {args.runs} run(s)")
    for s in series:
        if s.median is None:
            print(f"  {s.label:<{width}}  FAILED: {s.failed}")
        else:
            runs = ", ".join(f"{r:.0f}" for r in s.rates)
            print(f"  {s.label:<{width}}  {s.median:8.0f} msg/s  (runs: {runs})")
    if raw.median is None or iq.median is None:
        print("ratio=none")
        return 1
    ratios = [(f"iqbridge / raw, confirms per {args.window}", iq.median / raw.median)]
    if raw1 in series and raw1.median is not None:
        ratios.insert(0, ("iqbridge / raw, a confirm per publish", iq.median / raw1.median))
    for label, ratio in ratios:
        print(f"  {label:<{width}}  {ratio:8.2f}")
    print(f"ratio={iq.median / raw.median:.2f}")
    return 1 if any(s.failed for s in series) else 0


if __name__ == "__main__":
    sys.exit(main())
