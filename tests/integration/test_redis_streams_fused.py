"""The claim made by the Redis Streams receive script (co-located index), on the real
server:

* a batch's claims are one journal stream entry (and its settle acknowledges the
  entries in the same script as it commits), each message's history reads one
  entry per transition, and the index's bookkeeping (sorted sets, optional fields,
  ``ix``) matches its records, with the moved members' rows (and the publisher state
  once it moves) kept apart (``ms:<id>``) until a move of more than members writes the
  record whole again;
* an unsettled claim comes back after its lease with attempt + 1, and the old holder is
  fenced off (its done raises LeaseLost and changes nothing);
* a redelivered entry of a message already DONE is acknowledged, never handed out;
* a member in a pool, a browse-locked message and a message with a time limit are
  left to the facade (claimed the ordinary way), with the same outcome.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import iqbridge
from iqbridge import SubscriberState
from iqbridge.errors import LeaseLost
from iqbridge.model import Pool
from iqbridge.testing import FakeClock
from tests.redis_index_helpers import REDIS_URL, check_redis_index, drop_streams, fresh_prefix

pytestmark = pytest.mark.redis

S = SubscriberState


@pytest.fixture
def url() -> Iterator[str]:
    with fresh_prefix("fused") as prefix:
        try:
            yield f"{REDIS_URL}?prefix={prefix}&stream_prefix={prefix}:"
        finally:
            drop_streams(f"{prefix}:")


def _journal_rows(hub: iqbridge.Hub) -> int:
    store = hub.store
    return int(store.client.xlen(f"{store.keyspace}journal"))  # type: ignore[attr-defined]


def _lose_one_reply(monkeypatch: pytest.MonkeyPatch, script: Any) -> list[str]:
    """The first reply of ``script`` (run on the server) is lost: the connection drops
    after the script ran. The list returned says whether it happened."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from iqbridge.stores import redis_scripts

    real = redis_scripts.DirectScripts.run
    lost: list[str] = []

    def run(self: Any, ran: Any, keys: Any, args: Any) -> Any:
        reply = real(self, ran, keys, args)
        if ran.sha == script.sha and not lost:
            lost.append("reply")
            raise RedisConnectionError("connection dropped after the script ran")
        return reply

    monkeypatch.setattr(redis_scripts.DirectScripts, "run", run)
    return lost


def _apart(hub: iqbridge.Hub, msg_id: str) -> dict[str, str]:
    store = hub.store
    return dict(store.client.hgetall(f"{store.keyspace}ms:{msg_id}"))  # type: ignore[attr-defined]


def test_a_batch_claim_is_one_journal_entry_and_the_index_stays_consistent(url: str) -> None:
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders", lease=60)
        q.subscribe("a")
        q.subscribe("b")
        ids = q.put_many([f"m{i}".encode() for i in range(20)])
        rows = _journal_rows(hub)
        batch = q.get_many("a", 20)
        assert batch.msg_ids == ids
        assert _journal_rows(hub) == rows + 1
        for msg_id in ids:
            assert set(_apart(hub, msg_id)) == {"a"}
            history = q.state(msg_id).journal
            assert [(e.actor, e.dst) for e in history][-2:] == [("a", "GET"), ("a", "FETCHED")]
            assert q.state(msg_id).subscribers["a"].state is S.FETCHED
            assert q.state(msg_id).subscribers["b"].state is S.AVAILABLE
        check_redis_index(hub.store)
        # b claims too: both rows apart, each its own.
        other = q.get_many("b", 20)
        assert other.msg_ids == ids
        assert set(_apart(hub, ids[0])) == {"a", "b"}
        check_redis_index(hub.store)
        # Each record moved on meanwhile (b's claim): the settle compares a's member and
        # token where the index lives, not the record's version, so it holds at once,
        # in one script call, and both rows stay apart.
        rows = _journal_rows(hub)
        batch.done()
        assert _journal_rows(hub) == rows + 1
        assert all(set(_apart(hub, msg_id)) == {"a", "b"} for msg_id in ids)
        for msg_id in ids:
            view = q.state(msg_id).subscribers
            assert (view["a"].state, view["b"].state) == (S.JOURNALLED, S.FETCHED)
        check_redis_index(hub.store)
        other.done()
        assert [m.msg_id for m in q.search(state=iqbridge.PublisherState.JOURNALLED)] == ids
        check_redis_index(hub.store)


