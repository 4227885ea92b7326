"""The SQL index store's batch path: ``put_many`` -> ``get_many`` -> ``batch.done`` through
a queue whose index is PostgreSQL or MariaDB, three ways: per-row statements, the store's
native ``commit_writes`` of records, and the claims and settles made in place.

The broker is the embedded SQLite queue (``synchronous=normal``, so its file costs little
beside the index). Each side moves N messages of 100 bytes through a full life in batches
of ``--batch``, every batch one committed index transaction:

* before: the store as it was: a batch's writes committed as one ``commit_each`` of one
  change object per message (:class:`iqbridge.stores.base.BatchWrites`), every table
  written by ``executemany`` of per-row statements;
* records: the store's own ``commit_writes`` (one statement per table per transition
  with the compare-and-set inside, the journal expanded per batch in the database), puts
  and native refs in one statement each; the claims and settles decided on records by
  the batch engine;
* in place: the same puts, and the claim and the done made where the database keeps the
  messages (:mod:`iqbridge.stores.sql_claim`: the rows locked and read compactly, moved
  by the plan from the transition table, no record per message).

Rounds alternate between the sides, each on fresh tables; the median rate of each is
reported. The last line is ``ratio=<in place / records>`` (whole life) of the last
database measured.

Usage: python benchmarks/sql_index.py [--messages N] [--rounds R] [--batch N]
                                      [--db postgresql|mariadb|both]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import iqbridge
from iqbridge.stores.base import BatchWrites
from iqbridge.stores.sql import SqlStore
from iqbridge.stores.sql_commit import SqlCommits

BODY = b"x" * 100
SERVERS = {
    "postgresql": os.environ.get("IQ_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("IQ_MARIADB_URL", "mariadb://root@127.0.0.1:3306/test"),
}


class Before(SqlStore):
    """The store as it was: a batch's writes as one ``commit_each`` of a change per
    message, and every statement per row (``executemany``)."""

    commit_writes = BatchWrites.commit_writes
    _insert_records = SqlCommits._insert_records
    _append_journal = SqlCommits._append_journal
    set_native_refs = SqlCommits.set_native_refs
    # No claim or settle in place: the facade decides on records (None marks a protocol
    # method as not offered).
    claim_ready = None  # type: ignore[assignment]
    claim_received = None  # type: ignore[assignment]
    settle_held = None  # type: ignore[assignment]


class Records(SqlStore):
    """The store's own batch writes of records, no claim or settle in place."""

    claim_ready = None  # type: ignore[assignment]
    claim_received = None  # type: ignore[assignment]
    settle_held = None  # type: ignore[assignment]


SIDES: dict[str, type[SqlStore]] = {
    "before (commit_each of changes)": Before,
    "records (commit_writes)": Records,
    "in place (claims and settles)": SqlStore,
}

Rates = tuple[float, float, float]  # whole life, put_many, get_many + batch.done


def run(db: str, n: int, size: int, *, side: type[SqlStore], tmp: Path) -> Rates:
    """Messages per second through put_many/get_many/batch.done on a fresh index: the
    whole life, the puts alone, the gets and settlements alone."""
    prefix = f"b{uuid.uuid4().hex[:8]}_"
    store = side.from_url(f"{SERVERS[db]}?prefix={prefix}")
    try:
        broker = f"sqlite:///{tmp / prefix}q.db?synchronous=normal"
        with iqbridge.connect(broker, index=store) as hub:
            queue = hub.queue("bench")
            queue.subscribe("s1")
            start = time.perf_counter()
            for first in range(0, n, size):
                queue.put_many([BODY] * min(size, n - first))
            put = time.perf_counter()
            taken = 0
            while taken < n:
                batch = queue.get_many("s1", size)
                assert batch
                batch.done()
                taken += len(batch)
            end = time.perf_counter()
            assert queue.get("s1") is None
            assert len(store.history(batch[0].msg_id)) == 8  # PUT .. JOURNALLED, one each
    finally:
        _drop(store)
        store.close()
    return n / (end - start), n / (put - start), n / (end - put)


def _drop(store: SqlStore) -> None:
    with store.writer.begin() as conn:
        store.tables.metadata.drop_all(conn)


def measure(db: str, n: int, size: int, rounds: int) -> dict[str, Rates]:
    """Median rates of each side over alternating rounds, each figure on its own."""
    got: dict[str, list[Rates]] = {label: [] for label in SIDES}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for label, side in SIDES.items():
                got[label].append(run(db, n, size, side=side, tmp=Path(tmp)))

    def med(rates: list[Rates]) -> Rates:
        life, put, get = (statistics.median(r[k] for r in rates) for k in range(3))
        return life, put, get

    return {label: med(rates) for label, rates in got.items()}


def main() -> None:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--db", choices=["postgresql", "mariadb", "both"], default="both")
    args = parser.parse_args()
    dbs = ["postgresql", "mariadb"] if args.db == "both" else [args.db]
    n = max(args.messages, args.batch)
    print(
        f"SQL index: {n} messages of {len(BODY)} B in batches of {args.batch}, "
        f"{args.rounds} interleaved rounds (medians)"
    )
    ratio = 0.0
    for db in dbs:
        rates = measure(db, n, args.batch, args.rounds)
        print(f"{db}  (msg/s: whole life | put_many | get_many+batch.done)")
        for label, r in rates.items():
            print(f"  {label:32}: {r[0]:7.0f} | {r[1]:7.0f} | {r[2]:7.0f}")
        first, records, in_place = rates.values()
        for label, base in (("in place / before", first), ("in place / records", records)):
            print(
                f"  {label:32}: {in_place[0] / base[0]:7.2f} | {in_place[1] / base[1]:7.2f} | "
                f"{in_place[2] / base[2]:7.2f}"
            )
        ratio = in_place[0] / records[0]
    print(f"ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
