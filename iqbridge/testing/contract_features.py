"""Adapter contract, the features around the state model: browse with lock, search,
leases, once-only, ordering, time limits, re-reveal, purge, payloads, the retry policy,
waiting and the journal."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from iqbridge import engine
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
from iqbridge.ids import new_id
from iqbridge.model import Audience, Filter, Pool, from_micros
from iqbridge.queue import Queue
from iqbridge.retry import RetryPolicy
from iqbridge.states import PublisherState, SubscriberState
from iqbridge.testing import FakeClock
from iqbridge.testing.contract_base import (
    LEASE,
    ContractBase,
    count_moves,
    delay_broker_read,
    pub_history,
    sub_history,
    sub_state,
    take,
    unique,
)

P = PublisherState
S = SubscriberState


class FeatureTests(ContractBase):
    """Browse, search, leases, once-only, ordering, ttl, re-reveal, purge, payloads."""

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

    @pytest.mark.parametrize("many", [False, True], ids=["get", "get_many"])
    def test_a_lease_runs_from_the_claim_after_a_slow_broker_read(
        self, hub: Hub, q: Queue, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, many: bool
    ) -> None:
        """A broker read that outlasts the lease (a slow broker, a consumer group
        joining) does not make a claim born lapsed: the lease runs from the claim, so no
        other member or get takes the message while the holder's lease holds."""
        pool = Pool("workers", ["w1", "w2"])
        msg_id = q.put(b"x", to=[pool])
        delayed = delay_broker_read(hub, clock, LEASE + 5, monkeypatch)
        if many:
            got = q.get_many("w1", 5)
            assert got.msg_ids == [msg_id]
            d = got[0]
        else:
            d = take(q, "w1")
        assert delayed, "the broker read was not delayed"
        assert d.msg_id == msg_id
        assert q.get("w2") is None and q.get("w1") is None
        assert q.recover() == 0
        view = q.state(msg_id).subscribers["w1"]
        assert (view.state, view.attempt) == (S.FETCHED, 1)
        assert view.lease_until == from_micros(int((delayed[0] + LEASE) * 1_000_000))
        d.done()
        assert count_moves(q.state(msg_id), "w1", S.DONE) == 1

    @pytest.mark.parametrize("many", [False, True], ids=["get", "get_many"])
    def test_a_message_no_get_can_take_yet_hides_none_behind_it(
        self, hub: Hub, q: Queue, clock: FakeClock, many: bool
    ) -> None:
        """A message revealed in the index whose payload the broker does not have yet (a
        put that sends after it indexes, still in flight) is first in claim order: the
        get skips it and takes the ones behind it."""
        q.subscribe("a")
        early = engine.new_message(
            msg_id=new_id(),
            queue=q.name,
            publisher="p",
            audience=Audience(("a",)),
            now=hub.now_us(),
            priority=9,
        )
        hub.store.commit(early)
        first = q.put(b"1", to=["a"])
        second = q.put(b"2", to=["a"])
        if many:
            assert q.get_many("a", 1).msg_ids == [first]
            assert q.get_many("a", 5).msg_ids == [second]
        else:
            assert take(q, "a").msg_id == first
            assert take(q, "a").msg_id == second
        assert q.get("a") is None
        assert q.state(early.msg_id).subscribers["a"].state is S.AVAILABLE

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
