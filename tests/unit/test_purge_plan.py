"""Purging exactly what a retention plan lists: ``Queue.purge_listed`` (and its async
twin) and ``iq purge --from-plan PLAN [--dry-run]``, on real traffic (put, get, done)
on the embedded SQLite default and the in-process memory broker. A purge plan is the
Parquet file (or directory) the analytics retention job writes: store, queue, msg_id,
journalled_at, before. The store-level rule (``IndexStore.purge(..., ids=...)``) is in
the store contract suite, run on every store."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner, Result

import iqbridge
from iqbridge import aio
from iqbridge.cli import app
from iqbridge.errors import InvalidArgument, MessageNotFound
from iqbridge.model import from_micros
from iqbridge.states import PublisherState, SubscriberState
from iqbridge.testing import FakeClock
from tests.unit.test_cli import ok, one_error_line

Run = Callable[..., Result]

#: Where no store of these tests is.
OTHER_STORE = "redis://elsewhere:6379/0?prefix=prod"

PLAN_SCHEMA = pa.schema(
    [
        pa.field("store", pa.string()),
        pa.field("queue", pa.string()),
        pa.field("msg_id", pa.string()),
        pa.field("journalled_at", pa.timestamp("us", tz="UTC")),
        pa.field("before", pa.timestamp("us", tz="UTC")),
    ]
)


@pytest.fixture
def iq(sqlite_url: str) -> Run:
    """Run ``iq --url <tmp db> ARGS...`` in-process."""
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(app, ["--url", sqlite_url, *args])

    return run


@pytest.fixture
def clock() -> FakeClock:
    """In the past (2023): the command line's own hub reads the real clock."""
    return FakeClock(1_700_000_000.0)


@pytest.fixture
def hub(sqlite_url: str, clock: FakeClock) -> Iterator[iqbridge.Hub]:
    with iqbridge.connect(sqlite_url, clock=clock) as h:
        yield h


def now(clock: FakeClock) -> datetime:
    return datetime.fromtimestamp(clock.now, UTC)


def done(hub: iqbridge.Hub, queue: str, clock: FakeClock, payload: str = "x") -> str:
    """Put a message, get it and mark it DONE: JOURNALLED, payload kept; then tick."""
    q = hub.queue(queue)
    msg_id = q.put(payload, to=["s"])
    delivery = q.get("s")
    assert delivery is not None and delivery.msg_id == msg_id
    delivery.done()
    assert q.state(msg_id).publisher_state is PublisherState.JOURNALLED
    clock.advance(1)
    return msg_id


def rerevealed(hub: iqbridge.Hub, queue: str, clock: FakeClock) -> str:
    """A message found UNUSABLE (JOURNALLED), then re-revealed: AVAILABLE again."""
    q = hub.queue(queue)
    msg_id = q.put("poison?", to=["s"])
    delivery = q.get("s")
    assert delivery is not None
    delivery.unusable("looked bad")
    assert q.state(msg_id).publisher_state is PublisherState.JOURNALLED
    q.reveal(msg_id, to="s")
    assert q.state(msg_id).subscribers["s"].state is SubscriberState.AVAILABLE
    clock.advance(1)
    return msg_id


