"""Queue.reclaim (what a holder known to be gone holds comes back at once) and
Queue.put_each (a batch whose messages carry their own options)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import iqbridge
from iqbridge import InvalidArgument, Outgoing, SubscriberState

S = SubscriberState


@pytest.fixture(params=["sqlite", "memory"])
def hub(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[iqbridge.Hub]:
    url = f"sqlite:///{tmp_path / 'q.db'}" if request.param == "sqlite" else "memory://"
    with iqbridge.connect(url) as h:
        yield h


def test_reclaim_gives_back_at_once_with_the_next_attempt(
    hub: iqbridge.Hub,
) -> None:
    q = hub.queue("orders", lease=300)
    q.subscribe("a", "b")
    ids = q.put_many([1, 2, 3])
    held = q.get_many("a", 3)
    held[0].in_process()
    other = q.get("b")  # another subscriber's hold is not touched
    assert other is not None
    owner = f"a@{hub.client_id}"
    assert q.reclaim("a", "someone@else") == []
    back = q.reclaim("a", owner, reason="process gone")
    assert sorted(back) == sorted(ids)
    views = {i: q.state(i).subscribers for i in ids}
    assert all(v["a"].state is S.AVAILABLE for v in views.values())
    assert [views[i]["a"].attempt for i in ids] == [2, 2, 2]
    assert views[ids[0]]["b"].state is S.FETCHED
    again = q.get_many("a", 3)
    assert [d.msg_id for d in again] == ids  # in put order, at once, no lease to wait out
    assert q.reclaim("a") == ids and q.reclaim("a") == []  # owner None: whoever holds


def test_reclaim_makes_only_started_work_unusable_past_max_attempts(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders", retry=iqbridge.RetryPolicy(max_attempts=1))
    q.subscribe("a")
    started, waiting = q.put_many([1, 2])
    d, _ = q.get_many("a", 2)
    d.in_process()  # it may be what made the holder crash; the other never started
    q.reclaim("a")
    view = q.state(started).subscribers["a"]
    assert view.state is S.JOURNALLED and view.history[-2][0] is S.UNUSABLE
    assert q.state(waiting).subscribers["a"].state is S.AVAILABLE


def test_reclaim_in_a_pool_gives_back_the_member_s_holds(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    q.subscribe_pool("workers", ["w1", "w2"])
    q.put_many([1, 2])
    assert len(q.get_many("w1", 2)) == 2
    assert len(q.reclaim("w1")) == 2
    assert len(q.get_many("w2", 2)) == 2


def test_put_each_keeps_each_message_s_options(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    q.subscribe("a")
    ids = q.put_each(
        [
            Outgoing(
                {"n": 1}, ordering_key="k1", correlation_id="c1", priority=7, headers={"h": "1"}
            ),
            Outgoing(b"raw", ordering_key="k2", parents=["p0"], publisher="other"),
            Outgoing("text", msg_id=None),
        ]
    )
    got = {d.msg_id: d for d in q.get_many("a", 3)}
    first, second, third = (got[i] for i in ids)
    assert (first.payload, first.ordering_key, first.correlation_id, first.priority) == (
        {"n": 1},
        "k1",
        "c1",
        7,
    )
    assert first.headers == {"h": "1"}
    assert (second.payload, second.parents, second.publisher) == (b"raw", ("p0",), "other")
    assert third.payload == "text"
    assert q.put_each([]) == []


def test_put_each_with_ids_is_idempotent_and_checks_its_input(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    q.subscribe("a")
    batch = [Outgoing(i, msg_id=f"m-{i}", ordering_key="k") for i in range(3)]
    assert q.put_each(batch) == ["m-0", "m-1", "m-2"]
    assert q.put_each([*batch, Outgoing(3, msg_id="m-3", ordering_key="k")])[-1] == "m-3"
    assert [d.payload for d in q.get_many("a", 10)] == [0, 1, 2, 3]
    with pytest.raises(InvalidArgument, match="every message of a put_each a msg_id, or none"):
        q.put_each([Outgoing(1, msg_id="x"), Outgoing(2)])
    with pytest.raises(InvalidArgument, match="takes Outgoing messages"):
        q.put_each([1])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="priority"):
        q.put_each([Outgoing(1, priority=10)])
    with pytest.raises(InvalidArgument, match="parents"):
        q.put_each([Outgoing(1, parents=[3])])  # type: ignore[list-item]
