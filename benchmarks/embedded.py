"""Embedded SQLite backend: iqbridge facade against raw sqlite3, in the same run.

Each side moves N messages of 100 bytes through a full life, one operation per
transaction as an application would (every call returns only once it is committed):

* iqbridge: ``queue.put`` -> ``queue.get`` -> ``delivery.done``, with full state tracking
  (publisher and subscriber states, a journal entry per transition, leases).
* raw sqlite3: ``INSERT`` a row; claim it with ``UPDATE ... RETURNING`` (compare-and-set on
  a state column, with a lease time); ``DELETE`` it. The same WAL mode and ``synchronous``
  setting as the facade.

With ``--batch N`` both sides work in batches of N instead, each batch one committed
transaction: iqbridge ``queue.put_many`` -> ``queue.get_many(N)`` -> ``batch.done()``;
raw sqlite3 an ``executemany`` INSERT, one ``UPDATE ... WHERE id IN (SELECT ... LIMIT
N) RETURNING`` claim with a lease time, one ``DELETE ... WHERE id IN (...)``.

Rounds alternate between the two sides and the median rate of each is reported, so a
noisy machine skews both alike. The default measures the embedded default
(``synchronous=full``: what a call acknowledged survives power loss) and, for
transparency, ``synchronous=normal`` too. The last line is ``ratio=<facade/raw>`` for the
default setting.

Usage: python benchmarks/embedded.py [--messages N] [--rounds R] [--sync full|normal|both]
                                    [--batch N]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import iqbridge

BODY = b"x" * 100


def run_raw(path: Path, n: int, sync: str) -> float:
    """Messages per second through put/claim/delete in raw sqlite3."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync.upper()}")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS q (id INTEGER PRIMARY KEY, body BLOB NOT NULL,"
        " state INTEGER NOT NULL DEFAULT 0, lease_until INTEGER)"
    )
    conn.execute("CREATE INDEX IF NOT EXISTS q_state ON q (state, id)")
    start = time.perf_counter()
    for _ in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO q (body) VALUES (?)", (BODY,))
        conn.execute("COMMIT")
    for _ in range(n):
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute(
            "UPDATE q SET state = 1, lease_until = ? WHERE id = ("
            " SELECT id FROM q WHERE state = 0 ORDER BY id LIMIT 1) RETURNING id, body",
            (time.time_ns() // 1000 + 30_000_000,),
        ).fetchone()
        conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM q WHERE id = ?", (row[0],))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return n / elapsed


def run_raw_batch(path: Path, n: int, sync: str, size: int) -> float:
    """Messages per second through put/claim/delete in raw sqlite3, ``size`` a commit."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync.upper()}")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS q (id INTEGER PRIMARY KEY, body BLOB NOT NULL,"
        " state INTEGER NOT NULL DEFAULT 0, lease_until INTEGER)"
    )
    conn.execute("CREATE INDEX IF NOT EXISTS q_state ON q (state, id)")
    start = time.perf_counter()
    for first in range(0, n, size):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO q (body) VALUES (?)", [(BODY,)] * min(size, n - first))
        conn.execute("COMMIT")
    taken = 0
    while taken < n:
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(
            "UPDATE q SET state = 1, lease_until = ? WHERE id IN ("
            " SELECT id FROM q WHERE state = 0 ORDER BY id LIMIT ?) RETURNING id, body",
            (time.time_ns() // 1000 + 30_000_000, size),
        ).fetchall()
        conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            f"DELETE FROM q WHERE id IN ({','.join('?' * len(rows))})", [r[0] for r in rows]
        )
        conn.execute("COMMIT")
        taken += len(rows)
    elapsed = time.perf_counter() - start
    conn.close()
    return n / elapsed


def run_facade_batch(path: Path, n: int, sync: str, size: int) -> float:
    """Messages per second through put_many/get_many/batch.done, ``size`` a commit."""
    with iqbridge.connect(f"sqlite:///{path}?synchronous={sync}") as hub:
        queue = hub.queue("bench")
        queue.subscribe("s1")
        start = time.perf_counter()
        for first in range(0, n, size):
            queue.put_many([BODY] * min(size, n - first))
        taken = 0
        while taken < n:
            batch = queue.get_many("s1", size)
            assert batch
            batch.done()
            taken += len(batch)
        elapsed = time.perf_counter() - start
        assert queue.get("s1") is None
    return n / elapsed


def run_facade(path: Path, n: int, sync: str) -> float:
    """Messages per second through put/get/done in the iqbridge facade."""
    with iqbridge.connect(f"sqlite:///{path}?synchronous={sync}") as hub:
        queue = hub.queue("bench")
        queue.subscribe("s1")
        start = time.perf_counter()
        for _ in range(n):
            queue.put(BODY)
        for _ in range(n):
            delivery = queue.get("s1")
            assert delivery is not None
            delivery.done()
        elapsed = time.perf_counter() - start
        assert queue.get("s1") is None
    return n / elapsed


def measure(n: int, rounds: int, sync: str, batch: int = 0) -> tuple[float, float]:
    """Median rates (raw, facade) over alternating rounds, each on a fresh file; in
    batches of ``batch`` when it is not 0."""
    raw: list[float] = []
    facade: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            if batch:
                raw.append(run_raw_batch(Path(tmp) / f"raw{i}.db", n, sync, batch))
                facade.append(run_facade_batch(Path(tmp) / f"facade{i}.db", n, sync, batch))
            else:
                raw.append(run_raw(Path(tmp) / f"raw{i}.db", n, sync))
                facade.append(run_facade(Path(tmp) / f"facade{i}.db", n, sync))
    return statistics.median(raw), statistics.median(facade)


def main() -> None:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sync", choices=["full", "normal", "both"], default="both")
    parser.add_argument(
        "--batch", type=int, default=0, help="batch size (0: one message a transaction)"
    )
    args = parser.parse_args()
    syncs = ["normal", "full"] if args.sync == "both" else [args.sync]
    n = args.messages if not args.batch else max(args.messages, 10 * args.batch)
    how = f"batches of {args.batch}" if args.batch else "one message a transaction"
    print(f"embedded SQLite: {n} messages of {len(BODY)} B, {how}, {args.rounds} rounds")
    ratio = 0.0
    ops = (
        ("put_many+get_many+done", "insert+claim+delete")
        if args.batch
        else ("put+get+done", "put+claim+delete")
    )
    for sync in syncs:
        raw, facade = measure(n, args.rounds, sync, args.batch)
        ratio = facade / raw
        label = "the embedded default" if sync == "full" else "opt-in"
        print(f"synchronous={sync} ({label})")
        print(f"  raw sqlite3 {ops[1]:22}: {raw:8.0f} msg/s")
        print(f"  iqbridge {ops[0]:25}: {facade:8.0f} msg/s")
        print(f"  facade/raw{'':25}: {ratio:8.2f}")
    print(f"ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
