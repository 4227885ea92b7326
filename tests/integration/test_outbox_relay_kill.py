"""Acceptance (issue 3, point 5): the relay is SIGKILLed at random points 50 times while it
relays 10,000 outbox rows; afterwards every row is REVEALED exactly once (one index
record, one PUT -> REVEALED in the journal) and every subscriber got it exactly once
(two pubsub subscribers and a pool of two, counted by the consumers themselves).

A producer thread writes the rows in business transactions, one in ten of which is rolled
back (those messages must never appear), while ``iq relay`` processes are started and
killed: half of the kills come a random moment within a round after a random number of
rows, the others a random moment after the relay started (start-up or first round). The
consumers join halfway, so that in the first half nobody else records where the broker
put an entry (a relay killed between the send and recording it leaves a second entry).
Broker: Redis Streams; index: the Redis index store; outbox: an SQLite file.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from forker import Forker

import iqbridge
from iqbridge import Pool, PublisherState
from iqbridge.errors import MessageNotFound
from iqbridge.outbox import Outbox, OutboxCounts
from iqbridge.states import ActorKind
from tests.conftest import need_server

pytestmark = [pytest.mark.slow, pytest.mark.redis]

ROWS = 10_000
KILLS = 50
BATCH = 25
QUEUE = "orders"
AUDIENCE = ["a", "b", Pool("p", ["p1", "p2"])]
SUBSCRIBERS = ["a", "b", "p1", "p2"]
REDIS = "redis://127.0.0.1:6379/0"
IQ = Path(sys.executable).with_name("iq")
CONSUMERS = Path(__file__).with_name("outbox_consumers.py")


@pytest.fixture
def prefix() -> Iterator[str]:
    """A key prefix of this test's own on the shared Redis; its keys are deleted after."""
    import redis

    client = redis.Redis.from_url(REDIS)
    try:
        client.ping()
        ok, why = True, ""
    except redis.RedisError as exc:
        ok, why = False, str(exc)
    need_server("Redis at 127.0.0.1:6379", ok, why)
    name = f"iqob-{uuid.uuid4().hex[:10]}"
    try:
        yield name
    finally:
        keys = list(client.scan_iter(match=f"*{name}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
        client.close()


def _producer(
    outbox: Outbox, rng: random.Random, committed: list[str], rolled_back: list[str]
) -> None:
    n = 0
    while len(committed) < ROWS:
        size = min(rng.randint(1, 40), ROWS - len(committed))
        fail = rng.random() < 0.1
        ids: list[str] = []
        try:
            with outbox.engine.begin() as conn:
                for _ in range(size):
                    n += 1
                    conn.exec_driver_sql("INSERT INTO orders (id, total) VALUES (?, ?)", (n, n))
                    ids.append(
                        outbox.put(
                            conn,
                            QUEUE,
                            {"order": n},
                            to=AUDIENCE,
                            correlation_id=f"cart-{n // 3}",
                        )
                    )
                if fail:
                    raise RuntimeError("business step failed")
        except RuntimeError:
            rolled_back.extend(ids)
            continue
        committed.extend(ids)
        time.sleep(0.002)


def _counts(outbox: Outbox) -> OutboxCounts:
    return outbox.counts()


def _in_flight(outbox: Outbox, hub: iqbridge.Hub) -> tuple[int, int]:
    """After a kill: pending rows the killed relay had already put (index record exists),
    and of those, how many without a broker reference yet."""
    t = outbox.table
    with outbox.engine.connect() as conn:
        ids = conn.execute(outbox.pending_stmt(BATCH * 2).with_only_columns(t.c.msg_id)).scalars()
        pending = list(ids)
    published = half = 0
    for msg_id in pending:
        try:
            rec = hub.store.load(msg_id)
        except MessageNotFound:
            continue
        published += 1
        half += rec.native_ref is None
    return published, half


def _stream_length(prefix: str) -> int:
    import redis

    client = redis.Redis.from_url(REDIS)
    try:
        return int(client.xlen(f"{prefix}:{QUEUE}"))  # stream_prefix + queue name
    finally:
        client.close()


@pytest.mark.timeout(300)
def test_relay_killed_50_times_relays_each_row_exactly_once(tmp_path: Path, prefix: str) -> None:
    target = "redis-streams"
    index = f"{REDIS}?prefix={prefix}"
    broker = f"{index}&stream_prefix={prefix}:"  # the stream is <prefix>:orders
    app_db = f"sqlite:///{tmp_path / 'app.db'}"
    seed = int(os.environ.get("IQ_KILL_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    print(f"\n{target}: seed {seed} (IQ_KILL_SEED={seed} repeats this run)")

    outbox = Outbox(app_db)
    with outbox.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
    outbox.create_table()
    hub = iqbridge.connect(broker, index=index)
    hub.queue(QUEUE)

    committed: list[str] = []
    rolled_back: list[str] = []
    producer = threading.Thread(
        target=_producer, args=(outbox, random.Random(seed + 1), committed, rolled_back)
    )
    stop_file = tmp_path / "stop"
    report = tmp_path / "consumers.json"
    consumer_log = (tmp_path / "consumers.stderr").open("wb")
    consumer_cmd = [
        sys.executable,
        str(CONSUMERS),
        "--url",
        broker,
        "--index",
        index,
        "--queue",
        QUEUE,
        "--out",
        str(report),
        "--stop",
        str(stop_file),
        *SUBSCRIBERS,
    ]
    consumers: subprocess.Popen[bytes] | None = None
    relay_cmd = [
        "iq",
        "--url",
        broker,
        "--index",
        index,
        "relay",
        "--outbox",
        app_db,
        "--batch",
        str(BATCH),
        "--poll",
        "20ms",
    ]
    # Each life of the relay is the `iq` command line forked from a server that imported
    # it once: a kill's restart costs a fork, not a Python start-up (the final relay below
    # starts as the installed `iq` does).
    relay_log = tmp_path / "relay.stderr"
    forker = Forker(["iqbridge.cli", "iqbridge.relay", "iqbridge.outbox"], tmp_path / "forker.log")
    lives: list[int] = []
    pending_at_kill: list[int] = []
    published_unmarked: list[int] = []
    half_put: list[int] = []
    started = time.monotonic()
    try:
        producer.start()
        for k in range(KILLS):
            if k == KILLS // 2:
                # Consumers join halfway: before, nobody reads the broker, so a relay killed
                # between send and recording the reference leaves a second broker entry;
                # after, consumers often record the reference first.
                consumers = subprocess.Popen(
                    consumer_cmd, stdout=subprocess.DEVNULL, stderr=consumer_log
                )
            before = _counts(outbox).relayed
            proc = forker.start(relay_cmd, stderr=relay_log)
            # Each life relays a bounded, random number of rows, so that every kill comes
            # while rows are still waiting.
            deadline = time.monotonic() + 30
            if k % 2 == 0:
                # A random moment within a round, after a random number of rows.
                goal = rng.randint(1, 150)
                while _counts(outbox).relayed - before < goal:
                    assert proc.poll() is None, f"relay exited with {proc.returncode}"
                    assert time.monotonic() < deadline, "the relay made no progress in 30 s"
                    time.sleep(0.002)
                time.sleep(rng.uniform(0.0, 0.03))
            else:
                # A random moment after it started: start-up, first round or later.
                at = time.monotonic() + rng.uniform(0.05, 0.9)
                while time.monotonic() < at and _counts(outbox).relayed - before < 200:
                    assert proc.poll() is None, f"relay exited with {proc.returncode}"
                    time.sleep(0.002)
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(10) == -signal.SIGKILL
            counts = _counts(outbox)
            lives.append(counts.relayed - before)
            pending_at_kill.append(counts.pending)
            published, half = _in_flight(outbox, hub)
            published_unmarked.append(published)
            half_put.append(half)
        kill_phase = time.monotonic() - started
        assert consumers is not None
        producer.join(60)
        assert not producer.is_alive()
        final = subprocess.run(
            [str(IQ), *relay_cmd[1:-2], "--once"],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert final.returncode == 0, final.stderr
        assert _counts(outbox) == OutboxCounts(pending=0, relayed=ROWS, parked=0)
        relayed_at = time.monotonic()

        # Everything is delivered: wait until every message is JOURNALLED, then stop.
        q = hub.queue(QUEUE)
        deadline = time.monotonic() + 120
        while len(q.search(state=PublisherState.JOURNALLED, limit=ROWS + 1)) < ROWS:
            assert consumers.poll() is None, "the consumers exited early"
            assert time.monotonic() < deadline, "not everything was delivered in 120 s"
            time.sleep(0.2)
        stop_file.touch()
        assert consumers.wait(60) == 0
        delivered_at = time.monotonic()
        got: dict[str, Any] = json.loads(report.read_text())
        assert got["errors"] == []

        # Exactly once, from the outbox through the index to every subscriber.
        assert len(committed) == ROWS and len(set(committed)) == ROWS
        records = q.search(limit=ROWS * 2)
        assert len(records) == ROWS
        assert {r.msg_id for r in records} == set(committed)
        assert not set(rolled_back) & {r.msg_id for r in records}
        moves: dict[str, list[tuple[str | None, str]]] = {}
        after = 0
        while batch := hub.journal(after, 5000):
            for e in batch:
                if e.actor_kind is ActorKind.PUBLISHER and e.dst in ("PUT", "REVEALED"):
                    moves.setdefault(e.msg_id, []).append((e.src, e.dst))
            after = batch[-1].seq
        assert set(moves) == set(committed)
        wrong = {m: v for m, v in moves.items() if v != [(None, "PUT"), ("PUT", "REVEALED")]}
        assert wrong == {}
        deliveries = Counter(
            (msg_id, "p" if sub in ("p1", "p2") else sub)
            for sub, items in got["got"].items()
            for msg_id, _attempt in items
        )
        expected = {(m, s) for m in committed for s in ("a", "b", "p")}
        assert set(deliveries) == expected
        twice = {k: n for k, n in deliveries.items() if n != 1}
        assert twice == {}
        entries = _stream_length(prefix)
        assert entries >= ROWS
        # Entries a group still holds unacknowledged (a second entry read while the first
        # was being processed waits for its idle time to pass): reported, not asserted.
        adapter: Any = hub.adapter
        unacked = sum(len(adapter.pending(QUEUE, g)) for g in ("a", "b", "p"))
    finally:
        stop_file.touch()
        if consumers is not None and consumers.poll() is None:
            consumers.kill()
            consumers.wait()
        consumer_log.close()
        forker.close()
        hub.close()
        outbox.close()

    assert min(pending_at_kill) > 0, "a kill came when nothing was left to relay"
    pool = Counter(sub for sub in ("p1", "p2") for _ in got["got"][sub])
    print(
        f"{target}: {ROWS} rows ({len(rolled_back)} more rolled back), {KILLS} kills; "
        f"rows relayed per life min/median/max "
        f"{min(lives)}/{statistics.median(lives):.0f}/{max(lives)}; kills that left rows "
        f"put but unmarked: {sum(1 for p in published_unmarked if p)} "
        f"({sum(published_unmarked)} rows, {sum(half_put)} of them without a broker "
        f"reference); broker entries {entries} ({entries - ROWS} duplicates, {unacked} "
        f"entries still pending in a group); deliveries "
        f"a={len(got['got']['a'])} b={len(got['got']['b'])} pool p1/p2="
        f"{pool['p1']}/{pool['p2']}; seconds: kills {kill_phase:.1f}, final relay "
        f"{relayed_at - started - kill_phase:.1f}, deliveries {delivered_at - relayed_at:.1f}, "
        f"checks {time.monotonic() - delivered_at:.1f}"
    )
