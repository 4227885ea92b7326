"""The Redis index store's batch writes (``commit_writes``, stores/lua/writes.lua) on the
real Redis server, beyond the store contract:

* a batch's templated journal is one stream entry per group, not one per message, and
  every reader (history, the journal tail, search, purge) still sees one entry per
  message per transition;
* a batch whose reply or request is lost (the connection drops after or before Redis
  ran the script) is applied exactly once, and the retry reports exactly which records
  held; the same for a co-located put (records and broker entries) through
  ``commit_writes_with_entries``; and a claim of a consumer group's entries
  (``claim_received``, stores/lua/claim.lua).

Faults are made by a TCP proxy in front of Redis (:class:`~iqbridge.testing.proxy.FaultProxy`);
nothing is mocked.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from iqbridge import engine, engine_batch
from iqbridge.ids import new_id
from iqbridge.model import Audience, Filter
from iqbridge.states import PublisherState, SubscriberState
from iqbridge.stores.redis import RedisStore
from iqbridge.testing.proxy import FaultProxy
from iqbridge.writes import Writes
from tests.redis_index_helpers import REDIS_URL, drop_streams, fresh_prefix

pytestmark = pytest.mark.redis

T0 = 1_800_000_000_000_000
SEC = 1_000_000
S = SubscriberState


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    with fresh_prefix("writes") as prefix:
        yield prefix


@pytest.fixture
def store(redis_prefix: str) -> Iterator[RedisStore]:
    s = RedisStore.from_url(f"{REDIS_URL}?prefix={redis_prefix}")
    yield s
    s.close()


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    parts = redis.connection.parse_url(REDIS_URL)
    p = FaultProxy(parts.get("host", "127.0.0.1"), int(parts.get("port", 6379)))
    yield p
    p.close()


def _items(count: int) -> list[engine_batch.NewItem]:
    return [(new_id(), "pub", None, None, 0, (), None, "text/plain", 1) for _ in range(count)]


def _journal_rows(store: RedisStore) -> int:
    return int(store.client.xlen(f"{store.keyspace}journal"))


def test_a_batch_journal_is_one_stream_entry_per_group_read_per_message(
    store: RedisStore,
) -> None:
    queue = "rows"
    records, journal = engine_batch.create(queue, Audience(("a", "b")), T0, _items(50))
    writes = Writes(queue, created=records, journal=journal)
    assert store.commit_writes(writes) == [True] * 50
    assert _journal_rows(store) == 1
    claimed, journal, off = engine_batch.claim(
        [store.load(r.msg_id) for r in records],
        "a",
        T0 + SEC,
        [new_id() for _ in records],
        owner="me",
        lease_until=T0 + 30 * SEC,
    )
    assert off == []
    assert store.commit_writes(Writes(queue, moved=claimed, journal=journal)) == [True] * 50
    assert _journal_rows(store) == 2
    # One entry per message per transition, in order, for every reader.
    tail = store.journal(0, 100_000)
    assert len(tail) == 50 * 4 + 50 * 2
    seqs = [e.seq or 0 for e in tail]
    assert seqs == sorted(set(seqs))
    for rec in records:
        history = store.history(rec.msg_id)
        assert [e.msg_id for e in history] == [rec.msg_id] * 6
        assert [e.dst for e in history] == [
            "PUT",
            "REVEALED",
            "AVAILABLE",
            "AVAILABLE",
            "GET",
            "FETCHED",
        ]
    assert store.due(queue, T0 + 31 * SEC, 100) == [r.msg_id for r in records]
    found = store.search(queue, Filter(state=PublisherState.REVEALED, limit=100))
    assert len(found) == 50
    done, journal, off = engine_batch.settle(
        [a for _, a in claimed], "a", [a.members["a"].lease_token for _, a in claimed], "done", T0
    )
    assert store.commit_writes(Writes(queue, moved=done, journal=journal)) == [True] * 50
    assert store.due(queue, T0 + 31 * SEC, 100) == []


def test_a_purged_batch_message_keeps_its_history(store: RedisStore) -> None:
    queue = "purged"
    records, journal = engine_batch.create(queue, Audience(("a",)), T0, _items(3))
    assert store.commit_writes(Writes(queue, created=records, journal=journal)) == [True] * 3
    gone = records[1]
    withdraw = engine.withdraw(store.load(gone.msg_id), T0 + SEC, "no longer")
    assert store.commit_writes(Writes(queue, changes=[withdraw])) == [True]
    assert [p.msg_id for p in store.purge(queue, T0 + 2 * SEC)] == [gone.msg_id]
    history = store.history(gone.msg_id)
    assert [e.msg_id for e in history] == [gone.msg_id] * len(history)
    assert [e.dst for e in history][:3] == ["PUT", "REVEALED", "AVAILABLE"]
    assert len(history) == 3 + len(withdraw.journal)


@pytest.mark.parametrize("lose", ["reply", "request"])
def test_a_batch_whose_reply_or_request_is_lost_applies_once(
    redis_prefix: str, store: RedisStore, proxy: FaultProxy, lose: str
) -> None:
    queue = "lost-writes"
    records, journal = engine_batch.create(queue, Audience(("a",)), T0, _items(3))
    assert store.commit_writes(Writes(queue, created=records, journal=journal)) == [True] * 3
    loaded = [store.load(r.msg_id) for r in records]
    # Someone else claims the second first: its move below does not hold.
    store.commit(engine.claim(loaded[1], "a", T0 + SEC, token="x", owner="o", lease_until=None))
    moved, journal, _ = engine_batch.claim(
        loaded, "a", T0 + 2 * SEC, ["t0", "t1", "t2"], owner="me", lease_until=None
    )
    rows_before = _journal_rows(store)
    via = RedisStore.from_url(f"redis://127.0.0.1:{proxy.port}/0?prefix={redis_prefix}")
    try:
        proxy.arm(b"EVALSHA", loaded[0].msg_id.encode(), lose=lose)
        flags = via.commit_writes(Writes(queue, moved=moved, journal=journal))
        assert proxy.cuts == 1
    finally:
        via.close()
    assert flags == [True, False, True]
    assert _journal_rows(store) == rows_before + 1
    assert store.load(records[0].msg_id).members["a"].lease_token == "t0"
    assert store.load(records[1].msg_id).members["a"].lease_token == "x"
    assert [e.dst for e in store.history(records[0].msg_id)] == [
        "PUT",
        "REVEALED",
        "AVAILABLE",
        "GET",
        "FETCHED",
    ]


@pytest.mark.parametrize("lose", ["reply", "request"])
def test_a_colocated_put_whose_reply_or_request_is_lost_adds_each_entry_once(
    redis_prefix: str, store: RedisStore, proxy: FaultProxy, lose: str
) -> None:
    queue = "lost-put"
    stream = f"iq-test-{redis_prefix}-{queue}"
    records, journal = engine_batch.create(queue, Audience(("a",)), T0, _items(4))
    entries = [["payload", f"body {i}"] for i in range(4)]
    via = RedisStore.from_url(f"redis://127.0.0.1:{proxy.port}/0?prefix={redis_prefix}")
    try:
        proxy.arm(b"EVALSHA", records[0].msg_id.encode(), lose=lose)
        refs = via.commit_writes_with_entries(
            Writes(queue, created=records, journal=journal), stream, entries
        )
        assert proxy.cuts == 1
        assert len(set(refs)) == 4
        assert store.client.xlen(stream) == 4
        for rec, ref in zip(records, refs, strict=True):
            loaded = store.load(rec.msg_id)
            assert loaded.native_ref == ref == rec.native_ref
            assert loaded.seq == rec.seq
            assert len(store.history(rec.msg_id)) == 3
    finally:
        via.close()
        drop_streams(stream)


@pytest.mark.parametrize("lose", ["reply", "request"])
def test_a_claim_of_received_entries_whose_reply_or_request_is_lost_claims_once(
    redis_prefix: str, store: RedisStore, proxy: FaultProxy, lose: str
) -> None:
    queue = "lost-claim"
    records, journal = engine_batch.create(queue, Audience(("a",)), T0, _items(3))
    assert store.commit_writes(Writes(queue, created=records, journal=journal)) == [True] * 3
    store.set_native_refs([(r.msg_id, f"1-{i}") for i, r in enumerate(records)])
    plan = engine_batch.claim_plan("a", "me", T0 + 60 * SEC)
    entries = [(r.msg_id, f"1-{i}", "k") for i, r in enumerate(records)]
    rows_before = _journal_rows(store)
    via = RedisStore.from_url(f"redis://127.0.0.1:{proxy.port}/0?prefix={redis_prefix}")
    try:
        proxy.arm(b"EVALSHA", records[0].msg_id.encode(), lose=lose)
        got = via.claim_received(queue, plan, T0 + SEC, entries, ["t0", "t1", "t2"])
        assert proxy.cuts == 1
    finally:
        via.close()
    # The retry answers what the one try did: every claim once, under its own token.
    assert got == [(r.msg_id, f"1-{i}", 1, 5, f"t{i}") for i, r in enumerate(records)]
    assert _journal_rows(store) == rows_before + 1
    for i, rec in enumerate(records):
        member = store.load(rec.msg_id).members["a"]
        assert (member.state, member.lease_token) == (S.FETCHED, f"t{i}")
        assert [e.dst for e in store.history(rec.msg_id)][-2:] == ["GET", "FETCHED"]
