"""Consumers killed with SIGKILL mid-processing: their messages come back, nothing is lost,
nothing is done twice, and a message that kills every consumer ends UNUSABLE.

Real processes on the embedded SQLite queue, real SIGKILL, real lease expiry (1.5 s).
Processes report through files (see mp_consumers); every wait has a deadline.
"""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import pytest
from mp_consumers import Consumer, consumers

import iqbridge
from iqbridge import Pool, PublisherState, RetryPolicy, SubscriberState

S = SubscriberState
LEASE = 1.5
FIRST_TRY = [S.AVAILABLE, S.GET, S.FETCHED, S.IN_PROCESS]


def _owner(subscriber: str, pid: int) -> str:
    return f"{subscriber}@{socket.gethostname()}:{pid}"


def _recover_in_doubt(
    queue: iqbridge.Queue, msg_ids: list[str], subscriber: str, timeout: float
) -> int:
    """Run recovery until no message is IN_PROCESS for ``subscriber`` any more; return
    how many messages recovery changed."""

    def in_doubt() -> bool:
        views = (queue.state(m).subscribers[subscriber] for m in msg_ids)
        return any(v.state is S.IN_PROCESS for v in views)

    changed = 0
    deadline = time.monotonic() + timeout
    while in_doubt():
        assert time.monotonic() < deadline, f"recovery did not happen within {timeout}s"
        changed += queue.recover()
        time.sleep(0.05)
    return changed


def _history(queue: iqbridge.Queue, msg_id: str, subscriber: str) -> list[SubscriberState]:
    return [h[0] for h in queue.state(msg_id).subscribers[subscriber].history]


