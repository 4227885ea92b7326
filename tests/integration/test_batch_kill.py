"""Batch consumers SIGKILLed mid-batch, again and again: every batch claimed and not
settled comes back after its lease with attempt + 1, nothing is lost and no message is
DONE twice. On the embedded SQLite queue (index-driven) and on Redis Streams (consumer
groups), with real processes, real SIGKILL and real lease expiry.

Of the 8 kills, 6 land mid-batch by design: the consumer, told to hold a batch after
settling a few (``--hold-after``), reports the batch it holds (a full one of new
messages, just claimed or already processed) and waits; the test kills it then. So at
least 6 x 25 messages come back, each batch of its own. The other 2 land anywhere (a
random delay after the start): before the first claim, mid-batch, mid-settle.
"""

from __future__ import annotations

import random
import select
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import iqbridge
from iqbridge import SubscriberState

S = SubscriberState
N = 2000
BATCH = 25
LEASE = 1.0
KILLS = 8
#: Kills at a batch the consumer reports it holds (the rest after a random delay).
HELD = 6
SCRIPT = Path(__file__).with_name("batch_consumer.py")


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'q.db'}"
        return
    from redis_index_helpers import REDIS_URL, drop_streams, fresh_prefix

    with fresh_prefix("batchkill") as prefix:
        try:
            yield f"{REDIS_URL}?prefix={prefix}&stream_prefix={prefix}:"
        finally:
            drop_streams(f"{prefix}:")


def _start(url: str, log: Path, *hold: str) -> subprocess.Popen[bytes]:
    options = ["--batch", str(BATCH), "--lease", str(LEASE), "--pause", "0.1", *hold]
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), url, "orders", "svc", str(log), *options],
        stdout=subprocess.PIPE,
    )


def _held(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> str:
    """The consumer's report of the batch it holds (it waits for its kill then)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"the consumer reported no held batch within {timeout} s"
    line = proc.stdout.readline().decode()
    assert line.startswith("held "), f"the consumer said {line!r} (exit {proc.poll()})"
    return line.split()[1]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_consumers_killed_mid_batch_lose_nothing_and_finish_each_message_once(
    url: str, tmp_path: Path
) -> None:
    rng = random.Random(20261124)
    log = tmp_path / "processed.log"
    with iqbridge.connect(url) as hub:
        queue = hub.queue("orders", lease=LEASE)
        queue.subscribe("svc")
        ids = queue.put_many([{"n": i} for i in range(N)], to=["svc"])
        held_at: Counter[str] = Counter()
        for at_held in rng.sample([True] * HELD + [False] * (KILLS - HELD), KILLS):
            if at_held:
                after = str(rng.randint(0, 4))
                stage = rng.choice(["claimed", "processed"])
                proc = _start(url, log, "--hold-after", after, "--hold-at", stage)
            else:
                proc = _start(url, log)
            try:
                if at_held:
                    held_at[_held(proc)] += 1
                else:
                    time.sleep(rng.uniform(0.6, 1.4))
            finally:
                proc.kill()
                proc.wait(10)
        assert sum(held_at.values()) == HELD
        last = _start(url, log)
        try:
            deadline = time.monotonic() + 120
            while True:
                left = queue.search(state=S.JOURNALLED, subscriber="svc", limit=N + 1)
                if len(left) == N:
                    break
                assert last.poll() is None, "the last consumer died"
                assert time.monotonic() < deadline, f"only {len(left)} of {N} finished"
                time.sleep(0.2)
        finally:
            last.kill()
            last.wait(10)

        done_moves: Counter[str] = Counter()
        attempts: dict[str, int] = {}
        for msg_id in ids:
            state = queue.state(msg_id)
            view = state.subscribers["svc"]
            assert view.state is S.JOURNALLED
            done_moves[msg_id] = sum(
                1 for e in state.journal if e.actor == "svc" and e.dst == S.DONE.value
            )
            attempts[msg_id] = view.attempt
        assert set(done_moves.values()) == {1}, "a message was DONE twice (or never)"

    processed = Counter(line.split()[0] for line in log.read_text().splitlines())
    assert set(processed) == set(ids), "a message was never processed"
    # A batch a kill interrupted came back after its lease, each delivery on attempt + 1:
    # processed again, but DONE once.
    again = [m for m, n in processed.items() if n > 1]
    redelivered = [m for m, a in attempts.items() if a >= 2]
    # Each kill at a held batch stranded a full batch of new messages (attempt 1, so no
    # two of them share a message): each came back after its lease. The test proves
    # nothing unless they did.
    assert len(redelivered) >= BATCH * HELD, f"only {len(redelivered)} redelivered"
    assert all(attempts[m] >= 2 for m in again)
    seen_attempts = Counter(
        (m, int(a)) for m, a in (line.split() for line in log.read_text().splitlines())
    )
    for m in again:
        # Each processing on an attempt of its own (a kill between the claim and the
        # handler can use up attempt 1 unseen, so it need not start at 1).
        mine = {a: n for (mm, a), n in seen_attempts.items() if mm == m}
        assert set(mine.values()) == {1} and len(mine) == processed[m], (m, mine)
        assert max(mine) <= attempts[m]
    print(
        f"\n{N} messages, {KILLS} kills ({dict(held_at)} at a held batch): "
        f"{len(redelivered)} redelivered after a kill "
        f"({len(again)} of them processed before it), "
        f"max attempt {max(attempts.values())}, every message DONE once"
    )
