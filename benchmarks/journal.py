"""The journal analytics on Spark (iqbridge.analytics) against the same queries in DuckDB.

Run it (Java 17+ and the ``spark`` extra: PySpark, DuckDB, pyarrow)::

    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python benchmarks/journal.py            # 1M and 10M
    .venv/bin/python benchmarks/journal.py --rows 1000000 --repeat 5
    .venv/bin/python benchmarks/journal.py --variants                 # + what each setting buys

The data: a synthetic exported journal of ``--rows`` transitions per size (see
``benchmarks/journal_gen.py``: two stores, eight queues, named subscribers and pools,
redeliveries, UNUSABLE and EXPIRED members, latencies with a long tail over 60 hours, and
a few planted audit findings whose counts are known), written once under
``--dir``/<rows> in the layout ``iq journal export`` writes and reused while its marker
file says it is the same data. Its ``messages`` dataset is not written, so the audit's
passed-over check runs without priorities (every message at the default priority) on
both engines.

The work, on each engine, timed in two parts:

* audit: the member fold (one row per store, queue, msg_id, actor kind and actor: current
  state by the highest seq, first and revealed times, DONE count, GETs, time in each
  state as the sum of the times a state was left minus the sum of the times it was
  entered), then the four findings (duplicate_done, stuck, lost, inconsistent) written to
  Parquet, read back and summed up into a summary file.
* latency: the fold again (subscribers only), then REVEALED to DONE p50/p95/p99 per
  store, queue and subscriber, the time in each state (count, mean, p95, total), and DONEs
  per hour, each written to Parquet.

Spark runs ``iqbridge.analytics.audit.audit`` and ``latency.latency(report=False)`` on one
session made by ``spark_session`` (its start timed on its own), warmed up by
``--warmup`` untimed runs on the smallest size. DuckDB runs the same queries in SQL over
``read_parquet('DIR/journal/**/*.parquet', hive_partitioning=true)``, a new in-memory
connection per run. Runs alternate (Spark, DuckDB, Spark, ...), ``--repeat`` of each per
size; every run (wall time, the CPU time of the engine's processes, which other work on
the machine skews less, and the load average) and the medians are printed. After each
size a check line compares them (untimed): the findings (on both engines as many as were
planted, and the same rows), the latency tables (the same DONE counts per subscriber, the
same state and throughput rows), and each engine's p50, p95 and p99 against the exact
percentiles (within ``RANK`` of rank); a failed check makes the exit code 1.

``--variants`` then runs Spark once per variant at the largest size, each right after a
reference run with the session's settings and the jobs as they are: Spark's defaults (200
shuffle partitions and the schema inferred), each of those alone, exact ``percentile``
instead of ``percentile_approx``, adaptive execution off, a smaller
``spark.sql.files.maxPartitionBytes``; and changes to the jobs, made here by wrapping
what they call (iqbridge.analytics itself is not changed): the two optimisations of
3acbcb1 undone (the fold's ``max_by`` on the state's name, which makes Spark sort instead
of hash, and the audit's fold not persisted, which makes it group the journal once per
branch of its findings' plan), and one persisted fold shared by both jobs.

Last: the scaling (time at the largest size over time at the smallest, per engine) and
the line ``ratio=<Spark median / DuckDB median at the largest size>``.

Usage: python benchmarks/journal.py [--rows N ...] [--repeat R] [--warmup W]
       [--dir /tmp/iq-journal-bench] [--master local[*]] [--threads T] [--variants]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import journal_gen

STATES = ("AVAILABLE", "GET", "FETCHED", "IN_PROCESS", "DONE", "UNUSABLE", "EXPIRED", "JOURNALLED")
FINDINGS = ("duplicate_done", "stuck", "lost", "inconsistent")
STUCK_AFTER = timedelta(minutes=15)
LOST_AFTER = timedelta(minutes=15)
PERCENTILES = {"p50_ms": 0.5, "p95_ms": 0.95, "p99_ms": 0.99}
#: An approximate percentile p must lie between the exact ones at p - RANK and p + RANK
#: (and one value further each way: see rank_window).
RANK = 0.005
KEY = ("store", "queue", "actor")
MAX_PARTITION = "spark.sql.files.maxPartitionBytes"


@dataclass
class Run:
    """One run of both jobs on one engine: times, finding counts, the latency tables."""

    audit_s: float
    latency_s: float
    findings: dict[str, int]
    percentiles: list[dict[str, Any]] = field(default_factory=list)
    states: list[dict[str, Any]] = field(default_factory=list)
    throughput: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: CPU seconds the engine's processes used in the run (the JVM's and Python's for
    #: Spark, Python's for DuckDB): less skewed than the wall time by other work.
    cpu_s: float = 0.0

    @property
    def total(self) -> float:
        return self.audit_s + self.latency_s


# --- Spark -------------------------------------------------------------------------------


def spark_run(spark: Any, ds: journal_gen.Dataset, out: Path) -> Run:
    from iqbridge.analytics.audit import audit
    from iqbridge.analytics.latency import latency

    _clear(out)
    c0 = _cpu(spark)
    t0 = time.perf_counter()
    found = audit(
        spark, ds.root, out, as_of=ds.as_of, stuck_after=STUCK_AFTER, lost_after=LOST_AFTER
    )
    t1 = time.perf_counter()
    lat = latency(spark, ds.root, out, report=False)
    t2 = time.perf_counter()
    return Run(
        t1 - t0,
        t2 - t1,
        {f.finding: f.count for f in found.findings},
        lat.percentiles,
        lat.states,
        lat.throughput,
        cpu_s=_cpu(spark) - c0,
    )


def _cpu(spark: Any = None) -> float:
    """CPU seconds used so far by this process, and by Spark's JVM when given."""
    self = time.process_time()
    if spark is None:
        return self
    pid = spark.sparkContext._jvm.ProcessHandle.current().pid()
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # not Linux: the JVM's own count
        bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory
        return self + bean.getOperatingSystemMXBean().getProcessCpuTime() / 1e9
    return self + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def spark_conf(spark: Any, keys: dict[str, str]) -> Iterator[None]:
    """Spark SQL settings changed for the block, then put back."""
    old = {k: spark.conf.get(k, None) for k in keys}
    for k, v in keys.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


