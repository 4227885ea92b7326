"""The ordered parallel worker (seed 004): many threads, every ordering key in put order.

Each test drives a real store (the embedded SQLite queue, and memory:// where cheap) and
checks the outcome both in what the handler saw and in what the index recorded.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import iqbridge
from iqbridge import Delivery, JournalEntry, RetryPolicy, SubscriberState
from iqbridge.worker import Worker, WorkerStats
from tests.conftest import FakeClock

S = SubscriberState
SUB = "w"


# --- helpers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One handler call: which message, when, on which thread, on which try."""

    key: str
    seq: int
    start: float
    end: float
    thread: int
    attempt: int


class Recorder:
    """A handler that records every call under a lock; ``work`` seconds per call (a
    callable of the payload, or a constant), ``fail`` decides whether a call raises."""

    def __init__(
        self,
        work: float | Callable[[dict[str, object]], float] = 0.0,
        fail: Callable[[dict[str, object], int], bool] | None = None,
    ) -> None:
        self.work = work
        self.fail = fail
        self.lock = threading.Lock()
        self.calls: list[Call] = []

    def __call__(self, delivery: Delivery) -> None:
        payload = delivery.payload
        start = time.perf_counter()
        pause = self.work(payload) if callable(self.work) else self.work
        if pause:
            time.sleep(pause)
        failing = self.fail is not None and self.fail(payload, delivery.attempt)
        end = time.perf_counter()
        with self.lock:
            self.calls.append(
                Call(
                    payload["key"],
                    payload["seq"],
                    start,
                    end,
                    threading.get_ident(),
                    delivery.attempt,
                )
            )
        if failing:
            raise RuntimeError(f"refused {payload['key']}#{payload['seq']}")

    def by_key(self) -> dict[str, list[Call]]:
        out: dict[str, list[Call]] = defaultdict(list)
        for call in sorted(self.calls, key=lambda c: c.start):
            out[call.key].append(call)
        return out


def inversions(calls_by_key: dict[str, list[Call]]) -> int:
    """Calls that broke their key's order: a sequence number not above the previous call's
    (a retry of the same message excepted), or a start before the previous call ended."""
    bad = 0
    for calls in calls_by_key.values():
        for prev, cur in itertools.pairwise(calls):
            overtaken = cur.seq < prev.seq or cur.start < prev.end
            repeated = cur.seq == prev.seq and cur.attempt <= prev.attempt
            bad += overtaken or repeated
    return bad


def max_concurrency(calls: list[Call]) -> int:
    events = sorted([(c.start, 1) for c in calls] + [(c.end, -1) for c in calls])
    level = peak = 0
    for _, step in events:  # at equal times an end (-1) sorts before a start
        level += step
        peak = max(peak, level)
    return peak


def put_interleaved(
    queue: iqbridge.Queue, keys: list[str], per_key: int, chunk: int = 10
) -> list[str]:
    """Put ``per_key`` messages for every key, keys interleaved in chunks of ``chunk``."""
    ids: list[str] = []
    for first in range(0, per_key, chunk):
        for key in keys:
            payloads = [{"key": key, "seq": s} for s in range(first, min(first + chunk, per_key))]
            ids.extend(queue.put_many(payloads, to=[SUB], ordering_key=key))
    return ids


def whole_journal(hub: iqbridge.Hub) -> list[JournalEntry]:
    entries: list[JournalEntry] = []
    after = 0
    while batch := hub.journal(after=after, limit=20_000):
        entries.extend(batch)
        after = batch[-1].seq or 0
    return entries


def sub_moves(hub: iqbridge.Hub) -> dict[str, list[str]]:
    """Every subscriber state each message went through, in order."""
    moves: dict[str, list[str]] = defaultdict(list)
    for e in whole_journal(hub):
        if e.actor == SUB:
            moves[e.msg_id].append(e.dst)
    return moves