def test_a_batch_settle_of_members_only_keeps_the_record_json_as_put(url: str) -> None:
    """A batch's claim and settle move members only: their rows, and the publisher
    state once the last member is journalled, are written apart (``ms:<id>``, the state
    under ""), not the record JSON; every read lays them over it."""
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders")
        q.subscribe("a")
        ids = q.put_many([f"m{i}".encode() for i in range(5)])
        store = hub.store
        client = store.client  # type: ignore[attr-defined]
        put = {m: client.hget(f"{store.keyspace}m:{m}", "r") for m in ids}  # type: ignore[attr-defined]
        q.get_many("a", 5).done()
        for msg_id in ids:
            assert client.hget(f"{store.keyspace}m:{msg_id}", "r") == put[msg_id]  # type: ignore[attr-defined]
            apart = _apart(hub, msg_id)
            assert set(apart) == {"a", ""} and apart[""] == "JOURNALLED"
            state = q.state(msg_id)
            assert state.publisher_state is iqbridge.PublisherState.JOURNALLED
            assert state.subscribers["a"].state is S.JOURNALLED
        assert [m.msg_id for m in q.search(state=iqbridge.PublisherState.JOURNALLED)] == ids
        assert [m.msg_id for m in q.search(state=S.JOURNALLED)] == ids
        check_redis_index(store)


def test_a_settle_acknowledges_its_entries_in_the_same_script(url: str) -> None:
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders")
        q.subscribe("a")
        ids = q.put_many([f"m{i}".encode() for i in range(10)])
        batch = q.get_many("a", 10)
        adapter = hub.adapter
        assert len(adapter.pending("orders", "a")) == 10  # type: ignore[attr-defined]
        rows = _journal_rows(hub)
        assert batch.done().done == ids
        # Nothing held back for a later round trip: the commit's script sent the XACK.
        assert adapter.pending("orders", "a") == {}  # type: ignore[attr-defined]
        assert _journal_rows(hub) == rows + 1
        check_redis_index(hub.store)


def test_an_unsettled_claim_comes_back_after_its_lease_and_fences_the_old_holder(
    url: str,
) -> None:
    clock = FakeClock()
    with iqbridge.connect(url, clock=clock) as hub:
        q = hub.queue("orders", lease=5)
        q.subscribe("a")
        ids = q.put_many([b"1", b"2", b"3"])
        first = q.get_many("a", 3)
        assert [d.attempt for d in first] == [1, 1, 1]
        assert q.get_many("a", 3).msg_ids == []  # held
        clock.advance(6)
        assert q.recover() == 3
        again = q.get_many("a", 3)
        assert again.msg_ids == ids
        assert [d.attempt for d in again] == [2, 2, 2]
        with pytest.raises(LeaseLost):
            first[0].done()
        for msg_id in ids:
            assert q.state(msg_id).subscribers["a"].state is S.FETCHED
        again.done()
        for msg_id in ids:
            state = q.state(msg_id)
            assert state.subscribers["a"].state is S.JOURNALLED
            assert sum(1 for e in state.journal if e.dst == S.DONE.value) == 1
        check_redis_index(hub.store)


def test_a_redelivered_done_entry_is_acknowledged_and_never_handed_out(url: str) -> None:
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders")
        q.subscribe("a")
        ids = q.put_many([b"1", b"2"])
        batch = q.get_many("a", 2)
        batch.done()
        adapter = hub.adapter
        adapter.flush()  # type: ignore[attr-defined]
        ref = hub.store.load(ids[0]).native_ref
        assert ref is not None
        assert adapter.redeliver("orders", "a", ref)  # type: ignore[attr-defined]
        assert q.get_many("a", 10).msg_ids == []
        adapter.flush()  # type: ignore[attr-defined]
        assert adapter.pending("orders", "a") == {}  # type: ignore[attr-defined]
        state = q.state(ids[0])
        assert sum(1 for e in state.journal if e.dst == S.DONE.value) == 1