@contextlib.contextmanager
def inferred_schema() -> Iterator[None]:
    """The jobs read the journal with ``spark.read.parquet`` and nothing else (Spark infers
    the schema from the files and the partition values' types from the directories)."""
    from iqbridge.analytics import audit, latency

    def read(spark: Any, journal: Any) -> Any:
        return spark.read.parquet(str(Path(journal) / "journal"))

    with patched(audit, "read_journal", read), patched(latency, "read_journal", read):
        yield


@contextlib.contextmanager
def exact_percentiles() -> Iterator[None]:
    """``percentile`` (exact: every value of a group kept and sorted) wherever the latency
    job calls ``percentile_approx``."""
    from pyspark.sql import functions as F

    def exact(col: Any, percentage: Any, accuracy: Any = None) -> Any:
        return F.percentile(col, percentage)

    with patched(F, "percentile_approx", exact):
        yield


@contextlib.contextmanager
def state_by_name() -> Iterator[None]:
    """The fold as before 3acbcb1: ``max_by`` of the state's name (a string) instead of its
    code. A string in the aggregation buffer keeps Spark off its hash aggregate: it sorts
    the journal by the five keys (SortAggregate), partially and finally. Done by wrapping
    ``F.max_by`` while the jobs build their plans (facts.member_facts calls it once, for
    the state's code): the name's maximum by seq, then turned into its code."""
    from pyspark.sql import functions as F

    from iqbridge.analytics import facts

    real = F.max_by
    names = F.array(*(F.lit(n) for n in facts._STATES))

    def max_by(col: Any, ord: Any) -> Any:
        if isinstance(col, str):
            return real(col, ord)
        return F.array_position(names, real("dst", ord)).cast("int")

    with patched(F, "max_by", max_by):
        yield


