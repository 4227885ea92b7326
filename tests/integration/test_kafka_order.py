"""Ordering keys on Kafka: pool members join and leave mid-run, every key keeps put order.

3,000 messages of 12 ordering keys (250 each, each body carrying its key and sequence
number) go to a topic of three partitions (``partitions=3``) and a pool of three
members, ``w0``, ``w1`` and ``w2``, one consumer group. Each member is an OS process with
its own hub running an ordered :class:`~iqbridge.worker.Worker` (4 threads). The
ordering key is the record key, so a key lives in one partition, and a partition is read
by one member at a time: the group splits the partitions among the members present and
moves them when one joins or leaves. A publisher puts the keys interleaved, a round of
10 per key at a time, through most of the run, so every partition has work coming
whoever holds it.

The run: ``w0`` and ``w1`` start and split the partitions; once some of the work is done
``w2`` joins (the group rebalances: a partition moves to it); then ``w0`` leaves; ``w0``
joins again in a new process; then ``w1`` leaves after finishing what it holds
(``Worker.stop(drain=True)``). Leaving is graceful: the Worker stops, then the hub
closes, which commits the group's offsets below the first record in doubt and leaves the
group, so its partitions go to the members left (a member giving partitions away first
finishes what it holds of them, ``revoke_wait``). A leave waits until the member that
joined before it has been given partitions (the adapter logs each assignment), and the
last fifth of the puts waits until ``w1`` has left, so every change happens while work
remains and the keys of every leaver get messages after it left. The last two members
leave once every message is recorded.

Two variants of ``w0``'s leave. ``drain``: it finishes what it holds, like ``w1``.
``give-back``: ``stop(drain=False)``, the messages it holds unstarted are given back
(AVAILABLE again, attempt 2). The broker hands them out again: the leaver's commit stays
below them, so whoever reads the partition next reads them first; through the index only
the process reading their partition may hand them out again
(:class:`~iqbridge.adapter.Fenced`), so a key's given-back run is never split between
two members.

The index is one ``sql+sqlite://`` file shared by the processes, and it also holds the
application's own record: the handler writes one row per message (key, seq, when its
processing started, when the row was written) and marks DONE in the same transaction.
Every transaction begins IMMEDIATE on the one SQLite file, so the rows' autoincrement ids
are the commit order across all processes: the order in which the messages were really
processed.

Asserted: every message processed (committed) exactly once; per key, the commit order is
the put order (0 inversions), and no two messages of a key overlapped (each started only
after its predecessor's row was written), across every hand-over of a partition; every
member process did work, and the keys of each leaving process were continued by another
one. The index has every message finished.
"""

from __future__ import annotations

import itertools
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from rabbitmq_consumer import app_engine, processed_table

import iqbridge
from iqbridge import PublisherState, SubscriberState
from tests.kafka_helpers import fresh_prefix, kafka_url

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

S = SubscriberState
KEYS = 12
PER_KEY = 250
N = KEYS * PER_KEY
#: Messages of one key per put_many (one ordering key per call); keys interleave, and
#: the publisher pauses after each round of keys: the puts go on for most of the run, so
#: every partition has work coming whoever holds it.
CHUNK = 10
PUT_PAUSE = 0.35
#: The last puts (this share of each key's messages) wait until every membership change
#: happened: the partitions of the last member to leave still get work after it left.
LAST_PUTS = 0.8
PARTITIONS = 3
MEMBERS = ("w0", "w1", "w2")
QUEUE = "events"
POOL = "workers"
LEASE = 10.0
#: Seconds a message "processes", at most (uniform), besides its transaction.
WORK = 0.01
#: The membership changes, each once this share of the messages is recorded (and the
#: previous joiner has been given partitions): (share, what, process). A process named
#: ``w0'`` is pool member ``w0`` again.
EVENTS = ((0.15, "join", "w2"), (0.30, "leave", "w0"), (0.45, "join", "w0'"), (0.60, "leave", "w1"))
FIRST = ("w0", "w1")


class KeyOutOfOrder(AssertionError):
    """Messages of one ordering key processed out of put order (or overlapping)."""


SCRIPT = Path(__file__).with_name("kafka_consumer.py")
#: The adapter's log line of an assignment of the pool's partitions (kafka_feed.Feed; a
#: member also joins a group of its own, for messages addressed to it by name).
ASSIGNED = re.compile(rf"Kafka group {POOL} on \S+: assigned partitions \[\d")