def write_plan(path: Path, rows: Sequence[tuple[str, str, str, datetime]]) -> Path:
    """A purge plan as the retention job writes it: (store, queue, msg_id, before) rows."""
    table = pa.Table.from_pylist(
        [
            {
                "store": s,
                "queue": q,
                "msg_id": m,
                "journalled_at": b - timedelta(days=1),
                "before": b,
            }
            for s, q, m, b in rows
        ],
        schema=PLAN_SCHEMA,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def gone(hub: iqbridge.Hub, queue: str, msg_id: str) -> bool:
    try:
        hub.queue(queue).state(msg_id)
    except MessageNotFound:
        assert hub.queue(queue).search(msg_id=msg_id) == []
        return True
    return False


def journalled_ids(hub: iqbridge.Hub) -> set[str]:
    return {e.msg_id for e in hub.journal(0, 1_000_000)}


def queue_rows(sqlite_url: str, refs: Sequence[str | None]) -> int:
    """How many of these broker entries the embedded SQLite queue still holds."""
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        marks = ",".join("?" * len(refs))
        row = conn.execute(
            f"SELECT count(*) FROM iq_queue_rows WHERE ref IN ({marks})",
            [int(r) for r in refs if r is not None],
        ).fetchone()
    return int(row[0])


# --- iq purge --from-plan ---------------------------------------------------------------


def test_a_plan_purges_exactly_the_listed_purgeable_messages(
    iq: Run, hub: iqbridge.Hub, clock: FakeClock, sqlite_url: str, tmp_path: Path
) -> None:
    store = hub.store.url
    listed = [done(hub, "orders", clock) for _ in range(3)]
    audit = done(hub, "audit", clock)
    unlisted = done(hub, "orders", clock)
    cutoff = now(clock)  # what the retention rule allows: journalled before now
    too_recent = done(hub, "orders", clock)
    theirs = done(hub, "orders", clock)
    back = rerevealed(hub, "orders", clock)  # last: a get would take it again
    refs = [hub.store.load(m).native_ref for m in [*listed, audit]]
    assert queue_rows(sqlite_url, refs) == 4
    history = {e for e in hub.journal(0, 1_000_000) if e.msg_id in listed}
    later = now(clock)
    plan = write_plan(
        tmp_path / "plan.parquet",
        [
            *[(store, "orders", m, cutoff) for m in listed],
            (store, "audit", audit, later),
            (store, "orders", too_recent, cutoff),
            (store, "orders", back, later),
            (store, "orders", "01a204d2-adcc-703c-a805-10edb4ac4fd1", later),  # gone
            (store, "ghosts", "01a204d2-adcc-703c-a805-10edb4ac4fd2", later),
            (OTHER_STORE, "orders", theirs, later),
        ],
    )

    out = ok(iq("purge", "--from-plan", str(plan)))

    assert out.strip() == (
        f"purged 4 message(s) from {plan}; 3 listed no longer purgeable (re-revealed, too "
        f"recent or gone); 1 for other stores ({OTHER_STORE}; rerun with --url/--index "
        f"naming it); 1 for unknown queue(s) (ghosts)"
    )
    for msg_id in listed:
        assert gone(hub, "orders", msg_id)
    assert gone(hub, "audit", audit)
    for msg_id in (unlisted, too_recent, back, theirs):
        assert not gone(hub, "orders", msg_id)
    assert hub.queue("orders").state(back).subscribers["s"].state is SubscriberState.AVAILABLE
    # The journal is kept (the audit trail the retention job archived from); the payloads
    # went from the broker with the records.
    assert history <= set(hub.journal(0, 1_000_000))
    assert {*listed, audit} <= journalled_ids(hub)
    assert queue_rows(sqlite_url, refs) == 0
    assert hub.queues() == ["audit", "orders"]  # the unknown queue was not created

    again = ok(iq("purge", "--from-plan", str(plan)))
    assert again.startswith(f"purged 0 message(s) from {plan}; 7 listed no longer purgeable")


def test_a_dry_run_counts_what_the_plan_lists_per_queue_and_deletes_nothing(
    iq: Run, hub: iqbridge.Hub, clock: FakeClock, tmp_path: Path
) -> None:
    store = hub.store.url
    orders = [done(hub, "orders", clock) for _ in range(3)]
    audit = done(hub, "audit", clock)
    cutoff = now(clock)
    plan = write_plan(
        tmp_path / "plan.parquet",
        [
            *[(store, "orders", m, cutoff) for m in orders],
            (store, "orders", orders[0], cutoff),  # listed twice: one message
            (store, "audit", audit, cutoff),
            (store, "ghosts", "no-such-message", cutoff),
            (OTHER_STORE, "orders", "theirs-1", cutoff),
            ("sqlite:////elsewhere/iq.db", "orders", "theirs-2", cutoff),
        ],
    )
    out = ok(iq("purge", "--from-plan", str(plan), "--dry-run"))
    assert out.splitlines() == [
        "audit: 1 listed",
        "ghosts: 1 listed (no such queue)",
        "orders: 3 listed",
        f"dry run: 5 message(s) listed for this store in {plan}, nothing deleted; "
        f"2 for other stores ({OTHER_STORE}, sqlite:////elsewhere/iq.db; rerun with "
        f"--url/--index naming each); 1 for unknown queue(s) (ghosts)",
    ]
    for msg_id in orders:
        assert not gone(hub, "orders", msg_id)
    assert not gone(hub, "audit", audit)


def test_a_queue_argument_applies_only_that_queues_rows(
    iq: Run, hub: iqbridge.Hub, clock: FakeClock, tmp_path: Path
) -> None:
    store = hub.store.url
    orders, audit = done(hub, "orders", clock), done(hub, "audit", clock)
    plan = write_plan(
        tmp_path / "plan.parquet",
        [(store, "orders", orders, now(clock)), (store, "audit", audit, now(clock))],
    )
    out = ok(iq("purge", "audit", "--from-plan", str(plan)))
    assert out.strip() == (
        f"purged 1 message(s) from {plan}; 0 listed no longer purgeable (re-revealed, too "
        f"recent or gone); 0 for other stores; 1 for other queues"
    )
    assert gone(hub, "audit", audit) and not gone(hub, "orders", orders)


def test_a_plan_written_by_spark_is_a_directory_of_parts(
    iq: Run, hub: iqbridge.Hub, clock: FakeClock, tmp_path: Path
) -> None:
    """Parts, possibly partitioned by queue (the column then lives in the directory
    name), Spark's INT96 timestamps (naive nanoseconds, UTC), and its marker and
    checksum files."""
    store = hub.store.url
    orders = [done(hub, "orders", clock) for _ in range(2)]
    audit = done(hub, "orders:eu", clock)
    cutoff = now(clock)
    plan = tmp_path / "plan"
    write_plan(plan / "part-00000.parquet", [(store, "orders", orders[0], cutoff)])
    naive_ns = pa.table(
        {
            "store": [store],
            "msg_id": [orders[1]],
            "journalled_at": pa.array([cutoff.replace(tzinfo=None)], pa.timestamp("ns")),
            "before": pa.array([cutoff.replace(tzinfo=None)], pa.timestamp("ns")),
        }
    )
    (plan / "queue=orders").mkdir()
    pq.write_table(naive_ns, plan / "queue=orders" / "part-00001.parquet")
    eu = naive_ns.set_column(1, "msg_id", pa.array([audit]))
    (plan / "queue=orders%3Aeu").mkdir()
    pq.write_table(eu, plan / "queue=orders%3Aeu" / "part-00002.parquet")
    (plan / "_SUCCESS").write_bytes(b"")
    (plan / ".part-00000.parquet.crc").write_bytes(b"not parquet")
    out = ok(iq("purge", "--from-plan", str(plan)))
    assert out.startswith(f"purged 3 message(s) from {plan}; 0 listed no longer purgeable")
    assert all(gone(hub, "orders", m) for m in orders)
    assert gone(hub, "orders:eu", audit)


# --- malformed plans --------------------------------------------------------------------


def _table(**columns: Any) -> pa.Table:
    good: dict[str, Any] = {
        "store": ["sqlite:////x.db"],
        "queue": ["orders"],
        "msg_id": ["m-1"],
        "journalled_at": pa.array([datetime(2026, 1, 1, tzinfo=UTC)], pa.timestamp("us", "UTC")),
        "before": pa.array([datetime(2026, 2, 1, tzinfo=UTC)], pa.timestamp("us", "UTC")),
    }
    good.update(columns)
    return pa.table({k: v for k, v in good.items() if v is not None})


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        (_table(before=None, store=None), "missing column(s) store, before (it has queue, "),
        (_table(before=["2026-02-01"]), "column before is string, not a timestamp"),
        (_table(msg_id=pa.array([None], pa.string())), "column msg_id has 1 empty value(s)"),
        (_table(queue=pa.array([[1]])), "column queue is list<"),
    ],
    ids=["missing columns", "text cutoff", "empty id", "list queue"],
)
def test_a_malformed_plan_is_one_line_naming_the_file_and_the_problem(
    iq: Run, hub: iqbridge.Hub, tmp_path: Path, table: pa.Table, problem: str
) -> None:
    path = tmp_path / "plan.parquet"
    pq.write_table(table, path)
    line = one_error_line(iq("purge", "--from-plan", str(path)), 1)
    assert line.startswith(f"iq: error: purge plan {path}: {problem}")


