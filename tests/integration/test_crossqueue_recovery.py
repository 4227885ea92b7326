"""Seed 000's failure scenarios, recovered with the cross-queue recovery (issue 16).

The seed's flow: a point-of-sale module (``pos``) publishes each sale to an inbound queue
A (``sales``); a customer-database module (``customer-db``) gets it, adds the customer's
data and puts a child on an outbound queue B (``approvals``) naming the sale as its parent,
marks the sale DONE and only then reveals the child (a confirmed put, as the seed's
modules do); a credit-approval module (``credit-approval``) gets the child and approves
it. Each module runs on its own hub (a process of its own in production); a failure is
its hub closed with its work half-done (what a killed process leaves behind: leases
still running, puts unconfirmed).

Each scenario fails one module at one point the seed lists, runs the recovery the seed
prescribes for it, asserts the states the seed says, then lets new module instances
finish the flow and asserts that every sale was approved once and every message
processed (DONE) once per subscriber. The pairs of stores: embedded SQLite in and Redis
Streams out; RabbitMQ in (index on SQLite) and embedded SQLite out.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import iqbridge
from iqbridge import PublisherState, SubscriberState
from iqbridge.recovery.crossqueue import CrossQueueRecovery, Plan
from tests.rabbitmq_helpers import fresh_prefix as rabbit_prefix
from tests.rabbitmq_helpers import remember, url_with
from tests.redis_index_helpers import REDIS_URL, drop_streams, redis_reachable
from tests.redis_index_helpers import fresh_prefix as redis_prefix

S = SubscriberState
P = PublisherState

A, B = "sales", "approvals"
CDB, CA = "customer-db", "credit-approval"
CUSTOMERS = {"t1": "alice", "t2": "bob", "t3": "carol"}


class Crash(Exception):
    """A module dies here: nothing after this point runs, nothing is settled; its hubs
    close as the process's connections would."""


@dataclass
class End:
    """One store pair's end: how to open a hub on it."""

    url: str
    index: str | None = None

    def hub(self, publisher: str) -> iqbridge.Hub:
        return iqbridge.connect(self.url, self.index, publisher=publisher)