@dataclass
class Member:
    """One member process: the pool member it is and how it leaves."""

    name: str  # the process's name in this test ("w0'": w0 again)
    proc: subprocess.Popen[bytes]
    leave: Path
    stderr: Path
    joined: float
    left: float | None = None


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "w0_drains",
    [
        pytest.param(True, id="drain"),
        pytest.param(False, id="give-back"),
    ],
)
def test_members_joining_and_leaving_keep_every_key_in_put_order(
    tmp_path: Path, w0_drains: bool
) -> None:
    t0 = time.monotonic()
    db = tmp_path / "app.db"
    index = f"sql+sqlite:///{db}"
    url = kafka_url(fresh_prefix("order"), partitions=str(PARTITIONS))
    with iqbridge.connect(url, index=index) as hub:
        queue = hub.queue(QUEUE, lease=LEASE)
        queue.subscribe_pool(POOL, list(MEMBERS))
        app = app_engine(db)
        table = processed_table()
        table.create(app)

        ids: dict[str, tuple[str, int]] = {}
        put_error: list[BaseException] = []
        changed = threading.Event()

        def publish() -> None:
            try:
                for first in range(0, PER_KEY, CHUNK):
                    if first >= LAST_PUTS * PER_KEY:
                        changed.wait(120)  # every member change happened: the last puts
                    for k in range(KEYS):
                        key = f"key-{k:02d}"
                        seqs = range(first, min(first + CHUNK, PER_KEY))
                        got = queue.put_many(
                            [{"key": key, "seq": s} for s in seqs], ordering_key=key
                        )
                        ids.update(zip(got, ((key, s) for s in seqs), strict=True))
                    time.sleep(PUT_PAUSE)
            except BaseException as exc:
                put_error.append(exc)

        def start(name: str, drain: bool) -> Member:
            member = name.rstrip("'")
            leave = tmp_path / f"leave-{name}"
            stderr = tmp_path / f"{name}.stderr"
            cmd = [sys.executable, str(SCRIPT), "ordered", "--url", url, "--index", index]
            cmd += ["--app", str(db), "--queue", QUEUE, "--subscriber", member]
            cmd += ["--group", POOL, "--lease", str(LEASE), "--threads", "4"]
            cmd += ["--batch", "16", "--work", str(WORK), "--leave", str(leave)]
            cmd += ["--drain" if drain else "--no-drain"]
            proc = subprocess.Popen(cmd, stderr=stderr.open("wb"))
            return Member(name, proc, leave, stderr, time.monotonic() - t0)

        def rows() -> list[sa.Row[tuple[object, ...]]]:
            with app.connect() as conn:
                return list(conn.execute(sa.select(table).order_by(table.c.id)).all())

        def recorded() -> int:
            with app.connect() as conn:
                return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar())

        def assigned(member: Member) -> bool:
            """Whether the group gave the member partitions (the adapter logs each
            assignment: "... assigned partitions [0, 2]")."""
            return ASSIGNED.search(member.stderr.read_text(errors="replace")) is not None

        def leave(member: Member) -> None:
            member.leave.touch()
            code = member.proc.wait(60)
            stderr = member.stderr.read_text(errors="replace")
            assert code == 0, f"{member.name} exited with {code}:\n{stderr[-3000:]}"
            member.left = time.monotonic() - t0

        drains = {"w0": w0_drains}  # w1 drains; the last members leave with nothing held
        members = {name: start(name, drains.get(name, True)) for name in FIRST}
        everyone = list(members.values())
        publisher = threading.Thread(target=publish, name="publisher")
        publisher.start()
        at_event: list[int] = []
        try:
            deadline = time.monotonic() + 120
            last_joiner: Member | None = None
            for share, what, name in EVENTS:
                while recorded() < share * N or (
                    last_joiner is not None and not assigned(last_joiner)
                ):
                    for m in members.values():
                        assert m.proc.poll() is None, (
                            f"{m.name} exited with {m.proc.returncode}:\n"
                            + m.stderr.read_text(errors="replace")[-3000:]
                        )
                    assert time.monotonic() < deadline, (
                        f"stuck before {what} {name}: {recorded()} of {N} recorded"
                    )
                    time.sleep(0.05)
                at_event.append(recorded())
                if what == "join":
                    members[name] = last_joiner = start(name, True)
                    everyone.append(members[name])
                else:
                    leave(members.pop(name))
            changed.set()
            publisher.join(60)
            put_s = time.monotonic() - t0
            assert not put_error, f"the publisher failed: {put_error[0]!r}"
            assert len(ids) == N
            while (done_rows := recorded()) < N:
                for m in members.values():
                    assert m.proc.poll() is None, (
                        f"{m.name} exited with {m.proc.returncode}:\n"
                        + m.stderr.read_text(errors="replace")[-3000:]
                    )
                assert time.monotonic() < deadline, f"only {done_rows} of {N} recorded"
                time.sleep(0.05)
            run_s = time.monotonic() - t0
            for m in list(members.values()):
                leave(m)
        finally:
            changed.set()
            publisher.join(60)
            for m in everyone:
                if m.proc.poll() is None:
                    m.proc.send_signal(signal.SIGKILL)
                m.proc.wait(10)

        got = rows()
        app.dispose()

        # Every message processed exactly once (the record has no unique constraint).
        counts = Counter(r.msg_id for r in got)
        assert [m for m, n in counts.items() if n > 1] == [], "processed twice"
        assert set(counts) == set(ids), "lost (or a row for a message nobody put)"
        assert all((r.okey, r.seq) == ids[r.msg_id] for r in got)

        # Every member process did work; the keys of a leaving one went on elsewhere.
        by_process = Counter(r.pid for r in got)
        names = {m.proc.pid: m.name for m in everyone}
        per_process = {names[pid]: n for pid, n in by_process.items()}
        assert sorted(per_process) == sorted(m.name for m in everyone), per_process
        per_key: dict[str, list[sa.Row[tuple[object, ...]]]] = defaultdict(list)
        for r in got:
            per_key[r.okey].append(r)
        continued: Counter[str] = Counter()  # keys a leaver processed that others went on with
        for key_rows in per_key.values():
            for pid in {r.pid for r in key_rows}:
                last = max(i for i, r in enumerate(key_rows) if r.pid == pid)
                if any(r.pid != pid for r in key_rows[last + 1 :]):
                    continued[names[pid]] += 1
        for name in ("w0", "w1"):
            assert continued[name] > 0, f"nobody went on with {name}'s keys: {continued}"

        # Per key, the commit order (row id) is the put order, and no overlap.
        inversions = in_one_process = overlaps = switches = 0
        examples: list[str] = []
        for key, key_rows in per_key.items():
            for before, after in itertools.pairwise(key_rows):
                if after.seq < before.seq:
                    inversions += 1
                    in_one_process += after.pid == before.pid
                    examples.append(
                        f"{key}: #{after.seq} ({names[after.pid]}) committed after "
                        f"#{before.seq} ({names[before.pid]})"
                    )
                if after.started < before.written:
                    overlaps += 1
                switches += after.pid != before.pid
        again = sum(1 for r in got if r.attempt > 1)
        timeline = ", ".join(
            f"{m.name} {m.joined:.1f}-{m.left:.1f} s" if m.left else m.name for m in everyone
        )
        print(
            f"\nKafka ordered pool ({'w0 drains' if w0_drains else 'w0 gives back'}): "
            f"{N} messages, {KEYS} keys, {PARTITIONS} partitions, "
            f"{len(everyone)} member processes x 4 threads ({timeline}; events at "
            f"{at_event} recorded); per process {dict(sorted(per_process.items()))}; "
            f"put by {put_s:.1f} s, all recorded at {run_s:.1f} s; {inversions} inversions "
            f"({in_one_process} of them within one process), {overlaps} overlaps, "
            f"{switches} hand-overs of a key between processes, keys continued after a "
            f"leaver {dict(sorted(continued.items()))}, {again} processed on attempt >= 2; "
            f"elapsed {time.monotonic() - t0:.1f} s"
        )
        assert sorted(len(v) for v in per_key.values()) == [PER_KEY] * KEYS
        assert switches > 0

        summaries = queue.search(state=PublisherState.JOURNALLED, limit=N + 1)
        assert len(summaries) == N
        assert {st for s in summaries for st in s.subscribers.values()} == {S.JOURNALLED}

    # Last, and as its own exception: what the test is about.
    if inversions or overlaps:
        raise KeyOutOfOrder(
            f"{inversions} inversions, e.g. {examples[:5]}; {overlaps} messages started "
            f"before their predecessor's row was written"
        )