def _pinned(frame: Any, persist: bool, unpersist: bool) -> Any:
    """``frame`` with its own ``persist`` or ``unpersist`` made a no-op (on this object)."""
    if not persist:
        frame.persist = lambda *_args, **_kw: frame
    if not unpersist:
        frame.unpersist = lambda *_args, **_kw: frame
    return frame


@contextlib.contextmanager
def audit_fold_not_persisted() -> Iterator[None]:
    """The audit as before 3acbcb1: its findings read the fold unpersisted, so Spark
    groups the journal again for each branch of their plan (no exchange is reused: each
    branch prunes and filters the fold differently)."""
    from iqbridge.analytics import audit, facts

    with patched(audit, "member_facts", lambda j: _pinned(facts.member_facts(j), False, True)):
        yield


@contextlib.contextmanager
def one_fold() -> Iterator[None]:
    """The member fold made and persisted once and used by both jobs (the audit's own
    persist and unpersist of it made no-ops; it is dropped after the latency job)."""
    from pyspark import StorageLevel

    from iqbridge.analytics import audit, facts, latency

    made: list[Any] = []

    def shared(journal: Any) -> Any:
        if not made:
            fold = facts.member_facts(journal).persist(StorageLevel.MEMORY_AND_DISK)
            made.append(_pinned(fold, False, False))
        return made[0]

    try:
        with patched(audit, "member_facts", shared), patched(latency, "member_facts", shared):
            yield
    finally:
        for fold in made:
            type(fold).unpersist(fold)


# --- DuckDB ------------------------------------------------------------------------------


def _fold(source: str, where: str = "") -> str:
    """The member fold in DuckDB SQL, as facts.member_facts: a state's time is null where
    the member left it more often than it entered it."""
    sums = ",\n".join(
        f"  coalesce(sum(us) FILTER (src = '{s}'), 0)"
        f" - coalesce(sum(us) FILTER (dst = '{s}'), 0) AS _stay_{s},"
        f" count(*) FILTER (src = '{s}') AS _nleave_{s},"
        f" count(*) FILTER (dst = '{s}') AS _nenter_{s}"
        for s in STATES
    )
    stays = ",\n".join(
        f"  CASE WHEN _nleave_{s} = _nenter_{s} - CASE WHEN state = '{s}' THEN 1 ELSE 0 END"
        f" THEN CAST(_stay_{s} + CASE WHEN state = '{s}' THEN since_us ELSE 0 END AS BIGINT)"
        f" END AS in_{s.lower()}_us"
        for s in STATES
    )
    return f"""
SELECT store, queue, msg_id, actor_kind, actor, state, since_us, first_us, revealed_us,
  done_us, dones, gets, attempt,
{stays}
FROM (
 SELECT store, queue, msg_id, actor_kind, actor,
  arg_max(dst, seq) AS state,
  max(us) AS since_us,
  min(us) AS first_us,
  min(us) FILTER (dst IN ('AVAILABLE', 'REVEALED')) AS revealed_us,
  min(us) FILTER (dst = 'DONE') AS done_us,
  count(*) FILTER (dst = 'DONE') AS dones,
  count(*) FILTER (dst = 'GET') AS gets,
  max(attempt) AS attempt,
{sums}
 FROM (SELECT *, epoch_us("at") AS us FROM {source}) {where}
 GROUP BY store, queue, msg_id, actor_kind, actor
)"""