@dataclass
class Flow:
    """The three modules over A and B; each instance on its own hubs."""

    a: End
    b: End
    approved: list[str] = field(default_factory=list)
    hubs: list[iqbridge.Hub] = field(default_factory=list)

    def _hub(self, end: End, name: str) -> iqbridge.Hub:
        hub = end.hub(name)
        self.hubs.append(hub)
        return hub

    def setup(self) -> None:
        with self.a.hub("setup") as ha, self.b.hub("setup") as hb:
            ha.queue(A).subscribe(CDB)
            hb.queue(B).subscribe(CA)
            remember_if_rabbit(ha)
            remember_if_rabbit(hb)

    def pos(self, tx: str, *, crash: bool = False) -> str:
        """The point-of-sale module: a confirmed put of the sale."""
        with self.a.hub("pos") as hub:
            return self._pos(hub.queue(A), tx, crash)

    @staticmethod
    def _pos(q: iqbridge.Queue, tx: str, crash: bool) -> str:
        msg_id = q.put({"tx": tx, "amount": 10 * len(tx)}, confirm=True)
        if crash:
            raise Crash("pos: put, not revealed")
        q.confirm_put(msg_id)
        return msg_id

    def customer_db(self, *, crash_at: str | None = None) -> tuple[str, str | None]:
        """The customer-database module, one sale: get, put the child (confirm=True),
        DONE, reveal the child."""
        with self.a.hub(CDB) as ha, self.b.hub(CDB) as hb:
            return self._customer_db(ha.queue(A), hb.queue(B), crash_at)

    @staticmethod
    def _customer_db(
        qa: iqbridge.Queue, qb: iqbridge.Queue, crash_at: str | None
    ) -> tuple[str, str | None]:
        d = qa.get(CDB, timeout=5)
        assert d is not None, "no sale for the customer-database module"
        if crash_at == "fetched":
            raise Crash("customer-db: fetched, nothing put")
        sale = d.payload
        child = qb.put(
            {**sale, "customer": CUSTOMERS[sale["tx"]]}, parents=(d.msg_id,), confirm=True
        )
        if crash_at == "put":
            raise Crash("customer-db: child put, sale not DONE")
        d.done()
        if crash_at == "done":
            raise Crash("customer-db: sale DONE, child not revealed")
        qb.confirm_put(child)
        return d.msg_id, child

    def credit_approval(self, *, crash_at: str | None = None) -> str:
        """The credit-approval module, one request: get, approve, DONE."""
        with self.b.hub(CA) as hb:
            return self._credit_approval(hb.queue(B), crash_at)

    def _credit_approval(self, qb: iqbridge.Queue, crash_at: str | None) -> str:
        d = qb.get(CA, timeout=5)
        assert d is not None, "no request for the credit-approval module"
        if crash_at == "fetched":
            raise Crash("credit-approval: fetched, not DONE")
        self.approved.append(d.payload["tx"])
        d.done()
        return d.msg_id

    def finish(self) -> None:
        """New module instances drain both queues (the flow completes)."""
        qa = self._hub(self.a, CDB).queue(A)
        qb = self._hub(self.b, CDB).queue(B)
        qc = self._hub(self.b, CA).queue(B)
        idle = 0
        while idle < 3:
            moved = False
            d = qa.get(CDB, timeout=0.3)
            if d is not None:
                sale = d.payload
                c = qb.put(
                    {**sale, "customer": CUSTOMERS[sale["tx"]]}, parents=(d.msg_id,), confirm=True
                )
                d.done()
                qb.confirm_put(c)
                moved = True
            r = qc.get(CA, timeout=0.3)
            if r is not None:
                self.approved.append(r.payload["tx"])
                r.done()
                moved = True
            idle = 0 if moved else idle + 1

    def crash(self) -> None:
        """Every module instance dies: hubs closed, nothing settled."""
        for hub in self.hubs:
            with contextlib.suppress(Exception):
                hub.close()
        self.hubs.clear()

    def recover(self, source: tuple[End, str] | None, target: tuple[End, str] | None) -> Plan:
        """Seed 000's recovery from ``source`` to ``target`` (each an end and a queue),
        applied; the plan it made."""
        with contextlib.ExitStack() as stack:
            qs = [
                stack.enter_context(end.hub("recovery")).queue(name) if end else None
                for end, name in (source or (None, ""), target or (None, ""))
            ]
            job = CrossQueueRecovery(qs[0], qs[1])
            plan = job.plan()
            result = job.apply(plan)
            assert result.applied == len(plan.rows) and result.already == 0
        return plan

    def states(self, end: End, queue: str, msg_id: str) -> tuple[Any, ...]:
        with end.hub("look") as hub:
            st = hub.queue(queue).state(msg_id)
        (sub,) = st.subscribers.values()
        return st.publisher_state, sub.state, sub.attempt

    def journal(self, end: End, queue: str) -> list[iqbridge.JournalEntry]:
        with end.hub("look") as hub:
            return [
                e
                for m in hub.queue(queue).search(limit=1000)
                for e in hub.queue(queue).state(m.msg_id).journal
            ]

    def assert_once(self, sales: list[str]) -> None:
        """Every sale approved once; each message DONE once per subscriber."""
        assert Counter(self.approved) == Counter(sales), self.approved
        for end, queue, sub in ((self.a, A, CDB), (self.b, B, CA)):
            done = Counter(
                e.msg_id for e in self.journal(end, queue) if e.actor == sub and e.dst == "DONE"
            )
            assert done and set(done.values()) == {1}, (queue, done)
        with self.a.hub("look") as ha:
            for s in ha.queue(A).search(limit=1000):
                assert s.publisher_state is P.JOURNALLED, s


def remember_if_rabbit(hub: iqbridge.Hub) -> None:
    if hub.adapter.url.startswith("amqp"):
        remember(hub.adapter)