def test_messages_off_the_common_path_are_claimed_by_the_facade(url: str) -> None:
    clock = FakeClock()
    with iqbridge.connect(url, clock=clock) as hub:
        q = hub.queue("orders", lease=30)
        q.subscribe_pool("workers", ["w1", "w2"])
        q.subscribe("a")
        pooled = q.put_many([b"p1", b"p2"], to=[Pool("workers", ("w1", "w2"))])
        limited = q.put(b"t", to=["a"], ttl=60)
        left: list[str] = []
        accept = q._receiving._accept_many

        def spy(batch: Any, *args: Any) -> Any:
            left.extend(r.envelope.msg_id for r in batch)
            return accept(batch, *args)

        q._receiving._accept_many = spy  # type: ignore[method-assign]
        got = q.get_many("w1", 5)
        assert got.msg_ids == pooled
        d = q.get("a")
        assert d is not None and d.msg_id == limited
        assert left == [*pooled, limited]  # not claimed by the receive script
        got.done()
        d.done()
        check_redis_index(hub.store)


# --- the settle where the index lives (stores/lua/settle.lua) -------------------------


def test_a_batch_done_moves_the_publisher_once_every_member_is_journalled(url: str) -> None:
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders", lease=60)
        q.subscribe("a")
        q.subscribe("b")
        ids = q.put_many([f"m{i}".encode() for i in range(6)])
        a, b = q.get_many("a", 6), q.get_many("b", 6)
        assert a.done().done == ids
        for msg_id in ids:
            state = q.state(msg_id)
            assert state.publisher_state is iqbridge.PublisherState.REVEALED
            assert state.subscribers["a"].state is S.JOURNALLED
            member = hub.store.load(msg_id).members["a"]
            assert (member.outcome, member.lease_until) == (S.DONE, None)
            assert state.subscribers["b"].state is S.FETCHED
        check_redis_index(hub.store)
        assert b.done().done == ids
        assert [m.msg_id for m in q.search(state=iqbridge.PublisherState.JOURNALLED)] == ids
        assert q.search(state=iqbridge.PublisherState.REVEALED) == []
        for msg_id in ids:
            moves = [(e.actor, e.src, e.dst) for e in q.state(msg_id).journal]
            assert moves[-3:] == [
                ("b", "FETCHED", "DONE"),
                ("b", "DONE", "JOURNALLED"),
                (q.state(msg_id).publisher, "REVEALED", "JOURNALLED"),
            ]
        check_redis_index(hub.store)


def test_in_process_then_done_where_held_keeps_then_ends_the_lease(url: str) -> None:
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders", lease=60)
        q.subscribe("a")
        ids = q.put_many([b"1", b"2"])
        batch = q.get_many("a", 2)
        leases = [d.lease_until_us for d in batch]
        assert all(lease is not None for lease in leases)
        stream = hub.adapter.key("orders")  # type: ignore[attr-defined]
        client = hub.store.client  # type: ignore[attr-defined]
        batch.in_process()
        assert [d.state for d in batch] == [S.IN_PROCESS, S.IN_PROCESS]
        # In process is not done: the entries stay pending in the group.
        assert client.xpending(stream, "a")["pending"] == 2
        assert [d.lease_until_us for d in batch] == leases
        for msg_id in ids:
            assert q.state(msg_id).subscribers["a"].state is S.IN_PROCESS
        batch.done()
        assert client.xpending(stream, "a")["pending"] == 0
        assert [d.lease_until_us for d in batch] == [None, None]
        for msg_id in ids:
            state = q.state(msg_id)
            assert state.subscribers["a"].state is S.JOURNALLED
            assert [e.dst for e in state.journal][-4:] == [
                "IN_PROCESS",
                "DONE",
                "JOURNALLED",
                "JOURNALLED",
            ]
        check_redis_index(hub.store)
        assert hub.store.due("orders", 2**62, 10) == []


def test_a_done_without_auto_journal_stays_done_and_the_publisher_waits(url: str) -> None:
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders", lease=60, auto_journal=False)
        q.subscribe("a")
        ids = q.put_many([b"1", b"2"])
        q.get_many("a", 2).done()
        for msg_id in ids:
            state = q.state(msg_id)
            assert state.subscribers["a"].state is S.DONE
            assert state.publisher_state is iqbridge.PublisherState.REVEALED
        check_redis_index(hub.store)


