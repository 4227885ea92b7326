"""Eight OS processes compete for one pool of 10,000 messages through the Redis index.

The messages sit in the embedded SQLite queue; the index is the Redis store, so delivery
is index-driven: every process reads the same claim index and races the others with
the store's compare-and-set commit script for each message. Each process is one pool
member with its own hub. Whatever the interleaving, every message must be processed by
exactly one member (one DONE in the journal and in the record), the other seven must
be expired and journalled, and no message may be lost.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from mp_consumers import Consumer, consumers

import iqbridge
from iqbridge import JournalEntry, Pool, PublisherState, SubscriberState
from iqbridge.states import ActorKind
from iqbridge.stores.redis import RedisStore
from tests.redis_index_helpers import REDIS_URL, fresh_prefix

N_MESSAGES = 10_000
MEMBERS = tuple(f"w{i}" for i in range(8))
PUT_BATCH = 1_000

S = SubscriberState
WINNER_PATH = [S.AVAILABLE, S.GET, S.FETCHED, S.IN_PROCESS, S.DONE, S.JOURNALLED]
LOSER_PATH = [S.AVAILABLE, S.EXPIRED, S.JOURNALLED]
PUBLISHER_PATH = [PublisherState.PUT, PublisherState.REVEALED, PublisherState.JOURNALLED]


def _whole_journal(hub: iqbridge.Hub) -> list[JournalEntry]:
    entries: list[JournalEntry] = []
    after = 0
    while batch := hub.journal(after=after, limit=50_000):
        entries.extend(batch)
        after = batch[-1].seq or 0
    return entries


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_eight_processes_share_one_pool_through_the_redis_index(tmp_path: Path) -> None:
    with fresh_prefix("race") as prefix:
        _race(tmp_path, f"{REDIS_URL}?prefix={prefix}")


def _race(tmp_path: Path, index_url: str) -> None:
    queue_url = f"sqlite:///{tmp_path / 'pool.db'}?synchronous=normal"
    t0 = time.time()
    with iqbridge.connect(queue_url, index=index_url) as hub:
        assert isinstance(hub.store, RedisStore)
        queue = hub.queue("jobs")
        ids: list[str] = []
        for start in range(0, N_MESSAGES, PUT_BATCH):
            ids += queue.put_many(
                ({"n": i} for i in range(start, start + PUT_BATCH)),
                to=Pool("workers", MEMBERS),
                publisher="feeder",
            )
    put_s = time.time() - t0
    assert len(set(ids)) == N_MESSAGES

    go = tmp_path / "go"
    with consumers() as started:
        for member in MEMBERS:
            started.append(
                Consumer(
                    tmp_path,
                    member,
                    "drain",
                    url=queue_url,
                    index=index_url,
                    queue="jobs",
                    subscriber=member,
                    go=go,
                    timeout=0.2,
                    idle=3,
                )
            )
        for c in started:
            c.wait_file(c.ready, 30)
        go.touch()
        t1 = time.time()
        reports = {c.name: c.finish(150) for c in started}
        wall = time.time() - t1

    # Each process's own log: no duplicates, no overlap, together exactly the ids put.
    per_process = {name: [row[0] for row in r["processed"]] for name, r in reports.items()}
    for name, got in per_process.items():
        assert len(got) == len(set(got)), f"{name} processed a message twice"
    owner_of = {msg_id: name for name, got in per_process.items() for msg_id in got}
    assert sum(len(got) for got in per_process.values()) == len(owner_of), "processes overlap"
    assert set(owner_of) == set(ids), "a message was lost"
    counts = {name: len(got) for name, got in per_process.items()}
    assert all(counts[m] > 0 for m in MEMBERS), f"not every process competed: {counts}"
    assert all(row[1] == 1 for r in reports.values() for row in r["processed"])

    active = max(r["last"] for r in reports.values()) - min(r["first"] for r in reports.values())
    print(
        f"\n8-process pool through the Redis index: {N_MESSAGES} messages put in {put_s:.2f}s, "
        f"consumed in {active:.2f}s active ({N_MESSAGES / active:.0f} msg/s; {wall:.2f}s wall "
        f"with idle exit); per process {counts}"
    )

    with iqbridge.connect(queue_url, index=index_url) as hub:
        journal = _whole_journal(hub)
        done_count: Counter[str] = Counter()
        paths: dict[tuple[str, str], list[SubscriberState]] = defaultdict(list)
        pub_paths: dict[str, list[PublisherState]] = defaultdict(list)
        for e in journal:
            assert e.msg_id in owner_of, f"journal names a message nobody put: {e.msg_id}"
            if e.actor_kind is ActorKind.PUBLISHER:
                pub_paths[e.msg_id].append(PublisherState(e.dst))
            else:
                paths[e.msg_id, e.actor].append(SubscriberState(e.dst))
                if e.dst == S.DONE:
                    done_count[e.msg_id] += 1
                    assert e.actor == owner_of[e.msg_id], "DONE by a member that did not process"
        assert set(done_count.values()) == {1} and len(done_count) == N_MESSAGES
        for msg_id in ids:
            owner = owner_of[msg_id]
            assert paths[msg_id, owner] == WINNER_PATH, (msg_id, owner)
            for other in MEMBERS:
                if other != owner:
                    assert paths[msg_id, other] == LOSER_PATH, (msg_id, other)
            assert pub_paths[msg_id] == PUBLISHER_PATH, msg_id

        # The records agree: finished, one member DONE (the owner), the rest EXPIRED.
        for msg_id in ids:
            rec = hub.store.load(msg_id)
            assert rec.publisher_state is PublisherState.JOURNALLED
            outcomes = {name: m.outcome for name, m in rec.members.items()}
            assert outcomes.pop(owner_of[msg_id]) is S.DONE
            assert set(outcomes.values()) == {S.EXPIRED}
            assert {m.state for m in rec.members.values()} == {S.JOURNALLED}
        assert hub.store.claimable("jobs", "w0", hub.now_us(), 10) == []
