"""The shared contract every broker adapter passes, run through the public facade.

Subclass :class:`AdapterContract` in a test module (its name must start with ``Test``)
and implement :meth:`AdapterContract.make_hub`; pytest then runs every test below
against your adapter::

    import iqbridge
    from iqbridge.testing.adapter_contract import AdapterContract

    class TestRedisAdapter(AdapterContract):
        def make_hub(self, clock):
            # A fresh, isolated broker and index for every test: a new database
            # number, key prefix, vhost or temporary file, as the broker allows.
            return iqbridge.connect(REDIS_URL, index=INDEX_URL, clock=clock)

        def force_redelivery(self, hub, queue, msg_id, subscriber):
            ...  # make the broker hand msg_id to the subscriber's group again

Hooks:

* :meth:`~AdapterContract.make_hub` (required): a new :class:`~iqbridge.Hub` whose clock
  is ``clock``. The suite closes it after the test. Every lease, ttl, lock and retry
  delay is driven by that clock, so no test sleeps for them.
* :meth:`~AdapterContract.force_redelivery` (optional): make the broker deliver an
  already-delivered message to a subscriber again (a consumer crash before the ack, a
  network retry). Brokers with native consumer groups must override it; for
  index-driven adapters (the index is the queue) the default hands the stored entry to
  the facade the way a broker redelivery arrives. If the broker truly cannot redeliver,
  skip with the reason (``pytest.skip(...)``).

Fixtures a subclass can use or override: ``clock`` (a :class:`~iqbridge.testing.FakeClock`),
``hub`` and ``q`` (a queue with a unique name, lease 30 s, 3 attempts, 1 s initial retry
delay, and the due-work sweep run on every get). Tests that depend on a capability the
broker lacks (see :class:`~iqbridge.adapter.Capabilities`) skip with the reason.
"""

from __future__ import annotations

import abc
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from iqbridge.delivery import Delivery
from iqbridge.errors import (
    AudienceError,
    IllegalTransition,
    InvalidArgument,
    LeaseLost,
    MessageNotFound,
    MessageTooLarge,
    PayloadError,
    UnknownQueueError,
)
from iqbridge.hub import Hub
from iqbridge.model import Filter, MessageState, Pool, Received, from_micros
from iqbridge.queue import Queue
from iqbridge.retry import RetryPolicy
from iqbridge.states import Mode, PublisherState, SubscriberState
from iqbridge.testing import FakeClock

__all__ = ["AdapterContract"]

P = PublisherState
S = SubscriberState

#: The lease of the ``q`` fixture's queue, in seconds.
LEASE = 30.0


def unique(prefix: str = "cq") -> str:
    """A queue name no other test uses (brokers shared between tests stay apart)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def take(q: Queue, subscriber: str, **kw: Any) -> Delivery:
    """A get that must deliver something."""
    d = q.get(subscriber, **kw)
    assert d is not None, f"{subscriber!r} got nothing from {q.name!r}"
    return d


def sub_state(q: Queue, msg_id: str, subscriber: str) -> SubscriberState | None:
    """One subscriber's current state."""
    return q.state(msg_id).subscribers[subscriber].state


def sub_history(q: Queue, msg_id: str, subscriber: str) -> list[SubscriberState]:
    """One subscriber's states, oldest first."""
    return [s for s, _ in q.state(msg_id).subscribers[subscriber].history]


def pub_history(q: Queue, msg_id: str) -> list[PublisherState]:
    """The publisher's states, oldest first."""
    return [s for s, _ in q.state(msg_id).publisher_history]


def current(delivery: Delivery) -> SubscriberState:
    """The state a delivery says it is in (read anew after each move)."""
    return delivery.state


def count_moves(state: MessageState, subscriber: str, dst: SubscriberState) -> int:
    """How often the journal records ``subscriber`` moving to ``dst``."""
    return sum(1 for e in state.journal if e.actor == subscriber and e.dst == dst.value)