@pytest.fixture(params=["sqlite-in/redis-out", "rabbitmq-in/sqlite-out"])
def flow(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Flow]:
    if request.param == "sqlite-in/redis-out":
        ok, why = redis_reachable()
        from tests.conftest import need_server

        need_server(f"Redis at {REDIS_URL}", ok, why)
        with redis_prefix("xq") as prefix:
            out = End(f"{REDIS_URL}?prefix={prefix}&stream_prefix={prefix}:")
            f = Flow(End(f"sqlite:///{tmp_path}/in.db"), out)
            try:
                f.setup()
                yield f
            finally:
                f.crash()
                drop_streams(f"{prefix}:")
    else:
        with rabbit_prefix("xq") as prefix:
            f = Flow(
                End(url_with(prefix), f"sqlite:///{tmp_path}/index.db"),
                End(f"sqlite:///{tmp_path}/out.db"),
            )
            try:
                f.setup()
                yield f
            finally:
                f.crash()


def _normal_traffic(f: Flow) -> tuple[str, str]:
    """t1 goes through the whole flow; t3 is put and waits (AVAILABLE): recovery must
    leave both alone."""
    f.pos("t1")
    f.customer_db()
    f.credit_approval()
    t3 = f.pos("t3")
    return "t1", t3


def _rows(plan: Plan) -> list[tuple[int, str, str, str | None]]:
    return [(r.step, r.action, r.side, r.subscriber) for r in plan.rows]


# --- the point-of-sale module fails ---------------------------------------------------


def test_pos_fails_after_the_put_steps_1_2_4_reveal_the_sale(flow: Flow) -> None:
    """Scenario 1: published onto A and not fetched -> steps 1, 2 and 4."""
    _normal_traffic(flow)
    with pytest.raises(Crash):
        flow.pos("t2", crash=True)
    flow.crash()
    with flow.a.hub("look") as ha:
        [pending] = ha.queue(A).search(state=P.PUT)
    assert flow.states(flow.a, A, pending.msg_id) == (P.PUT, None, 1)
    # The POS module has no inbound queue: A is the recovery's outbound side.
    plan = flow.recover(None, (flow.a, A))
    assert _rows(plan) == [(4, "reveal", "target", None)]
    assert flow.states(flow.a, A, pending.msg_id) == (P.REVEALED, S.AVAILABLE, 1)
    flow.finish()
    flow.assert_once(["t1", "t2", "t3"])


def test_pos_fails_after_the_sale_was_fetched_the_subscriber_recovers(flow: Flow) -> None:
    """Scenario 2: put onto A and marked FETCHED -> the subscriber does the recovery:
    the plan is empty and the customer-database module, still running, finishes it."""
    _normal_traffic(flow)
    flow.pos("t2")
    qa = flow._hub(flow.a, CDB).queue(A)
    qb = flow._hub(flow.b, CDB).queue(B)
    got = [qa.get(CDB, timeout=5) for _ in range(2)]  # t3 and t2, in put order
    assert all(d is not None for d in got)
    # The POS module fails now; nothing of it is left in doubt.
    plan = flow.recover(None, (flow.a, A))
    assert plan.rows == () and plan.unresolved == ()
    for d in got:
        assert d is not None
        assert flow.states(flow.a, A, d.msg_id)[1] is S.FETCHED
        c = qb.put(
            {**d.payload, "customer": CUSTOMERS[d.payload["tx"]]}, parents=(d.msg_id,), confirm=True
        )
        d.done()
        qb.confirm_put(c)
    flow.finish()
    flow.assert_once(["t1", "t2", "t3"])


# --- the credit-approval module fails -------------------------------------------------


def test_credit_approval_fails_after_the_fetch_step_5_makes_it_available(flow: Flow) -> None:
    """Scenario 1: fetched but not DONE -> step 5 (B is the inbound queue here)."""
    _normal_traffic(flow)
    flow.pos("t2")
    flow.customer_db()  # t3 (put before t2)
    flow.customer_db()  # t2
    flow.credit_approval()  # t3's request
    with pytest.raises(Crash):
        flow.credit_approval(crash_at="fetched")
    flow.crash()
    with flow.b.hub("look") as hb:
        [held] = hb.queue(B).search(state=S.FETCHED)
    plan = flow.recover((flow.b, B), None)
    assert _rows(plan) == [(5, "release", "source", CA)]
    assert plan.rows[0].msg_id == held.msg_id
    assert flow.states(flow.b, B, held.msg_id) == (P.REVEALED, S.AVAILABLE, 2)
    flow.finish()
    flow.assert_once(["t1", "t2", "t3"])