def _audit_sql(now_us: int, stuck_before: int, lost_before: int, path: str) -> str:
    finding = (
        "store, queue, msg_id, actor, state, make_timestamp(since_us) AS since,"
        " CAST(dones AS BIGINT) AS dones"
    )
    return f"""
COPY (
WITH subs AS (SELECT * FROM members WHERE actor_kind = 'subscriber'),
mfacts AS (
 SELECT store, queue, msg_id,
  max(state) FILTER (actor_kind = 'publisher') AS pub_state,
  max(revealed_us) FILTER (actor_kind = 'publisher') AS pub_revealed_us,
  count(*) FILTER (actor_kind = 'subscriber' AND state <> 'JOURNALLED') AS not_journalled,
  count(*) FILTER (actor_kind = 'subscriber' AND gets > 0) AS busy
 FROM members GROUP BY store, queue, msg_id
),
waiting AS (SELECT * FROM subs WHERE state = 'AVAILABLE' AND since_us < {lost_before}),
latest AS (
 SELECT s.store, s.queue, s.actor, max(s.revealed_us) AS taken_revealed_us
 FROM subs s SEMI JOIN (SELECT DISTINCT store, queue, actor FROM waiting) w
   ON s.store = w.store AND s.queue = w.queue AND s.actor = w.actor
 WHERE s.gets > 0 GROUP BY s.store, s.queue, s.actor
),
suspects AS (
 SELECT store, queue, msg_id, pub_state, pub_revealed_us FROM mfacts
 WHERE (pub_state = 'JOURNALLED' AND not_journalled > 0)
    OR (busy > 0 AND pub_revealed_us IS NULL)
)
SELECT 'duplicate_done' AS finding, {finding}, 'DONE ' || dones || ' times' AS detail
FROM subs WHERE dones > 1
UNION ALL
SELECT 'stuck', {finding}, 'attempt ' || attempt
FROM subs WHERE state IN ('GET', 'FETCHED', 'IN_PROCESS') AND since_us < {stuck_before}
UNION ALL
SELECT 'lost', {finding}, 'passed over by a later message'
FROM waiting w SEMI JOIN latest t
  ON w.store = t.store AND w.queue = t.queue AND w.actor = t.actor
 AND t.taken_revealed_us > w.since_us
UNION ALL
SELECT 'inconsistent', {finding},
 CASE WHEN pub_state = 'JOURNALLED' THEN 'publisher JOURNALLED, subscriber ' || state
      ELSE 'subscriber took it; publisher never REVEALED, is '
           || coalesce(pub_state, 'unknown') END
FROM subs JOIN suspects USING (store, queue, msg_id)
WHERE (pub_state = 'JOURNALLED' AND state <> 'JOURNALLED')
   OR (gets > 0 AND pub_revealed_us IS NULL)
) TO '{path}' (FORMAT parquet)"""


def _latency_sql(base: str) -> dict[str, str]:
    took = "(done_us - revealed_us) / 1000.0"
    stays = ", ".join(f"in_{s.lower()}_us" for s in STATES)
    return {
        "percentiles": f"""
COPY (
 SELECT store, queue, actor, done, q[1] AS p50_ms, q[2] AS p95_ms, q[3] AS p99_ms,
  mean_ms, max_ms
 FROM (
  SELECT store, queue, actor, count(*) AS done,
   approx_quantile({took}, [0.5, 0.95, 0.99]) AS q, avg({took}) AS mean_ms,
   max({took}) AS max_ms
  FROM subs WHERE done_us IS NOT NULL AND revealed_us IS NOT NULL
  GROUP BY store, queue, actor)
) TO '{base}/percentiles.parquet' (FORMAT parquet)""",
        "states": f"""
COPY (
 SELECT store, queue, actor, upper(regexp_extract(name, '^in_(.*)_us$', 1)) AS state,
  count(*) AS messages, avg(us / 1000.0) AS mean_ms,
  approx_quantile(us / 1000.0, 0.95) AS p95_ms, sum(us) / 1000000.0 AS total_s
 FROM (UNPIVOT (SELECT store, queue, actor, {stays} FROM subs)
       ON {stays} INTO NAME name VALUE us)
 WHERE us > 0
 GROUP BY ALL
) TO '{base}/states.parquet' (FORMAT parquet)""",
        "throughput": f"""
COPY (
 SELECT store, queue, actor, date_trunc('hour', make_timestamp(done_us)) AS hour,
  count(*) AS done
 FROM subs WHERE done_us IS NOT NULL GROUP BY ALL
) TO '{base}/throughput.parquet' (FORMAT parquet)""",
    }


