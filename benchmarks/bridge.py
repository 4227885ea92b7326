"""Bridge: Redis Streams to RabbitMQ, iqbridge's bridge against a raw consume-produce loop.

The workload, on every side: N messages (``--messages``) of ``--size`` bytes, with 50
ordering keys, already in a Redis stream; the clock runs from the start of the bridge
(or loop) until every message is on the RabbitMQ queue and settled at the source.

* iqbridge bridge (the ratio's numerator): ``Bridge`` with one route, ``--workers``
  lanes and ``--batch`` gets, every guarantee on: the source's Redis index (on the same
  server as the stream), an SQLite index for the RabbitMQ side, deterministic child ids
  (idempotent puts), the RabbitMQ ``ledger`` (no second broker entry after a crash),
  IN_PROCESS and DONE at the source, parents recorded, key order kept. The route is
  started on the full stream: start-up, the route's lease and recovery are on the clock.
* raw loop (the ratio's denominator), the loop one writes by hand with the same
  clients: ``XREADGROUP`` of ``--batch`` entries, a pika ``basic_publish`` of each to a
  queue (no publisher confirms: nothing says the broker has it), ``XACK`` of the batch.
  It loses messages when it crashes after the ack and duplicates them when it crashes
  before; it has one thread, so it keeps order without trying.
* raw loop with confirms (printed, not in the ratio): the same with
  ``confirm_delivery()`` (pika's blocking channel waits for each publish's confirm).

Rounds alternate between the sides; each round's rate and each side's median are
printed. The last line is ``ratio=<iqbridge / raw loop>`` (medians), or ``ratio=none``
with the reason when Redis or RabbitMQ cannot be reached (exit code 0).

Usage: python benchmarks/bridge.py [--messages N] [--rounds R] [--size BYTES]
       [--batch B] [--workers W]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable

REDIS = "redis://127.0.0.1:6379/0"
AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F"
KEYS = 50


def _reachable() -> str | None:
    import pika
    import redis

    try:
        redis.Redis.from_url(REDIS, socket_connect_timeout=1).ping()
    except Exception as exc:
        return f"Redis at {REDIS}: {exc}"
    try:
        pika.BlockingConnection(pika.URLParameters(AMQP)).close()
    except Exception as exc:
        return f"RabbitMQ at {AMQP}: {exc}"
    return None


def _body(i: int, size: int) -> bytes:
    return (b"%010d" % i * (size // 10 + 1))[:size]


def iqbridge_round(n: int, size: int, batch: int, workers: int) -> float:
    import iqbridge
    from iqbridge.bridge import Bridge, parse_config

    tag = f"iqb-bench-{uuid.uuid4().hex[:8]}"
    src_url = f"{REDIS}?prefix={tag}&stream_prefix={tag}:"
    dst_url = f"{AMQP}?prefix={tag}-&ledger=true"
    with tempfile.TemporaryDirectory() as tmp:
        index = f"sqlite:///{tmp}/rabbit.db"
        cfg = parse_config(
            {
                "bridge": {"name": "bench", "state": f"sqlite:///{tmp}/state.db"},
                "routes": [
                    {
                        "name": "r",
                        "source": {"url": src_url, "queue": "orders"},
                        "destination": {
                            "url": dst_url,
                            "index": index,
                            "queue": "orders",
                            "to": ["sink"],
                        },
                        "workers": workers,
                        "batch": batch,
                    }
                ],
            }
        )
        with iqbridge.connect(src_url) as src, iqbridge.connect(dst_url, index=index) as dst:
            dst.queue("orders").subscribe("sink")
            q = src.queue("orders")
            q.subscribe("bridge")
            for start in range(0, n, 1000):
                q.put_each(
                    [
                        iqbridge.Outgoing(_body(i, size), ordering_key=f"k{i % KEYS}")
                        for i in range(start, min(n, start + 1000))
                    ]
                )
            bridge = Bridge(cfg)
            t0 = time.perf_counter()  # start-up, route lease and recovery included
            bridge.start()
            while bridge.stats()[0].bridged < n:
                time.sleep(0.005)
            elapsed = time.perf_counter() - t0
            bridge.stop()
            bridge.join(30)
            bridge.close()
            _drop(tag)
            return n / elapsed


def raw_round(n: int, size: int, batch: int, confirms: bool) -> float:
    import pika
    import redis

    tag = f"iqb-raw-{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(REDIS)
    key = f"{tag}:orders"
    r.xgroup_create(key, "loop", id="0", mkstream=True)
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(key, {"payload": _body(i, size), "key": f"k{i % KEYS}"})
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    conn = pika.BlockingConnection(pika.URLParameters(AMQP))
    ch = conn.channel()
    qname = f"{tag}-orders.sink"
    ch.queue_declare(qname, durable=True)
    if confirms:
        ch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2)
    moved = 0
    t0 = time.perf_counter()
    while moved < n:
        reply = r.xreadgroup("loop", "c", {key: ">"}, count=batch, block=1000)
        for _stream, entries in reply:
            for _id, fields in entries:
                ch.basic_publish("", qname, fields[b"payload"], props)
            r.xack(key, "loop", *[e[0] for e in entries])
            moved += len(entries)
    elapsed = time.perf_counter() - t0
    ch.queue_delete(qname)
    conn.close()
    r.delete(key)
    return n / elapsed


def _drop(tag: str) -> None:
    import pika
    import redis

    r = redis.Redis.from_url(REDIS)
    for k in r.scan_iter(match=f"*{tag}*", count=1000):
        r.delete(k)
    conn = pika.BlockingConnection(pika.URLParameters(AMQP))
    for name in (f"{tag}-orders.sink", f"{tag}-orders/dead", f"{tag}-orders/ledger"):
        ch = conn.channel()
        ch.queue_delete(name)
        ch.close()
    for name in (f"{tag}-orders", f"{tag}-orders/dead"):
        ch = conn.channel()
        ch.exchange_delete(name)
        ch.close()
    conn.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args(argv)
    why = _reachable()
    if why is not None:
        print(f"cannot run: {why}")
        print("ratio=none")
        return 0
    sides: dict[str, Callable[[], float]] = {
        "raw loop (no confirms)": lambda: raw_round(args.messages, args.size, args.batch, False),
        "iqbridge bridge": lambda: iqbridge_round(
            args.messages, args.size, args.batch, args.workers
        ),
        "raw loop (confirm each)": lambda: raw_round(args.messages, args.size, args.batch, True),
    }
    rates: dict[str, list[float]] = {name: [] for name in sides}
    print(
        f"bridge Redis Streams -> RabbitMQ: {args.messages} messages of {args.size} bytes, "
        f"batch {args.batch}, {args.workers} workers, {args.rounds} rounds (interleaved)"
    )
    for rnd in range(1, args.rounds + 1):
        for name, fn in sides.items():
            rate = fn()
            rates[name].append(rate)
            print(f"round {rnd}: {name:26s} {rate:10,.0f} msg/s", flush=True)
    for name, series in rates.items():
        shown = " / ".join(f"{x:,.0f}" for x in series)
        print(f"{name:26s} median {statistics.median(series):10,.0f} msg/s  ({shown})")
    ratio = statistics.median(rates["iqbridge bridge"]) / statistics.median(
        rates["raw loop (no confirms)"]
    )
    print(f"ratio={ratio:.2f}" if ratio >= 0.1 else f"ratio={ratio:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
