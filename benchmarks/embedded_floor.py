"""The floor of the embedded SQLite batch path: its SQL statements alone.

`benchmarks/embedded.py --batch N` compares the whole iqbridge batch path with raw
sqlite3 doing a queue's work (insert, claim, delete). This script runs only the SQL the
embedded path issues for the same messages, with every parameter computed beforehand
(no Python work at all), so the gap between the two shows what the table layout costs
and what the Python around it costs:

* ``put``: the queue row (payload), the message row (index fields, members, journal
  list), the ready row of its AVAILABLE member, the batch's journal row, the commit;
* ``get``: the claim query, the records, the compare-and-set versions, the payloads, the
  message rows rewritten (FETCHED, lease, next due time), the ready rows deleted, the
  journal row, the commit;
* ``done``: the versions, the message rows rewritten (JOURNALLED), the journal row, the
  commit.

Each statement is timed alone; the last line is ``ratio=<raw / floor>``: the best the
embedded batch path could reach against raw sqlite3 with this layout, were its Python
free. Both sides use WAL and ``synchronous=full``, batches of ``--batch``.

``--layout segments`` times instead the SQL of segment claims (issue 28, point 5; Kafka's
share-group state batches): the put as today; a claim is the same claim query, records
and payloads read, then ONE claim row (holder, token, lease, state, the seq range it
covers) and the ready rows deleted by range, the journal row, the commit; a done is ONE
update of the claim row (compare-and-set on its version), the journal row, the commit.
Messages leaving the common path would get rows of their own (not timed: the common path
is what the ratio is about).

Usage: python benchmarks/embedded_floor.py [--messages N] [--batch B] [--rounds R]
       [--layout rows|segments]
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from embedded import run_raw_batch

from iqbridge.adapters.sqlite import _SCHEMA as QUEUE_SCHEMA
from iqbridge.stores.sqlite_database import _SCHEMA as INDEX_SCHEMA

BODY = b"x" * 100
T0 = 1_800_000_000_000_000
TOKEN = "0123456789abcdef0123456789abcdef"
OWNER = "s1@host:1234:abcdef"
_MEMBERS = '[["s1",null,"{}",{},1,{},{},{},null,null,{}]]'
AVAILABLE = _MEMBERS.format("AVAILABLE", "null", "null", "null", "null", T0)
FETCHED = _MEMBERS.format("FETCHED", "null", f'"{TOKEN}"', f'"{OWNER}"', T0 + 30_000_000, T0)
JOURNALLED = _MEMBERS.format("JOURNALLED", '"DONE"', f'"{TOKEN}"', f'"{OWNER}"', "null", T0)
OCTETS = "application/octet-stream"
INSERT_QUEUE_ROW = (
    "INSERT INTO iq_queue_rows (ref, queue, msg_id, body, content_type, headers, publisher,"
    " correlation_id, priority, ordering_key, parents, put_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
)
INSERT_MESSAGE = (
    "INSERT INTO iq_messages (seq, msg_id, queue, publisher, ordering_key, correlation_id,"
    " priority, mode, parents, native_ref, content_type, size, created_at, expires_at,"
    " max_attempts, publisher_state, withdrawn, updated_at, lock_id, lock_owner, lock_until,"
    " version, members, journal, next_due)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
INSERT_READY = (
    "INSERT INTO iq_ready (queue, subscriber, priority, seq, attempt, not_before)"
    " VALUES (?,?,?,?,?,?)"
)
INSERT_JOURNAL = "INSERT INTO iq_journal VALUES (?,?,?,?)"
CLAIMABLE = (
    "SELECT m.seq, m.native_ref FROM iq_ready r JOIN iq_messages m ON m.seq = r.seq"
    " WHERE r.queue='q' AND r.subscriber='s1' AND r.not_before IS NULL"
    " AND m.expires_at IS NULL AND m.lock_id IS NULL ORDER BY r.priority DESC, r.seq LIMIT ?"
)
DELETE_READY = "DELETE FROM iq_ready WHERE queue='q' AND subscriber='s1' AND priority=4 AND seq=?"
UPDATE = (
    "UPDATE iq_messages SET publisher_state=?, withdrawn=?, updated_at=?, lock_id=?,"
    " lock_owner=?, lock_until=?, version=?, members=?, journal=journal || ?, next_due=?"
    " WHERE seq=? AND version=?"
)


CLAIMS_SCHEMA = """
CREATE TABLE IF NOT EXISTS iq_claims (
    claim INTEGER PRIMARY KEY, queue TEXT NOT NULL, subscriber TEXT NOT NULL,
    lo INTEGER NOT NULL, hi INTEGER NOT NULL, state TEXT NOT NULL, token TEXT NOT NULL,
    owner TEXT NOT NULL, lease_until INTEGER, attempt INTEGER NOT NULL,
    updated_at INTEGER NOT NULL, version INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS iq_claims_range ON iq_claims (queue, subscriber, lo);
CREATE INDEX IF NOT EXISTS iq_claims_due ON iq_claims (lease_until)
    WHERE lease_until IS NOT NULL;
"""
INSERT_CLAIM = "INSERT INTO iq_claims VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
SETTLE_CLAIM = (
    "UPDATE iq_claims SET state=?, lease_until=NULL, updated_at=?, version=version+1"
    " WHERE claim=? AND version=? AND token=?"
)
DELETE_READY_RANGE = (
    "DELETE FROM iq_ready WHERE queue='q' AND subscriber='s1' AND priority=4"
    " AND seq BETWEEN ? AND ?"
)


def run_floor(path: Path, n: int, size: int, layout: str = "rows") -> dict[str, float]:
    """Seconds spent in each statement of the embedded batch path, by name."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.executescript(INDEX_SCHEMA)
    conn.executescript(QUEUE_SCHEMA)
    conn.executescript(CLAIMS_SCHEMA)
    segments = layout == "segments"
    spent: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        spent[name] = spent.get(name, 0.0) + time.perf_counter() - start

    journal = "x" * 30 * size  # a batch's journal row, about as long as the real one
    seq = row = 0
    for _ in range(n // size):
        conn.execute("BEGIN IMMEDIATE")
        ids = [f"01a2{seq + i:028d}" for i in range(size)]
        queue_rows = [
            (seq + i + 1, "q", ids[i], BODY, OCTETS, None, "pub", None, 4, "pub", None, T0)
            for i in range(size)
        ]
        with timed("put: queue rows"):
            conn.executemany(INSERT_QUEUE_ROW, queue_rows)
        row += 1
        fixed = (OCTETS, 100, T0, None, 5, "REVEALED", 0, T0, None, None, None, 1, AVAILABLE)
        head = ("q", "pub", "pub", None, 4, "pubsub", None)
        messages = [
            (seq + i + 1, ids[i], *head, str(seq + i + 1), *fixed, str(row), None)
            for i in range(size)
        ]
        with timed("put: message rows"):
            conn.executemany(INSERT_MESSAGE, messages)
        ready = [("q", "s1", 4, seq + i + 1, 1, None) for i in range(size)]
        with timed("put: ready rows"):
            conn.executemany(INSERT_READY, ready)
        with timed("put: journal row"):
            conn.execute(INSERT_JOURNAL, (row, "", "q", journal))
        with timed("put: commit"):
            conn.execute("COMMIT")
        seq += size
    for _ in range(n // size):
        conn.execute("BEGIN IMMEDIATE")
        with timed("get: claim query"):
            found = conn.execute(CLAIMABLE, (size,)).fetchall()
        seqs = [f[0] for f in found]
        refs = [int(f[1]) for f in found]
        marks = ",".join("?" * len(seqs))
        with timed("get: records"):
            conn.execute(f"SELECT * FROM iq_messages WHERE seq IN ({marks})", seqs).fetchall()
        with timed("get: versions"):
            conn.execute(f"SELECT seq, version FROM iq_messages WHERE seq IN ({marks})", seqs)
        with timed("get: payloads"):
            conn.execute(f"SELECT * FROM iq_queue_rows WHERE ref IN ({marks})", refs).fetchall()
        row += 1
        lease = T0 + 30_000_000
        if segments:
            claim = row
            with timed("get: claim row"):
                lo, hi = min(seqs), max(seqs)
                values = (claim, "q", "s1", lo, hi, "FETCHED", TOKEN, OWNER, lease, 1, T0, 1)
                conn.execute(INSERT_CLAIM, values)
            with timed("get: ready rows"):
                conn.execute(DELETE_READY_RANGE, (min(seqs), max(seqs)))
            with timed("get: journal row"):
                conn.execute(INSERT_JOURNAL, (row, "", "q", journal))
            with timed("get: commit"):
                conn.execute("COMMIT")
            conn.execute("BEGIN IMMEDIATE")
            row += 1
            with timed("done: claim row"):
                cur = conn.execute(SETTLE_CLAIM, ("JOURNALLED", T0 + 2, claim, 1, TOKEN))
                assert cur.rowcount == 1
            with timed("done: journal row"):
                conn.execute(INSERT_JOURNAL, (row, "", "q", journal))
            with timed("done: commit"):
                conn.execute("COMMIT")
            continue
        claimed = [
            ("REVEALED", 0, T0 + 1, None, None, None, 2, FETCHED, f",{row}", lease, s, 1)
            for s in seqs
        ]
        with timed("get: message rows"):
            conn.executemany(UPDATE, claimed)
        with timed("get: ready rows"):
            conn.executemany(DELETE_READY, [(s,) for s in seqs])
        with timed("get: journal row"):
            conn.execute(INSERT_JOURNAL, (row, "", "q", journal))
        with timed("get: commit"):
            conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        with timed("done: versions"):
            conn.execute(f"SELECT seq, version FROM iq_messages WHERE seq IN ({marks})", seqs)
        row += 1
        finished = [
            ("JOURNALLED", 0, T0 + 2, None, None, None, 3, JOURNALLED, f",{row}", None, s, 2)
            for s in seqs
        ]
        with timed("done: message rows"):
            conn.executemany(UPDATE, finished)
        with timed("done: journal row"):
            conn.execute(INSERT_JOURNAL, (row, "", "q", journal))
        with timed("done: commit"):
            conn.execute("COMMIT")
    conn.close()
    return spent


def main() -> None:
    """Run the floor and raw sqlite3 in alternating rounds and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layout", choices=["rows", "segments"], default="rows")
    args = parser.parse_args()
    n = args.messages - args.messages % args.batch
    floors: list[dict[str, float]] = []
    raws: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            raws.append(run_raw_batch(Path(tmp) / f"raw{i}.db", n, "full", args.batch))
            floors.append(run_floor(Path(tmp) / f"floor{i}.db", n, args.batch, args.layout))
    print(
        f"embedded SQLite batch path, SQL only ({args.layout}): {n} messages, "
        f"batches of {args.batch}"
    )
    total = 0.0
    for name in floors[0]:
        us = statistics.median(f[name] for f in floors) * 1e6 / n
        total += us
        print(f"  {name:20}: {us:6.2f} us/msg")
    raw_us = 1e6 / statistics.median(raws)
    print(f"  {'floor, all statements':20}: {total:6.2f} us/msg ({1e6 / total:,.0f} msg/s)")
    print(f"  {'raw sqlite3':20}: {raw_us:6.2f} us/msg ({statistics.median(raws):,.0f} msg/s)")
    print(f"ratio={raw_us / total:.2f}")


if __name__ == "__main__":
    main()
