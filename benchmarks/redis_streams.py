"""Redis Streams: iqbridge facade (Redis index) against raw redis-py, in the same run.

The workload, on both sides: N messages of 100 bytes are put one at a time to a queue
with two pubsub subscribers (``s1``, ``s2``) and a pool of two (``p1``, ``p2``), so
every message makes three deliveries: one each to ``s1`` and ``s2`` and one to a pool
member. Consumers take one delivery at a time and finish it before taking the next.

* iqbridge: ``queue.put`` -> ``queue.get`` -> ``delivery.done``, with full state
  tracking in the Redis index store on the same server (publisher and subscriber states,
  a journal entry per transition, leases, once-only), its defaults unchanged (it reads
  16 entries ahead per round trip).
* raw redis-py, with its defaults: ``XADD``; each consumer reads with ``XREADGROUP``
  (COUNT ``--count``: 1 by default, the plainest consumer; 16 reads as far ahead as the
  adapter does) from its group (one group per subscriber, one shared by the pool members)
  and ``XACK``s each entry once handled.

Rounds alternate between the sides and the median of each is reported. The last line is
``ratio=<facade/raw>``.

Usage: python benchmarks/redis_streams.py [--url redis://127.0.0.1:6379/0]
       [--messages N] [--rounds R] [--count C]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import redis

import iqbridge
from iqbridge import Pool

BODY = b"x" * 100
SUBSCRIBERS = ("s1", "s2")
POOL = Pool("pool", ["p1", "p2"])


def run_raw(client: redis.Redis, n: int, count: int) -> float:
    """Messages per second through XADD, XREADGROUP and XACK."""
    stream = f"bench-raw-{uuid.uuid4().hex[:8]}"
    groups = [*SUBSCRIBERS, POOL.name]
    for group in groups:
        client.xgroup_create(stream, group, id="0", mkstream=True)
    start = time.perf_counter()
    for _ in range(n):
        client.xadd(stream, {"payload": BODY})

    def take(group: str, consumer: str) -> int:
        reply = client.xreadgroup(group, consumer, {stream: ">"}, count=count)
        entries = reply[0][1] if reply else []
        for entry_id, fields in entries:
            assert fields[b"payload"] == BODY
            client.xack(stream, group, entry_id)
        return len(entries)

    delivered = 0
    for subscriber in SUBSCRIBERS:
        while got := take(subscriber, subscriber):
            delivered += got
    while got := sum(take(POOL.name, member) for member in POOL.members):
        delivered += got  # the pool's members take turns
    elapsed = time.perf_counter() - start
    assert delivered == 3 * n, delivered
    client.delete(stream)
    return n / elapsed


def run_facade(url: str, n: int) -> float:
    """Messages per second through put/get/done in the iqbridge facade."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    sep = "&" if "?" in url else "?"
    with iqbridge.connect(f"{url}{sep}prefix={prefix}&stream_prefix={prefix}:") as hub:
        queue = hub.queue("bench")
        queue.subscribe(*SUBSCRIBERS)
        queue.subscribe_pool(POOL.name, POOL.members)
        start = time.perf_counter()
        for _ in range(n):
            queue.put(BODY)
        delivered = 0
        for subscriber in SUBSCRIBERS:
            while (delivery := queue.get(subscriber)) is not None:
                assert delivery.payload == BODY
                delivery.done()
                delivered += 1
        while True:
            progressed = False
            for member in POOL.members:
                delivery = queue.get(member)
                if delivery is not None:
                    progressed = True
                    delivery.done()
                    delivered += 1
            if not progressed:
                break
        elapsed = time.perf_counter() - start
        assert delivered == 3 * n, delivered
        cleanup = redis.Redis.from_url(url)
        for key in cleanup.scan_iter(match=f"*{prefix}*", count=1000):
            cleanup.delete(key)
        cleanup.close()
    return n / elapsed


def main() -> None:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=1, help="raw XREADGROUP COUNT")
    args = parser.parse_args()
    client = redis.Redis.from_url(args.url)
    raw: list[float] = []
    facade: list[float] = []
    for _ in range(args.rounds):
        raw.append(run_raw(client, args.messages, args.count))
        facade.append(run_facade(args.url, args.messages))
    client.close()
    r, f = statistics.median(raw), statistics.median(facade)
    print(
        f"Redis Streams: {args.messages} messages of {len(BODY)} B, 2 subscribers + a pool "
        f"of 2 (3 deliveries each), {args.rounds} rounds"
    )
    print(f"  raw redis-py XADD+XREADGROUP+XACK : {r:8.0f} msg/s")
    print(f"  iqbridge put+get+done             : {f:8.0f} msg/s")
    print(f"  facade/raw                        : {f / r:8.2f}")
    print(f"ratio={f / r:.2f}")


if __name__ == "__main__":
    main()
