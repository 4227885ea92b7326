"""Once-only on RabbitMQ under crashes: consumer processes SIGKILLed 50 times.

10,000 messages go to two named subscribers and a pool of two members: three consumer
groups, 30,000 deliveries to finish. One OS process per subscriber and per pool member,
each with its own hub on the real broker; the index is one ``sql+sqlite://`` file that
every process shares. While the publisher puts, a random consumer is SIGKILLed after a
random delay and started again, 50 times in all, so kills land anywhere: while claiming,
while processing (the lease runs out and the message comes back, attempt + 1), inside
the transaction (rolled back: no row, no DONE), between the commit and the broker
acknowledgement (the broker gives the entry again and the once-only rule acknowledges it
unprocessed), and at start-up.

The application's own record decides "processed": each consumer writes one row per
delivery in the same database transaction as the batch's DONE
(``batch.done(transaction=tx)``), in a table without a unique constraint, so a message
committed twice would show as two rows. Afterwards: each named subscriber has exactly
one row per message, the pool exactly one across its two members, nothing is lost, and
the index has every member JOURNALLED with one DONE each, made by the attempt that wrote
the row.

Why the index is an SQLite file and not Redis: the record must commit with DONE, so the
index has to live in the application's SQL database; an SQLite file needs no server
beyond RabbitMQ. Every writer begins ``IMMEDIATE`` (no lock-upgrade failures) and waits
for the write lock, and the consumers claim and settle in batches, so five processes
share it without contention errors and fast enough (a batch is one index commit to claim
and one transaction to record and settle).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa
from forker import Forked, Forker
from kill_checks import check_once_only, wait_for_rows
from rabbitmq_consumer import app_engine, processed_table
from rabbitmq_helpers import fresh_prefix, remember, url_with

import iqbridge
from iqbridge import SubscriberState

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

S = SubscriberState
N = 10_000
KILLS = 50
LEASE = 2.5
BATCH = 50
#: Seconds a consumer "processes" a batch, at most (uniform): slow enough that the
#: consumers work through a backlog for the whole kill phase, so kills hit work.
WORK = 0.5
PUT_CHUNK = 250
QUEUE = "orders"
#: Consumer processes: name -> (subscriber or pool member, the pool's name or "").
CONSUMERS = {"a": ("a", ""), "b": ("b", ""), "m1": ("m1", "pool"), "m2": ("m2", "pool")}
SCRIPT = Path(__file__).with_name("rabbitmq_consumer.py")


@pytest.mark.timeout(300)
def test_consumers_killed_50_times_lose_nothing_and_process_each_message_once(
    tmp_path: Path,
) -> None:
    t0 = time.monotonic()
    rng = random.Random(20260511)
    db = tmp_path / "app.db"
    index = f"sql+sqlite:///{db}"
    claims = tmp_path / "claims.log"
    with fresh_prefix("kill") as prefix, iqbridge.connect(url_with(prefix), index=index) as hub:
        url = url_with(prefix)
        try:
            queue = hub.queue(QUEUE, lease=LEASE)
            queue.subscribe("a", "b")
            queue.subscribe_pool("pool", ["m1", "m2"])
            # A member also reads its own group (messages addressed to it by name): the
            # consumers declare a queue for it too; declared here, it is cleaned up.
            hub.adapter.declare(QUEUE, ["m1", "m2"])
        finally:
            remember(hub.adapter)
        app = app_engine(db)
        table = processed_table()
        table.create(app)

        # Each consumer process is forked from a server that imported its script's
        # libraries once: a restart costs a fork, not a Python start-up.
        forker = Forker(
            ["iqbridge", "sqlalchemy", "pika", "iqbridge.adapters.rabbitmq"],
            tmp_path / "forker.log",
        )

        def start(name: str) -> Forked:
            subscriber, group = CONSUMERS[name]
            cmd = [str(SCRIPT), "record", "--url", url, "--index", index]
            cmd += ["--app", str(db), "--queue", QUEUE, "--subscriber", subscriber]
            cmd += ["--group", group, "--lease", str(LEASE), "--batch", str(BATCH)]
            cmd += ["--work", str(WORK), "--claims", str(claims)]
            return forker.start(cmd, stderr=tmp_path / f"{name}.stderr")

        ids: list[str] = []
        put_error: list[BaseException] = []

        def publish() -> None:
            prng = random.Random(7)
            try:
                for start_at in range(0, N, PUT_CHUNK):
                    ids.extend(
                        queue.put_many([{"n": i} for i in range(start_at, start_at + PUT_CHUNK)])
                    )
                    time.sleep(prng.uniform(0.1, 0.5))
            except BaseException as exc:
                put_error.append(exc)

        procs = {name: start(name) for name in CONSUMERS}
        publisher = threading.Thread(target=publish, name="publisher")
        publisher.start()
        kills: Counter[str] = Counter()

        def rows() -> int:
            with app.connect() as conn:
                return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar())

        try:
            for _ in range(KILLS):
                time.sleep(rng.uniform(0.2, 1.6))
                victim = rng.choice(sorted(procs))
                proc = procs[victim]
                assert proc.poll() is None, f"consumer {victim} died by itself: {proc.returncode}"
                proc.send_signal(signal.SIGKILL)
                assert proc.wait(10) == -signal.SIGKILL
                kills[victim] += 1
                procs[victim] = start(victim)
            kills_s = time.monotonic() - t0
            at_last_kill = rows()
            publisher.join(120)
            assert not put_error, f"the publisher failed: {put_error[0]!r}"
            assert len(ids) == N
            wait_for_rows(rows, 3 * N, procs, tmp_path)
            drained_s = time.monotonic() - t0
            # Anything still due (a duplicate row, a late DONE) would show up now.
            time.sleep(1.0)
        finally:
            publisher.join(60)
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                proc.wait(10)
            forker.close()

        # --- the application's record: 0 lost, 0 processed twice ---------------------------
        assert sum(kills.values()) == KILLS
        committed, by_member = check_once_only(app, table, ids, queue, hub)
        check_s = time.monotonic() - t0 - drained_s

    lines = [line.split() for line in claims.read_text().splitlines()]
    claimed = sum(int(n) for _, n, _ in lines)
    claimed_again = sum(int(a) for _, _, a in lines)
    redelivered = sum(1 for a in committed.values() if a > 1)
    # The kills must have hit work in progress, or this test proves nothing.
    assert claimed > 3 * N and redelivered > 0, (claimed, redelivered)
    print(
        f"\nRabbitMQ kill test: {N} messages x 3 groups = {3 * N} deliveries, {KILLS} SIGKILLs "
        f"({dict(sorted(kills.items()))}) in {kills_s:.1f} s "
        f"({at_last_kill} of {3 * N} deliveries processed at the last kill); {claimed} claims "
        f"({claimed - 3 * N} processings killed before their commit), {claimed_again} "
        f"redeliveries claimed (attempt >= 2), {redelivered} committed on attempt >= 2 "
        f"(max attempt {max(committed.values())}); pool split {by_member['m1']}/"
        f"{by_member['m2']}; 0 lost, 0 processed twice; drained at {drained_s:.1f} s, "
        f"checks {check_s:.1f} s, elapsed {time.monotonic() - t0:.1f} s"
    )