ONCE = ["AVAILABLE", "GET", "FETCHED", "IN_PROCESS", "DONE", "JOURNALLED"]


@pytest.fixture(params=["sqlite", "memory"])
def any_hub(request: pytest.FixtureRequest, sqlite_url: str) -> Iterator[iqbridge.Hub]:
    url = sqlite_url if request.param == "sqlite" else "memory://"
    with iqbridge.connect(url) as hub:
        yield hub


@pytest.fixture
def quick_hub(sqlite_url: str) -> Iterator[iqbridge.Hub]:
    """The SQLite queue without an fsync per commit (``synchronous=normal``): these tests
    measure the worker's ordering and parallelism, not the disk, which other jobs on a
    shared machine make slow and erratic."""
    with iqbridge.connect(sqlite_url + "?synchronous=normal") as hub:
        yield hub


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


# --- 1. the acceptance test ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_eight_threads_fifty_keys_ten_thousand_messages_in_order(
    quick_hub: iqbridge.Hub,
) -> None:
    hub = quick_hub
    queue = hub.queue("orders")
    keys = [f"k{i}" for i in range(50)]
    ids = put_interleaved(queue, keys, per_key=200)
    assert len(ids) == 10_000
    handler = Recorder(work=0.0005)

    stats = Worker(queue, SUB, handler, threads=8).run(until_idle=1.0)

    calls = handler.calls
    by_key = handler.by_key()
    assert Counter((c.key, c.seq) for c in calls) == Counter(
        {(k, s): 1 for k in keys for s in range(200)}
    )
    bad = inversions(by_key)
    peak = max_concurrency(calls)
    threads = {c.thread for c in calls}
    span = max(c.end for c in calls) - min(c.start for c in calls)
    print(
        f"\n[worker acceptance] {len(calls)} messages, 50 keys, 8 threads, SQLite "
        f"synchronous=normal: "
        f"{len(calls) / span:.0f} msg/s over {span:.2f} s, inversions {bad}, "
        f"max concurrency {peak}, threads used {len(threads)}"
    )
    assert bad == 0
    for key, kcalls in by_key.items():
        assert [c.seq for c in kcalls] == list(range(200)), key
    assert len(threads) > 1
    assert peak > 1
    assert (stats.processed, stats.done, stats.unusable, stats.lost) == (10_000, 10_000, 0, 0)
    assert (stats.held, stats.in_flight) == (0, 0)
    # The index agrees: every message went through DONE exactly once, nothing left over.
    moves = sub_moves(hub)
    assert set(moves) == set(ids)
    assert all(path == ONCE for path in moves.values())
    finished = queue.search(state=S.JOURNALLED, subscriber=SUB, limit=20_000)
    assert len(finished) == 10_000
    for state in (S.AVAILABLE, S.GET, S.FETCHED, S.IN_PROCESS, S.DONE, S.UNUSABLE):
        assert queue.search(state=state, subscriber=SUB, limit=10) == [], state


def test_many_keys_in_order_on_memory_broker() -> None:
    with iqbridge.connect("memory://") as hub:
        queue = hub.queue("orders")
        keys = [f"k{i}" for i in range(20)]
        ids = put_interleaved(queue, keys, per_key=50, chunk=5)
        handler = Recorder(work=0.0005)
        stats = Worker(queue, SUB, handler, threads=6).run(until_idle=0.5)
        assert stats.done == len(ids) == 1000
        assert inversions(handler.by_key()) == 0
        assert max_concurrency(handler.calls) > 1
        assert all(path == ONCE for path in sub_moves(hub).values())