class AdapterContract(abc.ABC):
    """Facade-level behaviour every adapter shares; see the module docstring to subclass."""

    # --- hooks -------------------------------------------------------------------------

    @abc.abstractmethod
    def make_hub(self, clock: Callable[[], float]) -> Hub:
        """A fresh hub (broker plus index) with nothing from other tests in it."""

    def force_redelivery(self, hub: Hub, queue: Queue, msg_id: str, subscriber: str) -> None:
        """Make the broker hand ``msg_id`` to ``subscriber`` again after it was delivered.

        The default serves index-driven adapters, where the index is the queue and no
        broker redelivers: it hands the stored entry to the facade the way a broker
        redelivery arrives (``Queue._accept``, which resolves every broker delivery
        against the index) and fails the test if the facade turns it into a delivery.
        """
        if hub.adapter.capabilities.native_groups:
            pytest.skip(
                f"{type(self).__name__} must override force_redelivery() to make its "
                f"broker redeliver a message"
            )
        rec = hub.store.load(msg_id)
        assert rec.native_ref is not None, f"message {msg_id} has no native reference"
        env = hub.adapter.read(queue.name, rec.native_ref)
        assert env is not None, f"the broker lost the payload of {msg_id}"
        now = hub.now_us()
        member = rec.members[subscriber]
        received = Received(rec.native_ref, member.pool or subscriber, env, delivery_count=2)
        owner = f"{subscriber}@{hub.client_id}"
        dup = queue._accept(received, subscriber, now, owner, now + int(queue.lease * 1e6))
        if dup is not None:
            pytest.fail(f"the facade handed {msg_id} to {subscriber!r} again on redelivery")

    # --- fixtures ----------------------------------------------------------------------

    @pytest.fixture
    def clock(self) -> FakeClock:
        """The hub's clock; advance it to run leases, ttl and locks out."""
        return FakeClock()

    @pytest.fixture
    def hub(self, clock: FakeClock) -> Iterator[Hub]:
        """A fresh hub from :meth:`make_hub`, closed after the test."""
        hub = self.make_hub(clock)
        try:
            yield hub
        finally:
            hub.close()

    @pytest.fixture
    def q(self, hub: Hub) -> Queue:
        """A new queue: lease 30 s, 3 attempts, 1 s then 2 s retry delays."""
        return self.open_queue(hub)

    def open_queue(self, hub: Hub, **options: Any) -> Queue:
        """A queue with a unique name and the suite's defaults, overridable by ``options``."""
        opts: dict[str, Any] = {
            "retry": RetryPolicy(max_attempts=3, initial_delay=1.0, multiplier=2.0),
            "lease": LEASE,
            "sweep_interval": 0.0,
        }
        opts.update(options)
        return hub.queue(unique(), **opts)

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

    # --- browse with lock -----------------------------------------------------------------

    def test_browse_without_lock_changes_nothing(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"], correlation_id="c1")
        before = q.state(msg_id)
        found = q.browse(correlation_id="c1")
        assert [m.msg_id for m in found.messages] == [msg_id]
        assert found.lock_id is None
        assert q.state(msg_id) == before
        assert take(q, "a").msg_id == msg_id

    def test_browse_lock_hides_from_other_gets(self, q: Queue) -> None:
        locked_id = q.put(b"x", to=["a"], priority=9)
        free_id = q.put(b"y", to=["a"], priority=1)
        found = q.browse(priority=9, lock=True, owner="auditor")
        assert found.lock_id is not None
        assert [m.msg_id for m in found.messages] == [locked_id]
        assert take(q, "a").msg_id == free_id
        assert q.get("a") is None
        assert q.get("a", lock_id="some-other-lock") is None
        d = take(q, "a", lock_id=found.lock_id)
        assert d.msg_id == locked_id
        assert q.search(lock_id=found.lock_id) == []

    def test_get_under_a_lock_frees_the_message_for_the_others(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a", "b"])
        found = q.browse(lock=True)
        assert found.lock_id is not None
        assert q.get("a") is None
        assert take(q, "b", lock_id=found.lock_id).msg_id == msg_id
        assert take(q, "a").msg_id == msg_id

    def test_unlock_makes_it_visible_again(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        found = q.browse(lock=True)
        assert found.lock_id is not None
        assert q.get("a") is None
        assert q.unlock(found.lock_id) == 1
        assert take(q, "a").msg_id == msg_id

    def test_lock_lapses_after_lock_for(self, q: Queue, clock: FakeClock) -> None:
        msg_id = q.put(b"x", to=["a"])
        found = q.browse(lock=True, lock_for=10)
        assert q.get("a") is None
        clock.advance(11)
        assert take(q, "a").msg_id == msg_id
        assert found.lock_id is not None
        assert q.search(lock_id=found.lock_id) == []

    def test_locking_browse_skips_messages_locked_by_someone_else(self, q: Queue) -> None:
        first = q.put(b"x", to=["a"])
        mine = q.browse(lock=True, owner="one")
        second = q.put(b"y", to=["a"])
        theirs = q.browse(lock=True, owner="two")
        assert [m.msg_id for m in mine.messages] == [first]
        assert [m.msg_id for m in theirs.messages] == [second]
        assert mine.lock_id is not None and theirs.lock_id is not None
        assert take(q, "a", lock_id=theirs.lock_id).msg_id == second
        assert q.get("a", lock_id=theirs.lock_id) is None

    # --- search ---------------------------------------------------------------------------

    def test_search_by_msg_id(self, q: Queue) -> None:
        ids = q.put_many([b"1", b"2"], to=["a"])
        hits = q.search(msg_id=ids[1])
        assert [h.msg_id for h in hits] == [ids[1]]
        assert hits[0].subscribers == {"a": S.AVAILABLE}
        assert q.search(msg_id="no-such-id") == []

    def test_search_by_correlation_id(self, q: Queue) -> None:
        one = q.put(b"1", to=["a"], correlation_id="order-1")
        q.put(b"2", to=["a"], correlation_id="order-2")
        q.put(b"3", to=["a"])
        hits = q.search(Filter(correlation_id="order-1"))
        assert [(h.msg_id, h.correlation_id) for h in hits] == [(one, "order-1")]

    def test_search_by_priority_exact_and_range(self, q: Queue) -> None:
        by_prio = {p: q.put(b"x", to=["a"], priority=p) for p in (0, 3, 5, 9)}
        assert [h.msg_id for h in q.search(priority=5)] == [by_prio[5]]
        hits = q.search(priority=(3, 5))
        assert [h.msg_id for h in hits] == [by_prio[3], by_prio[5]]
        assert [h.priority for h in hits] == [3, 5]

    def test_search_by_publisher(self, q: Queue) -> None:
        alice = q.put(b"1", to=["a"], publisher="alice")
        q.put(b"2", to=["a"], publisher="bob")
        hits = q.search(publisher="alice")
        assert [(h.msg_id, h.publisher) for h in hits] == [(alice, "alice")]

    def test_search_by_publisher_state(self, q: Queue) -> None:
        pending = q.put(b"1", to=["a"], confirm=True)
        revealed = q.put(b"2", to=["a"])
        assert [h.msg_id for h in q.search(state=P.PUT)] == [pending]
        assert [h.msg_id for h in q.search(state=P.REVEALED)] == [revealed]
        assert q.search(state=P.JOURNALLED) == []

    def test_search_by_subscriber_state(self, q: Queue) -> None:
        first, second = q.put_many([b"1", b"2"], to=["a", "b"])
        take(q, "a").done()
        assert [h.msg_id for h in q.search(state=S.JOURNALLED)] == [first]
        assert [h.msg_id for h in q.search(state=S.AVAILABLE, subscriber="a")] == [second]
        hits = q.search(state=S.AVAILABLE, subscriber="b")
        assert [h.msg_id for h in hits] == [first, second]
        assert q.search(state=S.JOURNALLED, subscriber="b") == []

    def test_search_by_time_range(self, q: Queue, clock: FakeClock) -> None:
        early = q.put(b"1", to=["a"])
        clock.advance(10)
        mark = from_micros(int(clock.now * 1_000_000))
        middle = q.put(b"2", to=["a"])
        clock.advance(10)
        late = q.put(b"3", to=["a"])
        assert [h.msg_id for h in q.search(since=mark)] == [middle, late]
        assert [h.msg_id for h in q.search(until=mark)] == [early]
        window = q.search(since=mark, until=mark + timedelta(seconds=5))
        assert [h.msg_id for h in window] == [middle]
        assert window[0].created_at == mark

    def test_search_returns_put_order_up_to_the_limit(self, q: Queue) -> None:
        ids = q.put_many([b"1", b"2", b"3", b"4"], to=["a"])
        assert [h.msg_id for h in q.search()] == ids
        assert [h.msg_id for h in q.search(limit=2)] == ids[:2]
        with pytest.raises(InvalidArgument):
            q.search(Filter(), limit=2)

    # --- leases and attempts --------------------------------------------------------------

    def test_lease_expiry_returns_it_with_attempt_plus_one(
        self, q: Queue, clock: FakeClock
    ) -> None:
        msg_id = q.put(b"x", to=["a"])
        take(q, "a").in_process()
        clock.advance(LEASE - 1)
        assert q.recover() == 0
        clock.advance(2)
        assert q.recover() == 1
        view = q.state(msg_id).subscribers["a"]
        assert (view.state, view.attempt) == (S.AVAILABLE, 2)
        assert view.reason is not None and "expired" in view.reason
        assert take(q, "a").attempt == 2

    def test_get_applies_lapsed_leases_by_itself(self, q: Queue, clock: FakeClock) -> None:
        msg_id = q.put(b"x", to=["a"])
        take(q, "a")
        clock.advance(LEASE + 1)
        d = take(q, "a")
        assert (d.msg_id, d.attempt) == (msg_id, 2)

    def test_lease_expiry_after_max_attempts_is_unusable(self, q: Queue, clock: FakeClock) -> None:
        msg_id = q.put(b"x", to=["a"])
        for attempt in (1, 2, 3):
            assert take(q, "a").attempt == attempt
            clock.advance(LEASE + 1)
            q.recover()
        view = q.state(msg_id).subscribers["a"]
        assert view.state is S.JOURNALLED
        assert sub_history(q, msg_id, "a")[-2:] == [S.UNUSABLE, S.JOURNALLED]
        assert view.reason == "lease expired on attempt 3 of 3"
        assert q.get("a") is None
        assert q.state(msg_id).publisher_state is P.JOURNALLED

    def test_renew_extends_the_lease(self, q: Queue, clock: FakeClock) -> None:
        msg_id = q.put(b"x", to=["a"])
        d = take(q, "a")
        clock.advance(LEASE - 1)
        d.renew(LEASE)
        clock.advance(LEASE - 1)
        q.recover()
        assert sub_state(q, msg_id, "a") is S.FETCHED
        d.done()
        assert sub_state(q, msg_id, "a") is S.JOURNALLED

    def test_stale_delivery_cannot_move_a_message_it_lost(self, q: Queue, clock: FakeClock) -> None:
        msg_id = q.put(b"x", to=["a"])
        stale = take(q, "a")
        clock.advance(LEASE + 1)
        fresh = take(q, "a")
        before = q.state(msg_id)
        for move in (stale.done, stale.in_process, stale.release, stale.renew):
            with pytest.raises(LeaseLost):
                move()
        assert q.state(msg_id) == before
        fresh.done()
        assert count_moves(q.state(msg_id), "a", S.DONE) == 1

    # --- once-only ------------------------------------------------------------------------

    def test_redelivery_of_a_done_message_is_not_processed(self, hub: Hub, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        take(q, "a").done()
        self.force_redelivery(hub, q, msg_id, "a")
        assert q.get("a") is None
        st = q.state(msg_id)
        assert count_moves(st, "a", S.DONE) == 1
        assert st.subscribers["a"].state is S.JOURNALLED

    def test_redelivery_is_skipped_for_the_next_message(self, hub: Hub, q: Queue) -> None:
        first, second = q.put_many([b"1", b"2"], to=["a"])
        take(q, "a").done()
        self.force_redelivery(hub, q, first, "a")
        d = take(q, "a")
        assert d.msg_id == second
        d.done()
        assert q.get("a") is None
        assert count_moves(q.state(first), "a", S.DONE) == 1

    def test_redelivery_to_a_pool_is_not_processed(self, hub: Hub, q: Queue) -> None:
        msg_id = q.put(b"x", to=Pool("workers", ["w1", "w2"]))
        take(q, "w1").done()
        for sub in ("w1", "w2"):
            self.force_redelivery(hub, q, msg_id, sub)
            assert q.get(sub) is None
        st = q.state(msg_id)
        assert [count_moves(st, s, S.DONE) for s in ("w1", "w2")] == [1, 0]

    def test_redelivery_of_an_unusable_message_is_not_processed(self, hub: Hub, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        take(q, "a").unusable("poison")
        self.force_redelivery(hub, q, msg_id, "a")
        assert q.get("a") is None
        assert count_moves(q.state(msg_id), "a", S.GET) == 1

    def test_redelivery_of_done_but_not_journalled_is_not_processed(self, hub: Hub) -> None:
        q = self.open_queue(hub, auto_journal=False)
        msg_id = q.put(b"x", to=["a"])
        take(q, "a").done()
        self.force_redelivery(hub, q, msg_id, "a")
        assert q.get("a") is None
        assert sub_state(q, msg_id, "a") is S.DONE
        assert count_moves(q.state(msg_id), "a", S.DONE) == 1

    # --- ordering -------------------------------------------------------------------------

    def test_same_priority_is_delivered_in_put_order(self, q: Queue) -> None:
        ids = [q.put(str(i), to=["a"]) for i in range(6)]
        got = []
        while (d := q.get("a")) is not None:
            got.append(d.msg_id)
            d.done()
        assert got == ids

    def test_higher_priority_is_delivered_first(self, hub: Hub, q: Queue) -> None:
        caps = hub.adapter.capabilities
        if caps.native_groups and not caps.native_priority:
            pytest.skip("the broker delivers in log order (Capabilities.native_priority=False)")
        puts = [(p, q.put(b"x", to=["a"], priority=p)) for p in (1, 9, 4, 9, 0, 4)]
        got = []
        while (d := q.get("a")) is not None:
            got.append(d.msg_id)
            d.done()
        expected = [m for _, m in sorted(puts, key=lambda pm: -pm[0])]  # stable: put order
        assert got == expected

    # --- time limits (ttl) ----------------------------------------------------------------

    def test_ttl_expires_members_that_did_not_get_it(self, q: Queue, clock: FakeClock) -> None:
        msg_id = q.put(b"x", to=["a", "b"], ttl=timedelta(seconds=5))
        take(q, "a").done()
        clock.advance(6)
        assert q.get("b") is None
        st = q.state(msg_id)
        assert sub_history(q, msg_id, "b") == [S.AVAILABLE, S.EXPIRED, S.JOURNALLED]
        assert st.subscribers["b"].reason == "time limit passed"
        assert st.publisher_state is P.JOURNALLED

    def test_ttl_lets_a_holder_finish(self, q: Queue, clock: FakeClock) -> None:
        msg_id = q.put(b"x", to=["a"], ttl=5)
        d = take(q, "a")
        clock.advance(6)
        q.recover()
        assert sub_state(q, msg_id, "a") is S.FETCHED
        d.done()
        assert sub_history(q, msg_id, "a")[-2:] == [S.DONE, S.JOURNALLED]

    def test_release_after_ttl_expires_the_member(self, q: Queue, clock: FakeClock) -> None:
        msg_id = q.put(b"x", to=["a"], ttl=5)
        d = take(q, "a")
        clock.advance(6)
        d.release()
        assert sub_history(q, msg_id, "a")[-3:] == [S.AVAILABLE, S.EXPIRED, S.JOURNALLED]
        assert q.get("a") is None

    def test_negative_ttl_is_refused(self, q: Queue) -> None:
        with pytest.raises(InvalidArgument):
            q.put(b"x", to=["a"], ttl=-1)
        assert q.search() == []

    # --- re-reveal ------------------------------------------------------------------------

    def test_rereveal_to_one_subscriber(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a", "b"])
        take(q, "a").unusable("bad")
        take(q, "b").done()
        assert q.state(msg_id).publisher_state is P.JOURNALLED
        q.reveal(msg_id, to="a")
        st = q.state(msg_id)
        assert st.publisher_state is P.REVEALED
        assert (st.subscribers["a"].state, st.subscribers["a"].attempt) == (S.AVAILABLE, 2)
        assert st.subscribers["b"].state is S.JOURNALLED
        assert q.get("b") is None
        d = take(q, "a")
        assert (d.msg_id, d.attempt) == (msg_id, 2)
        d.done()
        assert pub_history(q, msg_id) == [
            P.PUT,
            P.REVEALED,
            P.JOURNALLED,
            P.REVEALED,
            P.JOURNALLED,
        ]

    @pytest.mark.parametrize("outcome", ["done", "available", "in_process"])
    def test_rereveal_needs_an_unusable_member(self, q: Queue, outcome: str) -> None:
        msg_id = q.put(b"x", to=["a"])
        if outcome != "available":
            d = take(q, "a")
            d.in_process()
            if outcome == "done":
                d.done()
        before = q.state(msg_id)
        with pytest.raises(IllegalTransition):
            q.reveal(msg_id, to="a")
        assert q.state(msg_id) == before

    def test_rereveal_of_a_withdrawn_message_is_illegal(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a", "b"])
        take(q, "a").unusable("bad")
        q.withdraw(msg_id)
        assert q.state(msg_id).publisher_state is P.JOURNALLED
        before = q.state(msg_id)
        with pytest.raises(IllegalTransition):
            q.reveal(msg_id, to="a")
        assert q.state(msg_id) == before

    # --- purge ----------------------------------------------------------------------------

    def test_purge_removes_journalled_messages_and_keeps_the_journal(
        self, hub: Hub, q: Queue, clock: FakeClock
    ) -> None:
        msg_id = q.put(b"payload", to=["a"])
        take(q, "a").done()
        ref = hub.store.load(msg_id).native_ref
        assert ref is not None
        journal_before = [e for e in hub.journal(limit=100_000) if e.msg_id == msg_id]
        clock.advance(100)
        assert q.purge(older_than=60) == 1
        with pytest.raises(MessageNotFound):
            q.state(msg_id)
        with pytest.raises(MessageNotFound):
            q.peek(msg_id)
        assert q.search(msg_id=msg_id) == []
        assert hub.adapter.read(q.name, ref) is None
        assert [e for e in hub.journal(limit=100_000) if e.msg_id == msg_id] == journal_before
        assert journal_before[-1].dst == P.JOURNALLED.value

    def test_purge_keeps_unfinished_and_recent_messages(self, q: Queue, clock: FakeClock) -> None:
        old_done = q.put(b"1", to=["a"])
        unfinished = q.put(b"2", to=["a", "b"])
        take(q, "a").done()
        take(q, "a").done()
        clock.advance(100)
        recent = q.put(b"3", to=["a"])
        take(q, "a").done()
        assert q.purge(timedelta(seconds=60)) == 1
        with pytest.raises(MessageNotFound):
            q.state(old_done)
        assert q.state(unfinished).publisher_state is P.REVEALED
        assert q.state(recent).publisher_state is P.JOURNALLED
        assert take(q, "b").msg_id == unfinished

    def test_negative_purge_age_is_refused(self, q: Queue) -> None:
        with pytest.raises(InvalidArgument):
            q.purge(-1)

    # --- payloads and put arguments -------------------------------------------------------

    @pytest.mark.parametrize(
        ("payload", "content_type"),
        [
            (b"\x00\xffraw bytes", "application/octet-stream"),
            ("text with ünïcödé ✓", "text/plain; charset=utf-8"),
            ({"order": 1, "lines": [{"sku": "a", "qty": 2.5}], "ok": True}, "application/json"),
            ([1, "two", None], "application/json"),
            (42, "application/json"),
            (None, "application/json"),
            ("", "text/plain; charset=utf-8"),
            (b"", "application/octet-stream"),
        ],
    )
    def test_payload_round_trip(self, q: Queue, payload: object, content_type: str) -> None:
        msg_id = q.put(payload, to=["a"])
        d = take(q, "a")
        assert d.payload == payload
        assert type(d.payload) is type(payload)
        assert d.content_type == content_type
        assert q.peek(msg_id).payload() == payload

    def test_envelope_fields_round_trip(self, hub: Hub, q: Queue, clock: FakeClock) -> None:
        msg_id = q.put(
            b"x",
            to=["a"],
            publisher="pub-1",
            correlation_id="corr-1",
            priority=7,
            ordering_key="customer-9",
            parents=["parent-1", "parent-2"],
            headers={"trace": "t-1", "kind": "order"},
        )
        d = take(q, "a")
        assert (d.msg_id, d.queue, d.publisher) == (msg_id, q.name, "pub-1")
        assert (d.correlation_id, d.priority, d.ordering_key) == ("corr-1", 7, "customer-9")
        assert d.parents == ("parent-1", "parent-2")
        assert dict(d.headers) == {"trace": "t-1", "kind": "order"}
        assert d.put_at == from_micros(int(clock.now * 1_000_000))
        st = q.state(msg_id)
        assert (st.publisher, st.correlation_id, st.priority) == ("pub-1", "corr-1", 7)
        assert st.parents == ("parent-1", "parent-2")
        q.put(b"k", to=["b"])
        assert take(q, "b").ordering_key == hub.publisher  # the default ordering key

    def test_bytes_keep_an_explicit_content_type(self, q: Queue) -> None:
        q.put(b'{"a": 1}', to=["a"], content_type="application/json")
        d = take(q, "a")
        assert (d.body, d.payload, d.content_type) == (b'{"a": 1}', {"a": 1}, "application/json")

    def test_malformed_json_raises_payload_error(self, q: Queue) -> None:
        msg_id = q.put(b"{not json", to=["a"], content_type="application/json")
        d = take(q, "a")
        assert d.body == b"{not json"
        with pytest.raises(PayloadError):
            _ = d.payload
        assert sub_state(q, msg_id, "a") is S.FETCHED

    def test_malformed_json_in_context_manager_is_unusable_at_once(self, q: Queue) -> None:
        msg_id = q.put(b"{not json", to=["a"], content_type="application/json")
        d = take(q, "a")
        assert d.attempt < d.max_attempts
        with pytest.raises(PayloadError), d:
            _ = d.payload
        view = q.state(msg_id).subscribers["a"]
        assert [s for s, _ in view.history][-3:] == [S.IN_PROCESS, S.UNUSABLE, S.JOURNALLED]
        assert view.reason is not None and view.reason.startswith("PayloadError")

    def test_unserialisable_payload_is_refused(self, q: Queue) -> None:
        with pytest.raises(PayloadError):
            q.put(object(), to=["a"])
        with pytest.raises(PayloadError):
            q.put({"a": 1}, to=["a"], content_type="text/csv")
        assert q.search() == []

    def test_oversized_payload_is_refused(self, hub: Hub) -> None:
        q = self.open_queue(hub, max_bytes=16)
        q.put(b"x" * 16, to=["a"])
        with pytest.raises(MessageTooLarge) as info:
            q.put(b"x" * 17, to=["a"])
        assert (info.value.size, info.value.limit) == (17, 16)
        assert len(q.search()) == 1

    @pytest.mark.parametrize("priority", [-1, 10, "5", True, 4.0, None])
    def test_bad_priority_is_refused(self, q: Queue, priority: Any) -> None:
        with pytest.raises(InvalidArgument):
            q.put(b"x", to=["a"], priority=priority)
        assert q.search() == []

    @pytest.mark.parametrize("headers", [{"n": 1}, {1: "x"}])
    def test_bad_headers_are_refused(self, q: Queue, headers: Any) -> None:
        with pytest.raises(InvalidArgument):
            q.put(b"x", to=["a"], headers=headers)

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("correlation_id", "c\udc80"),
            ("ordering_key", "k\udc80"),
            ("headers", {"h": "v\udc80"}),
            ("headers", {"h\udc80": "v"}),
            ("correlation_id", 7),
        ],
    )
    def test_text_that_is_not_text_is_refused(self, q: Queue, field: str, value: Any) -> None:
        """A lone surrogate (bytes decoded with surrogateescape) cannot reach a store or a
        broker as UTF-8: a typed error names the field, and nothing is put."""
        with pytest.raises(InvalidArgument, match=r"header|correlation_id|ordering_key"):
            q.put(b"x", to=["a"], **{field: value})
        assert q.search() == []
        q.put(b"x", to=["a"], correlation_id="c\u00e9\U0001f600")
        assert [r.correlation_id for r in q.search()] == ["c\u00e9\U0001f600"]

    def test_publisher_name_that_is_not_text_is_refused(self, q: Queue) -> None:
        with pytest.raises(AudienceError, match="not valid text"):
            q.put(b"x", to=["a"], publisher="p\udc80")
        assert q.search() == []

    def test_unknown_queue_without_create(self, hub: Hub) -> None:
        name = unique("missing")
        with pytest.raises(UnknownQueueError):
            hub.queue(name, create=False)
        hub.queue(name)
        assert hub.queue(name, create=False).name == name
        assert name in hub.queues()

    def test_state_of_an_unknown_or_foreign_message(self, hub: Hub, q: Queue) -> None:
        with pytest.raises(MessageNotFound):
            q.state("no-such-message")
        other = self.open_queue(hub)
        msg_id = other.put(b"x", to=["a"])
        with pytest.raises(MessageNotFound):
            q.state(msg_id)
        with pytest.raises(MessageNotFound):
            q.withdraw(msg_id)
        assert q.get("a") is None

    def test_peek_changes_nothing(self, q: Queue) -> None:
        msg_id = q.put({"k": "v"}, to=["a"])
        before = q.state(msg_id)
        assert q.peek(msg_id).payload() == {"k": "v"}
        assert q.state(msg_id) == before

    def test_put_many_keeps_order_and_options(self, q: Queue) -> None:
        ids = q.put_many([b"1", b"2", b"3"], to=["a"], correlation_id="batch")
        assert len(set(ids)) == 3
        assert [h.msg_id for h in q.search(correlation_id="batch")] == ids
        assert [take(q, "a").body for _ in ids] == [b"1", b"2", b"3"]
        assert q.put_many([], to=["a"]) == []

    # --- context manager and retry policy -------------------------------------------------

    def test_context_manager_success_is_done(self, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        with take(q, "a") as d:
            assert sub_state(q, msg_id, "a") is S.IN_PROCESS
            assert d.body == b"x"
        assert sub_history(q, msg_id, "a")[-3:] == [S.IN_PROCESS, S.DONE, S.JOURNALLED]

    def test_context_manager_failure_is_retried_after_backoff(
        self, q: Queue, clock: FakeClock
    ) -> None:
        msg_id = q.put(b"x", to=["a"])
        with pytest.raises(RuntimeError, match="boom"), take(q, "a"):
            raise RuntimeError("boom")
        view = q.state(msg_id).subscribers["a"]
        assert (view.state, view.attempt, view.reason) == (S.AVAILABLE, 2, "RuntimeError: boom")
        assert q.get("a") is None  # first retry delay: 1 s
        clock.advance(1.5)
        with pytest.raises(RuntimeError), take(q, "a"):
            raise RuntimeError("again")
        clock.advance(1.5)
        assert q.get("a") is None  # second retry delay: 2 s
        clock.advance(1)
        assert take(q, "a").attempt == 3

    def test_context_manager_failure_on_the_last_attempt_is_unusable(
        self, q: Queue, clock: FakeClock
    ) -> None:
        msg_id = q.put(b"x", to=["a"])
        for _ in range(3):
            clock.advance(10)
            with pytest.raises(ValueError), take(q, "a"):
                raise ValueError("still broken")
        view = q.state(msg_id).subscribers["a"]
        assert (view.state, view.attempt, view.reason) == (
            S.JOURNALLED,
            3,
            "ValueError: still broken",
        )
        assert sub_history(q, msg_id, "a")[-2:] == [S.UNUSABLE, S.JOURNALLED]
        clock.advance(100)
        assert q.get("a") is None

    def test_permanent_errors_are_unusable_at_once(self, hub: Hub) -> None:
        class Poison(Exception):
            pass

        q = self.open_queue(hub, retry=RetryPolicy(max_attempts=5, permanent=(Poison,)))
        msg_id = q.put(b"x", to=["a"])
        with pytest.raises(Poison), take(q, "a"):
            raise Poison("never works")
        view = q.state(msg_id).subscribers["a"]
        assert (view.state, view.attempt) == (S.JOURNALLED, 1)
        assert sub_history(q, msg_id, "a")[-2:] == [S.UNUSABLE, S.JOURNALLED]

    # --- waiting --------------------------------------------------------------------------

    def test_get_with_timeout_returns_none_when_empty(self, q: Queue) -> None:
        started = time.monotonic()
        assert q.get("a", timeout=0.2) is None
        assert time.monotonic() - started >= 0.2

    def test_get_with_timeout_returns_a_message_put_while_waiting(self, q: Queue) -> None:
        put_ids: list[str] = []
        putter = threading.Timer(0.1, lambda: put_ids.append(q.put(b"late", to=["a"])))
        started = time.monotonic()
        putter.start()
        try:
            d = q.get("a", timeout=10)
        finally:
            putter.join()
        assert d is not None
        assert [d.msg_id] == put_ids
        assert time.monotonic() - started < 5

    # --- journal --------------------------------------------------------------------------

    def test_hub_journal_is_ordered_by_seq(self, hub: Hub, q: Queue) -> None:
        msg_id = q.put(b"x", to=["a"])
        take(q, "a").done()
        entries = [e for e in hub.journal(limit=100_000) if e.msg_id == msg_id]
        seqs = [e.seq for e in entries if e.seq is not None]
        assert len(seqs) == len(entries)
        assert seqs == sorted(seqs)
        assert [(e.actor, e.dst) for e in entries] == [
            (hub.publisher, "PUT"),
            (hub.publisher, "REVEALED"),
            ("a", "AVAILABLE"),
            ("a", "GET"),
            ("a", "FETCHED"),
            ("a", "DONE"),
            ("a", "JOURNALLED"),
            (hub.publisher, "JOURNALLED"),
        ]
        assert list(q.state(msg_id).journal) == entries
