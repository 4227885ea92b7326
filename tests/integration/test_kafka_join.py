"""Kafka while a consumer group joins, on the session's Tansu (a join there takes about
half of ``session.timeout.ms``; these tests make it longer than the gets' timeouts and
the leases on purpose):

* a get returns within its timeout plus ``join_timeout`` however long the join takes;
  the join goes on in the background, and the message it brings is not lost: a later
  get delivers it, first attempt;
* a pool member that got a message after a slow join holds it for its whole lease (the
  lease runs from the claim, not from before the read): another member's get finds
  nothing, and the message stays with the first on attempt 1.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import iqbridge
from iqbridge.model import Pool
from iqbridge.states import SubscriberState
from tests.kafka_helpers import fresh_prefix, kafka_url

pytestmark = pytest.mark.kafka

S = SubscriberState


@pytest.fixture
def index(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'index.db'}"


def _hub(index: str, session_ms: int, **options: str) -> iqbridge.Hub:
    url = kafka_url(fresh_prefix("join"), **{"session.timeout.ms": str(session_ms)}, **options)
    return iqbridge.connect(url, index=index)


def test_a_get_returns_within_its_timeout_while_the_group_joins(index: str) -> None:
    # Joins of about 8 s, longer than the default join_timeout (5 s).
    hub = _hub(index, 16000)
    try:
        q = hub.queue("orders")
        msg_id = q.put(b"x", to=["a"])
        started = time.monotonic()
        first = q.get("a", timeout=0.5)
        took = time.monotonic() - started
        # The bound: timeout 0.5 s + join_timeout 5 s, plus slack for a loaded machine.
        assert took < 6.8, f"get(timeout=0.5) took {took:.1f} s while the group joined"
        assert first is None, f"the join took {took:.1f} s only: raise session.timeout.ms"
        d = q.get("a", timeout=30)
        assert d is not None, "the message the join brought was lost"
        assert (d.msg_id, d.attempt) == (msg_id, 1)
        d.done()
        assert q.get("a") is None
        assert q.state(msg_id).subscribers["a"].state is S.JOURNALLED
    finally:
        hub.close()


def test_a_pool_member_keeps_a_message_it_got_after_a_slow_join(index: str) -> None:
    # Joins of 3 s or more, a lease of 1.5 s: a lease measured from before the read
    # lapsed before the claim was made, and the next member's get took the message.
    hub = _hub(index, 6000)
    try:
        q = hub.queue("lb", lease=1.5)
        msg_id = q.put(b"lb", to=[Pool("P", ["S0", "S1", "S2"])])
        started = time.monotonic()
        d = q.get("S2", timeout=30)
        assert d is not None and d.msg_id == msg_id
        joined = time.monotonic() - started
        assert joined > 1.5, f"the join took {joined:.1f} s only: raise session.timeout.ms"
        assert q.get("S0", timeout=0.5) is None
        view = q.state(msg_id).subscribers["S2"]
        assert (view.state, view.attempt) == (S.FETCHED, 1)
        d.done()
        assert q.state(msg_id).subscribers["S2"].state is S.JOURNALLED
    finally:
        hub.close()
