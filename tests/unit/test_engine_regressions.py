"""Regressions found by the stateful test (test_stateful.py), each as its shortest story."""

from __future__ import annotations

from pathlib import Path

import pytest

import iqbridge
from iqbridge import IllegalTransition, Pool, SubscriberState
from iqbridge.engine import claim, new_message, release
from iqbridge.model import Audience
from iqbridge.testing import FakeClock

S = SubscriberState
US = 1_000_000


def test_claim_refuses_a_member_whose_retry_delay_runs() -> None:
    rec = new_message(
        msg_id="m", queue="q", publisher="p", audience=Audience(("S1",)), now=0
    ).record
    held = claim(rec, "S1", 10, token="t1", owner="S1@x", lease_until=None).record
    back = release(held, "S1", "t1", 20, delay_us=5 * US).record
    with pytest.raises(IllegalTransition, match="retry delay"):
        claim(back, "S1", 20 + 5 * US - 1, token="t2", owner="S1@x", lease_until=None)
    again = claim(back, "S1", 20 + 5 * US, token="t2", owner="S1@x", lease_until=None)
    assert again.record.members["S1"].state is S.FETCHED


def test_release_with_delay_is_not_redelivered_early_by_the_broker() -> None:
    """memory:// (native groups): the lease sweep requeued the pool's broker entry; after
    the next holder gave it back with a delay, a get took that entry at once."""
    clock = FakeClock()
    with iqbridge.connect("memory://", clock=clock) as hub:
        queue = hub.queue("q", sweep_interval=0.0)
        msg = queue.put("x", to=Pool("P2", ["B1", "B2", "B3"]))
        first = queue.get("B1", lease=4.0)
        assert first is not None
        clock.advance(5)  # the lease lapses; the next get's sweep reopens the pool
        second = queue.get("B1")
        assert second is not None and second.attempt == 2
        second.release(delay=3.0)
        assert queue.get("B1") is None, "delivered before its retry delay passed"
        clock.advance(3)
        third = queue.get("B1")
        assert third is not None and third.msg_id == msg
        assert queue.state(msg).subscribers["B1"].attempt == 3


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_a_handler_exception_that_cannot_be_printed_still_gives_the_message_back(
    tmp_path: Path,
) -> None:
    with iqbridge.connect(f"sqlite:///{tmp_path}/q.db") as hub:
        q = hub.queue("orders")
        msg_id = q.put(b"x", to=["billing"])
        d = q.get("billing")
        assert d is not None
        with pytest.raises(_Unprintable), d:
            raise _Unprintable
        view = q.state(msg_id).subscribers["billing"]
        assert (view.state, view.attempt) == (iqbridge.SubscriberState.AVAILABLE, 2)
        assert view.reason == "_Unprintable: (its message could not be read)"
