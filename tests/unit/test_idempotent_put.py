"""Queue.put(msg_id=...) / put_many(msg_ids=...): a put the caller may repeat.

The transactional outbox's relay repeats a put after a crash; the index must never get
a second record, and a payload the broker never got must be sent by the repeat."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import iqbridge
from iqbridge import Pool, PublisherState, SubscriberState
from iqbridge.errors import BrokerUnavailable, IndexUnavailable, InvalidArgument
from iqbridge.ids import new_id
from iqbridge.model import Envelope
from iqbridge.states import ActorKind


@pytest.fixture(params=["sqlite", "memory"])
def hub(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[iqbridge.Hub]:
    url = f"sqlite:///{tmp_path / 'q.db'}" if request.param == "sqlite" else "memory://"
    with iqbridge.connect(url) as h:
        yield h


def publisher_moves(q: iqbridge.Queue, msg_id: str) -> list[tuple[str | None, str]]:
    return [(e.src, e.dst) for e in q.state(msg_id).journal if e.actor_kind is ActorKind.PUBLISHER]


def drain(q: iqbridge.Queue, subscriber: str) -> list[object]:
    got = []
    while (d := q.get(subscriber)) is not None:
        with d:
            got.append(d.payload)
    return got


def test_a_repeated_put_keeps_one_record(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    ids = [new_id() for _ in range(3)]
    assert q.put_many(["a", "b", "c"], to=["s"], msg_ids=ids) == ids
    # The repeat carries one new message too: only that one is created.
    extra = new_id()
    assert q.put_many(["a", "b", "c", "d"], to=["s"], msg_ids=[*ids, extra]) == [*ids, extra]
    assert q.put("a", to=["s"], msg_id=ids[0]) == ids[0]
    assert [m.msg_id for m in q.search()] == [*ids, extra]
    for msg_id in ids:
        assert publisher_moves(q, msg_id) == [(None, "PUT"), ("PUT", "REVEALED")]
    assert drain(q, "s") == ["a", "b", "c", "d"]


def test_a_repeat_after_delivery_changes_nothing(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    msg_id = q.put({"n": 1}, to=["s", Pool("p", ["p1", "p2"])], msg_id=new_id())
    assert drain(q, "s") == [{"n": 1}]
    assert drain(q, "p2") == [{"n": 1}]
    before = q.state(msg_id)
    q.put({"n": 1}, to=["s", Pool("p", ["p1", "p2"])], msg_id=msg_id)
    assert q.state(msg_id) == before
    assert before.publisher_state is PublisherState.JOURNALLED
    assert drain(q, "s") == drain(q, "p1") == []


@pytest.mark.parametrize(
    ("ids", "why"),
    [
        (["x y"], "without whitespace"),
        (["a/b"], "'/'"),
        ([""], "1 to 128"),
        (["x" * 129], "1 to 128"),
        ([7], "must be a string"),
        (["same", "same"], "distinct"),
        (["one", "two", "three"], "got 3 msg_ids for 2 payloads"),
    ],
)
def test_bad_msg_ids_are_refused(hub: iqbridge.Hub, ids: list[object], why: str) -> None:
    q = hub.queue("orders")
    payloads = ["a", "b"] if len(ids) != 1 else ["a"]
    with pytest.raises(InvalidArgument, match=why):
        q.put_many(payloads, to=["s"], msg_ids=ids)  # type: ignore[arg-type]
    assert q.search() == []


def test_a_msg_id_of_another_queue_is_refused(hub: iqbridge.Hub) -> None:
    msg_id = hub.queue("one").put("x", to=["s"], msg_id=new_id())
    with pytest.raises(InvalidArgument, match="already names a message of queue 'one'"):
        hub.queue("two").put("x", to=["s"], msg_id=msg_id)
    assert hub.queue("two").search() == []


def fail_once(obj: object, name: str, exc: Exception) -> list[int]:
    """Make ``obj.name`` raise ``exc`` on its first call only; count the calls."""
    real: Callable[..., object] = getattr(obj, name)
    calls = [0]

    def wrapper(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        if calls[0] == 1:
            raise exc
        return real(*args, **kwargs)

    setattr(obj, name, wrapper)
    return calls


def test_a_broker_failure_leaves_the_record_for_the_repeat() -> None:
    # A plain put withdraws a message the broker refused; an idempotent one keeps its
    # record (REVEALED, no broker entry yet) so that the repeat can finish it.
    with iqbridge.connect("memory://") as hub:
        q = hub.queue("orders")
        msg_id = new_id()
        fail_once(hub.adapter, "send", BrokerUnavailable("broker down"))
        with pytest.raises(BrokerUnavailable):
            q.put("x", to=["s"], msg_id=msg_id)
        rec = hub.store.load(msg_id)
        assert rec.publisher_state is PublisherState.REVEALED and rec.native_ref is None
        assert q.get("s") is None  # nothing on the broker yet
        q.put("x", to=["s"], msg_id=msg_id)
        assert hub.store.load(msg_id).native_ref is not None
        assert drain(q, "s") == ["x"]


def test_an_id_created_between_the_read_and_the_commit_is_settled_as_a_repeat() -> None:
    # The usual case reads the ids first (none known), then commits the records as a
    # batch; another putter creating one of them in between makes the batch commit only
    # the others, and the put then goes on as a repeat: every message once in the index
    # and once on the broker, the one created meanwhile not sent again.
    with iqbridge.connect("memory://") as hub:
        q = hub.queue("orders")
        theirs, mine = new_id(), new_id()
        q.put("theirs", to=["s"], msg_id=theirs)
        store = hub.store
        real = store.load_many
        reads: list[list[str]] = []

        def stale_read(ids: list[str]) -> dict[str, object]:
            reads.append(list(ids))
            return {} if len(reads) == 1 else real(ids)  # the first read, before theirs

        store.load_many = stale_read  # type: ignore[method-assign,assignment]
        send = hub.adapter.send
        sent: list[list[str]] = []

        def counting(queue: str, envelopes: list[Envelope]) -> list[str]:
            sent.append([e.msg_id for e in envelopes])
            return send(queue, envelopes)

        hub.adapter.send = counting  # type: ignore[method-assign]
        assert hub.colocated is None  # the index apart from the broker
        q.put_many(["theirs again", "mine"], to=["s"], msg_ids=[theirs, mine])
        store.load_many = real  # type: ignore[method-assign]
        assert reads == [[theirs, mine]] * 2  # the batch's read, then the repeat's
        assert sent == [[mine]]  # theirs is not sent again
        assert sorted(drain(q, "s")) == ["mine", "theirs"]
        assert [r.msg_id for r in q.search()] == [theirs, mine]


def test_a_repeat_reads_the_index_once_and_writes_nothing_it_has() -> None:
    # On an index apart from the broker: the put's one read finds the ids, and the
    # repeat goes on from it (no second read, no commit bound to fail on a taken id).
    with iqbridge.connect("memory://") as hub:
        q = hub.queue("orders")
        ids = q.put_many(["a", "b"], to=["s"], msg_ids=[new_id(), new_id()])
        store = hub.store
        calls: dict[str, int] = {"load_many": 0, "commit_many": 0, "commit_writes": 0}
        for name in calls:
            real = getattr(store, name)

            def counted(*args: object, _name: str = name, _real: object = real) -> object:
                calls[_name] += 1
                return _real(*args)  # type: ignore[operator]

            setattr(store, name, counted)
        assert q.put_many(["a", "b"], to=["s"], msg_ids=ids) == ids
        assert calls == {"load_many": 1, "commit_many": 0, "commit_writes": 0}
        assert sorted(drain(q, "s")) == ["a", "b"]


def test_a_plain_put_refused_by_the_broker_is_still_withdrawn() -> None:
    with iqbridge.connect("memory://") as hub:
        q = hub.queue("orders")
        fail_once(hub.adapter, "send", BrokerUnavailable("broker down"))
        with pytest.raises(BrokerUnavailable):
            q.put("x", to=["s"])
        [summary] = q.search()
        assert summary.publisher_state is not PublisherState.REVEALED


def test_a_lost_native_ref_gives_a_second_broker_entry_delivered_once() -> None:
    """The crash the relay cannot rule out: the broker took the entry, the index never
    learnt where. The repeat sends a second entry; every subscriber still gets the
    message once, and both entries end acknowledged."""
    with iqbridge.connect("memory://") as hub:
        q = hub.queue("orders", lease=0.2)
        to = ["a", "b", Pool("p", ["p1", "p2"])]
        msg_id = new_id()
        fail_once(hub.store, "set_native_refs", IndexUnavailable("index went away"))
        with pytest.raises(IndexUnavailable):
            q.put({"n": 1}, to=to, msg_id=msg_id)
        q.put({"n": 1}, to=to, msg_id=msg_id)
        broker = hub.adapter.broker  # type: ignore[attr-defined]
        assert len(broker.queues["orders"].log) == 2
        # p1 holds it through one entry; p2, reading the other, must not get it too.
        held = q.get("p1")
        assert held is not None and held.msg_id == msg_id
        assert q.get("p2") is None
        held.done()
        got = {s: drain(q, s) for s in ("a", "b", "p1", "p2")}
        assert got == {"a": [{"n": 1}], "b": [{"n": 1}], "p1": [], "p2": []}
        state = q.state(msg_id)
        assert state.publisher_state is PublisherState.JOURNALLED
        assert state.subscribers["p2"].state is SubscriberState.JOURNALLED
        # The second entry is acknowledged once read again (after the pending idle time).
        time.sleep(0.25)
        for s in ("a", "b", "p1", "p2"):
            assert drain(q, s) == []
        for group in ("a", "b", "p"):
            assert hub.adapter.pending("orders", group) == {}  # type: ignore[attr-defined]


def test_an_entry_read_before_its_reference_was_recorded_is_acknowledged(
    tmp_path: Path,
) -> None:
    # The putter sent the entry but has not recorded where (or died first): the consumer
    # records it, and its done() acknowledges that entry. (A broker with an index of its
    # own kind, as Redis Streams with the Redis index: the memory store would fill the
    # reference in by itself.)
    with iqbridge.connect("memory://", index=f"sqlite:///{tmp_path / 'index.db'}") as hub:
        q = hub.queue("orders")
        fail_once(hub.store, "set_native_refs", IndexUnavailable("not yet"))
        with pytest.raises(IndexUnavailable):
            q.put("x", to=["s", Pool("p", ["p1", "p2"])], msg_id=new_id())
        assert drain(q, "s") == ["x"]
        assert drain(q, "p2") == ["x"]
        for group in ("s", "p"):
            assert hub.adapter.pending("orders", group) == {}  # type: ignore[attr-defined]