def test_the_worker_claims_in_batches_and_keeps_every_key_in_order(
    any_hub: iqbridge.Hub,
) -> None:
    queue = any_hub.queue("batched")
    ids = put_interleaved(queue, [f"k{i}" for i in range(8)], per_key=25, chunk=5)
    sizes: list[int] = []
    get_many = queue.get_many

    def recording(*args: Any, **kw: Any) -> Any:
        batch = get_many(*args, **kw)
        sizes.append(len(batch))
        return batch

    queue.get_many = recording  # type: ignore[method-assign]
    handler = Recorder()
    stats = Worker(queue, SUB, handler, threads=4, batch=10).run(until_idle=0.5)
    assert stats.done == len(ids) == 200
    assert max(sizes) == 10
    assert sum(sizes) == 200
    assert len([n for n in sizes if n]) < 200 / 2  # far fewer claims than messages
    assert inversions(handler.by_key()) == 0
    assert all(path == ONCE for path in sub_moves(any_hub).values())


# --- 2. a slow key does not stall the others -------------------------------------------


def test_slow_key_does_not_stall_fast_keys(quick_hub: iqbridge.Hub) -> None:
    hub = quick_hub
    fast_keys = [f"f{i}" for i in range(10)]
    slow_pause = 0.0

    def work(payload: dict[str, object]) -> float:
        return slow_pause if payload["key"] == "slow" else 0.0

    def consume(keys: list[str]) -> Recorder:
        queue = hub.queue(f"q{len(keys)}")
        put_interleaved(queue, keys, per_key=30, chunk=3)
        handler = Recorder(work=work)
        with Worker(queue, SUB, handler, threads=4, poll=0.05) as worker:
            wait_for(lambda: len(handler.calls) == 30 * len(keys), timeout=60)
        assert worker.stats.done == 30 * len(keys)
        return handler

    def fast_end(handler: Recorder) -> float:
        begin = min(c.start for c in handler.calls)
        return max(c.end for c in handler.calls if c.key != "slow") - begin

    # Baseline: the fast keys alone, timed from the first handler call. The slow key is
    # then made to need at least three times that (and 1.2 s), so the comparison holds
    # however loaded this machine is.
    baseline = fast_end(consume(fast_keys))
    slow_pause = max(0.04, 3 * baseline / 30)
    # The slow key's messages are spread through the queue, its first ones at the front.
    handler = consume(["slow", *fast_keys])
    begin = min(c.start for c in handler.calls)
    slow_calls = handler.by_key()["slow"]
    fast_elapsed = fast_end(handler)
    slow_elapsed = slow_calls[-1].end - begin
    slow_done_before = sum(1 for c in slow_calls if c.end <= begin + fast_elapsed)
    bad = inversions(handler.by_key())
    print(
        f"\n[worker slow key] 300 fast messages alone: {baseline:.3f} s; with a slow key "
        f"(30 x {slow_pause * 1000:.0f} ms): fast keys done at {fast_elapsed:.3f} s, slow "
        f"key at {slow_elapsed:.3f} s, {slow_done_before}/30 slow messages done when the "
        f"fast keys were; inversions {bad}; max concurrency {max_concurrency(handler.calls)}"
    )
    assert bad == 0
    assert [c.seq for c in slow_calls] == list(range(30))
    # In series the slow key needs 30 x slow_pause >= 3 x baseline. The fast keys are done
    # while most of its backlog still waits, and not much later than without it.
    assert slow_elapsed >= 30 * slow_pause
    assert fast_elapsed < slow_elapsed - baseline
    assert slow_done_before < 20
    assert fast_elapsed < 2 * baseline + 0.5


def test_held_messages_are_capped(hub: iqbridge.Hub) -> None:
    queue = hub.queue("capped")
    put_interleaved(queue, ["slow"], per_key=12)
    put_interleaved(queue, ["fast"], per_key=5)
    seen: list[int] = []
    worker: Worker | None = None

    def handler(delivery: Delivery) -> None:
        assert worker is not None
        seen.append(worker.stats.held)
        time.sleep(0.01)

    worker = Worker(queue, SUB, handler, threads=3, max_held=4, poll=0.05)
    stats = worker.run(until_idle=0.3)
    assert stats.done == 17
    assert max(seen) <= 4
    assert max(seen) >= 2  # the cap was actually reached for, not trivially respected


