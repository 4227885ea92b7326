"""Read-ahead and batched acknowledgements of the Redis Streams adapter, on the real server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

import iqbridge
from iqbridge import SubscriberState
from iqbridge.adapters.redis_streams import RedisStreamsAdapter
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


def test_a_record_read_ahead_that_went_stale_is_decided_afresh(url: str) -> None:
    """Entries are read ahead with their index records; a message withdrawn meanwhile is
    not delivered on the strength of its old record, and its entry is acknowledged."""
    with iqbridge.connect(url) as hub, iqbridge.connect(url) as other:
        assert hub.colocated is not None
        queue = hub.queue("orders")
        queue.subscribe("a")
        ids = queue.put_many([b"1", b"2", b"3"])
        first = queue.get("a")  # reads 2 and 3 ahead, records included
        assert first is not None and first.msg_id == ids[0]
        other.queue("orders").withdraw(ids[1])
        first.done()
        second = queue.get("a")
        assert second is not None and second.msg_id == ids[2]
        second.done()
        assert queue.get("a") is None
        member = queue.state(ids[1]).subscribers["a"]
        assert member.state is SubscriberState.JOURNALLED
        assert [s for s, _ in member.history][-2:] == [
            SubscriberState.EXPIRED,
            SubscriberState.JOURNALLED,
        ]
        adapter = hub.adapter
        assert isinstance(adapter, RedisStreamsAdapter)
        adapter.flush()
        assert adapter.pending("orders", "a") == {}


def _count_scripts(hub: iqbridge.Hub) -> dict[str, int]:
    """Count the script calls of the hub's adapter (``receive``: its receive script) and
    of its Redis index (``index``: every store script, writes.lua included), as they
    happen."""
    calls = {"receive": 0, "index": 0}
    adapter, store = hub.adapter, hub.store
    assert isinstance(adapter, RedisStreamsAdapter)
    for owner, kind in ((adapter, "receive"), (store, "index")):
        run = owner._direct.run  # type: ignore[attr-defined]

        def counting(script: Any, keys: Any, args: Any, _run: Any = run, _k: str = kind) -> Any:
            calls[_k] += 1
            return _run(script, keys, args)

        owner._direct.run = counting  # type: ignore[attr-defined]
    return calls


def test_a_pool_member_reads_its_own_group_and_its_pool_in_one_round_trip(url: str) -> None:
    """A pool member named directly in a put and serving its pool: one receive script
    call covers both groups, in order (its own group first)."""
    with iqbridge.connect(url) as hub:
        queue = hub.queue("orders")
        queue.subscribe_pool("workers", ["w1", "w2"])
        pooled = queue.put(b"pooled")
        direct = queue.put(b"direct", to="w1")
        calls = _count_scripts(hub)
        got = []
        while (d := queue.get("w1")) is not None:
            got.append(d.msg_id)
            d.done()
        assert got == [direct, pooled]
        assert calls["receive"] == 3  # one per delivery, one that found nothing


def test_what_a_pool_member_read_ahead_is_offered_to_the_other_members(url: str) -> None:
    """Member w1 reads the pool's entries ahead (they wait in its process, pending with
    it in the group); member w2 in another process finds the group empty and gets them
    through the index at once, not after an idle-claim an hour later. w1 then finds them
    taken: acknowledged, never delivered twice."""
    with iqbridge.connect(url) as hub_a, iqbridge.connect(url) as hub_b:
        qa = hub_a.queue("orders", lease=3600)
        qb = hub_b.queue("orders", lease=3600)
        qa.subscribe_pool("workers", ["w1", "w2"])
        ids = qa.put_many([f"m{i}".encode() for i in range(6)])
        first = qa.get("w1")  # reads the other five ahead
        assert first is not None and first.msg_id == ids[0]
        got = []
        while (d := qb.get("w2")) is not None:
            assert d.payload == f"m{ids.index(d.msg_id)}".encode()
            got.append(d.msg_id)
            d.done()
        assert got == ids[1:]
        first.done()
        assert qa.get("w1") is None
        for msg_id in ids:
            members = qa.state(msg_id).subscribers
            owners = [n for n, v in members.items() if SubscriberState.DONE in dict(v.history)]
            assert owners == (["w1"] if msg_id == ids[0] else ["w2"]), msg_id
        for hub in (hub_a, hub_b):
            adapter = hub.adapter
            assert isinstance(adapter, RedisStreamsAdapter)
            adapter.flush()
        assert adapter.pending("orders", "workers") == {}


class _Crash(Exception):
    """Stands for a process killed in the middle of a get."""


def _crash_before_client_claims(queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next claim the client makes itself (after the receive script ran) dies first."""

    def die(*_args: Any, **_kwargs: Any) -> Any:
        raise _Crash

    monkeypatch.setattr(queue._receiving, "_accept_many", die)


def _taken_over(url: str, ids: list[str]) -> list[str]:
    """A new holder takes back what the dead one left and reads everything, in order."""
    with iqbridge.connect(url) as hub:
        queue = hub.queue("orders", lease=3600)
        queue.reclaim("a")
        got: list[str] = []
        while batch := queue.get_many("a", 100):
            got += [d.msg_id for d in batch]
            for d in batch:
                d.done()
        assert sorted(got) == sorted(ids)
        return got


def test_a_read_that_claims_on_the_way_reads_no_more_than_it_claims(url: str) -> None:
    """With the index on the stream's server, a get's read claims what it reads, and
    reads no more: nothing waits unclaimed in this consumer (where a get killed between
    a claim of entries read ahead and the read's own claims would leave a key's later
    messages claimed and its earlier ones not, as the bridge kill test once found), and
    a single get is one round trip that claims its message."""
    hub = iqbridge.connect(url)
    try:
        assert hub.colocated is not None
        queue = hub.queue("orders", lease=3600)
        queue.subscribe("a")
        ids = queue.put_many([f"m{i}".encode() for i in range(40)], ordering_key="k")
        adapter = hub.adapter
        assert isinstance(adapter, RedisStreamsAdapter)
        calls = _count_scripts(hub)
        first = queue.get("a")
        assert first is not None and first.msg_id == ids[0]
        # The read and its claim: one script call, no commit of the index's own.
        assert calls == {"receive": 1, "index": 0}
        stream = adapter.key("orders")
        client = redis.Redis.from_url(REDIS_URL)
        try:
            assert client.xpending(stream, "a")["pending"] == 1
            batch = queue.get_many("a", 20)
            assert [d.msg_id for d in batch] == ids[1:21]
            assert client.xpending(stream, "a")["pending"] == 21
        finally:
            client.close()
        assert calls == {"receive": 2, "index": 0}
    finally:
        hub.close()
    assert _taken_over(url, ids) == ids


def test_a_get_killed_between_its_claims_keeps_key_order_off_the_common_path(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receive script claims only an unbroken run of its rows: one it leaves to the
    client (here a message with a time limit) ends the run, so a get killed before the
    client's claim leaves nothing after it claimed."""
    dead = iqbridge.connect(url)
    try:
        queue = dead.queue("orders", lease=3600)
        queue.subscribe("a")
        ids = queue.put_many([f"m{i}".encode() for i in range(3)], ordering_key="k")
        ids += queue.put_many([b"m3"], ordering_key="k", ttl=3600)
        ids += queue.put_many([f"m{i}".encode() for i in range(4, 10)], ordering_key="k")
        _crash_before_client_claims(queue, monkeypatch)
        with pytest.raises(_Crash):
            queue.get_many("a", 10)
        assert _taken_over(url, ids) == ids
    finally:
        monkeypatch.undo()
        dead.adapter.close()
