"""Adapter contract, payloads needed again: journalled retention, peek, browse under a
lock, re-reveal to one subscriber, redelivery after a lapsed lease, and purge, on every
adapter. On a broker that forgets a message once it is acknowledged
(``Capabilities.forgets``) the facade serves them from its retained copy; the last tests
show what a queue opened with ``retain=False`` does there."""

from __future__ import annotations

import pytest

from iqbridge.errors import LeaseLost, MessageNotFound, PayloadNotRetained
from iqbridge.hub import Hub
from iqbridge.model import Pool
from iqbridge.queue import Queue
from iqbridge.states import PublisherState, SubscriberState
from iqbridge.testing import FakeClock
from iqbridge.testing.contract_base import LEASE, ContractBase, take

P = PublisherState
S = SubscriberState

BODY = b"\x00\xff payload \xe2\x9c\x93 kept byte for byte"
HEADERS = {"order": "1042", "note": "ünïcödé"}


class RetentionTests(ContractBase):
    """Everything that reads a payload after its first delivery."""

    def test_peek_after_every_subscriber_finished(self, q: Queue) -> None:
        msg_id = q.put(BODY, to=["a", Pool("p", ["p1", "p2"])], headers=HEADERS)
        take(q, "a").done()
        take(q, "p2").done()
        assert q.state(msg_id).publisher_state is P.JOURNALLED
        env = q.peek(msg_id)
        assert (env.msg_id, env.body, env.headers) == (msg_id, BODY, HEADERS)
        assert env.publisher == q.state(msg_id).publisher

    def test_rereveal_delivers_the_payload_again(self, q: Queue) -> None:
        msg_id = q.put(BODY, to=["a", "b"], headers=HEADERS, correlation_id="c-1")
        take(q, "a").unusable("bad")
        take(q, "b").done()
        q.reveal(msg_id, to="a")
        d = take(q, "a")
        assert (d.msg_id, d.attempt, d.body, dict(d.headers)) == (msg_id, 2, BODY, HEADERS)
        assert d.correlation_id == "c-1"
        d.done()
        assert q.state(msg_id).publisher_state is P.JOURNALLED

    def test_redelivery_after_a_lapsed_lease_delivers_the_payload(
        self, q: Queue, clock: FakeClock
    ) -> None:
        msg_id = q.put(BODY, to=["a"], headers=HEADERS)
        first = take(q, "a")
        clock.advance(LEASE + 1)
        again = take(q, "a")
        assert (again.msg_id, again.attempt, again.body) == (msg_id, 2, BODY)
        assert dict(again.headers) == HEADERS
        again.done()
        with pytest.raises(LeaseLost):
            first.done()

    def test_a_batch_of_redeliveries_gets_every_payload(self, q: Queue, clock: FakeClock) -> None:
        bodies = [BODY + bytes([i]) for i in range(5)]
        ids = q.put_many(bodies, to=["a"])
        q.get_many("a", 5)
        clock.advance(LEASE + 1)
        q.recover()
        batch = q.get_many("a", 5)
        assert sorted(batch.msg_ids) == sorted(ids)
        assert sorted(d.body for d in batch) == sorted(bodies)
        assert batch.done().done == batch.msg_ids

    def test_get_under_a_browse_lock_delivers_the_payload(self, q: Queue) -> None:
        msg_id = q.put(BODY, to=["a", "b"], priority=8)
        take(q, "b").done()
        found = q.browse(priority=8, lock=True)
        assert [m.msg_id for m in found.messages] == [msg_id]
        assert q.get("a") is None
        d = take(q, "a", lock_id=found.lock_id)
        assert (d.msg_id, d.body) == (msg_id, BODY)

    def test_purge_removes_the_retained_copy_with_the_record(
        self, hub: Hub, q: Queue, clock: FakeClock
    ) -> None:
        msg_id = q.put(BODY, to=["a"])
        take(q, "a").done()
        clock.advance(100)
        assert q.purge(older_than=60) == 1
        assert hub.store.retained([msg_id]) == {}
        with pytest.raises(MessageNotFound):
            q.peek(msg_id)

    def test_a_copy_is_kept_exactly_where_needed(self, hub: Hub) -> None:
        forgets = hub.adapter.capabilities.forgets
        default = self.open_queue(hub)
        kept = self.open_queue(hub, retain=True)
        a = default.put(BODY, to=["a"])
        b = kept.put(BODY, to=["a"], headers=HEADERS)
        assert default.retain is forgets
        assert (a in hub.store.retained([a])) is forgets
        copy = hub.store.retained([b])[b]
        assert (copy.body, dict(copy.headers)) == (BODY, HEADERS)

    # --- a broker that forgets, and a queue that keeps no copy ------------------------

    def _forgetful(self, hub: Hub) -> Queue:
        if not hub.adapter.capabilities.forgets:
            pytest.skip("the broker can give every payload again by reference")
        return self.open_queue(hub, retain=False)

    def test_without_a_copy_peek_says_why(self, hub: Hub) -> None:
        q = self._forgetful(hub)
        msg_id = q.put(BODY, to=["a"])
        take(q, "a").done()
        with pytest.raises(PayloadNotRetained, match="retain=True"):
            q.peek(msg_id)
        assert hub.store.retained([msg_id]) == {}

    def test_without_a_copy_rereveal_is_refused_and_changes_nothing(self, hub: Hub) -> None:
        q = self._forgetful(hub)
        msg_id = q.put(BODY, to=["a"])
        take(q, "a").unusable("bad")
        before = q.state(msg_id)
        with pytest.raises(PayloadNotRetained, match="re-reveal"):
            q.reveal(msg_id, to="a")
        assert q.state(msg_id) == before

    def test_without_a_copy_a_redelivery_comes_from_the_broker(
        self, hub: Hub, clock: FakeClock
    ) -> None:
        q = self._forgetful(hub)
        msg_id = q.put(BODY, to=["a"])
        take(q, "a")  # held, never acknowledged: the broker still has its entry
        clock.advance(LEASE + 1)
        again = take(q, "a")
        assert (again.msg_id, again.attempt, again.body) == (msg_id, 2, BODY)
        again.done()
        assert q.state(msg_id).subscribers["a"].state is S.JOURNALLED
