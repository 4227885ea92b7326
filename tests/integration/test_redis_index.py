"""The Redis index store when things go wrong, on the real Redis server.

* An unreachable server is an IndexUnavailable that names the URL without its password.
* A commit or purge whose reply is lost (the connection drops after Redis ran the script)
  is recognised on the retry, not applied twice and not reported as a lost race; one whose
  request is lost is applied by the retry. The same for a commit_each: the retry reports
  exactly which of its changes applied.
* A put through Redis Streams on the index's server keeps the retained payload copy in
  the same script as the record and the entry.
* Purge leaves no index entry (and no retained copy) behind; every key of an index
  carries its hash tag.
* A put through a broker apart from the index is not declared unusable while its
  payload's reference is still on its way to the index.

Faults are made by a TCP proxy in front of Redis (:class:`~iqbridge.testing.proxy.FaultProxy`)
that resets a connection at the chosen moment; nothing is mocked.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import iqbridge
from iqbridge import engine
from iqbridge.errors import ConfigurationError, IndexUnavailable
from iqbridge.ids import new_id, new_token
from iqbridge.model import Audience, Filter, Pool, Retained
from iqbridge.states import SubscriberState
from iqbridge.stores.base import StaleRecord
from iqbridge.stores.redis import RedisStore
from iqbridge.testing import FakeClock
from iqbridge.testing.proxy import FaultProxy
from tests.redis_index_helpers import REDIS_URL, drop_streams, fresh_prefix

pytestmark = pytest.mark.redis

T0 = 1_800_000_000_000_000
S = SubscriberState


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    with fresh_prefix("failures") as prefix:
        yield prefix


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    parts = redis.connection.parse_url(REDIS_URL)
    p = FaultProxy(parts.get("host", "127.0.0.1"), int(parts.get("port", 6379)))
    yield p
    p.close()


@pytest.fixture
def store(redis_prefix: str) -> Iterator[RedisStore]:
    s = RedisStore.from_url(f"{REDIS_URL}?prefix={redis_prefix}")
    yield s
    s.close()


def _new(queue: str, audience: Audience, **fields: object) -> engine.Change:
    return engine.new_message(
        msg_id=new_id(), queue=queue, publisher="pub", audience=audience, now=T0, **fields
    )


def test_unreachable_redis_is_index_unavailable_naming_the_redacted_url() -> None:
    # Port 1 on loopback: nothing listens there, every connection is refused at once.
    url = "redis://iq-user:s3cret-pw@127.0.0.1:1/0?prefix=nowhere&retries=2"
    with pytest.raises(IndexUnavailable) as info:
        RedisStore.from_url(url)
    text = str(info.value)
    assert "s3cret-pw" not in text
    assert "redis://iq-user:***@127.0.0.1:1/0" in text
    assert "check that Redis is running" in text


def test_hub_on_an_unreachable_index_fails_before_use(tmp_path: Path) -> None:
    with pytest.raises(IndexUnavailable, match=r"127\.0\.0\.1:1"):
        iqbridge.connect(f"sqlite:///{tmp_path / 'q.db'}", index="redis://127.0.0.1:1/0?retries=1")


@pytest.mark.parametrize(
    ("query", "complaint"),
    [
        ("prefix=a{b}", "braces"),
        ("retries=0", "retries must be a positive integer"),
        ("socket_timeout=soon", "socket_timeout must be a positive number"),
        ("colour=blue", "unknown Redis index option"),
    ],
)
def test_bad_options_are_configuration_errors(query: str, complaint: str) -> None:
    with pytest.raises(ConfigurationError, match=complaint):
        RedisStore.from_url(f"redis://127.0.0.1:1/0?{query}")


def _proxied(redis_prefix: str, proxy: FaultProxy) -> RedisStore:
    return RedisStore.from_url(f"redis://127.0.0.1:{proxy.port}/0?prefix={redis_prefix}")


@pytest.mark.parametrize("lose", ["reply", "request"])
def test_a_commit_whose_reply_or_request_is_lost_applies_exactly_once(
    redis_prefix: str, store: RedisStore, proxy: FaultProxy, lose: str
) -> None:
    queue = "lost"
    via = _proxied(redis_prefix, proxy)
    try:
        put = _new(queue, Audience((), (Pool("p", ["p1", "p2"]),)))
        proxy.arm(b"EVALSHA", put.msg_id.encode(), lose=lose)
        via.commit(put)
        assert proxy.cuts == 1
        assert put.record.seq == store.load(put.msg_id).seq

        rec = store.load(put.msg_id)
        claim = engine.claim(rec, "p1", T0, token=new_token(), owner="o", lease_until=None)
        journal_before = len(store.journal(0, 100_000))
        proxy.arm(b"EVALSHA", put.msg_id.encode(), lose=lose)
        via.commit(claim)  # neither StaleRecord nor applied twice
        assert proxy.cuts == 2
    finally:
        via.close()
    assert store.load(put.msg_id) == claim.record
    history = store.history(put.msg_id)
    assert [(e.actor, e.dst) for e in history] == [
        (e.actor, e.dst) for e in put.journal + claim.journal
    ]
    assert len(store.journal(0, 100_000)) == journal_before + len(claim.journal)


@pytest.mark.parametrize("lose", ["reply", "request"])
def test_a_commit_each_whose_reply_or_request_is_lost_reports_what_applied_once(
    redis_prefix: str, store: RedisStore, proxy: FaultProxy, lose: str
) -> None:
    """The retry reads the reply the script kept (reply lost) or runs it again (request
    lost): either way every flag is right, nothing applies twice, and a change without
    journal entries (a lease renewal) is reported too."""
    queue = "lost-each"
    puts = [_new(queue, Audience(("a",))) for _ in range(4)]
    store.commit_many(puts)
    first, second, third, held = (p.msg_id for p in puts)
    token = new_token()
    store.commit(
        engine.claim(store.load(held), "a", T0, token=token, owner="o", lease_until=T0 + 10)
    )
    recs = store.load_many([first, second, third, held])
    # The second moves on (a browse lock taken and given back): its claim below is stale.
    store.commit(engine.lock(store.load(second), "l", "o", T0, None))
    store.commit(engine.unlock(store.load(second), "l", T0))

    def claim(msg_id: str) -> engine.Change:
        return engine.claim(
            recs[msg_id], "a", T0 + 1, token=new_token(), owner="b", lease_until=None
        )

    fresh = _new(queue, Audience(("a",)))
    fresh.retain = Retained(b"\xff\x00 kept", {"k": "v"})
    batch = [
        claim(first),
        claim(second),  # stale
        fresh,
        _dup(first, queue),  # exists already
        engine.renew(recs[held], "a", token, T0 + 1, T0 + 60_000_000),  # no journal entry
        claim(third),
    ]
    journal_before = len(store.journal(0, 100_000))
    second_before = store.load(second)
    via = _proxied(redis_prefix, proxy)
    try:
        proxy.arm(b"EVALSHA", first.encode(), lose=lose)
        flags = via.commit_each(batch)
        assert proxy.cuts == 1
    finally:
        via.close()
    assert flags == [True, False, True, False, True, True]
    for change in (batch[0], batch[2], batch[4], batch[5]):
        assert store.load(change.msg_id) == change.record
    assert store.load(second) == second_before
    assert fresh.record.seq == store.load(fresh.msg_id).seq
    assert store.retained([fresh.msg_id, first]) == {fresh.msg_id: fresh.retain}
    applied = [batch[0], batch[2], batch[5]]
    assert len(store.journal(0, 100_000)) == journal_before + sum(len(c.journal) for c in applied)
    assert store.claimable(queue, "a", T0 + 2, 10) == [second, fresh.msg_id]


def _dup(msg_id: str, queue: str) -> engine.Change:
    """A creation of a message that exists already (skipped by commit_each)."""
    change = engine.new_message(
        msg_id=msg_id, queue=queue, publisher="pub", audience=Audience(("z",)), now=T0
    )
    change.retain = Retained(b"not kept")
    return change


def test_a_colocated_put_keeps_the_retained_copy_with_the_record_and_the_entry(
    redis_prefix: str, store: RedisStore
) -> None:
    """RedisStore.commit_with_entries (the Redis Streams put on the index's server)
    writes the retained copy in the same script: all three appear, or none."""
    stream = f"{{iq:{redis_prefix}}}:entries"
    put = _new("colocated", Audience(("a",)))
    put.retain = Retained(b"\x00\xfe body", {"k": "v"})
    [ref] = store.commit_with_entries([put], stream, [["f", b"\x00\xfe body"]])
    assert store.load(put.msg_id).native_ref == ref
    assert store.retained([put.msg_id]) == {put.msg_id: put.retain}
    again = _dup(put.msg_id, "colocated")
    fresh = _new("colocated", Audience(("a",)))
    fresh.retain = Retained(b"fresh")
    with pytest.raises(StaleRecord):
        store.commit_with_entries([fresh, again], stream, [["f", b"1"], ["f", b"2"]])
    assert store.retained([put.msg_id, fresh.msg_id]) == {put.msg_id: put.retain}
    client = redis.Redis.from_url(REDIS_URL)
    try:
        assert client.xlen(stream) == 1
    finally:
        client.close()


def test_a_put_through_redis_streams_with_retain_keeps_the_copy_in_the_index(
    redis_prefix: str,
) -> None:
    """The facade's put on Redis Streams with the index on the same server (one script
    for record, entry and copy): the copy is there, byte for byte, with its headers."""
    body = b"\xff\xfe not UTF-8 \x00"
    try:
        with iqbridge.connect(
            f"{REDIS_URL}?prefix={redis_prefix}&stream_prefix={redis_prefix}:"
        ) as hub:
            assert hub.colocated is not None
            q = hub.queue("kept", retain=True)
            msg_id = q.put(body, to=["a"], headers={"h": "ü"})
            [copy] = hub.store.retained([msg_id]).values()
            assert (copy.body, dict(copy.headers)) == (body, {"h": "ü"})
            plain = hub.queue("plain", retain=False).put(body, to=["a"])
            assert hub.store.retained([plain]) == {}
    finally:
        drop_streams(f"{redis_prefix}:")


def test_a_purge_whose_reply_is_lost_reports_what_it_purged(
    redis_prefix: str, store: RedisStore, proxy: FaultProxy
) -> None:
    queue = "purged"
    ids = []
    for _ in range(3):
        put = _new(queue, Audience(("a",)), native_ref=f"ref-{len(ids)}")
        store.commit(put)
        store.commit(engine.withdraw(store.load(put.msg_id), T0))
        ids.append(put.msg_id)
    via = _proxied(redis_prefix, proxy)
    try:
        proxy.arm(b"EVALSHA", f"p:{queue}/JOURNALLED".encode())
        gone = via.purge(queue, T0 + 1, limit=2)
        assert proxy.cuts == 1
    finally:
        via.close()
    assert [(p.msg_id, p.native_ref) for p in gone] == [(ids[0], "ref-0"), (ids[1], "ref-1")]
    assert [p.msg_id for p in store.purge(queue, T0 + 1)] == [ids[2]]


def test_purge_leaves_no_index_entry_and_every_key_has_the_hash_tag(
    redis_prefix: str, store: RedisStore
) -> None:
    queue = "tidy"
    put = _new(
        queue,
        Audience(("a",), (Pool("p", ["p1", "p2"]),)),
        correlation_id="corr/1",
        expires_at=T0 + 10_000_000,
    )
    put.retain = Retained(b"kept until the purge", {"h": "v"})
    store.commit(put)
    copy_key = f"{{iq:{redis_prefix}}}:b:{put.msg_id}"
    token = new_token()
    store.commit(engine.lock(store.load(put.msg_id), "lock-1", "browser", T0, T0 + 5_000_000))
    store.commit(
        engine.claim(
            store.load(put.msg_id),
            "p1",
            T0,
            token=token,
            owner="o",
            lease_until=T0 + 1_000_000,
            lock_id="lock-1",
        )
    )
    store.commit(engine.release(store.load(put.msg_id), "p1", token, T0, delay_us=1_000_000))
    store.commit(engine.withdraw(store.load(put.msg_id), T0 + 1))
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        keys = set(client.scan_iter(match=f"*{redis_prefix}*", count=1000))
        assert copy_key in keys
        assert keys and all(k.startswith(f"{{iq:{redis_prefix}}}:") for k in keys)
        assert [p.msg_id for p in store.purge(queue, T0 + 2)] == [put.msg_id]
        left = {
            k
            for k in client.scan_iter(match=f"{{iq:{redis_prefix}}}:*", count=1000)
            if client.type(k) == "zset" and client.zscore(k, put.msg_id) is not None
        }
        assert left == set()
        assert not client.exists(f"{{iq:{redis_prefix}}}:m:{put.msg_id}")
        assert not client.exists(copy_key)
        assert client.xlen(f"{{iq:{redis_prefix}}}:journal") > 0  # the journal is kept
    finally:
        client.close()


def test_a_put_whose_payload_reference_is_not_yet_indexed_is_not_declared_unusable(
    redis_prefix: str, tmp_path: Path
) -> None:
    # The embedded queue with its index in Redis: a put commits the record first, then
    # stores the row, then records the row's reference. A get in between must wait.
    clock = FakeClock()
    with iqbridge.connect(
        f"sqlite:///{tmp_path / 'q.db'}",
        index=f"{REDIS_URL}?prefix={redis_prefix}",
        clock=clock,
    ) as hub:
        queue = hub.queue("inflight", lease=30)
        change = engine.new_message(
            msg_id=new_id(),
            queue="inflight",
            publisher="pub",
            audience=Audience(("a",)),
            now=hub.now_us(),
        )
        hub.store.commit(change)  # the put's first step, and no further
        assert queue.get("a") is None
        assert hub.store.load(change.msg_id).members["a"].state is S.AVAILABLE
        clock.advance(31)  # a put that never finished: now the payload is missing
        assert queue.get("a") is None
        view = queue.state(change.msg_id).subscribers["a"]
        assert view.reason == "payload missing on the broker"


def test_search_pages_through_a_long_index_past_entries_without_a_record(
    redis_prefix: str, store: RedisStore
) -> None:
    queue = "long"
    changes = [_new(queue, Audience(("a",)), priority=i % 3) for i in range(450)]
    store.commit_many(changes)
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        # An index entry whose record is gone (say, deleted by hand) is passed over.
        client.zadd(
            f"{{iq:{redis_prefix}}}:q:{queue}", {"ghost": (changes[50].record.seq or 0) + 0.5}
        )
    finally:
        client.close()
    # 100 hits need about 300 records: more than one page (pages are twice the limit).
    hits = store.search(queue, Filter(priority=2, limit=100))
    assert [h.msg_id for h in hits] == [c.msg_id for c in changes if c.record.priority == 2][:100]
    assert len(store.search(queue, Filter(limit=1000))) == 450
    assert len(store.search(queue, Filter(limit=300))) == 300


def test_a_change_without_the_record_it_started_from_is_refused(store: RedisStore) -> None:
    """The store works out which index entries to move from ``Change.before``; a change
    made without it (not by the engine) is refused before anything is written."""
    put = _new("orders", Audience(("a",)))
    store.commit(put)
    claim = engine.claim(
        store.load(put.msg_id), "a", T0 + 1, token=new_token(), owner="o", lease_until=None
    )
    claim.before = None
    with pytest.raises(ValueError, match="lacks the record it started from"):
        store.commit(claim)
    rec = store.load(put.msg_id)
    assert rec.version == put.record.version
    assert rec.members["a"].state is SubscriberState.AVAILABLE
    assert store.claimable("orders", "a", T0 + 2, 10) == [put.msg_id]


def test_a_forked_child_takes_its_own_connection(store: RedisStore) -> None:
    """The hot scripts run on a connection each thread keeps; a forked child must not
    share its parent's socket (replies would cross) and takes its own, and the parent
    goes on with its own."""
    first = _new("orders", Audience(("a",)))
    store.commit(first)
    parent_conn = store._direct._connection()
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        code = 1
        try:
            child_conn = store._direct._connection()
            second = _new("orders", Audience(("a",)))
            store.commit(second)
            ok = child_conn is not parent_conn and store.load(second.msg_id).version == 1
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store._direct._connection() is parent_conn
    claim = engine.claim(
        store.load(first.msg_id), "a", T0 + 1, token=new_token(), owner="o", lease_until=None
    )
    store.commit(claim)
    assert store.load(first.msg_id).members["a"].state is SubscriberState.FETCHED
    assert len(store.claimable("orders", "a", T0 + 2, 10)) == 1  # the child's message