def test_an_unreadable_or_missing_plan_is_one_line_naming_the_file(
    iq: Run, hub: iqbridge.Hub, clock: FakeClock, tmp_path: Path
) -> None:
    msg_id = done(hub, "orders", clock)
    missing = tmp_path / "nope.parquet"
    line = one_error_line(iq("purge", "--from-plan", str(missing)), 1)
    assert line == f"iq: error: purge plan {missing}: no such file or directory"

    empty = tmp_path / "empty"
    (empty / "_temporary").mkdir(parents=True)
    line = one_error_line(iq("purge", "--from-plan", str(empty)), 1)
    assert line == f"iq: error: purge plan {empty}: the directory holds no Parquet files"

    # One bad part in a directory: nothing is purged, and the error names that part.
    plan = tmp_path / "plan"
    write_plan(plan / "part-0.parquet", [(hub.store.url, "orders", msg_id, now(clock))])
    (plan / "part-1.parquet").write_text("store,queue,msg_id\n")
    line = one_error_line(iq("purge", "--from-plan", str(plan)), 1)
    assert line.startswith(
        f"iq: error: purge plan {plan / 'part-1.parquet'}: not a readable Parquet file ("
    )
    assert not gone(hub, "orders", msg_id)


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (("purge", "orders"), "exactly one of --older-than (with QUEUE) and --from-plan"),
        (
            ("purge", "orders", "--older-than", "1d", "--from-plan", "p.parquet"),
            "exactly one of --older-than (with QUEUE) and --from-plan",
        ),
        (("purge", "--older-than", "1d"), "--older-than needs the queue to purge"),
        (("purge", "orders", "--older-than", "1d", "--dry-run"), "only goes with --from-plan"),
    ],
)
def test_purge_options_that_do_not_go_together_are_usage_errors(
    iq: Run, args: tuple[str, ...], complaint: str
) -> None:
    assert complaint in one_error_line(iq(*args), 2)


