"""The SQLite index's commits wait for the disk (``synchronous=full``), but for the broker
references a put writes after the broker took its messages: that commit does not wait,
so a put through a broker waits for the disk once, and the connection waits again at
once after it."""

from __future__ import annotations

from pathlib import Path

import iqbridge
from iqbridge.stores.sqlite_database import SqliteDatabase


def _traced(db: SqliteDatabase) -> list[str]:
    seen: list[str] = []
    db.conn.set_trace_callback(seen.append)
    return seen


def test_native_refs_commit_without_waiting_and_the_connection_waits_again(
    tmp_path: Path,
) -> None:
    with iqbridge.connect(f"sqlite:///{tmp_path / 'q.db'}") as hub:
        q = hub.queue("orders")
        q.subscribe("a")
        ids = q.put_many([b"1", b"2"])
        db: SqliteDatabase = hub.store.db  # type: ignore[attr-defined]
        seen = _traced(db)
        hub.store.set_native_refs([(ids[0], "ref-1"), (ids[1], "ref-2")])
        assert seen[0] == "PRAGMA synchronous=NORMAL"
        assert seen[1] == "BEGIN IMMEDIATE"
        assert seen[-2:] == ["COMMIT", "PRAGMA synchronous=FULL"]
        assert db.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert [hub.store.load(i).native_ref for i in ids] == ["ref-1", "ref-2"]
        # Every other commit waits for the disk.
        seen.clear()
        q.put_many([b"3"])
        assert "PRAGMA synchronous=NORMAL" not in seen
        assert db.conn.execute("PRAGMA synchronous").fetchone()[0] == 2


def test_with_synchronous_normal_nothing_changes(tmp_path: Path) -> None:
    with iqbridge.connect(f"sqlite:///{tmp_path / 'q.db'}?synchronous=normal") as hub:
        q = hub.queue("orders")
        q.subscribe("a")
        ids = q.put_many([b"1"])
        db: SqliteDatabase = hub.store.db  # type: ignore[attr-defined]
        seen = _traced(db)
        hub.store.set_native_refs([(ids[0], "ref-1")])
        assert not any(s.startswith("PRAGMA") for s in seen)
        assert db.conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL


def test_a_failed_lazy_commit_leaves_the_connection_waiting_for_the_disk(
    tmp_path: Path,
) -> None:
    with iqbridge.connect(f"sqlite:///{tmp_path / 'q.db'}") as hub:
        db: SqliteDatabase = hub.store.db  # type: ignore[attr-defined]
        try:
            with db.transaction(wait_for_disk=False) as conn:
                conn.execute("UPDATE iq_messages SET native_ref='x' WHERE msg_id='none'")
                raise RuntimeError("boom")
        except RuntimeError:
            pass
        assert db.conn.execute("PRAGMA synchronous").fetchone()[0] == 2
