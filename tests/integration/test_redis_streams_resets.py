"""Redis Streams when the connection is reset in the middle of a call (issue 27, points 15
and 16), through :class:`~iqbridge.testing.proxy.FaultProxy` in front of the real Redis.

* A put whose ``XADD`` pipeline is cut part way (some entries added, the reply lost)
  adds, on its retry, only the entries the stream lacks: counted with redis-py, every
  msg_id has one entry and each key's entries are in put order.
* A read whose reply is lost after Redis moved entries to the consumer's pending list
  (the receive script, the blocking ``XREADGROUP``) hands those entries out on the retry,
  first and in order, instead of leaving them to be taken over after the lease; through
  the facade a subscriber gets every message of each key in put order, well within the
  lease.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis

import iqbridge
from iqbridge.adapters.redis_streams import RedisStreamsAdapter
from iqbridge.putting import Outgoing
from iqbridge.testing.proxy import FaultProxy
from tests.redis_index_helpers import REDIS_URL, drop_streams, fresh_prefix

pytestmark = pytest.mark.redis

KEYS = ("k0", "k1", "k2", "k3")


@pytest.fixture
def proxied() -> Iterator[tuple[FaultProxy, str, str]]:
    """A fault proxy to the shared Redis, and the stream URL through it and direct, on a
    fresh prefix (streams and index keys deleted afterwards)."""
    parts = redis.connection.parse_url(REDIS_URL)
    with fresh_prefix("resets") as prefix:
        proxy = FaultProxy(parts.get("host", "127.0.0.1"), int(parts.get("port", 6379)))
        query = f"?prefix={prefix}&stream_prefix={prefix}:&retry_for=10"
        try:
            yield proxy, proxy.url(REDIS_URL) + query, REDIS_URL + query
        finally:
            proxy.close()
            drop_streams(f"{prefix}:")


def _entries(key: str) -> list[tuple[str, dict[bytes, bytes]]]:
    with redis.Redis.from_url(REDIS_URL) as raw:
        return [(ref.decode(), fields) for ref, fields in raw.xrange(key)]


def _assert_once_in_order(entries: list[tuple[str, dict[bytes, bytes]]], total: int) -> None:
    ids = Counter(f[b"iq-id"].decode() for _, f in entries)
    twice = {m: n for m, n in ids.items() if n > 1}
    assert not twice, f"{len(twice)} msg_ids have more than one entry"
    assert len(ids) == total
    last: dict[str, int] = {}
    for _, fields in entries:
        body = orjson.loads(fields[b"payload"])
        assert body["n"] > last.get(body["k"], -1), f"key {body['k']} out of order at {body}"
        last[body["k"]] = body["n"]


def test_a_put_cut_in_the_middle_of_its_xadds_adds_each_entry_once(
    proxied: tuple[FaultProxy, str, str], tmp_path: Path
) -> None:
    """10 windows of 100 messages (4 keys, msg_ids: a bridge's put) with the index apart
    from Redis; 5 of the windows lose the connection after 10-70% of their XADDs reached
    Redis. Before the fix each of those windows was added again whole by the retry: the
    entries that had landed were in the stream twice (a plain consumer reads both) and
    after later ones of the same key."""
    proxy, via_proxy, _direct = proxied
    seq = dict.fromkeys(KEYS, 0)
    with iqbridge.connect(via_proxy, index=f"sqlite:///{tmp_path}/index.db") as hub:
        assert hub.colocated is None
        q = hub.queue("orders")
        q.subscribe("a")
        for window in range(10):
            batch = []
            for i in range(100):
                k = KEYS[i % len(KEYS)]
                body = {"k": k, "n": seq[k], "pad": "x" * 200}
                seq[k] += 1
                batch.append(Outgoing(body, msg_id=f"w{window}-{i}", ordering_key=k))
            if window % 2:
                # One XADD of these is ~420 bytes on the wire: cut after 10% to 70%.
                proxy.cut_after(4_200 * (1 + (window * 3) % 7))
            q.put_each(batch)
            assert not proxy.armed
        assert proxy.cuts == 5
        adapter = hub.adapter
        assert isinstance(adapter, RedisStreamsAdapter)
        entries = _entries(adapter.key("orders"))
    _assert_once_in_order(entries, 1000)


def _adapter(url: str, **options: str) -> RedisStreamsAdapter:
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return RedisStreamsAdapter.from_url(f"{url}&{query}" if query else url)


def _fill(adapter: RedisStreamsAdapter, count: int) -> list[str]:
    from iqbridge.model import Envelope

    envs = [
        Envelope(msg_id=f"m{i}", body=b"%d" % i, put_at=time.time_ns() // 1000, groups=("g",))
        for i in range(count)
    ]
    return adapter.send("orders", envs)


def test_a_receive_whose_reply_is_lost_hands_out_those_entries_first(
    proxied: tuple[FaultProxy, str, str],
) -> None:
    """The receive script ran (16 entries moved to the consumer's pending list: 10 asked
    for, 6 read ahead) and its reply was lost. The retry reads the consumer's own pending
    entries again first: the receive returns entries 1-10 and the next one 11-20, in id
    order, and nothing is pending that was not handed out or read ahead. Before the fix the retry
    read 17-26, and 1-16 waited in the pending list for an XAUTOCLAIM after the lease."""
    proxy, via_proxy, direct = proxied
    writer, reader = _adapter(direct), _adapter(via_proxy, read_ahead="16")
    try:
        writer.declare("orders", ["g"])
        refs = _fill(writer, 40)
        proxy.arm(b"EVALSHA", b"iq-requeue")
        first = reader.receive("orders", "g", "c1", count=10, timeout=0)
        assert proxy.cuts == 1
        assert [r.native_ref for r in first] == refs[:10]
        second = reader.receive("orders", "g", "c1", count=10, timeout=0)
        assert [r.native_ref for r in second] == refs[10:20]
        assert {r.delivery_count for r in first + second} == {1}
        pending = writer.pending("orders", "g")
        # 20 handed out, 12 read ahead by the second (6 of the first's were left).
        assert sorted(pending) == sorted(refs[:32])
    finally:
        reader.close()
        writer.close()


def test_a_blocking_read_whose_reply_is_lost_hands_out_those_entries(
    proxied: tuple[FaultProxy, str, str],
) -> None:
    """The stream is empty, so the receive blocks in XREADGROUP; entries arrive, Redis
    moves them to the consumer's pending list and answers, and the answer is lost. The
    retry reads them from the pending list at once (before the fix it blocked again and
    returned the next entries, newer than the lost ones, which waited for the lease)."""
    proxy, via_proxy, direct = proxied
    writer, reader = _adapter(direct), _adapter(via_proxy)
    try:
        writer.declare("orders", ["g"])
        reader.declare("orders", ["g"])
        proxy.arm(b"XREADGROUP", b"BLOCK")
        got: list[list[str]] = []
        t = threading.Thread(
            target=lambda: got.append(
                [r.native_ref for r in reader.receive("orders", "g", "c1", count=5, timeout=3)]
            )
        )
        t.start()
        deadline = time.monotonic() + 5
        while proxy.armed:  # the blocking read is not sent yet
            assert time.monotonic() < deadline
            time.sleep(0.01)
        refs = _fill(writer, 5)
        t.join(10)
        assert proxy.cuts == 1
        # The lost read took the first entries (Redis answers a blocked read as soon as
        # one arrives): exactly those come back, not newer ones.
        (taken,) = got
        assert taken, "the entries the lost read took did not come back"
        assert taken == refs[: len(taken)]
        assert sorted(writer.pending("orders", "g")) == sorted(taken)
    finally:
        reader.close()
        writer.close()


def test_the_get_path_keeps_each_keys_order_through_a_lost_read(
    proxied: tuple[FaultProxy, str, str],
) -> None:
    """Through the facade (index on the same Redis, one round trip per read): 200
    messages of 4 keys put directly, then got one by one through the proxy while the
    reply of one read is lost after it moved a batch to the subscriber's pending list.
    Every message is got once, each key in put order, and all well within the lease
    (3 s here). Before the fix the lost batch came back only after the lease, after
    newer messages of its keys."""
    proxy, via_proxy, direct = proxied
    with iqbridge.connect(direct) as writer_hub, iqbridge.connect(via_proxy) as hub:
        assert hub.colocated is not None
        w = writer_hub.queue("orders", lease=3.0)
        w.subscribe("a")
        seq = dict.fromkeys(KEYS, 0)
        for start in range(0, 200, 50):
            batch = []
            for i in range(start, start + 50):
                k = KEYS[i % len(KEYS)]
                batch.append(Outgoing({"k": k, "n": seq[k]}, ordering_key=k))
                seq[k] += 1
            w.put_each(batch)
        q = hub.queue("orders", lease=3.0)
        order: dict[str, list[int]] = defaultdict(list)
        t0 = time.monotonic()
        for n in range(200):
            if n == 30:
                proxy.arm(b"EVALSHA", b"iq-requeue")
            d = q.get("a", timeout=5)
            assert d is not None, f"message {n + 1} of 200 did not come within 5 s"
            order[d.payload["k"]].append(d.payload["n"])
            d.done()
        took = time.monotonic() - t0
        assert proxy.cuts == 1
        assert q.get("a") is None
    for k in KEYS:
        assert order[k] == list(range(50)), f"key {k}: {order[k]}"
    assert took < 3.0, f"took {took:.1f} s: the lost batch waited for the lease"
