"""Ordering keys on RabbitMQ: four worker processes on one pool keep each key in put order.

3,000 messages of 50 ordering keys (60 each, put interleaved, each body carrying its key
and sequence number) go to a pool of four members, one OS process each with its own hub
running an ordered :class:`~iqbridge.worker.Worker` (4 threads). The index is one
``sql+sqlite://`` file shared by the processes, and it also holds the application's own
record: the handler writes one row per message (key, seq, when its processing started,
when the row was written) and marks DONE in the same transaction. Every transaction
begins IMMEDIATE on the one SQLite file, so the rows' autoincrement ids are the commit
order across all processes: the order in which the messages were really processed.

Asserted: every message processed (committed) exactly once; per key, the commit order is
the put order (0 inversions); and no two messages of a key overlapped: each started only
after its predecessor's row was written. The index has every member finished.

The pool's queues are declared with RabbitMQ's single active consumer
(``?single_active=true``): the broker delivers a pool's messages to one process at a time,
the others stand by (and take over if it goes), and the facade does not claim through the
index what the active process holds read ahead. Hand-overs are not exercised here (see
docs/adapters/rabbitmq.md for what they do on RabbitMQ 3.10). Without single active
consumers, RabbitMQ hands a pool's messages round-robin to the processes, and no broker
keeps a key in order across the processes of one pool (the Worker's guarantee is per
process): this test then counted 700-785 inversions in six runs.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import sqlalchemy as sa
from rabbitmq_consumer import app_engine, processed_table
from rabbitmq_helpers import fresh_prefix, remember, url_with

import iqbridge
from iqbridge import PublisherState, SubscriberState

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

S = SubscriberState
KEYS = 50
PER_KEY = 60
N = KEYS * PER_KEY
#: Messages of one key per put_many (one ordering key per call); keys interleave.
CHUNK = 4
MEMBERS = ("w0", "w1", "w2", "w3")
QUEUE = "events"
POOL = "workers"
LEASE = 10.0
#: A process stops once it has had nothing to do for this long.
IDLE = 4.0
SCRIPT = Path(__file__).with_name("rabbitmq_consumer.py")


class KeyOutOfOrder(AssertionError):
    """Messages of one ordering key processed out of put order (or overlapping)."""


@pytest.mark.timeout(180)
def test_four_worker_processes_on_one_pool_keep_every_key_in_put_order(tmp_path: Path) -> None:
    t0 = time.monotonic()
    db = tmp_path / "app.db"
    index = f"sql+sqlite:///{db}"
    go = tmp_path / "go"
    with (
        fresh_prefix("order") as prefix,
        iqbridge.connect(url_with(prefix, single_active="true"), index=index) as hub,
    ):
        url = url_with(prefix, single_active="true")
        try:
            queue = hub.queue(QUEUE, lease=LEASE)
            queue.subscribe_pool(POOL, list(MEMBERS))
            # A member also reads its own group (messages addressed to it by name): the
            # workers declare a queue for it too; declared here, it is cleaned up.
            hub.adapter.declare(QUEUE, list(MEMBERS))
        finally:
            remember(hub.adapter)
        app = app_engine(db)
        table = processed_table()
        table.create(app)

        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for member in MEMBERS:
                cmd = [sys.executable, str(SCRIPT), "ordered", "--url", url, "--index", index]
                cmd += ["--app", str(db), "--queue", QUEUE, "--subscriber", member]
                cmd += ["--group", POOL, "--lease", str(LEASE), "--threads", "4"]
                cmd += ["--batch", "16", "--idle", str(IDLE), "--ready", str(tmp_path / member)]
                cmd += ["--go", str(go)]
                procs[member] = subprocess.Popen(
                    cmd, stderr=(tmp_path / f"{member}.stderr").open("wb")
                )
            deadline = time.monotonic() + 60
            for member, proc in procs.items():
                while not (tmp_path / member).exists():
                    assert proc.poll() is None, (tmp_path / f"{member}.stderr").read_text()
                    assert time.monotonic() < deadline, f"{member} never got ready"
                    time.sleep(0.02)
            go.touch()
            start_put = time.monotonic()
            ids: dict[str, tuple[str, int]] = {}
            for first in range(0, PER_KEY, CHUNK):
                for k in range(KEYS):
                    key = f"key-{k:02d}"
                    seqs = range(first, min(first + CHUNK, PER_KEY))
                    got = queue.put_many([{"key": key, "seq": s} for s in seqs], ordering_key=key)
                    ids.update(zip(got, ((key, s) for s in seqs), strict=True))
            put_s = time.monotonic() - start_put
            for member, proc in procs.items():
                code = proc.wait(max(deadline + 60 - time.monotonic(), 1))
                stderr = (tmp_path / f"{member}.stderr").read_text(errors="replace")
                assert code == 0, f"{member} exited with {code}:\n{stderr[-3000:]}"
            run_s = time.monotonic() - start_put
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                proc.wait(10)

        with app.connect() as conn:
            rows = conn.execute(sa.select(table).order_by(table.c.id)).all()
        app.dispose()

        # Every message processed exactly once (the record has no unique constraint).
        counts = Counter(r.msg_id for r in rows)
        assert [m for m, n in counts.items() if n > 1] == [], "processed twice"
        assert set(counts) == set(ids), "lost (or a row for a message nobody put)"
        assert all((r.okey, r.seq) == ids[r.msg_id] for r in rows)
        by_member = Counter(r.member for r in rows)
        # One process active at a time: the broker's choice (the others stand by).

        # Per key, the commit order (row id) is the put order, and no overlap.
        per_key: dict[str, list[sa.Row[tuple[object, ...]]]] = defaultdict(list)
        for r in rows:
            per_key[r.okey].append(r)
        inversions = in_one_process = overlaps = switches = 0
        examples: list[str] = []
        for key, got in per_key.items():
            for before, after in itertools.pairwise(got):
                if after.seq < before.seq:
                    inversions += 1
                    in_one_process += after.pid == before.pid
                    examples.append(
                        f"{key}: #{after.seq} ({after.member}) committed after "
                        f"#{before.seq} ({before.member})"
                    )
                if after.started < before.written:
                    overlaps += 1
                switches += after.pid != before.pid
        print(
            f"\nRabbitMQ ordered workers: {N} messages, {KEYS} keys, 4 processes x 4 threads "
            f"(per process {dict(sorted(by_member.items()))}); put {put_s:.1f} s, "
            f"processed by {run_s:.1f} s ({IDLE:g} s idle exit included); {inversions} inversions "
            f"({in_one_process} of them within one process's Worker), "
            f"{overlaps} overlaps, {switches} hand-overs of a key between processes; "
            f"elapsed {time.monotonic() - t0:.1f} s"
        )
        assert sorted(len(v) for v in per_key.values()) == [PER_KEY] * KEYS

        summaries = queue.search(state=PublisherState.JOURNALLED, limit=N + 1)
        assert len(summaries) == N
        assert {st for s in summaries for st in s.subscribers.values()} == {S.JOURNALLED}

    # Last, and as its own exception: the xfail covers this failure and no other.
    if inversions or overlaps:
        raise KeyOutOfOrder(
            f"{inversions} inversions, e.g. {examples[:5]}; {overlaps} messages started "
            f"before their predecessor's row was written"
        )
