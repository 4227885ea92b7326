"""The journal export's watermark: sequence numbers a store shows late are exported on a
later run exactly once; numbers that never show up are forgotten after ``gap_grace``;
the watermark's own file, its lock and its errors.

The store is the in-memory one with a journal that hides chosen sequence numbers, as a
SQL server's does while the transactions holding them are open (a rolled-back one hides
its numbers for ever)."""

from __future__ import annotations

import fcntl
import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow.dataset as ds
import pytest

import iqbridge
from iqbridge import engine
from iqbridge.analytics.export import (
    ExportError,
    Watermark,
    export_journal,
    late_commits,
    store_id,
)
from iqbridge.errors import ConfigurationError
from iqbridge.ids import new_id
from iqbridge.model import Audience, JournalEntry, Retained
from iqbridge.stores.memory import MemoryStore

GRACE = 300.0


class LateStore(MemoryStore):
    """A memory store whose journal leaves out the sequence numbers in ``hidden``."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden: set[int] = set()

    def journal(self, after: int = 0, limit: int = 1000) -> list[JournalEntry]:
        return [e for e in super().journal(after, limit) if e.seq not in self.hidden]


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def store() -> Iterator[LateStore]:
    s = LateStore()
    with iqbridge.connect("memory://", index=s) as hub:
        q = hub.queue("orders")
        q.subscribe("a")
        for i in range(6):
            q.put(f"m{i}", correlation_id=f"c{i}")  # seqs 3i+1 (PUT), +2, +3
        yield s


def exported(out: Path, kind: str = "journal") -> list[int]:
    if not (out / kind).exists():
        return []
    return sorted(ds.dataset(out / kind, partitioning="hive").to_table().column("seq").to_pylist())


def watermark(out: Path, store: MemoryStore) -> dict[str, object]:
    data: dict[str, object] = json.loads(
        (out / "_iqexport" / f"{store_id(store.url)}.json").read_text()
    )
    return data


def test_late_rows_are_exported_once_and_lost_ones_forgotten_after_the_grace(
    store: LateStore, tmp_path: Path
) -> None:
    clock = Clock()
    out = tmp_path / "out"
    every = [e.seq for e in store.journal(0, 1000)]
    assert every == list(range(1, 19))
    store.hidden = {4, 5, 6, 10}  # message 1 is committing late; 10 rolled back

    def run() -> None:
        export_journal(store, out, page_size=4, gap_grace=GRACE, now=clock, late=True)

    run()
    assert exported(out) == [s for s in every if s not in store.hidden]
    wm = watermark(out, store)
    assert (wm["floor"], wm["high"], wm["pending"]) == (3, 18, None)
    assert wm["gaps"] == {"4-6": clock.t, "10": clock.t}
    assert exported(out, "messages") == [1, 7, 13, 16]  # the PUTs of messages 1 and 3 hide

    clock.t += 10
    store.hidden = {10}
    run()
    assert exported(out) == [s for s in every if s != 10]
    assert exported(out, "messages") == [1, 4, 7, 13, 16]
    wm = watermark(out, store)
    assert (wm["floor"], wm["high"], wm["gaps"]) == (9, 18, {"10": clock.t - 10})

    clock.t += GRACE - 10  # first missed exactly GRACE ago: kept
    run()
    assert watermark(out, store)["floor"] == 9
    clock.t += 1
    run()
    wm = watermark(out, store)
    assert (wm["floor"], wm["high"], wm["gaps"]) == (18, 18, {})
    assert exported(out) == [s for s in every if s != 10]

    with iqbridge.connect("memory://", index=store) as hub:
        hub.queue("orders").put("late")
    run()
    seqs = exported(out)
    assert seqs == sorted(set(seqs))
    assert seqs[-3:] == [19, 20, 21]


def test_a_message_created_late_gets_its_messages_row_once(
    store: LateStore, tmp_path: Path
) -> None:
    clock = Clock()
    out = tmp_path / "out"
    store.hidden = {7, 8, 9}
    for _ in range(3):
        export_journal(store, out, page_size=5, now=clock, late=True)
    assert exported(out, "messages") == [1, 4, 10, 13, 16]
    store.hidden = set()
    for _ in range(2):
        export_journal(store, out, page_size=5, now=clock, late=True)
    assert exported(out, "messages") == [1, 4, 7, 10, 13, 16]
    table = ds.dataset(out / "messages", partitioning="hive").to_table().to_pylist()
    assert Counter(r["correlation_id"] for r in table) == {f"c{i}": 1 for i in range(6)}
    assert exported(out) == list(range(1, 19))


def test_gap_ranges_split_as_numbers_show_up(store: LateStore, tmp_path: Path) -> None:
    clock = Clock()
    out = tmp_path / "out"
    store.hidden = set(range(5, 12))
    export_journal(store, out, page_size=100, now=clock, late=True)
    assert watermark(out, store)["gaps"] == {"5-11": clock.t}
    store.hidden = {5, 6, 9, 11}
    export_journal(store, out, page_size=3, now=clock, late=True)
    assert watermark(out, store)["gaps"] == {"5-6": clock.t, "9": clock.t, "11": clock.t}
    assert watermark(out, store)["floor"] == 4
    assert exported(out) == [s for s in range(1, 19) if s not in store.hidden]


def test_a_store_that_commits_in_order_keeps_no_gaps(tmp_path: Path) -> None:
    store = LateStore()
    with iqbridge.connect("memory://", index=store) as hub:
        q = hub.queue("orders")
        q.subscribe("a")
        for i in range(3):
            q.put(i)
    store.hidden = {2}
    result = export_journal(store, tmp_path, page_size=2)
    assert (result.rows, result.messages, result.gaps, result.floor) == (8, 3, 0, 9)
    store.hidden = set()
    assert export_journal(store, tmp_path).rows == 0  # in order: 2 can never come now


@pytest.mark.parametrize(
    ("url", "late"),
    [
        ("postgresql://u@h/db", True),
        ("postgresql+psycopg://u@h/db", True),
        ("mariadb://root@h/db?schema=x", True),
        ("mysql+pymysql://root@h/db", True),
        ("oracle+oracledb://u@h/db", True),
        ("sql+sqlite:///x.db", False),
        ("sqlite:///x.db", False),
        ("redis://h:6379/0", False),
        ("memory://", False),
    ],
)
def test_which_stores_can_commit_late(url: str, late: bool) -> None:
    store = MemoryStore()
    store.url = url
    assert late_commits(store) is late


def test_queue_names_round_trip_through_partition_directories(tmp_path: Path) -> None:
    store = MemoryStore()
    names = ["orders/eu:1", "a=b%c", "x#y?z", "plain"]
    for name in names:
        change = engine.new_message(
            msg_id=new_id(), queue=name, publisher="p", audience=Audience(("s",)), now=10**15
        )
        change.retain = Retained(name.encode(), {"k": name})
        store.commit(change)
    export_journal(store, tmp_path)
    journal = ds.dataset(tmp_path / "journal", partitioning="hive").to_table()
    assert Counter(journal.column("queue").to_pylist()) == dict.fromkeys(names, 3)
    rows = ds.dataset(tmp_path / "messages", partitioning="hive").to_table().to_pylist()
    assert sorted(
        (r["queue"], r["payload"], json.loads(r["headers"])["k"]) for r in rows
    ) == sorted((n, n.encode(), n) for n in names)
    assert {r["date"] for r in rows} == {"2001-09-09"}
    dirs = {p.name for p in (tmp_path / "journal" / "date=2001-09-09").iterdir()}
    assert "queue=orders%2Feu%3A1" in dirs


def test_several_stores_export_into_one_directory(tmp_path: Path) -> None:
    stores = [MemoryStore("export-a"), MemoryStore("export-b")]
    for n, store in enumerate(stores, 1):
        with iqbridge.connect("memory://", index=store) as hub:
            q = hub.queue("orders")
            q.subscribe("a")
            for i in range(n * 2):
                q.put(i)
    for _ in range(2):
        for store in stores:
            export_journal(store, tmp_path, page_size=4)
    rows = ds.dataset(tmp_path / "journal", partitioning="hive").to_table().to_pylist()
    assert Counter((r["store"], r["seq"]) for r in rows) == {
        (s.url, e.seq): 1 for s in stores for e in s.journal(0, 1000)
    }
    assert {p.name for p in (tmp_path / "_iqexport").glob("*.json")} == {
        f"{store_id(s.url)}.json" for s in stores
    }


def test_without_pyarrow_the_error_names_the_extra(
    store: LateStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'iqbridge\[spark\]'"):
        export_journal(store, tmp_path)
    assert not (tmp_path / "journal").exists()


def test_a_damaged_or_foreign_watermark_is_an_export_error(
    store: LateStore, tmp_path: Path
) -> None:
    export_journal(store, tmp_path)
    path = tmp_path / "_iqexport" / f"{store_id(store.url)}.json"
    data = json.loads(path.read_text())
    path.write_text("{not json")
    with pytest.raises(ExportError, match="damaged"):
        export_journal(store, tmp_path)
    path.write_text(json.dumps({**data, "store": "memory://other"}))
    with pytest.raises(ExportError, match="belongs to memory://other"):
        export_journal(store, tmp_path)


def test_a_second_export_of_one_store_into_one_directory_is_refused(
    store: LateStore, tmp_path: Path
) -> None:
    (tmp_path / "_iqexport").mkdir()
    with (tmp_path / "_iqexport" / f"{store_id(store.url)}.lock").open("a+b") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(ExportError, match="another export of memory:// into"):
            export_journal(store, tmp_path)
    assert export_journal(store, tmp_path).rows == 18


def test_watermark_json_round_trips() -> None:
    text = {
        "store": "memory://",
        "floor": 3,
        "high": 40,
        "gaps": {"4-6": 1.5, "10": 2.0},
        "pending": {"batch": "b", "files": ["journal/x.parquet"]},
    }
    wm = Watermark.from_json(text)
    assert wm.covers(5) and wm.covers(10) and not wm.covers(7) and not wm.covers(3)
    assert wm.missing() == 4
    assert wm.to_json() == text
