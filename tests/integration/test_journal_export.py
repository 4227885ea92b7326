"""``iq journal export`` on real stores: the embedded SQLite default, the Redis index,
PostgreSQL and MariaDB.

* The exported journal equals ``store.journal()`` row for row (seqs, ids, states, times);
  the messages rows carry what the put gave (parents, correlation id, priority) and the
  payload where the store retained one; queue names with ``/``, ``:``, ``=``, ``%`` read
  back as themselves; a purged message has its transitions but no messages row.
* A re-run exports only what is new, never a seq twice.
* A transaction still open while an export runs on a SQL server store (its sequence
  numbers taken, not yet visible) is exported by the next run once it commits; the
  numbers of one that rolled back are forgotten after the grace.
* A kill at every ``os.replace`` of a run (each staged file's move and both watermark
  writes of every page), then a re-run, leaves every seq exactly once and none missing.
* The command line: its one output line, exit codes, one-line errors.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from typer.testing import CliRunner

import iqbridge
from iqbridge import Pool, engine
from iqbridge.analytics.export import export_journal, store_id
from iqbridge.cli import app
from iqbridge.ids import new_id
from iqbridge.model import Audience, JournalEntry, Retained
from iqbridge.states import ActorKind
from iqbridge.stores.base import IndexStore
from tests.redis_index_helpers import REDIS_URL, fresh_prefix
from tests.sql_helpers import MARIADB_URL, PG_URL, fresh_schema

ALL = 10**9
FIELDS = ("seq", "msg_id", "queue", "actor", "actor_kind", "src", "dst", "at", "attempt", "detail")
LINE = re.compile(
    r"exported (\d+) transition\(s\), (\d+) message\(s\) from (\S+) to (\S+) \(watermark (\d+)\)"
)


@dataclass
class Source:
    hub: iqbridge.Hub
    broker: str
    index: str | None
    kind: str

    @property
    def store(self) -> IndexStore:
        return self.hub.store


def _server(kind: str) -> tuple[str, str]:
    if kind == "postgres":
        return PG_URL, "PostgreSQL at 127.0.0.1:5432"
    return MARIADB_URL, "MariaDB at 127.0.0.1:3306"


@pytest.fixture(
    params=[
        pytest.param("sqlite"),
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ]
)
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Source]:
    """A hub on an SQLite broker file with the parametrized index store."""
    yield from _source(request.param, tmp_path)


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ]
)
def sql_source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Source]:
    """A hub whose index is on a SQL server (sequence numbers can commit late)."""
    yield from _source(request.param, tmp_path)


def _source(kind: str, tmp_path: Path) -> Iterator[Source]:
    broker = f"sqlite:///{tmp_path / 'q.db'}"
    if kind == "sqlite":
        with iqbridge.connect(broker) as hub:
            yield Source(hub, broker, None, kind)
    elif kind == "redis":
        with fresh_prefix("exp") as prefix:
            index = f"{REDIS_URL}?prefix={prefix}"
            with iqbridge.connect(broker, index=index) as hub:
                yield Source(hub, broker, index, kind)
    else:
        with (
            fresh_schema(*_server(kind), label="iqexp") as index,
            iqbridge.connect(broker, index=index) as hub,
        ):
            yield Source(hub, broker, index, kind)


@dataclass
class Put:
    queue: str
    parents: tuple[str, ...]
    correlation_id: str | None
    priority: int
    payload: bytes | None
    headers: dict[str, str] | None


def traffic(hub: iqbridge.Hub, n: int = 6) -> dict[str, Put]:
    """Puts, gets and settlements on three queues (one retaining payloads, one with a
    pool, one named with ``/`` written straight to the store); what each put gave."""
    uid = uuid.uuid4().hex[:8]
    puts: dict[str, Put] = {}
    kept = hub.queue(f"exp:{uid}", retain=True)
    kept.subscribe("a", "b")
    plain = hub.queue(f"exp={uid}%x")
    parent: tuple[str, ...] = ()
    for i in range(n):
        body, headers, cid = f"body {i}".encode(), {"h": f"é{i}"}, f"corr-{uid}-{i}"
        mid = kept.put(body, parents=parent, correlation_id=cid, priority=i % 10, headers=headers)
        puts[mid] = Put(kept.name, parent, cid, i % 10, body, headers)
        parent = (mid,)
        other = plain.put(b"x", to=[Pool("workers", ["w1", "w2"])], priority=9 - i)
        puts[other] = Put(plain.name, (), None, 9 - i, None, None)
    for i in range(n):
        delivery = kept.get("a", timeout=0)
        assert delivery is not None
        delivery.done()
        delivery = kept.get("b", timeout=0)
        assert delivery is not None
        delivery.unusable("bad") if i % 3 == 0 else delivery.done()
        delivery = plain.get("w1" if i % 2 else "w2", timeout=0)
        assert delivery is not None
        delivery.done()
    slashed = f"orders/eu:{uid}"
    hub.store.declare_queue(slashed)
    change = engine.new_message(
        msg_id=new_id(),
        queue=slashed,
        publisher="direct",
        audience=Audience(("s",)),
        now=hub.now_us(),
        parents=tuple(puts)[:2],
        priority=7,
    )
    change.retain = Retained(b"\x00\xff", {"k": "v"})
    hub.store.commit(change)
    puts[change.msg_id] = Put(slashed, tuple(puts)[:2], None, 7, b"\x00\xff", {"k": "v"})
    return puts


def read(out: Path, kind: str) -> list[dict[str, object]]:
    if not (out / kind).exists():
        return []
    table = ds.dataset(out / kind, partitioning="hive").to_table()
    time_col = "at" if kind == "journal" else "put_at"
    index = table.schema.get_field_index(time_col)
    table = table.set_column(index, time_col, table.column(time_col).cast(pa.int64()))
    rows: list[dict[str, object]] = table.to_pylist()
    return sorted(rows, key=lambda r: int(str(r["seq"])))


def _states(e: JournalEntry) -> tuple[str | None, str]:
    return (None if e.src is None else str(e.src)), str(e.dst)


def assert_exactly_the_journal(out: Path, store: IndexStore) -> list[dict[str, object]]:
    """Every journal entry of the store exported once, with every field as stored."""
    rows = read(out, "journal")
    want = [
        (e.seq, e.msg_id, e.queue, e.actor, str(e.actor_kind), *_states(e), e.at, *e[7:9])
        for e in store.journal(0, ALL)
    ]
    got = [tuple(r[k] for k in FIELDS) for r in rows]
    seqs = [int(str(r["seq"])) for r in rows]
    assert seqs == sorted(set(seqs)), "a seq exported twice"
    assert got == want
    assert {r["store"] for r in rows} <= {store.url}
    return rows


def test_the_export_is_the_journal_and_the_messages_carry_the_put(
    source: Source, tmp_path: Path
) -> None:
    hub, store = source.hub, source.store
    puts = traffic(hub)
    gone = hub.queue("exp-purged")
    gone.subscribe("s")
    purged = gone.put(b"short-lived")
    delivery = gone.get("s", timeout=0)
    assert delivery is not None
    delivery.done()
    assert gone.purge(0) == 1
    out = tmp_path / "out"

    result = export_journal(store, out, page_size=9)

    rows = assert_exactly_the_journal(out, store)
    assert (result.rows, result.messages, result.gaps) == (len(rows), len(puts), 0)
    assert result.high == rows[-1]["seq"] == result.floor
    assert result.store_id == store_id(store.url)
    assert any(r["msg_id"] == purged for r in rows)
    messages = {str(r["msg_id"]): r for r in read(out, "messages")}
    assert set(messages) == set(puts)  # the purged one has none
    records = store.load_many(list(puts))
    creations = {
        e.msg_id: e.seq
        for e in store.journal(0, ALL)
        if e.src is None and e.actor_kind == ActorKind.PUBLISHER
    }
    for mid, put in puts.items():
        row, rec = messages[mid], records[mid]
        assert row["queue"] == put.queue
        assert tuple(row["parents"]) == put.parents  # type: ignore[arg-type]
        assert (row["correlation_id"], row["priority"]) == (put.correlation_id, put.priority)
        assert row["payload"] == put.payload
        assert (None if row["headers"] is None else json.loads(str(row["headers"]))) == (
            put.headers
        )
        assert (row["put_at"], row["mode"], row["publisher"]) == (
            rec.created_at,
            str(rec.mode),
            rec.publisher,
        )
        assert row["seq"] == creations[mid]
    assert {r["mode"] for r in messages.values()} == {"pubsub", "pool"}
    layout = {p.parent.name for p in (out / "journal").rglob("*.parquet")}
    assert any(name.startswith("queue=orders%2Feu%3A") for name in layout)

    again = export_journal(store, out, page_size=9)
    assert (again.rows, again.messages, again.files) == (0, 0, 0)


def test_a_rerun_exports_only_what_is_new(source: Source, tmp_path: Path) -> None:
    hub, store = source.hub, source.store
    out = tmp_path / "out"
    first = set(traffic(hub, 3))
    one = export_journal(store, out, page_size=7)
    before = {int(str(r["seq"])) for r in read(out, "journal")}
    second = set(traffic(hub, 2))
    two = export_journal(store, out, page_size=7)
    rows = assert_exactly_the_journal(out, store)
    assert two.rows == len(rows) - one.rows == len(rows) - len(before)
    assert two.messages == len(second)
    assert min(int(str(r["seq"])) for r in rows if int(str(r["seq"])) not in before) > max(before)
    messages = Counter(str(r["msg_id"]) for r in read(out, "messages"))
    assert messages == Counter(first | second)


class _Rollback(Exception):
    pass


def test_a_transaction_committing_late_is_exported_when_it_commits(
    sql_source: Source, tmp_path: Path
) -> None:
    hub, store = sql_source.hub, sql_source.store
    q = hub.queue(f"late-{uuid.uuid4().hex[:8]}")
    q.subscribe("a")
    q.put(b"before")
    held, release = threading.Barrier(3), threading.Event()
    late_ids: dict[bool, str] = {}

    def open_transaction(commit: bool) -> None:
        change = engine.new_message(
            msg_id=new_id(), queue=q.name, publisher="slow", audience=Audience(("a",)), now=1
        )
        late_ids[commit] = change.msg_id
        try:
            with store.atomic():
                store.commit(change)
                held.wait(10)
                release.wait(10)
                if not commit:
                    raise _Rollback
        except _Rollback:
            pass

    threads = [threading.Thread(target=open_transaction, args=(c,)) for c in (True, False)]
    for t in threads:
        t.start()
    held.wait(10)
    q.put(b"after")
    t0 = 1_900_000_000.0
    out = tmp_path / "out"
    try:
        one = export_journal(store, out, page_size=4, gap_grace=60, now=lambda: t0)
    finally:
        release.set()
        for t in threads:
            t.join()
    assert one.gaps == 6  # PUT, REVEALED, AVAILABLE of each open transaction
    assert one.floor < one.high
    wm = json.loads((out / "_iqexport" / f"{one.store_id}.json").read_text())
    assert len(wm["gaps"]) in (1, 2) and wm["pending"] is None

    two = export_journal(store, out, page_size=4, gap_grace=60, now=lambda: t0 + 30)
    assert (two.rows, two.messages, two.gaps) == (3, 1, 3)
    messages = [str(r["msg_id"]) for r in read(out, "messages")]
    assert late_ids[True] in messages and late_ids[False] not in messages

    three = export_journal(store, out, page_size=4, gap_grace=60, now=lambda: t0 + 61)
    assert (three.rows, three.gaps, three.floor) == (0, 0, three.high)
    assert_exactly_the_journal(out, store)


_CHILD = """
import os, sys
from iqbridge.analytics.export import export_journal
from iqbridge.registry import open_store

