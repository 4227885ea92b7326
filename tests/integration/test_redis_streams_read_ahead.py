"""Read-ahead and batched acknowledgements of the Redis Streams adapter, on the real server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

import iqbridge
from tests.redis_index_helpers import REDIS_URL, drop_streams, fresh_prefix

pytestmark = pytest.mark.redis


@pytest.fixture
def url() -> Iterator[str]:
    with fresh_prefix("ahead") as prefix:
        try:
            yield f"{REDIS_URL}?prefix={prefix}&stream_prefix={prefix}:"
        finally:
            drop_streams(f"{prefix}:")


def test_entries_read_ahead_go_back_to_the_group_on_close(url: str) -> None:
    """A hub that read ahead and closed gives the entries back at once: the next hub gets
    them now, not after they have been idle for a lease."""
    with iqbridge.connect(url) as hub:
        queue = hub.queue("orders")
        queue.subscribe("a")
        ids = queue.put_many([f"m{i}".encode() for i in range(5)])
        first = queue.get("a")
        assert first is not None and first.msg_id == ids[0]
        first.done()
    with iqbridge.connect(url) as hub:
        queue = hub.queue("orders", lease=3600)  # an idle-claim would take an hour
        got = []
        while (d := queue.get("a")) is not None:
            got.append(d.msg_id)
            d.done()
        assert got == ids[1:]
        for msg_id in ids:
            assert queue.state(msg_id).subscribers["a"].attempt == 1


def test_held_acknowledgements_are_sent_on_close(url: str) -> None:
    with iqbridge.connect(url) as hub:
        queue = hub.queue("orders")
        queue.subscribe("a")
        queue.put_many([b"1", b"2"])
        for _ in range(2):
            d = queue.get("a")
            assert d is not None
            d.done()
        stream = hub.adapter.key("orders")  # type: ignore[attr-defined]
    client = redis.Redis.from_url(REDIS_URL)
    try:
        assert client.xpending(stream, "a")["pending"] == 0
    finally:
        client.close()
