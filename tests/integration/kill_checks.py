"""What the broker kill tests (RabbitMQ, Kafka) check once the consumers are done: the
application's own record (one row per message and group, nothing lost) and the index
(every member JOURNALLED, one DONE each, by the attempt that wrote the row)."""

from __future__ import annotations

import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import sqlalchemy as sa

import iqbridge
from iqbridge import JournalEntry, PublisherState, SubscriberState
from iqbridge.queue import Queue
from iqbridge.states import ActorKind

S = SubscriberState


def wait_for_rows(
    rows: Callable[[], int],
    want: int,
    procs: dict[str, subprocess.Popen[bytes]],
    logs: Path,
    timeout: float = 120.0,
) -> None:
    """Wait until the application recorded ``want`` rows; fail at once, with its stderr
    (``logs / <name>.stderr``), if a consumer exits."""
    deadline = time.monotonic() + timeout
    while (done_rows := rows()) < want:
        for name, proc in procs.items():
            assert proc.poll() is None, (
                f"consumer {name} exited with {proc.returncode}:\n"
                + (logs / f"{name}.stderr").read_text(errors="replace")[-3000:]
            )
        assert time.monotonic() < deadline, f"only {done_rows} of {want} rows"
        time.sleep(0.2)


def whole_journal(hub: iqbridge.Hub) -> list[JournalEntry]:
    """Every journal entry of the hub's store, oldest first."""
    entries: list[JournalEntry] = []
    after = 0
    while batch := hub.journal(after=after, limit=20_000):
        entries.extend(batch)
        after = batch[-1].seq or 0
    return entries


def check_once_only(
    app: sa.engine.Engine,
    table: sa.Table,
    ids: Sequence[str],
    queue: Queue,
    hub: iqbridge.Hub,
) -> tuple[dict[tuple[str, str], int], Counter[str]]:
    """Named subscribers ``a`` and ``b`` and the pool (members ``m1``, ``m2``): exactly
    one row per message each, nothing lost, both members worked; in the index every
    member JOURNALLED with one DONE, made by the attempt that wrote the row. Returns the
    committed attempt per (message, member) and the rows per member."""
    n = len(ids)
    with app.connect() as conn:
        recorded = conn.execute(
            sa.select(table.c.grp, table.c.member, table.c.msg_id, table.c.attempt)
        ).all()
    app.dispose()
    per_group: dict[str, Counter[str]] = defaultdict(Counter)
    for r in recorded:
        per_group[r.grp][r.msg_id] += 1
    assert sorted(per_group) == ["a", "b", "pool"]
    for grp, counts in per_group.items():
        twice = [m for m, k in counts.items() if k > 1]
        lost = set(ids) - set(counts)
        assert not twice, f"{grp}: {len(twice)} message(s) processed twice, e.g. {twice[:3]}"
        assert not lost, f"{grp}: {len(lost)} message(s) lost, e.g. {sorted(lost)[:3]}"
        assert set(counts) == set(ids), f"{grp}: rows for messages nobody put"
    assert len(recorded) == 3 * n
    by_member = Counter(r.member for r in recorded)
    assert by_member["m1"] > 0 and by_member["m2"] > 0, f"no competition: {by_member}"
    committed = {(r.msg_id, r.member): r.attempt for r in recorded}

    summaries = queue.search(state=PublisherState.JOURNALLED, limit=n + 1)
    assert len(summaries) == n
    assert {s.msg_id for s in summaries} == set(ids)
    assert {st for s in summaries for st in s.subscribers.values()} == {S.JOURNALLED}
    assert {frozenset(s.subscribers) for s in summaries} == {frozenset({"a", "b", "m1", "m2"})}
    done = [
        e
        for e in whole_journal(hub)
        if e.actor_kind is ActorKind.SUBSCRIBER and e.dst == S.DONE.value
    ]
    assert len(done) == 3 * n, f"{len(done)} DONE moves for {3 * n} deliveries"
    assert {(e.msg_id, e.actor): e.attempt for e in done} == committed
    return committed, by_member