# --- the customer-database module fails -----------------------------------------------


def _cdb_fails(flow: Flow, at: str) -> str:
    _normal_traffic(flow)
    flow.customer_db()  # t3 goes through to B (revealed, untouched by the recovery)
    flow.pos("t2")
    with pytest.raises(Crash):
        flow.customer_db(crash_at=at)
    flow.crash()
    with flow.a.hub("look") as ha:
        return ha.queue(A).search(limit=100)[-1].msg_id  # t2, the last put


def _child_of(flow: Flow, parent: str) -> list[str]:
    with flow.b.hub("look") as hb:
        return [s.msg_id for s in hb.queue(B).search(limit=100) if parent in s.parents]


def test_customer_db_fails_after_the_fetch_step_5_makes_the_sale_available(flow: Flow) -> None:
    """Scenario 1: fetched from A, nothing put on B -> step 5."""
    sale = _cdb_fails(flow, "fetched")
    assert flow.states(flow.a, A, sale) == (P.REVEALED, S.FETCHED, 1)
    plan = flow.recover((flow.a, A), (flow.b, B))
    assert _rows(plan) == [(5, "release", "source", CDB)]
    assert flow.states(flow.a, A, sale) == (P.REVEALED, S.AVAILABLE, 2)
    assert _child_of(flow, sale) == []
    flow.finish()
    flow.assert_once(["t1", "t2", "t3"])


def test_customer_db_fails_after_the_put_steps_1_2_3_withdraw_the_child(flow: Flow) -> None:
    """Scenario 2: fetched from A and put on B, the sale not DONE -> steps 1, 2, 3: the
    sale is made available again and the child withdrawn (never delivered)."""
    sale = _cdb_fails(flow, "put")
    [child] = _child_of(flow, sale)
    assert flow.states(flow.a, A, sale) == (P.REVEALED, S.FETCHED, 1)
    assert flow.states(flow.b, B, child) == (P.PUT, None, 1)
    plan = flow.recover((flow.a, A), (flow.b, B))
    assert _rows(plan) == [(3, "release", "source", CDB), (3, "withdraw", "target", None)]
    assert flow.states(flow.a, A, sale) == (P.REVEALED, S.AVAILABLE, 2)
    assert flow.states(flow.b, B, child) == (P.JOURNALLED, S.JOURNALLED, 1)
    flow.finish()
    flow.assert_once(["t1", "t2", "t3"])
    # The withdrawn child was never handed to the credit-approval module.
    with flow.b.hub("look") as hb:
        history = [(e.src, e.dst) for e in hb.queue(B).state(child).journal if e.actor == CA]
    assert history == [(None, "EXPIRED"), ("EXPIRED", "JOURNALLED")]


def test_customer_db_fails_after_done_steps_1_2_3_reveal_the_child(flow: Flow) -> None:
    """Scenario 3: fetched, put on B and marked DONE in A -> steps 1, 2, 3: the child is
    revealed, the sale is not processed again."""
    sale = _cdb_fails(flow, "done")
    [child] = _child_of(flow, sale)
    assert flow.states(flow.a, A, sale) == (P.JOURNALLED, S.JOURNALLED, 1)
    plan = flow.recover((flow.a, A), (flow.b, B))
    assert _rows(plan) == [(3, "reveal", "target", None)]
    assert flow.states(flow.b, B, child) == (P.REVEALED, S.AVAILABLE, 1)
    assert flow.states(flow.a, A, sale) == (P.JOURNALLED, S.JOURNALLED, 1)
    flow.finish()
    flow.assert_once(["t1", "t2", "t3"])
    assert len(_child_of(flow, sale)) == 1  # the sale was not processed again