def test_a_settle_whose_reply_is_lost_is_not_made_twice(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders", lease=60)
        q.subscribe("a")
        ids = q.put_many([b"1", b"2", b"3"])
        batch = q.get_many("a", 3)
        lost = _lose_one_reply(monkeypatch, hub.store._settle)  # type: ignore[attr-defined]
        settled = batch.done()
        assert lost == ["reply"]
        assert settled.done == ids and settled.lost == {}
        for msg_id in ids:
            assert sum(1 for e in q.state(msg_id).journal if e.dst == S.DONE.value) == 1
        check_redis_index(hub.store)


def test_a_settle_off_the_common_path_is_left_to_the_engine(url: str) -> None:
    """A member no longer held under the batch's token (released, then claimed again) is
    reported lost and left as it is; the others in the batch settle where they live."""
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders", lease=60)
        q.subscribe("a")
        ids = q.put_many([b"1", b"2", b"3"])
        batch = q.get_many("a", 3)
        first = next(iter(batch))
        q.undo(first.confirm_id)  # given back: AVAILABLE again, attempt 2
        again = q.get_many("a", 1)
        assert again.msg_ids == [ids[0]]
        settled = batch.done(partial=True)
        assert settled.done == ids[1:]
        assert list(settled.lost) == [ids[0]]
        assert q.state(ids[0]).subscribers["a"].state is S.FETCHED
        again.done()
        assert q.state(ids[0]).subscribers["a"].state is S.JOURNALLED
        check_redis_index(hub.store)


def test_a_pool_batch_claimed_by_the_facade_settles_where_held_twice(url: str) -> None:
    """Deliveries the facade claimed (a pool's: records at hand) settle where the index
    lives too, in process and then done, each in one call and no per-message commit."""
    from iqbridge.testing.contract_batches import counting

    with iqbridge.connect(url) as hub:
        q = hub.queue("orders", lease=60)
        q.subscribe_pool("workers", ["w1", "w2"])
        ids = q.put_many([b"p1", b"p2", b"p3"], to=[Pool("workers", ("w1", "w2"))])
        batch = q.get_many("w1", 5)
        assert batch.msg_ids == ids
        names = ("settle_held", "settle_indexed")
        with counting(hub.adapter, names) as calls, counting(hub.store, ("commit",)) as one:
            batch.in_process()
            batch.done()
        assert (calls["settle_held"], calls["settle_indexed"], one["commit"]) == (2, 0, 0)
        for msg_id in ids:
            state = q.state(msg_id)
            assert state.subscribers["w1"].state is S.JOURNALLED
            assert state.publisher_state is iqbridge.PublisherState.JOURNALLED
        check_redis_index(hub.store)


def test_an_idempotent_put_is_one_batch_write_and_its_repeat_changes_nothing(url: str) -> None:
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders", lease=60)
        q.subscribe("a")
        ids = [f"order-{i}" for i in range(5)]
        rows = _journal_rows(hub)
        assert q.put_many([f"m{i}".encode() for i in range(5)], msg_ids=ids) == ids
        assert _journal_rows(hub) == rows + 1  # the batch's templated journal, one entry
        assert q.put_many([f"m{i}".encode() for i in range(5)], msg_ids=ids) == ids
        assert _journal_rows(hub) == rows + 1  # the repeat wrote nothing
        assert q.get_many("a", 10).msg_ids == ids
        assert int(hub.store.client.xlen(hub.adapter.key("orders"))) == 5  # type: ignore[attr-defined]
        check_redis_index(hub.store)


def _stored(hub: iqbridge.Hub, msg_id: str) -> tuple[dict[str, str], list[Any], dict[str, Any]]:
    """A message's record hash (but its write id, put order and entry id), its history
    (but the entries' numbers) and its broker entry's fields (but the put instant)."""
    store: Any = hub.store
    raw = dict(store.client.hgetall(f"{store.keyspace}m:{msg_id}"))
    ref = raw.pop("n")
    for name in ("w", "s", "h"):
        raw.pop(name)
    history = [e._replace(seq=None, msg_id="") for e in store.history(msg_id)]
    [(_, fields)] = store.client.xrange(hub.adapter.key("orders"), ref, ref)  # type: ignore[attr-defined]
    return raw, history, dict(fields)


def test_a_put_by_kinds_stores_what_a_put_record_by_record_stores(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """put.lua (alike messages share their record and entry templates) writes every
    record, index entry, journal entry and broker entry as writes.lua does record by
    record: the same puts of mixed payloads, options and time limits through both, on
    the same clock, compared."""
    from iqbridge import Outgoing, putting
    from iqbridge.testing.contract_batches import counting
    from iqbridge.writes import Writes

    def puts(prefix: str) -> list[str]:
        ids = [f"{prefix}{i}" for i in range(9)]
        with iqbridge.connect(url, clock=FakeClock()) as hub:
            q = hub.queue("orders", lease=60)
            q.subscribe("a")
            q.subscribe_pool("p", ["p1", "p2"])
            with counting(hub.store, ("put_with_entries",)) as calls:
                q.put_many([{"n": 1}, b"xx", "three", {"n": 10_000}], msg_ids=ids[:4], ttl=30)
                q.put_each(
                    [
                        Outgoing(b"e1", msg_id=ids[4], priority=9, correlation_id="c1"),
                        Outgoing({"e": 2}, msg_id=ids[5], ordering_key="k", headers={"h": "v"}),
                        Outgoing(b"e3", msg_id=ids[6], parents=["x"], ttl=5, publisher="other"),
                    ],
                    to=["a"],
                )
                q.put_many([b"c1", b"c2"], msg_ids=ids[7:], confirm=True, priority=2)
            assert calls["put_with_entries"] == (3 if prefix == "k" else 0)
        return ids

    by_kinds = puts("k")
    # The same puts record by record (writes.lua): no kinds.
    monkeypatch.setattr(putting, "Writes", lambda *a, **kw: Writes(*a, **{**kw, "kinds": []}))
    by_record = puts("r")
    with iqbridge.connect(url) as hub:
        check_redis_index(hub.store)
        for kinds_id, record_id in zip(by_kinds, by_record, strict=True):
            kinds, record = _stored(hub, kinds_id), _stored(hub, record_id)
            assert kinds[:2] == record[:2]
            assert kinds[2].pop("iq-id") == kinds_id and record[2].pop("iq-id") == record_id
            assert kinds[2] == record[2]
        got = hub.queue("orders").get_many("a", 20).msg_ids
    # The claim order (priority, then put order) is the same for both.
    assert [i for i in got if i.startswith("k")] == ["k" + i[1:] for i in got if i.startswith("r")]
    assert len(got) == 14  # 7 revealed to "a" from each; the confirm=True ones wait


def test_a_put_whose_reply_is_lost_is_not_made_twice(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders", lease=60)
        q.subscribe("a")
        lost = _lose_one_reply(monkeypatch, hub.store._put)  # type: ignore[attr-defined]
        ids = q.put_many([b"1", b"2", b"3"])
        assert lost == ["reply"]
        assert int(hub.store.client.xlen(hub.adapter.key("orders"))) == 3  # type: ignore[attr-defined]
        batch = q.get_many("a", 10)
        assert batch.msg_ids == ids
        entries = hub.store.client.xrange(hub.adapter.key("orders"))  # type: ignore[attr-defined]
        assert [hub.store.load(i).native_ref for i in ids] == [ref for ref, _ in entries]
        check_redis_index(hub.store)


def test_holds_settled_where_held_are_read_in_one_call_when_they_move_on(url: str) -> None:
    """A batch in process (settled where the index lives: its holds know no record) whose
    work fails (``with batch:``: each delivery given back) reads its records in one call
    and commits its moves in one; so does a renewal of a batch's leases."""
    from iqbridge.testing.contract_batches import counting

    with iqbridge.connect(url) as hub:
        q = hub.queue("orders", lease=60)
        q.subscribe("a")
        ids = q.put_many([f"m{i}".encode() for i in range(20)])
        reads = ("load", "load_many", "commit", "commit_writes")
        renewed = q.get_many("a", 10)
        renewed.in_process()
        with counting(hub.store, reads) as calls:
            assert len(renewed.renew().lost) == 0
        assert (calls["load"], calls["load_many"], calls["commit"]) == (0, 1, 0)
        assert calls["commit_writes"] == 1
        renewed.done()
        failed = q.get_many("a", 10)
        with counting(hub.store, reads) as calls, pytest.raises(RuntimeError), failed:
            raise RuntimeError("the work failed")
        assert (calls["load"], calls["load_many"], calls["commit"]) == (0, 1, 0)
        assert calls["commit_writes"] == 1
        for msg_id in ids[10:]:
            member = q.state(msg_id).subscribers["a"]
            assert (member.state, member.attempt) == (S.AVAILABLE, 2)
        check_redis_index(hub.store)