def duckdb_run(ds: journal_gen.Dataset, out: Path, threads: int) -> Run:
    import duckdb

    from iqbridge.analytics.facts import micros

    _clear(out)
    (out / "audit").mkdir(parents=True)
    (out / "latency").mkdir(parents=True)
    source = (
        f"read_parquet('{ds.journal}/**/*.parquet', hive_partitioning = true,"
        " hive_types = {'date': VARCHAR, 'queue': VARCHAR})"
    )
    now_us = micros(ds.as_of)
    c0 = _cpu()
    t0 = time.perf_counter()
    con = duckdb.connect(config={"threads": threads})
    con.execute(f"CREATE TEMP TABLE members AS {_fold(source)}")
    findings = f"{out}/audit/findings.parquet"
    con.execute(
        _audit_sql(
            now_us,
            now_us - int(STUCK_AFTER.total_seconds() * 1e6),
            now_us - int(LOST_AFTER.total_seconds() * 1e6),
            findings,
        )
    )
    con.execute("DROP TABLE members")
    summary = f"{out}/audit/summary.parquet"
    con.execute(
        f"""COPY (SELECT finding, count(*) AS count,
             list(DISTINCT msg_id ORDER BY msg_id)[1:20] AS msg_ids
             FROM read_parquet('{findings}') GROUP BY finding)
           TO '{summary}' (FORMAT parquet)"""
    )
    counts = dict(con.execute(f"SELECT finding, count FROM read_parquet('{summary}')").fetchall())
    t1 = time.perf_counter()
    subscribers = _fold(source, "WHERE actor_kind = 'subscriber'")
    con.execute(f"CREATE TEMP TABLE subs AS {subscribers}")
    for sql in _latency_sql(f"{out}/latency").values():
        con.execute(sql)
    con.execute("DROP TABLE subs")
    tables = {}
    for name in ("percentiles", "states", "throughput"):
        cur = con.execute(f"SELECT * FROM read_parquet('{out}/latency/{name}.parquet')")
        cols = [d[0] for d in cur.description]
        tables[name] = [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
    con.close()
    t2 = time.perf_counter()
    return Run(
        t1 - t0,
        t2 - t1,
        {name: int(counts.get(name, 0)) for name in FINDINGS},
        tables["percentiles"],
        tables["states"],
        tables["throughput"],
        cpu_s=_cpu() - c0,
    )


# --- checks ------------------------------------------------------------------------------


def exact_values(ds: journal_gen.Dataset, threads: int) -> dict[tuple[str, ...], Any]:
    """Per subscriber, every REVEALED-to-DONE latency (ms), sorted (a numpy array)."""
    import duckdb
    import numpy as np

    source = (
        f"read_parquet('{ds.journal}/**/*.parquet', hive_partitioning = true,"
        " hive_types = {'date': VARCHAR, 'queue': VARCHAR})"
    )
    con = duckdb.connect(config={"threads": threads})
    rows = con.execute(
        f"""SELECT store, queue, actor, list((done_us - revealed_us) / 1000.0 ORDER BY 1)
        FROM (SELECT store, queue, actor,
               min(epoch_us("at")) FILTER (dst IN ('AVAILABLE', 'REVEALED')) AS revealed_us,
               min(epoch_us("at")) FILTER (dst = 'DONE') AS done_us
              FROM {source} WHERE actor_kind = 'subscriber'
              GROUP BY store, queue, msg_id, actor)
        WHERE done_us IS NOT NULL AND revealed_us IS NOT NULL
        GROUP BY store, queue, actor"""
    ).fetchall()
    con.close()
    return {tuple(r[:3]): np.sort(np.asarray(r[3], dtype=float)) for r in rows}


def rank_window(values: Any, p: float) -> tuple[float, float]:
    """The exact values at ranks p - RANK and p + RANK, one value wider on each side (an
    approximate percentile may fall between two neighbours)."""
    n = len(values)
    lo = max(0, int((p - RANK) * (n - 1)) - 1)
    hi = min(n - 1, math.ceil((p + RANK) * (n - 1)) + 1)
    return float(values[lo]), float(values[hi])


def check(
    ds: journal_gen.Dataset, spark: Run, duck: Run, exact: dict[tuple[str, ...], Any]
) -> list[str]:
    """What differs between the engines, the planted findings and the exact percentiles
    (empty: all agree)."""
    bad: list[str] = []
    for name in FINDINGS:
        want = ds.expected[name]
        if spark.findings.get(name) != want or duck.findings.get(name) != want:
            bad.append(
                f"{name}: planted {want}, spark {spark.findings.get(name)},"
                f" duckdb {duck.findings.get(name)}"
            )
    for engine, run in (("spark", spark), ("duckdb", duck)):
        pct = {tuple(r[k] for k in KEY): r for r in run.percentiles}
        if pct.keys() != exact.keys():
            bad.append(f"percentile rows: {engine} {len(pct)}, exact {len(exact)}")
        for key in pct.keys() & exact.keys():
            for col, p in PERCENTILES.items():
                lo, hi = rank_window(exact[key], p)
                if not lo * (1 - 1e-9) <= pct[key][col] <= hi * (1 + 1e-9):
                    bad.append(
                        f"{engine} {col} {key}: {pct[key][col]:.3f} outside the exact "
                        f"[{lo:.3f}, {hi:.3f}]"
                    )
    s_pct = {tuple(r[k] for k in KEY): r["done"] for r in spark.percentiles}
    d_pct = {tuple(r[k] for k in KEY): r["done"] for r in duck.percentiles}
    if s_pct != d_pct:
        bad.append("DONE counts per subscriber differ")
    s_st = {(*(r[k] for k in KEY), r["state"]): r["messages"] for r in spark.states}
    d_st = {(*(r[k] for k in KEY), r["state"]): r["messages"] for r in duck.states}
    if s_st != d_st:
        bad.append(f"states: {len(s_st)} rows on spark, {len(d_st)} on duckdb, or counts differ")
    s_tp = {(*(r[k] for k in KEY), _hour(r["hour"])): r["done"] for r in spark.throughput}
    d_tp = {(*(r[k] for k in KEY), _hour(r["hour"])): r["done"] for r in duck.throughput}
    if s_tp != d_tp:
        bad.append(f"throughput: {len(s_tp)} rows on spark, {len(d_tp)} on duckdb, or differ")
    return bad


def findings_differ(spark_dir: Path, duck_file: Path) -> int:
    """How many finding rows one engine wrote and the other did not."""
    import duckdb

    cols = "finding, store, queue, msg_id, actor, state, epoch_us(since), dones, detail"
    a = f"SELECT {cols} FROM read_parquet('{spark_dir}/*.parquet')"
    b = f"SELECT {cols} FROM read_parquet('{duck_file}')"
    con = duckdb.connect()
    n = con.execute(
        f"SELECT (SELECT count(*) FROM ({a} EXCEPT ALL {b})) + "
        f"(SELECT count(*) FROM ({b} EXCEPT ALL {a}))"
    ).fetchone()
    con.close()
    return int(n[0]) if n else -1


def percentile_gap(spark: Run, duck: Run) -> float:
    """The largest relative difference between the engines' p50, p95 and p99."""
    d_pct = {tuple(r[k] for k in KEY): r for r in duck.percentiles}
    gaps = [
        _rel(r[p], d_pct[key][p])
        for r in spark.percentiles
        if (key := tuple(r[k] for k in KEY)) in d_pct
        for p in PERCENTILES
    ]
    return max(gaps, default=0.0)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-9)