# --- 3. retry in place keeps order -----------------------------------------------------


def test_retry_in_place_keeps_key_order_and_gives_up_as_unusable(any_hub: iqbridge.Hub) -> None:
    queue = any_hub.queue("retry", retry=RetryPolicy(max_attempts=4, initial_delay=0.01))
    flaky = queue.put_many([{"key": "flaky", "seq": s} for s in range(5)], to=[SUB],
                           ordering_key="flaky")  # fmt: skip
    poison = queue.put_many([{"key": "poison", "seq": s} for s in range(4)], to=[SUB],
                            ordering_key="poison")  # fmt: skip

    def fail(payload: dict[str, object], attempt: int) -> bool:
        if payload["key"] == "flaky":
            return payload["seq"] == 1 and attempt <= 2
        return payload["seq"] == 1  # poison #1 always fails

    handler = Recorder(fail=fail)
    stats = Worker(queue, SUB, handler, threads=4, poll=0.05).run(until_idle=0.5)

    by_key = handler.by_key()
    assert inversions(by_key) == 0
    assert [(c.seq, c.attempt) for c in by_key["flaky"]] == [
        (0, 1), (1, 1), (1, 2), (1, 3), (2, 1), (3, 1), (4, 1),
    ]  # fmt: skip
    assert [(c.seq, c.attempt) for c in by_key["poison"]] == [
        (0, 1), (1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (3, 1),
    ]  # fmt: skip
    assert (stats.done, stats.unusable, stats.retried, stats.lost) == (8, 1, 5, 0)

    moves = sub_moves(any_hub)
    # Retried in place: never released, so no second GET and no later message overtook.
    assert moves[flaky[1]] == ONCE
    assert queue.state(flaky[1]).subscribers[SUB].attempt == 1
    bad = queue.state(poison[1]).subscribers[SUB]
    assert moves[poison[1]] == ["AVAILABLE", "GET", "FETCHED", "IN_PROCESS", "UNUSABLE",
                                "JOURNALLED"]  # fmt: skip
    assert bad.reason == "RuntimeError: refused poison#1 (gave up after 4 tries)"
    assert all(moves[m] == ONCE for m in [*flaky, *poison] if m != poison[1])


def test_permanent_error_is_unusable_at_once(hub: iqbridge.Hub) -> None:
    queue = hub.queue("perm", retry=RetryPolicy(initial_delay=0.01))
    msg_id = queue.put(b"\xff not json", to=[SUB], content_type="application/json")
    queue.put({"key": "k", "seq": 0}, to=[SUB])
    calls: list[str] = []

    def handler(delivery: Delivery) -> None:
        calls.append(delivery.msg_id)
        _ = delivery.payload  # PayloadError for the first: retrying cannot help

    stats = Worker(queue, SUB, handler, threads=2, poll=0.05).run(until_idle=0.3)
    assert (stats.done, stats.unusable, stats.retried) == (1, 1, 0)
    assert calls.count(msg_id) == 1
    view = queue.state(msg_id).subscribers[SUB]
    assert view.reason is not None
    assert view.reason.startswith("PayloadError")
    assert view.reason.endswith("(gave up after 1 try)")


# --- 4. leases of held messages are renewed --------------------------------------------


def test_held_backlog_keeps_its_lease(hub: iqbridge.Hub) -> None:
    queue = hub.queue("leases", sweep_interval=0.1)
    ids = queue.put_many([{"key": "k", "seq": s} for s in range(8)], to=[SUB], ordering_key="k")
    handler = Recorder(work=0.25)
    with Worker(queue, SUB, handler, threads=3, lease=1.0, poll=0.05) as worker:
        wait_for(lambda: len(handler.calls) == 8, timeout=30)
    assert worker.stats.held == 0
    calls = handler.calls
    # The last message was fetched at once and waited ~1.75 s > lease for its turn.
    assert calls[-1].start - calls[0].start > 1.5
    assert [c.seq for c in calls] == list(range(8))
    assert worker.stats.lost == 0
    assert worker.stats.done == 8
    moves = sub_moves(hub)
    assert all(moves[m] == ONCE for m in ids)  # never reclaimed, never fetched twice


def test_lease_lost_is_counted_and_the_worker_goes_on(sqlite_url: str, clock: FakeClock) -> None:
    with iqbridge.connect(sqlite_url, clock=clock) as hub:
        queue = hub.queue("lost", lease=30.0)
        first = queue.put({"key": "k", "seq": 0}, to=[SUB], ordering_key="k")
        queue.put_many([{"key": "o", "seq": s} for s in range(3)], to=[SUB], ordering_key="o")
        attempts: list[int] = []

        def handler(delivery: Delivery) -> None:
            if delivery.msg_id == first:
                attempts.append(delivery.attempt)
                if delivery.attempt == 1:
                    clock.advance(60)  # the lease lapses and recovery takes it back
                    queue.recover()

        # One message claimed per fetch, so only the first is held when its lease lapses
        # (a batch would hold the others too: see the next test).
        worker = Worker(queue, SUB, handler, threads=2, poll=0.05, batch=1)
        stats = worker.run(until_idle=0.5)
        assert attempts == [1, 2]
        assert (stats.lost, stats.done) == (1, 4)
        view = queue.state(first).subscribers[SUB]
        assert view.state is S.JOURNALLED
        assert view.attempt == 2


def test_a_lapsed_batch_comes_back_and_nothing_is_done_twice(
    sqlite_url: str, clock: FakeClock
) -> None:
    with iqbridge.connect(sqlite_url, clock=clock) as hub:
        queue = hub.queue("lost-batch", lease=30.0)
        first = queue.put({"key": "k", "seq": 0}, to=[SUB], ordering_key="k")
        others = queue.put_many(
            [{"key": "o", "seq": s} for s in range(5)], to=[SUB], ordering_key="o"
        )
        seen: list[tuple[str, int]] = []

        def handler(delivery: Delivery) -> None:
            seen.append((delivery.msg_id, delivery.attempt))
            if delivery.msg_id == first and delivery.attempt == 1:
                clock.advance(60)  # every lease of the batch lapses at once
                queue.recover()

        stats = Worker(queue, SUB, handler, threads=2, poll=0.05, batch=8).run(until_idle=0.5)
        assert stats.done == 6
        assert stats.lost >= 1
        for msg_id in (first, *others):
            state = queue.state(msg_id)
            assert sum(1 for e in state.journal if e.actor == SUB and e.dst == "DONE") == 1
            assert state.subscribers[SUB].state is S.JOURNALLED
        # Every message of key "o" was handled (its DONE is counted above). Their order is
        # not asserted: after lapsed leases the redeliveries race the worker's dropping of
        # the lost ones, and a lost lease may reorder a key (the Worker's documented
        # guarantee); asserting it failed 8 runs in 20 on this machine.
        assert {m for m, _ in seen} >= set(others)


# --- 5. stopping -------------------------------------------------------------------------


def test_stop_without_drain_gives_waiting_messages_back(any_hub: iqbridge.Hub) -> None:
    queue = any_hub.queue("stop")
    ids = queue.put_many([{"key": "k", "seq": s} for s in range(10)], to=[SUB], ordering_key="k")
    gate = threading.Event()
    started = threading.Event()

    def hold_first(payload: dict[str, object]) -> float:
        started.set()
        gate.wait(10)
        return 0.0

    handler = Recorder(work=hold_first)
    worker = Worker(queue, SUB, handler, threads=2, poll=0.05)
    worker.start()
    wait_for(lambda: started.is_set() and worker.stats.held == 10)
    stopper = threading.Thread(target=worker.stop, kwargs={"drain": False})
    stopper.start()
    time.sleep(0.2)
    assert stopper.is_alive()  # the message in process is finished first
    gate.set()
    stopper.join(10)
    assert not stopper.is_alive()

    assert [c.seq for c in handler.calls] == [0]
    assert worker.stats.done == 1
    assert worker.stats.held == 0
    assert queue.state(ids[0]).subscribers[SUB].state is S.JOURNALLED
    for msg_id in ids[1:]:
        view = queue.state(msg_id).subscribers[SUB]
        assert (view.state, view.attempt, view.reason) == (S.AVAILABLE, 2, "worker stopping")
    # Whoever gets them next gets them in order.
    got = []
    while (d := queue.get(SUB)) is not None:
        got.append(d.payload["seq"])
        d.done()
    assert got == list(range(1, 10))


def test_stop_with_drain_finishes_held_and_fetches_no_more(hub: iqbridge.Hub) -> None:
    queue = hub.queue("drain")
    queue.put_many([{"key": "k", "seq": s} for s in range(6)], to=[SUB], ordering_key="k")
    handler = Recorder(work=0.05)
    worker = Worker(queue, SUB, handler, threads=2, poll=0.05)
    worker.start()
    wait_for(lambda: worker.stats.held == 6)
    worker.stop(drain=True)
    later = queue.put({"key": "k", "seq": 6}, to=[SUB], ordering_key="k")
    time.sleep(0.1)
    assert [c.seq for c in handler.calls] == list(range(6))
    assert worker.stats.done == 6
    assert queue.state(later).subscribers[SUB].state is S.AVAILABLE
    with pytest.raises(RuntimeError):
        worker.start()


def test_a_block_ended_by_an_exception_stops_without_draining(hub: iqbridge.Hub) -> None:
    """Ctrl-C inside ``with Worker(...)``: what is in process finishes, the backlog goes
    back at once instead of being worked through first."""
    queue = hub.queue("interrupted")
    queue.put_many([{"key": "k", "seq": s} for s in range(20)], to=[SUB], ordering_key="k")
    started = threading.Event()

    def slow(payload: dict[str, object]) -> float:
        started.set()
        return 0.3

    handler = Recorder(work=slow)
    begin = time.monotonic()
    with pytest.raises(KeyboardInterrupt), Worker(queue, SUB, handler, threads=2, poll=0.05) as w:
        wait_for(lambda: started.is_set() and w.stats.held == 20)
        begin = time.monotonic()
        raise KeyboardInterrupt
    assert time.monotonic() - begin < 3
    assert [c.seq for c in handler.calls] == [0]
    stats = w.stats
    assert (stats.done, stats.released, stats.held) == (1, 19, 0)
    back = queue.search(state=S.AVAILABLE, subscriber=SUB, limit=100)
    assert len(back) == 19


@pytest.mark.parametrize("failures", [2, 100], ids=["index-back-soon", "index-gone"])
def test_giving_back_survives_an_unreachable_index(
    hub: iqbridge.Hub, monkeypatch: pytest.MonkeyPatch, failures: int
) -> None:
    """The give-back commit is retried while the index is briefly away; if it stays
    away, the worker still stops and the messages, FETCHED under their lease, come back
    when it runs out: nothing is lost either way."""
    queue = hub.queue("unreachable", lease=0.5)
    ids = queue.put_many([{"key": "k", "seq": s} for s in range(10)], to=[SUB], ordering_key="k")
    started, gate = threading.Event(), threading.Event()

    def hold(payload: dict[str, object]) -> float:
        started.set()
        gate.wait(10)
        return 0.0

    worker = Worker(queue, SUB, Recorder(work=hold), threads=2, poll=0.05)
    worker.start()
    wait_for(lambda: started.is_set() and worker.stats.held == 10)
    real, calls = queue._settling.settle_many, []

    def flaky(moves: Any, transaction: object = None, partial: bool = False) -> Any:
        calls.append(len(moves))
        if len(calls) <= failures:
            raise iqbridge.IndexUnavailable("the index went away")
        return real(moves, transaction, partial)

    monkeypatch.setattr(queue._settling, "settle_many", flaky)
    worker.request_stop(drain=False)
    gate.set()
    worker.stop(timeout=10)
    monkeypatch.undo()
    stats = worker.stats
    assert (stats.done, stats.held) == (1, 0)
    waiting = [S.FETCHED] if failures > 2 else [S.AVAILABLE]
    assert {queue.state(m).subscribers[SUB].state for m in ids[1:]} == set(waiting)
    assert stats.released == (9 if failures == 2 else 0)
    time.sleep(0.6)
    queue.recover()
    assert {queue.state(m).subscribers[SUB].state for m in ids[1:]} == {S.AVAILABLE}


def test_run_stops_after_max_messages(any_hub: iqbridge.Hub) -> None:
    queue = any_hub.queue("count")
    put_interleaved(queue, ["a", "b", "c"], per_key=10)
    handler = Recorder()
    stats = Worker(queue, SUB, handler, threads=3, poll=0.05).run(max_messages=7)
    assert isinstance(stats, WorkerStats)
    assert stats.processed == stats.done == len(handler.calls) == 7
    assert stats.elapsed > 0
    assert stats.started_at is not None
    assert len(queue.search(state=S.AVAILABLE, subscriber=SUB, limit=100)) == 23


def test_run_stops_when_stopped_from_another_thread(hub: iqbridge.Hub) -> None:
    queue = hub.queue("remote")
    worker = Worker(queue, SUB, Recorder(), threads=2, poll=0.05)
    threading.Timer(0.2, worker.stop).start()
    begin = time.monotonic()
    stats = worker.run()
    assert time.monotonic() - begin < 5
    assert stats.processed == 0


def test_handler_may_finish_the_delivery_itself(hub: iqbridge.Hub) -> None:
    queue = hub.queue("self")
    msg_id = queue.put({"key": "k", "seq": 0}, to=[SUB])

    def handler(delivery: Delivery) -> None:
        delivery.unusable("not for us")

    stats = Worker(queue, SUB, handler, threads=1, poll=0.05).run(until_idle=0.2)
    assert (stats.processed, stats.done, stats.unusable, stats.lost) == (1, 0, 0, 0)
    assert queue.state(msg_id).subscribers[SUB].reason == "not for us"


def test_bad_arguments_are_refused(hub: iqbridge.Hub) -> None:
    queue = hub.queue("args")
    for kwargs in ({"threads": 0}, {"lease": 0.0}, {"poll": 0.0}, {"max_held": 0}):
        with pytest.raises(iqbridge.InvalidArgument):
            Worker(queue, SUB, Recorder(), **kwargs)


class Fatal(BaseException):
    """Not an Exception: a handler raising it ends the worker, it is not retried."""


def test_fatal_handler_error_stops_the_worker_and_gives_messages_back(
    hub: iqbridge.Hub,
) -> None:
    queue = hub.queue("fatal", retry=RetryPolicy(initial_delay=0.01))
    ids = queue.put_many([{"key": "k", "seq": s} for s in range(5)], to=[SUB], ordering_key="k")

    def handler(delivery: Delivery) -> None:
        if delivery.payload["seq"] == 2:
            raise Fatal("stop everything")

    worker = Worker(queue, SUB, handler, threads=2, poll=0.05)
    with pytest.raises(Fatal):
        worker.run()
    states = [queue.state(m).subscribers[SUB] for m in ids]
    assert [v.state for v in states] == [S.JOURNALLED] * 2 + [S.AVAILABLE] * 3
    assert states[2].reason == "worker stopping"
    assert worker.stats.held == 0