def _done_moves(queue: iqbridge.Queue, msg_id: str) -> int:
    return sum(1 for e in queue.state(msg_id).journal if e.dst == S.DONE)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_killed_consumers_messages_come_back_once(sqlite_url: str, tmp_path: Path) -> None:
    n = 40
    with iqbridge.connect(sqlite_url) as hub, consumers() as started:
        queue = hub.queue("orders")
        ids = queue.put_many(({"order": i} for i in range(n)), to=["svc"])

        # A consumer finishes 2 messages, starts on 4 more, and is killed in the middle.
        victim = Consumer(
            tmp_path,
            "victim",
            "hold",
            url=sqlite_url,
            queue="orders",
            subscriber="svc",
            take=6,
            done=2,
            lease=LEASE,
        )
        started.append(victim)
        report = victim.report(timeout=30)
        done_first = [row[0] for row in report["done"]]
        held = [row[0] for row in report["held"]]
        assert len(done_first) == 2 and len(held) == 4
        views = [queue.state(m).subscribers["svc"] for m in held]
        assert {v.state for v in views} == {S.IN_PROCESS}
        assert {v.lease_owner for v in views} == {_owner("svc", victim.pid)}
        # Each message's lease runs from its own claim's commit, so they differ by a few
        # milliseconds: each is compared with its own.
        leases = {m: v.lease_until for m, v in zip(held, views, strict=True)}
        assert all(leases.values())
        lease_until = min(v for v in leases.values() if v is not None)

        assert victim.kill() == -signal.SIGKILL

        # A live lease is left alone (checked only while the lease surely still runs).
        if time.time() < lease_until.timestamp() - 0.5:
            assert queue.recover() == 0
            assert {queue.state(m).subscribers["svc"].state for m in held} == {S.IN_PROCESS}

        # Once it lapses, recovery returns exactly the in-doubt messages, attempt + 1.
        recovered = _recover_in_doubt(queue, held, "svc", timeout=LEASE + 15)
        assert recovered == len(held)
        for msg_id in held:
            view = queue.state(msg_id).subscribers["svc"]
            assert [h[0] for h in view.history] == [*FIRST_TRY, S.AVAILABLE]
            assert view.attempt == 2
            assert view.reason == f"lease of {_owner('svc', victim.pid)} expired"
            back = view.history[-1][1]
            own = leases[msg_id]
            assert own is not None and back >= own, "recovered before its lease ran out"
            last = queue.state(msg_id).journal[-1]
            assert (last.src, last.dst, last.attempt) == (S.IN_PROCESS, S.AVAILABLE, 2)
        for msg_id in done_first:
            assert _history(queue, msg_id, "svc") == [*FIRST_TRY, S.DONE, S.JOURNALLED]

        # A second consumer process drains the queue: the recovered ones on attempt 2.
        rescuer = Consumer(
            tmp_path, "rescuer", "drain", url=sqlite_url, queue="orders", subscriber="svc"
        )
        started.append(rescuer)
        processed = {row[0]: row[1] for row in rescuer.finish(timeout=60)["processed"]}
        assert len(processed) == len(rescuer.report(0)["processed"]), "processed twice"
        assert set(processed) == set(ids) - set(done_first)
        assert {processed[m] for m in held} == {2}
        assert {a for m, a in processed.items() if m not in held} == {1}

        # Nothing lost, nothing done twice.
        for msg_id in ids:
            st = queue.state(msg_id)
            assert st.publisher_state is PublisherState.JOURNALLED
            assert st.subscribers["svc"].state is S.JOURNALLED
            assert _done_moves(queue, msg_id) == 1, msg_id
        for msg_id in held:
            assert _history(queue, msg_id, "svc") == [
                *FIRST_TRY,
                S.AVAILABLE,
                *FIRST_TRY[1:],
                S.DONE,
                S.JOURNALLED,
            ]


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_message_that_kills_every_consumer_ends_unusable(sqlite_url: str, tmp_path: Path) -> None:
    members = ["c0", "c1", "c2"]
    with iqbridge.connect(sqlite_url) as hub, consumers() as started:
        queue = hub.queue("fragile", retry=RetryPolicy(max_attempts=3))
        pool = Pool("svc", members)
        poison = queue.put({"kind": "poison"}, to=pool, priority=9)  # first in line
        others = queue.put_many(({"kind": "fine", "n": i} for i in range(5)), to=pool)

        for attempt, member in enumerate(members, start=1):
            holder = Consumer(
                tmp_path,
                f"holder{attempt}",
                "hold",
                url=sqlite_url,
                queue="fragile",
                subscriber=member,
                take=1,
                lease=LEASE,
            )
            started.append(holder)
            [[msg_id, got_attempt]] = holder.report(timeout=30)["held"]
            assert (msg_id, got_attempt) == (poison, attempt)
            assert queue.state(poison).subscribers[member].state is S.IN_PROCESS
            assert holder.kill() == -signal.SIGKILL
            assert _recover_in_doubt(queue, [poison], member, timeout=LEASE + 15) == 1
            view = queue.state(poison).subscribers[member]
            if attempt < 3:
                # Lease lapsed: the pool reopens for every member, on the next attempt.
                st = queue.state(poison)
                assert {v.state for v in st.subscribers.values()} == {S.AVAILABLE}
                assert {v.attempt for v in st.subscribers.values()} == {attempt + 1}
                assert view.reason == f"lease of {_owner(member, holder.pid)} expired"

        st = queue.state(poison)
        last = st.subscribers["c2"]
        assert last.state is S.JOURNALLED
        assert last.history[-2][0] is S.UNUSABLE
        assert last.reason == "lease expired on attempt 3 of 3"
        assert last.attempt == 3
        for member in ("c0", "c1"):
            assert st.subscribers[member].state is S.JOURNALLED
            assert st.subscribers[member].history[-2][0] is S.EXPIRED
        assert st.publisher_state is PublisherState.JOURNALLED
        lapses = [e for e in st.journal if e.src == S.IN_PROCESS and e.dst == S.AVAILABLE]
        assert [(e.actor, e.attempt) for e in lapses] == [("c0", 2), ("c1", 3)]
        assert _done_moves(queue, poison) == 0

        # The other messages were never touched, and are processed normally, once.
        for msg_id in others:
            for member in members:
                view = queue.state(msg_id).subscribers[member]
                assert (view.state, view.attempt) == (S.AVAILABLE, 1)
                assert [h[0] for h in view.history] == [S.AVAILABLE]
        worker = Consumer(
            tmp_path, "worker", "drain", url=sqlite_url, queue="fragile", subscriber="c1"
        )
        started.append(worker)
        processed = worker.finish(timeout=60)["processed"]
        assert sorted(processed) == sorted([m, 1] for m in others)
        for msg_id in others:
            assert queue.state(msg_id).publisher_state is PublisherState.JOURNALLED
            assert _done_moves(queue, msg_id) == 1
        assert all(queue.get(m) is None for m in members)
