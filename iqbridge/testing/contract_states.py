"""Adapter contract, the state model: publisher and subscriber transitions, pubsub, pools,
combined audiences, confirm and undo of gets."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from iqbridge.errors import (
    AudienceError,
    IllegalTransition,
    InvalidArgument,
    LeaseLost,
)
from iqbridge.hub import Hub
from iqbridge.model import Pool, from_micros
from iqbridge.queue import Queue
from iqbridge.states import Mode, PublisherState, SubscriberState
from iqbridge.testing import FakeClock
from iqbridge.testing.contract_base import (
    LEASE,
    ContractBase,
    count_moves,
    current,
    pub_history,
    sub_history,
    sub_state,
    take,
)

P = PublisherState
S = SubscriberState


class StateModelTests(ContractBase):
    """Every transition of the state model, through the facade."""

    # --- publisher transitions -----------------------------------------------------------

    def test_put_reveals_at_once(self, hub: Hub, q: Queue, clock: FakeClock) -> None:
        msg_id = q.put(b"x", to=["a"])
        st = q.state(msg_id)
        assert st.publisher == hub.publisher
        assert st.mode is Mode.PUBSUB
        assert st.publisher_state is P.REVEALED
        assert pub_history(q, msg_id) == [P.PUT, P.REVEALED]
        assert sub_history(q, msg_id, "a") == [S.AVAILABLE]
        assert all(at == from_micros(int(clock.now * 1_000_000)) for _, at in st.publisher_history)

    def test_confirmed_put_is_hidden_until_confirm_put(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"], confirm=True)
        assert q.state(msg_id).publisher_state is P.PUT
        assert sub_state(q, msg_id, "a") is None
        assert q.get("a") is None
        q.confirm_put(msg_id)
        assert pub_history(q, msg_id) == [P.PUT, P.REVEALED]
        assert sub_state(q, msg_id, "a") is S.AVAILABLE
        assert take(q, "a").msg_id == msg_id

    def test_reveal_without_subscriber_confirms_a_put(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"], confirm=True)
        q.reveal(msg_id)
        assert q.state(msg_id).publisher_state is P.REVEALED
        assert take(q, "a").msg_id == msg_id

    def test_undo_of_unconfirmed_put_withdraws_it(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a", "b"], confirm=True)
        q.undo(msg_id)
        assert pub_history(q, msg_id) == [P.PUT, P.UNAVAILABLE, P.JOURNALLED]
        for sub in ("a", "b"):
            assert sub_history(q, msg_id, sub) == [S.EXPIRED, S.JOURNALLED]
            assert q.get(sub) is None

    def test_confirm_put_of_revealed_message_is_illegal(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        before = q.state(msg_id)
        with pytest.raises(IllegalTransition):
            q.confirm_put(msg_id)
        assert q.state(msg_id) == before

    def test_confirm_put_after_undo_is_illegal(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"], confirm=True)
        q.undo(msg_id)
        before = q.state(msg_id)
        with pytest.raises(IllegalTransition):
            q.confirm_put(msg_id)
        assert q.state(msg_id) == before
        assert q.get("a") is None

    def test_undo_of_revealed_put_is_illegal(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        before = q.state(msg_id)
        with pytest.raises(IllegalTransition):
            q.undo(msg_id)
        assert q.state(msg_id) == before

    def test_publisher_journalled_only_when_every_member_is(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a", "b"])
        take(q, "a").done()
        assert q.state(msg_id).publisher_state is P.REVEALED
        take(q, "b").done()
        assert pub_history(q, msg_id) == [P.PUT, P.REVEALED, P.JOURNALLED]

    def test_withdraw_expires_available_members_and_lets_holders_finish(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a", "b"])
        held = take(q, "a")
        held.in_process()
        q.withdraw(msg_id, reason="recalled")
        st = q.state(msg_id)
        assert st.publisher_state is P.UNAVAILABLE
        assert sub_history(q, msg_id, "b") == [S.AVAILABLE, S.EXPIRED, S.JOURNALLED]
        assert st.subscribers["b"].reason == "recalled"
        assert st.subscribers["a"].state is S.IN_PROCESS
        assert q.get("b") is None
        held.done()
        assert sub_state(q, msg_id, "a") is S.JOURNALLED
        assert pub_history(q, msg_id) == [P.PUT, P.REVEALED, P.UNAVAILABLE, P.JOURNALLED]

    def test_release_after_withdraw_expires_the_member(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        held = take(q, "a")
        q.withdraw(msg_id)
        held.release()
        assert sub_history(q, msg_id, "a")[-3:] == [S.AVAILABLE, S.EXPIRED, S.JOURNALLED]
        assert q.get("a") is None
        assert q.state(msg_id).publisher_state is P.JOURNALLED

    def test_withdraw_twice_is_illegal(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        q.withdraw(msg_id)
        before = q.state(msg_id)
        with pytest.raises(IllegalTransition):
            q.withdraw(msg_id)
        assert q.state(msg_id) == before

    def test_unconfirmed_put_past_its_ttl_is_withdrawn(self, q: Queue, clock: FakeClock) -> None:
        msg_id = q.put(b"x", to=["a"], confirm=True, ttl=5)
        clock.advance(6)
        q.recover()
        assert pub_history(q, msg_id) == [P.PUT, P.UNAVAILABLE, P.JOURNALLED]
        assert sub_history(q, msg_id, "a") == [S.EXPIRED, S.JOURNALLED]
        with pytest.raises(IllegalTransition):
            q.confirm_put(msg_id)

    # --- subscriber transitions ----------------------------------------------------------

    def test_get_moves_available_get_fetched(self, q: Queue, clock: FakeClock) -> None:
        msg_id = q.put(b"x", to=["a"])
        d = take(q, "a")
        assert (d.msg_id, d.subscriber, d.attempt, d.state) == (msg_id, "a", 1, S.FETCHED)
        assert sub_history(q, msg_id, "a") == [S.AVAILABLE, S.GET, S.FETCHED]
        view = q.state(msg_id).subscribers["a"]
        assert view.lease_owner is not None and "a" in view.lease_owner
        assert view.lease_until == from_micros(int((clock.now + LEASE) * 1_000_000))

    def test_in_process_then_done_then_journalled(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        d = take(q, "a")
        d.in_process()
        assert d.state is S.IN_PROCESS
        d.done()
        assert current(d) is S.JOURNALLED
        assert sub_history(q, msg_id, "a") == [
            S.AVAILABLE,
            S.GET,
            S.FETCHED,
            S.IN_PROCESS,
            S.DONE,
            S.JOURNALLED,
        ]
        assert q.get("a") is None

    def test_done_straight_from_fetched(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        take(q, "a").done()
        assert sub_history(q, msg_id, "a")[2:] == [S.FETCHED, S.DONE, S.JOURNALLED]

    def test_unusable_from_fetched_keeps_the_reason(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        take(q, "a").unusable("bad input")
        view = q.state(msg_id).subscribers["a"]
        assert [s for s, _ in view.history][2:] == [S.FETCHED, S.UNUSABLE, S.JOURNALLED]
        assert view.reason == "bad input"
        assert q.get("a") is None

    def test_unusable_from_in_process(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        d = take(q, "a")
        d.in_process()
        d.unusable("crashed")
        assert sub_history(q, msg_id, "a")[3:] == [S.IN_PROCESS, S.UNUSABLE, S.JOURNALLED]

    def test_release_makes_it_available_with_attempt_plus_one(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        d = take(q, "a")
        d.in_process()
        d.release(reason="not now")
        view = q.state(msg_id).subscribers["a"]
        assert (view.state, view.attempt, view.reason) == (S.AVAILABLE, 2, "not now")
        again = take(q, "a")
        assert (again.msg_id, again.attempt) == (msg_id, 2)

    def test_release_with_delay_hides_it_until_the_delay_passed(
        self, q: Queue, clock: FakeClock
    ) -> None:
        msg_id = q.put(b"x", to=["a"])
        take(q, "a").release(delay=10)
        assert q.get("a") is None
        clock.advance(11)
        assert take(q, "a").msg_id == msg_id

    def test_without_auto_journal_outcomes_stay_until_journalled(self, hub: Hub) -> None:
        q = self.open_queue(hub, auto_journal=False)
        ok, bad = q.put_many([b"1", b"2"], to=["a"])
        take(q, "a").done()
        take(q, "a").unusable("poison")
        assert sub_state(q, ok, "a") is S.DONE
        assert sub_state(q, bad, "a") is S.UNUSABLE
        assert q.state(ok).publisher_state is P.REVEALED
        q.reveal(bad, to="a")  # UNUSABLE -> AVAILABLE directly
        assert sub_history(q, bad, "a")[-2:] == [S.UNUSABLE, S.AVAILABLE]
        assert take(q, "a").msg_id == bad

    @pytest.mark.parametrize("move", ["done", "in_process", "release", "unusable"])
    def test_moves_after_done_are_illegal_and_change_nothing(self, q: Queue, move: str) -> None:
        msg_id = q.put(b"x", to=["a"])
        d = take(q, "a")
        d.done()
        before = q.state(msg_id)
        call: Callable[[], None] = {
            "done": d.done,
            "in_process": d.in_process,
            "release": d.release,
            "unusable": lambda: d.unusable("late"),
        }[move]
        with pytest.raises(IllegalTransition):
            call()
        assert q.state(msg_id) == before

    def test_in_process_twice_is_illegal(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        d = take(q, "a")
        d.in_process()
        before = q.state(msg_id)
        with pytest.raises(IllegalTransition):
            d.in_process()
        assert q.state(msg_id) == before

    def test_get_by_a_subscriber_outside_the_audience_finds_nothing(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        assert q.get("stranger") is None
        assert set(q.state(msg_id).subscribers) == {"a"}
        with pytest.raises(AudienceError):
            q.reveal(msg_id, to="stranger")

    def test_lost_payload_makes_the_member_unusable(self, hub: Hub, q: Queue) -> None:
        if q.retain:
            pytest.skip("the queue keeps a copy of every payload (contract_retention)")
        msg_id = q.put(b"x", to=["a"])
        take(q, "a").release()
        ref = hub.store.load(msg_id).native_ref
        assert ref is not None
        hub.adapter.delete(q.name, [ref])
        if hub.adapter.read(q.name, ref) is not None:
            pytest.skip("the broker cannot delete single entries")
        assert q.get("a") is None
        view = q.state(msg_id).subscribers["a"]
        assert [s for s, _ in view.history][-3:] == [S.GET, S.UNUSABLE, S.JOURNALLED]
        assert view.reason == "payload missing on the broker"

    # --- pubsub ---------------------------------------------------------------------------

    def test_pubsub_every_subscriber_gets_it_once(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a", "b"])
        for sub in ("a", "b"):
            d = take(q, sub)
            assert d.msg_id == msg_id
            d.done()
            assert q.get(sub) is None
        assert q.state(msg_id).publisher_state is P.JOURNALLED

    def test_one_subscriber_failing_leaves_the_others_alone(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a", "b"])
        take(q, "a").unusable("no")
        assert sub_history(q, msg_id, "b") == [S.AVAILABLE]
        take(q, "b").done()
        st = q.state(msg_id)
        assert st.subscribers["a"].reason == "no"
        assert st.publisher_state is P.JOURNALLED

    def test_standing_subscribers_are_the_default_audience(self, q: Queue) -> None:
        q.subscribe("a", "b")
        msg_id = q.put(b"x")
        assert set(q.state(msg_id).subscribers) == {"a", "b"}
        assert take(q, "a").msg_id == msg_id
        assert take(q, "b").msg_id == msg_id
        q.unsubscribe("b")
        later = q.put(b"y")
        assert set(q.state(later).subscribers) == {"a"}
        assert q.get("b") is None

    def test_put_without_any_audience_is_refused(self, q: Queue) -> None:
        with pytest.raises(AudienceError):
            q.put(b"x")
        assert q.search() == []

    # --- pool -----------------------------------------------------------------------------

    def test_pool_first_get_owns_it_and_the_others_expire(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=Pool("workers", ["w1", "w2", "w3"]))
        assert q.state(msg_id).mode is Mode.POOL
        d = take(q, "w2")
        st = q.state(msg_id)
        assert st.subscribers["w2"].state is S.FETCHED
        for other in ("w1", "w3"):
            assert sub_history(q, msg_id, other) == [S.AVAILABLE, S.EXPIRED, S.JOURNALLED]
            assert st.subscribers[other].reason == "pool taken by w2"
            assert q.get(other) is None
        d.done()
        assert q.state(msg_id).publisher_state is P.JOURNALLED

    def test_pool_members_share_the_load(self, q: Queue) -> None:
        q.subscribe_pool("workers", ["w1", "w2"])
        ids = q.put_many([b"1", b"2", b"3", b"4"])
        owners: dict[str, str] = {}
        for sub in ("w1", "w2", "w1", "w2"):
            d = take(q, sub)
            assert d.msg_id not in owners
            owners[d.msg_id] = sub
            d.done()
        assert q.get("w1") is None and q.get("w2") is None
        assert sorted(owners) == sorted(ids)
        for msg_id, owner in owners.items():
            st = q.state(msg_id)
            assert count_moves(st, owner, S.DONE) == 1
            assert sum(count_moves(st, s, S.DONE) for s in ("w1", "w2")) == 1

    def test_pool_reopens_after_release(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=Pool("workers", ["w1", "w2"]))
        take(q, "w1").release(reason="busy")
        st = q.state(msg_id)
        for sub in ("w1", "w2"):
            assert (st.subscribers[sub].state, st.subscribers[sub].attempt) == (S.AVAILABLE, 2)
        assert sub_history(q, msg_id, "w2") == [S.AVAILABLE, S.EXPIRED, S.JOURNALLED, S.AVAILABLE]
        d = take(q, "w2")
        assert (d.msg_id, d.attempt) == (msg_id, 2)
        assert sub_state(q, msg_id, "w1") is S.JOURNALLED
        assert q.state(msg_id).subscribers["w1"].reason == "pool taken by w2"

    def test_pool_reopens_after_lease_expiry(self, q: Queue, clock: FakeClock) -> None:
        msg_id = q.put(b"x", to=Pool("workers", ["w1", "w2"]))
        stale = take(q, "w1")
        clock.advance(LEASE + 1)
        assert q.recover() == 1
        st = q.state(msg_id)
        assert {n: (v.state, v.attempt) for n, v in st.subscribers.items()} == {
            "w1": (S.AVAILABLE, 2),
            "w2": (S.AVAILABLE, 2),
        }
        fresh = take(q, "w2")
        before = q.state(msg_id)
        with pytest.raises(LeaseLost):
            stale.done()
        assert q.state(msg_id) == before
        fresh.done()
        assert q.state(msg_id).publisher_state is P.JOURNALLED

    def test_pool_reopens_after_undo_of_a_held_get(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=Pool("workers", ["w1", "w2"]))
        held = take(q, "w1", confirm=True)
        q.undo(held.confirm_id)
        assert {v.state for v in q.state(msg_id).subscribers.values()} == {S.AVAILABLE}
        assert take(q, "w2").msg_id == msg_id

    def test_declared_pool_by_name_and_as_standing_audience(self, q: Queue) -> None:
        q.subscribe_pool("workers", ["w1", "w2"])
        by_name = q.put(b"x", to="workers")
        standing = q.put(b"y")
        for msg_id in (by_name, standing):
            st = q.state(msg_id)
            assert st.mode is Mode.POOL
            assert {v.pool for v in st.subscribers.values()} == {"workers"}
        with pytest.raises(AudienceError):
            q.put(b"z", to=Pool("workers", ["w1", "w9"]))

    def test_concurrent_pool_gets_never_share_a_message(self, q: Queue) -> None:
        ids = q.put_many([str(i) for i in range(24)], to=Pool("workers", ["w1", "w2", "w3"]))
        got: dict[str, list[str]] = {"w1": [], "w2": [], "w3": []}
        errors: list[BaseException] = []

        def work(sub: str) -> None:
            try:
                while (d := q.get(sub)) is not None:
                    got[sub].append(d.msg_id)
                    d.done()
            except BaseException as exc:  # surfaced by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(s,)) for s in got]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        owned = [m for ms in got.values() for m in ms]
        assert sorted(owned) == sorted(ids)
        for msg_id in ids:
            assert sum(count_moves(q.state(msg_id), s, S.DONE) for s in got) == 1

    # --- combined -------------------------------------------------------------------------

    def test_combined_pool_of_two_plus_two_named(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=[Pool("p", ["s0", "s1"]), "s2", "s3"])
        assert q.state(msg_id).mode is Mode.COMBINED
        for sub in ("s1", "s2", "s3"):
            take(q, sub).done()
        assert q.get("s0") is None
        st = q.state(msg_id)
        assert st.subscribers["s0"].reason == "pool taken by s1"
        assert [count_moves(st, s, S.DONE) for s in ("s0", "s1", "s2", "s3")] == [0, 1, 1, 1]
        assert st.publisher_state is P.JOURNALLED

    def test_combined_standing_audience(self, q: Queue) -> None:
        q.subscribe("s2", "s3")
        q.subscribe_pool("p", ["s0", "s1"])
        msg_id = q.put(b"x")
        assert q.state(msg_id).mode is Mode.COMBINED
        take(q, "s0").done()
        assert q.get("s1") is None
        take(q, "s2").done()
        take(q, "s3").done()
        assert q.state(msg_id).publisher_state is P.JOURNALLED

    # --- confirm get / undo ---------------------------------------------------------------

    def test_held_get_waits_for_confirm_get(self, q: Queue, clock: FakeClock) -> None:
        msg_id = q.put(b"x", to=["a"])
        d = take(q, "a", confirm=True)
        assert q.state(msg_id).subscribers["a"].lease_until is None
        clock.advance(10 * LEASE)
        q.recover()
        assert sub_state(q, msg_id, "a") is S.FETCHED
        q.confirm_get(d.confirm_id)
        assert sub_history(q, msg_id, "a")[-2:] == [S.DONE, S.JOURNALLED]
        assert q.get("a") is None

    def test_undo_of_a_held_get(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        d = take(q, "a", confirm=True)
        q.undo(d.confirm_id)
        view = q.state(msg_id).subscribers["a"]
        assert (view.state, view.attempt, view.reason) == (S.AVAILABLE, 2, "undo")
        before = q.state(msg_id)
        with pytest.raises(LeaseLost):
            q.confirm_get(d.confirm_id)
        assert q.state(msg_id) == before
        assert take(q, "a").attempt == 2

    def test_confirm_get_twice_is_illegal(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        d = take(q, "a", confirm=True)
        q.confirm_get(d.confirm_id)
        before = q.state(msg_id)
        with pytest.raises(IllegalTransition):
            q.confirm_get(d.confirm_id)
        assert q.state(msg_id) == before

    def test_held_get_with_a_lease_returns_when_it_lapses(self, q: Queue, clock: FakeClock) -> None:
        msg_id = q.put(b"x", to=["a"])
        d = take(q, "a", confirm=True, lease=5)
        clock.advance(6)
        q.recover()
        assert sub_state(q, msg_id, "a") is S.AVAILABLE
        with pytest.raises(LeaseLost):
            q.confirm_get(d.confirm_id)

    @pytest.mark.parametrize("bad", ["nonsense", "a/b", "a//c"])
    def test_malformed_confirm_id_is_refused(self, q: Queue, bad: str) -> None:
        with pytest.raises(InvalidArgument):
            q.confirm_get(bad)
