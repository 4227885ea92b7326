"""Once-only on Kafka under crashes: consumer processes SIGKILLed 30 times.

10,000 messages go to two named subscribers and a pool of two members: three consumer
groups (``<prefix>orders.a``, ``.b`` and ``.pool``), 30,000 deliveries to finish. The
topic has two partitions (``partitions=2``), so the pool's members split it, one
partition each. A record's partition is its ordering key's (the record key), and a put
without one is keyed by its publisher, which would put all 10,000 on one partition and
leave a member idle unless a kill handed it over; so the chunks of puts take eight
ordering keys in turn, and the test checks that both partitions got records. One OS
process per subscriber and per pool member, each with its own hub on the broker (Tansu,
started for the test session); the index is one ``sql+sqlite://`` file that every
process shares. Once both pool members have committed work (the group gave each a
partition: the pool is shared), while the publisher puts, a random consumer is
SIGKILLed after a random delay and started again, 30 times in all, so kills land
anywhere: while joining its group, while claiming, while processing (the records are
FETCHED under a lease in the index; the group's offset stays below them), inside the
transaction (rolled back: no row, no DONE), between the commit and the offset commit
(the group reads the records again and the once-only rule settles them unprocessed).

What a kill means on Kafka: the killed process's consumer stays in its group until its
session times out (``session.timeout.ms=2000``); only then does the group rebalance and
the restarted process (or, for the pool, the surviving member) get the partitions, from
the committed offset, which is never past a record in doubt. A record the dead process
had claimed is held (FETCHED) in the index until its lease runs out: the new owner
leaves it pending (its key fenced) and takes it once it has been idle for a lease. So a
kill costs a consumer a few seconds (start-up, the session timeout, a join of at least a
second on Tansu, the lease), and the figures below show how much of the work the kills
really interrupted.

The application's own record decides "processed": each consumer writes one row per
delivery in the same database transaction as the batch's DONE
(``batch.done(transaction=tx)``), in a table without a unique constraint, so a message
committed twice would show as two rows. Afterwards: each named subscriber has exactly
one row per message, the pool exactly one across its two members, nothing is lost, and
the index has every member JOURNALLED with one DONE each, made by the attempt that wrote
the row. The index is an SQLite file for the reasons given in test_rabbitmq_kill.py: the
record must commit with DONE, and every writer begins ``IMMEDIATE``.
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

import iqbridge
from iqbridge import SubscriberState
from tests.kafka_helpers import fresh_prefix, kafka_url

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

S = SubscriberState
N = 10_000
KILLS = 30
#: Longer than a batch takes (WORK plus the index and record commits), short next to
#: the time a killed consumer is away anyway (its session timeout and a group join).
LEASE = 3.0
BATCH = 100
#: Seconds a consumer "processes" a batch, at most (uniform): slow enough that kills hit
#: work in progress, quick enough that each group keeps up with the puts between kills.
WORK = 0.3
PUT_CHUNK = 250
#: Ordering keys, one per chunk of puts in turn: records on both partitions.
KEYS = 8
PARTITIONS = 2
QUEUE = "orders"
#: Consumer processes: name -> (subscriber or pool member, the pool's name or "").
CONSUMERS = {"a": ("a", ""), "b": ("b", ""), "m1": ("m1", "pool"), "m2": ("m2", "pool")}
SCRIPT = Path(__file__).with_name("kafka_consumer.py")


@pytest.mark.timeout(300)
def test_consumers_killed_30_times_lose_nothing_and_process_each_message_once(
    tmp_path: Path,
) -> None:
    t0 = time.monotonic()
    rng = random.Random(20260512)
    db = tmp_path / "app.db"
    index = f"sql+sqlite:///{db}"
    claims = tmp_path / "claims.log"
    url = kafka_url(fresh_prefix("kill"), partitions=str(PARTITIONS))
    with iqbridge.connect(url, index=index) as hub:
        queue = hub.queue(QUEUE, lease=LEASE)
        queue.subscribe("a", "b")
        queue.subscribe_pool("pool", ["m1", "m2"])
        hub.adapter.declare(QUEUE, [])  # the topic, with its partitions
        app = app_engine(db)
        table = processed_table()
        table.create(app)

        # Each consumer process is forked from a server that imported its script's
        # libraries once: a restart costs a fork, not a Python start-up.
        forker = Forker(
            ["iqbridge", "sqlalchemy", "confluent_kafka", "iqbridge.adapters.kafka"],
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
                for chunk, start_at in enumerate(range(0, N, PUT_CHUNK)):
                    payloads = [{"n": i} for i in range(start_at, start_at + PUT_CHUNK)]
                    ids.extend(queue.put_many(payloads, ordering_key=f"key-{chunk % KEYS}"))
                    time.sleep(prng.uniform(0.1, 0.5))
            except BaseException as exc:
                put_error.append(exc)

        procs = {name: start(name) for name in CONSUMERS}
        publisher = threading.Thread(target=publish, name="publisher")
        publisher.start()
        kills: Counter[str] = Counter()
        hit_work = 0

        def rows() -> int:
            with app.connect() as conn:
                return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar())

        def pool_members_with_rows() -> set[str]:
            query = sa.select(table.c.member).where(table.c.grp == "pool").distinct()
            with app.connect() as conn:
                return set(conn.execute(query).scalars())

        def working() -> list[str]:
            """The consumers that have claimed a batch since they were (re)started."""
            pids = {line.split()[0] for line in claims.read_text().splitlines()}
            return sorted(name for name, proc in procs.items() if str(proc.pid) in pids)

        try:
            # The pool is shared: once both members are in the group, each has a
            # partition with records coming, and commits work of its own. Only then do
            # the kills begin (a restarted member joins again, so kills still land on
            # joining consumers too).
            deadline = time.monotonic() + 60
            while pool_members_with_rows() != {"m1", "m2"}:
                for name, proc in procs.items():
                    assert proc.poll() is None, f"consumer {name} exited: {proc.returncode}"
                assert time.monotonic() < deadline, (
                    f"the pool's members did not both work: {pool_members_with_rows()}"
                )
                time.sleep(0.2)
            shared_s = time.monotonic() - t0
            for _ in range(KILLS):
                time.sleep(rng.uniform(0.5, 2.5))
                # Mostly a consumer at work (a restart takes seconds on Kafka, and kills
                # of consumers still joining would interrupt little work), sometimes any.
                busy = working() if claims.exists() else []
                victim = rng.choice(busy if busy and rng.random() < 0.75 else sorted(procs))
                hit_work += victim in busy
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
            # The records of each chunk share a key, so a partition: both got some.
            partitions = {
                int(str(hub.store.load(ids[i]).native_ref).split(":")[0])
                for i in range(0, N, PUT_CHUNK)
            }
            assert partitions == set(range(PARTITIONS)), partitions
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
    starts = [float(w[2]) for w in lines if w[1] == "start"]
    batches = [w for w in lines if w[1] != "start"]
    claimed = sum(int(n) for _, n, _ in batches)
    claimed_again = sum(int(a) for _, _, a in batches)
    redelivered = sum(1 for a in committed.values() if a > 1)
    # The kills must have hit work in progress, or this test proves nothing.
    assert claimed > 3 * N and redelivered > 0, (claimed, redelivered)
    print(
        f"\nKafka kill test: {N} messages x 3 groups = {3 * N} deliveries, {KILLS} SIGKILLs "
        f"({dict(sorted(kills.items()))}; {hit_work} of a consumer at work) in {kills_s:.1f} s "
        f"({at_last_kill} of {3 * N} deliveries processed at the last kill); {claimed} claims "
        f"({claimed - 3 * N} processings killed before their commit), {claimed_again} "
        f"redeliveries claimed (attempt >= 2), {redelivered} committed on attempt >= 2 "
        f"(max attempt {max(committed.values())}); pool split {by_member['m1']}/"
        f"{by_member['m2']} (both at work {shared_s:.1f} s in); {len(starts)} processes "
        f"got work, first batch {min(starts):.1f}-{max(starts):.1f} s after their start; "
        f"0 lost, 0 processed twice; drained at {drained_s:.1f} s, checks {check_s:.1f} s, elapsed "
        f"{time.monotonic() - t0:.1f} s"
    )