def test_without_pyarrow_the_error_says_what_to_install(
    iq: Run, hub: iqbridge.Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = write_plan(tmp_path / "plan.parquet", [])
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    line = one_error_line(iq("purge", "--from-plan", str(plan)), 1)
    assert "pip install 'iqbridge[spark]'" in line


def test_older_than_keeps_working(iq: Run, hub: iqbridge.Hub, clock: FakeClock) -> None:
    msg_id = done(hub, "orders", clock)
    assert ok(iq("purge", "orders", "--older-than", "0s")).strip() == "purged 1 message(s)"
    assert gone(hub, "orders", msg_id)


# --- Queue.purge_listed -----------------------------------------------------------------


def test_purge_listed_on_the_memory_broker_deletes_records_and_broker_entries(
    clock: FakeClock,
) -> None:
    with iqbridge.connect("memory://", clock=clock) as hub:
        ids = [done(hub, "orders", clock) for _ in range(3)]
        kept = done(hub, "orders", clock)
        refs = [r for m in ids if (r := hub.store.load(m).native_ref) is not None]
        assert len(refs) == 3
        assert None not in hub.adapter.read_many("orders", refs)
        q = hub.queue("orders")
        # Thousands of unknown ids first: the listed ones are found across chunks.
        listed = [f"unknown-{n}" for n in range(2500)] + ids[::-1]
        assert q.purge_listed(listed, now(clock)) == 3
        assert all(gone(hub, "orders", m) for m in ids)
        assert not gone(hub, "orders", kept)
        assert {*ids} <= journalled_ids(hub)
        assert hub.adapter.read_many("orders", refs) == [None] * 3
        assert q.purge_listed(ids, now(clock)) == 0


def test_purge_listed_takes_a_datetime_or_microseconds(hub: iqbridge.Hub, clock: FakeClock) -> None:
    first, second = done(hub, "orders", clock), done(hub, "orders", clock)
    q = hub.queue("orders")
    stamp = hub.store.load(second).updated_at
    assert q.purge_listed([first, second], stamp) == 1  # the cutoff is exclusive
    assert q.purge_listed([second], from_micros(stamp + 1).replace(tzinfo=None)) == 1
    assert q.purge_listed([], stamp) == 0
    with pytest.raises(InvalidArgument):
        q.purge_listed(first, stamp)
    with pytest.raises(InvalidArgument):
        q.purge_listed([first], 1.5)  # type: ignore[arg-type]


def test_async_purge_listed(sqlite_url: str, clock: FakeClock) -> None:
    with iqbridge.connect(sqlite_url, clock=clock) as hub:
        msg_id = done(hub, "orders", clock)

    async def main() -> int:
        async with await aio.connect(sqlite_url) as ahub:
            return await ahub.queue("orders").purge_listed([msg_id], now(clock))

    assert asyncio.run(main()) == 1
    with iqbridge.connect(sqlite_url) as hub:
        assert gone(hub, "orders", msg_id)