def _hour(value: datetime) -> str:
    return value.replace(tzinfo=None).strftime("%Y-%m-%dT%H")


# --- the run -----------------------------------------------------------------------------


def _clear(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def _size(rows: int) -> str:
    if rows >= 1_000_000 and rows % 1_000_000 == 0:
        return f"{rows // 1_000_000}M"
    if rows >= 1_000 and rows % 1_000 == 0:
        return f"{rows // 1_000}k"
    return f"{rows:,}"


def _show(run: Run) -> str:
    return (
        f"{run.total:7.2f} s  (audit {run.audit_s:6.2f} s, latency {run.latency_s:6.2f} s)"
        f"  cpu {run.cpu_s:6.1f} s  load {_load()}"
    )


def _load() -> str:
    """The machine's load average over the last minute (other work skews a run)."""
    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?"


def variants(spark: Any, ds: journal_gen.Dataset, out: Path, size: str, only: list[str]) -> None:
    """One Spark run per variant at this size, each right after a reference run with the
    session's settings and the jobs as they are (a drift of the machine shows in those)."""

    def conf(**keys: str) -> Callable[[], contextlib.AbstractContextManager[None]]:
        return lambda: spark_conf(spark, {k.replace("__", "."): v for k, v in keys.items()})

    def both(
        *makers: Callable[[], contextlib.AbstractContextManager[None]],
    ) -> Callable[[], contextlib.AbstractContextManager[None]]:
        @contextlib.contextmanager
        def entered() -> Iterator[None]:
            with contextlib.ExitStack() as stack:
                for make in makers:
                    stack.enter_context(make())
                yield

        return entered

    partitions_200 = conf(spark__sql__shuffle__partitions="200")
    split_16 = conf(spark__sql__files__maxPartitionBytes=str(16 << 20))
    cases: list[tuple[str, Callable[[], contextlib.AbstractContextManager[None]]]] = [
        (
            "Spark's defaults: 200 shuffle partitions, schema inferred",
            both(partitions_200, inferred_schema),
        ),
        ("200 shuffle partitions", partitions_200),
        ("schema inferred", inferred_schema),
        ("exact percentile instead of percentile_approx", exact_percentiles),
        ("adaptive execution off", conf(spark__sql__adaptive__enabled="false")),
        ("maxPartitionBytes 16 MB (128 MB)", split_16),
        ("fold: max_by of the state's name (before 3acbcb1)", state_by_name),
        ("audit: fold not persisted (before 3acbcb1)", audit_fold_not_persisted),
        (
            "both of those: the jobs as before 3acbcb1",
            both(state_by_name, audit_fold_not_persisted),
        ),
        ("one persisted fold for both jobs", one_fold),
        ("one fold for both jobs + maxPartitionBytes 16 MB", both(one_fold, split_16)),
    ]
    print(f"variants at {size} (Spark, one run each, after a reference run):")
    for label, make in cases:
        if only and not any(word.lower() in label.lower() for word in only):
            continue
        gc.collect()
        ref = spark_run(spark, ds, out)
        gc.collect()
        with make():
            run = spark_run(spark, ds, out)
        differ = "" if run.findings == ds.expected else f"  FINDINGS DIFFER: {run.findings}"
        print(
            f"  {label}{differ}\n"
            f"    variant    {_show(run)}\n    reference  {_show(ref)}\n"
            f"    change     wall {run.total / ref.total - 1:+.0%}, "
            f"cpu {run.cpu_s / ref.cpu_s - 1:+.0%}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="untimed Spark runs first")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/iq-journal-bench"))
    ap.add_argument("--master", default=None, help="Spark master (default local[*])")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="DuckDB threads")
    ap.add_argument(
        "--variants",
        nargs="*",
        metavar="WORD",
        default=None,
        help="what each Spark setting buys; with words, only the variants naming one",
    )
    args = ap.parse_args(argv)
    if args.repeat < 1 or min(args.rows) < 1000:
        ap.error("--repeat must be at least 1 and every --rows at least 1000")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    sizes = sorted(set(args.rows))

    import duckdb
    import pyspark

    from iqbridge.analytics.session import spark_session

    datasets = {}
    for rows in sizes:
        ds = journal_gen.ensure(rows, args.dir / str(rows))
        how = "reused" if ds.reused else f"generated in {ds.seconds:.1f} s"
        print(
            f"data {_size(rows)}: {ds.rows:,} transitions, {ds.messages:,} messages, "
            f"{ds.files} files, {ds.bytes / 1e6:.1f} MB ({how}) at {ds.root}",
            flush=True,
        )
        datasets[rows] = ds

    t0 = time.perf_counter()
    spark = spark_session(args.master)
    started = time.perf_counter() - t0
    master = spark.sparkContext.master
    print(
        f"audit + latency: Spark {pyspark.__version__} ({master}, "
        f"{spark.sparkContext.defaultParallelism} cores, shuffle partitions "
        f"{spark.conf.get('spark.sql.shuffle.partitions')}) against DuckDB "
        f"{duckdb.__version__} ({args.threads} threads); {args.repeat} run(s) per size, "
        "interleaved"
    )
    print(f"spark session start: {started:.2f} s")
    out = args.dir / "out"
    for i in range(args.warmup):
        run = spark_run(spark, datasets[sizes[0]], out / "spark")
        print(f"warm-up {i + 1} (spark, {_size(sizes[0])}): {_show(run)}", flush=True)

    runs: dict[tuple[int, str], list[Run]] = {}
    failed = False
    for rows in sizes:
        ds = datasets[rows]
        pairs = []
        for r in range(1, args.repeat + 1):
            gc.collect()
            s = spark_run(spark, ds, out / "spark")
            print(f"{_size(rows)} run {r}: spark  {_show(s)}", flush=True)
            gc.collect()
            d = duckdb_run(ds, out / "duckdb", args.threads)
            print(f"{_size(rows)} run {r}: duckdb {_show(d)}", flush=True)
            differ = findings_differ(
                out / "spark" / "audit" / "findings", out / "duckdb" / "audit" / "findings.parquet"
            )
            if differ:
                s.problems.append(f"{differ} finding rows differ between the engines")
            runs.setdefault((rows, "spark"), []).append(s)
            runs.setdefault((rows, "duckdb"), []).append(d)
            pairs.append((s, d))
        exact = exact_values(ds, args.threads)
        problems = [p for s, d in pairs for p in (*s.problems, *check(ds, s, d, exact))]
        gap = max(percentile_gap(s, d) for s, d in pairs)
        planted = ", ".join(f"{k} {v}" for k, v in ds.expected.items())
        if problems:
            failed = True
            print(f"check {_size(rows)}: FAILED: " + "; ".join(sorted(set(problems))[:10]))
        else:
            print(
                f"check {_size(rows)}: ok: findings spark = duckdb = planted ({planted}), "
                "the same rows; "
                f"{len(pairs[0][0].percentiles)} subscribers, the same DONE counts, states "
                f"and throughput; p50/p95/p99 within {RANK:.1%} of rank of the exact ones on both, "
                f"at most {gap:.1%} apart",
                flush=True,
            )

    if args.variants is not None:
        variants(spark, datasets[sizes[-1]], out / "spark", _size(sizes[-1]), args.variants)

    med: dict[tuple[int, str], float] = {}
    for rows in sizes:
        for engine in ("spark", "duckdb"):
            series = runs[rows, engine]
            med[rows, engine] = statistics.median(r.total for r in series)
            parts = (
                f"audit {statistics.median(r.audit_s for r in series):.2f} s, latency "
                f"{statistics.median(r.latency_s for r in series):.2f} s, cpu "
                f"{statistics.median(r.cpu_s for r in series):.1f} s"
            )
            shown = " / ".join(f"{r.total:.2f}" for r in series)
            print(
                f"median {_size(rows):>4} {engine:<6} {med[rows, engine]:7.2f} s  "
                f"({parts}; runs {shown})"
            )
        print(
            f"  {_size(rows)}: spark/duckdb {med[rows, 'spark'] / med[rows, 'duckdb']:.2f}; "
            f"spark {ds_rate(datasets[rows], med[rows, 'spark'])}, "
            f"duckdb {ds_rate(datasets[rows], med[rows, 'duckdb'])}"
        )
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        for engine in ("spark", "duckdb"):
            scale = med[hi, engine] / med[lo, engine]
            target = " (target <= 11)" if engine == "spark" else ""
            print(
                f"scaling {_size(hi)}/{_size(lo)} {engine}: {scale:.2f} for "
                f"{datasets[hi].rows / datasets[lo].rows:.1f} times the rows{target}"
            )
    ratio = med[sizes[-1], "spark"] / med[sizes[-1], "duckdb"]
    spark.stop()
    print(f"ratio={ratio:.2f}")
    return 1 if failed else 0


def ds_rate(ds: journal_gen.Dataset, seconds: float) -> str:
    return f"{ds.rows / seconds:,.0f} transitions/s"


if __name__ == "__main__":
    sys.exit(main())