url, out, page_size, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
real, calls = os.replace, []

def replace(src, dst, *args, **kwargs):
    calls.append(str(dst))
    if len(calls) == kill_at:
        os._exit(137)
    return real(src, dst, *args, **kwargs)

os.replace = replace
export_journal(open_store(url), out, page_size=page_size)
print("\\n".join(calls))
"""


def _child(url: str, out: Path, page_size: int, kill_at: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CHILD, url, str(out), str(page_size), str(kill_at)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_kill_at_any_replace_then_a_rerun_exports_every_row_once(
    hub: iqbridge.Hub, tmp_path: Path
) -> None:
    store = hub.store
    traffic(hub, 2)
    url, page_size = store.url, 8
    full = _child(url, tmp_path / "count", page_size, 0)
    assert full.returncode == 0, full.stderr
    calls = full.stdout.split()
    watermarks = [i for i, dst in enumerate(calls, 1) if dst.endswith(".json")]
    moves = [i for i, dst in enumerate(calls, 1) if dst.endswith(".parquet")]
    assert len(watermarks) >= 6 and len(moves) >= len(watermarks) // 2  # several pages

    def kill(k: int) -> subprocess.CompletedProcess[str]:
        return _child(url, tmp_path / f"kill-{k}", page_size, k)

    every = range(1, len(calls) + 1)
    with ThreadPoolExecutor(4) as pool:
        killed = dict(zip(every, pool.map(kill, every), strict=True))
    for k, child in killed.items():
        assert child.returncode == 137, (k, child.stderr)
        out = tmp_path / f"kill-{k}"
        path = out / "_iqexport" / f"{store_id(url)}.json"
        pending = path.exists() and json.loads(path.read_text())["pending"] is not None
        written = sum(1 for dst in calls[: k - 1] if dst.endswith(".json"))
        assert pending == (written % 2 == 1), k  # each page: pending set, then cleared
        export_journal(store, out, page_size=page_size)
        assert_exactly_the_journal(out, store)
        assert sorted(str(r["msg_id"]) for r in read(out, "messages")) == sorted(
            str(r["msg_id"]) for r in read(tmp_path / "count", "messages")
        )
        assert not list((out / "_iqexport" / "staging").rglob("*.parquet"))

    # Killed again while rolling the first kill's page forward.
    out = tmp_path / "twice"
    assert _child(url, out, page_size, moves[1]).returncode == 137
    state = out / "_iqexport" / f"{store_id(url)}.json"
    assert json.loads(state.read_text())["pending"] is not None
    assert _child(url, out, page_size, 1).returncode == 137  # its first move of that page
    export_journal(store, out, page_size=page_size)
    assert_exactly_the_journal(out, store)


# --- the command line -------------------------------------------------------------------


def test_iq_journal_export_prints_one_line(source: Source, tmp_path: Path) -> None:
    traffic(source.hub, 2)
    out = tmp_path / "out"
    args = ["--url", source.broker]
    if source.index:
        args += ["--index", source.index]
    args += ["journal", "export", "--to", str(out), "--page-size", "5", "--gap-grace", "1m"]
    runner = CliRunner()
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    match = LINE.fullmatch(lines[0])
    assert match is not None, lines[0]
    rows = assert_exactly_the_journal(out, source.store)
    assert match.groups() == (
        str(len(rows)),
        "5",
        source.store.url,
        str(out),
        str(rows[-1]["seq"]),
    )
    assert result.stderr == ""  # no progress bar when stderr is not a terminal
    again = runner.invoke(app, [*args, "--no-payloads", "--quiet"])
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith("exported 0 transition(s), 0 message(s) from ")

    fresh = [a if a != str(out) else str(tmp_path / "fresh") for a in args]
    shown = runner.invoke(app, fresh, env={"FORCE_COLOR": "1"})  # a terminal, for rich
    assert shown.exit_code == 0, shown.output
    assert "exporting the journal" in shown.stderr and "rows/s" in shown.stderr
    assert LINE.fullmatch(shown.stdout.strip()) is not None
    quiet = runner.invoke(app, [*fresh, "--quiet"], env={"FORCE_COLOR": "1"})
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.output


@pytest.mark.parametrize(
    ("options", "extra", "code", "needle"),
    [
        (["--url", "sqlit:///x.db"], [], 1, "did you mean 'sqlite'"),
        (["--url", "sqlite:///{tmp}/none.db"], [], 1, "no iqbridge database at"),
        (
            ["--index", "postgresql://iq:s3cret-pw@127.0.0.1:1/test"],
            [],
            1,
            "postgresql://iq:***@127.0.0.1:1/test",
        ),
        (["--url", "sqlite:///{tmp}/none.db"], ["--gap-grace", "soon"], 2, "not a duration"),
    ],
)
def test_iq_journal_export_errors_are_one_line(
    tmp_path: Path, options: list[str], extra: list[str], code: int, needle: str
) -> None:
    options = [a.replace("{tmp}", str(tmp_path)) for a in options]
    argv = [*options, "journal", "export", "--to", str(tmp_path / "out"), *extra]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("iq: error: "), result.stderr
    assert needle in lines[0]
    assert "s3cret-pw" not in result.output
    assert not (tmp_path / "none.db").exists()
