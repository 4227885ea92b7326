"""Adapter contract, batch consumption: ``get_many`` claims a batch in one index commit
after one broker read; a batch settles in one index commit and one acknowledgement per
group; ``put_many`` is one index commit and one broker call."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from iqbridge.batch import Batch
from iqbridge.errors import InvalidArgument
from iqbridge.hub import Hub
from iqbridge.model import Pool
from iqbridge.queue import Queue
from iqbridge.states import PublisherState, SubscriberState
from iqbridge.testing import FakeClock
from iqbridge.testing.contract_base import (
    LEASE,
    ContractBase,
    count_moves,
    sub_history,
    sub_state,
    take,
)

P = PublisherState
S = SubscriberState

#: Index writes: every method of a store that commits.
_COMMITS = ("commit", "commit_many", "commit_each", "commit_writes")
#: Index commits a store makes where it keeps the messages (a plan, no records).
_IN_PLACE = ("claim_ready", "claim_received", "settle_held", "settle_held_acking")
#: Broker reads: every adapter method that hands over or reads payloads.
_READS = ("receive", "receive_indexed", "read", "read_many")


@contextmanager
def counting(obj: object, names: tuple[str, ...]) -> Iterator[dict[str, int]]:
    """Count the outermost calls of ``obj``'s methods ``names`` (those it has) inside the
    block: a method calling another counted one (commit calling commit_many) counts once."""
    calls = dict.fromkeys(names, 0)
    depth = threading.local()
    own = vars(obj) if hasattr(obj, "__dict__") else {}
    saved: dict[str, Any] = {}
    for name in names:
        real = getattr(obj, name, None)
        if real is None:
            continue
        saved[name] = own.get(name)

        def counted(*args: Any, _name: str = name, _real: Any = real, **kw: Any) -> Any:
            level = getattr(depth, "n", 0)
            if level == 0:
                calls[_name] += 1
            depth.n = level + 1
            try:
                return _real(*args, **kw)
            finally:
                depth.n = level

        setattr(obj, name, counted)
    try:
        yield calls
    finally:
        for name, previous in saved.items():
            if previous is None:
                delattr(obj, name)
            else:
                setattr(obj, name, previous)


def grab(q: Queue, subscriber: str, max: int, **kw: Any) -> Batch:
    """A get_many that must deliver something."""
    batch = q.get_many(subscriber, max, **kw)
    assert batch, f"{subscriber!r} got nothing from {q.name!r}"
    return batch


class BatchTests(ContractBase):
    """get_many, Batch settlement, and the round trips of both."""

    # --- claiming ---------------------------------------------------------------------

    def test_get_many_claims_up_to_max_in_put_order(self, q: Queue) -> None:
        ids = q.put_many([f"m{i}".encode() for i in range(5)], to=["a"])
        first = grab(q, "a", 3)
        assert [d.msg_id for d in first] == ids[:3]
        assert [d.body for d in first] == [b"m0", b"m1", b"m2"]
        assert all(d.state is S.FETCHED and d.attempt == 1 for d in first)
        assert sub_history(q, ids[0], "a") == [S.AVAILABLE, S.GET, S.FETCHED]
        second = grab(q, "a", 10)
        assert second.msg_ids == ids[3:]
        empty = q.get_many("a", 10)
        assert not empty
        assert len(empty) == 0

    @pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3"])
    def test_get_many_refuses_a_bad_max(self, q: Queue, bad: Any) -> None:
        q.put(b"x", to=["a"])
        with pytest.raises(InvalidArgument):
            q.get_many("a", bad)
        assert take(q, "a").body == b"x"

    def test_get_many_holds_each_delivery_under_its_lease(self, q: Queue, clock: FakeClock) -> None:
        ids = q.put_many([b"1", b"2"], to=["a"])
        batch = grab(q, "a", 5, lease=10)
        clock.advance(11)
        again = grab(q, "a", 5)
        assert again.msg_ids == ids
        assert [d.attempt for d in again] == [2, 2]
        settled = batch.done()
        assert settled.done == []
        assert sorted(settled.lost) == sorted(ids)
        assert again.done().done == ids
        for msg_id in ids:
            assert count_moves(q.state(msg_id), "a", S.DONE) == 1

    def test_get_many_in_a_pool_gives_each_message_to_one_member(self, q: Queue) -> None:
        pool = Pool("workers", ["w1", "w2"])
        ids = q.put_many([b"1", b"2", b"3"], to=[pool])
        batch = grab(q, "w1", 10)
        assert batch.msg_ids == ids
        assert not q.get_many("w2", 10)
        for msg_id in ids:
            assert sub_state(q, msg_id, "w2") is S.JOURNALLED
        batch.done()
        assert all(q.state(i).publisher_state is P.JOURNALLED for i in ids)

    def test_get_many_in_pubsub_serves_each_subscriber_its_own_batch(self, q: Queue) -> None:
        ids = q.put_many([b"1", b"2"], to=["a", "b"])
        a = grab(q, "a", 10)
        b = grab(q, "b", 10)
        assert a.msg_ids == b.msg_ids == ids
        a.done()
        assert all(q.state(i).publisher_state is P.REVEALED for i in ids)
        b.done()
        assert all(q.state(i).publisher_state is P.JOURNALLED for i in ids)

    def test_concurrent_batches_of_a_pool_never_share_a_message(self, q: Queue) -> None:
        members = ["w1", "w2", "w3"]
        ids = q.put_many([str(i).encode() for i in range(60)], to=[Pool("p", members)])
        got: dict[str, list[str]] = {m: [] for m in members}

        def work(member: str) -> None:
            while True:
                batch = q.get_many(member, 7)
                if not batch:
                    return
                got[member].extend(batch.msg_ids)
                batch.done()

        threads = [threading.Thread(target=work, args=(m,)) for m in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        taken = [i for m in members for i in got[m]]
        assert sorted(taken) == sorted(ids)
        assert len(set(taken)) == len(taken)

    def test_get_many_waits_for_a_put_up_to_its_timeout(self, q: Queue) -> None:
        assert not q.get_many("a", 5, timeout=0.05)
        timer = threading.Timer(0.2, lambda: q.put(b"late", to=["a"]))
        timer.start()
        try:
            started = time.monotonic()
            batch = q.get_many("a", 5, timeout=10)
            assert time.monotonic() - started < 5
            assert [d.body for d in batch] == [b"late"]
        finally:
            timer.join()

    def test_get_many_takes_redeliveries_too(self, q: Queue) -> None:
        ids = q.put_many([b"1", b"2", b"3"], to=["a"])
        for d in grab(q, "a", 3):
            d.release()
        again = grab(q, "a", 3)
        assert sorted(again.msg_ids) == sorted(ids)
        assert sorted(d.body for d in again) == [b"1", b"2", b"3"]
        assert all(d.attempt == 2 for d in again)

    # --- settling ---------------------------------------------------------------------

    def test_batch_done_settles_every_delivery(self, q: Queue) -> None:
        ids = q.put_many([b"1", b"2", b"3"], to=["a"])
        batch = grab(q, "a", 3)
        settled = batch.done()
        assert (settled.done, settled.unusable, settled.released, settled.lost) == (
            ids,
            [],
            [],
            {},
        )
        assert all(d.state is S.JOURNALLED for d in batch)
        for msg_id in ids:
            assert sub_history(q, msg_id, "a")[-2:] == [S.DONE, S.JOURNALLED]
            assert q.state(msg_id).publisher_state is P.JOURNALLED
        assert q.get("a") is None

    def test_batch_settles_per_delivery_outcomes_together(self, q: Queue, clock: FakeClock) -> None:
        ids = q.put_many([b"ok", b"bad", b"later", b"ok2"], to=["a"])
        batch = grab(q, "a", 4)
        batch.unusable(batch[1], "poison")
        batch.release(batch[2], delay=5, reason="not yet")
        settled = batch.done()
        assert settled.done == [ids[0], ids[3]]
        assert settled.unusable == [ids[1]]
        assert settled.released == [ids[2]]
        bad = q.state(ids[1]).subscribers["a"]
        assert (bad.state, bad.reason) == (S.JOURNALLED, "poison")
        assert S.UNUSABLE in [s for s, _ in bad.history]
        later = q.state(ids[2]).subscribers["a"]
        assert (later.state, later.attempt, later.reason) == (S.AVAILABLE, 2, "not yet")
        assert q.get("a") is None  # the release delay runs
        clock.advance(6)
        d = take(q, "a")
        assert (d.msg_id, d.attempt, d.body) == (ids[2], 2, b"later")

    def test_a_delivery_moved_alone_is_left_alone_by_its_batch(self, q: Queue) -> None:
        ids = q.put_many([b"1", b"2", b"3"], to=["a"])
        batch = grab(q, "a", 3)
        batch[0].done()
        batch[1].unusable("bad")
        settled = batch.done()
        assert (settled.done, settled.unusable, settled.lost) == ([ids[2]], [], {})
        assert count_moves(q.state(ids[0]), "a", S.DONE) == 1
        assert count_moves(q.state(ids[1]), "a", S.DONE) == 0
        assert q.state(ids[1]).subscribers["a"].reason == "bad"
        assert batch.done().done == []  # settling twice moves nothing

    def test_an_outcome_for_a_stranger_is_refused(self, q: Queue) -> None:
        q.put_many([b"1", b"2"], to=["a", "b"])
        mine = grab(q, "a", 1)
        other = grab(q, "b", 1)
        with pytest.raises(InvalidArgument):
            mine.unusable(other[0], "not mine")
        with pytest.raises(InvalidArgument):
            mine.release(mine[0], delay=-1)
        assert mine.done().done == mine.msg_ids

    def test_batch_as_context_manager_is_in_process_then_done(self, q: Queue) -> None:
        ids = q.put_many([b"1", b"2"], to=["a"])
        with grab(q, "a", 2) as batch:
            assert all(d.state is S.IN_PROCESS for d in batch)
        for msg_id in ids:
            assert sub_history(q, msg_id, "a")[-4:] == [
                S.FETCHED,
                S.IN_PROCESS,
                S.DONE,
                S.JOURNALLED,
            ]

    def test_batch_context_manager_failure_follows_the_retry_policy(
        self, q: Queue, clock: FakeClock
    ) -> None:
        ids = q.put_many([b"1", b"2"], to=["a"])
        with pytest.raises(RuntimeError, match="boom"), grab(q, "a", 2) as batch:
            batch.unusable(batch[1], "given up by the handler")
            raise RuntimeError("boom")
        first = q.state(ids[0]).subscribers["a"]
        assert (first.state, first.attempt, first.reason) == (S.AVAILABLE, 2, "RuntimeError: boom")
        assert q.state(ids[1]).subscribers["a"].reason == "given up by the handler"
        assert q.get("a") is None  # the retry policy's first delay: 1 s
        clock.advance(1.5)
        assert take(q, "a").msg_id == ids[0]

    def test_batch_renew_extends_every_lease(self, q: Queue, clock: FakeClock) -> None:
        q.put_many([b"1", b"2"], to=["a"])
        batch = grab(q, "a", 2, lease=10)
        clock.advance(8)
        assert batch.renew(10).lost == {}
        clock.advance(8)
        assert q.get("a") is None  # still held: renewed at 8 s for 10 s
        assert batch.done().done == batch.msg_ids

    def test_batch_renew_within_extends_only_the_leases_running_out(
        self, q: Queue, clock: FakeClock
    ) -> None:
        """A heartbeat's renew: only the leases that run out within ``within`` seconds
        are extended; the others are left as they are (no write)."""
        q.put_many([b"1", b"2"], to=["a"])
        old = grab(q, "a", 1, lease=10)
        clock.advance(6)
        young = grab(q, "a", 1, lease=10)
        both = Batch(q, [*old, *young])
        before = young[0].lease_until
        assert before is not None and old[0].lease_until is not None
        assert old[0].lease_until < before
        renewed = both.renew(12, within=5)  # old: 4 s left; young: 10 s left
        assert renewed.lost == {}
        assert young[0].lease_until == before
        assert old[0].lease_until is not None and old[0].lease_until > before
        clock.advance(8)  # 14 s: old renewed at 6 s until 18 s; young held until 16 s
        assert q.get("a") is None
        assert both.done().done == both.msg_ids
        assert old[0].lease_until is None  # no longer held

    # --- round trips ------------------------------------------------------------------

    def _round_trips(self, hub: Hub, work: Callable[[], object]) -> tuple[int, int]:
        with (
            counting(hub.store, (*_COMMITS, *_IN_PLACE)) as commits,
            counting(
                hub.adapter, (*_READS, "send", "send_indexed", "settle_indexed", "ack")
            ) as broker,
        ):
            work()
        # A co-located adapter commits to the index in its own calls (its settle of held
        # messages through the store's, counted there).
        index_commits = sum(commits.values()) + sum(
            broker[name] for name in ("send_indexed", "settle_indexed")
        )
        return index_commits, sum(broker[name] for name in _READS)

    def test_put_many_is_one_index_commit_and_one_broker_call(self, hub: Hub, q: Queue) -> None:
        q.subscribe("a")  # declare first: the put then only puts
        with (
            counting(hub.store, (*_COMMITS, "set_native_ref", "set_native_refs")) as index,
            counting(hub.adapter, ("send", "send_indexed")) as broker,
        ):
            ids = q.put_many([str(i).encode() for i in range(50)], to=["a"])
        assert len(ids) == 50
        assert sum(index[name] for name in _COMMITS) + broker["send_indexed"] == 1
        assert broker["send"] + broker["send_indexed"] == 1
        assert index["set_native_ref"] == 0
        assert index["set_native_refs"] <= 1
        assert grab(q, "a", 100).msg_ids == ids

    def test_get_many_and_done_cost_one_commit_each(self, hub: Hub) -> None:
        q = self.open_queue(hub, sweep_interval=3600.0)  # no due-work sweep in the count
        q.subscribe("a")
        ids = q.put_many([str(i).encode() for i in range(40)], to=["a"])
        q.get_many("a", 1).done()  # the first get of a queue also sweeps
        batch: list[Batch] = []
        commits, reads = self._round_trips(hub, lambda: batch.append(q.get_many("a", 39)))
        assert batch[0].msg_ids == ids[1:]
        # With the index on the broker's server the read makes the claims itself (one
        # round trip, no commit of its own); else the read, then one commit.
        assert (commits, reads) == ((0 if hub.colocated is not None else 1), 1)
        with counting(hub.adapter, ("ack",)) as acks:
            commits, reads = self._round_trips(hub, batch[0].done)
        assert (commits, reads) == (1, 0)
        assert acks["ack"] <= 1
        for msg_id in ids:
            assert count_moves(q.state(msg_id), "a", S.DONE) == 1

    def test_redelivered_batch_is_one_commit(self, hub: Hub, clock: FakeClock) -> None:
        q = self.open_queue(hub, sweep_interval=3600.0)
        ids = q.put_many([str(i).encode() for i in range(10)], to=["a"])
        grab(q, "a", 10)
        clock.advance(LEASE + 1)
        q.recover()
        batch: list[Batch] = []
        commits, _ = self._round_trips(hub, lambda: batch.append(q.get_many("a", 10)))
        assert sorted(batch[0].msg_ids) == sorted(ids)
        assert all(d.attempt == 2 for d in batch[0])
        assert sorted(d.body for d in batch[0]) == sorted(str(i).encode() for i in range(10))
        assert commits == 1
