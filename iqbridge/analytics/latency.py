"""Latency: how long messages take from REVEALED to DONE, and where the time goes.

Per store, queue and subscriber, written under ``OUT/latency/``:

``percentiles/``
    ``done`` (messages that subscriber finished), REVEALED to DONE ``p50_ms``,
    ``p95_ms``, ``p99_ms``, ``mean_ms`` and ``max_ms``. A message is revealed to a
    subscriber the moment its publisher reveals it (the same step writes both), so the
    clock starts at the subscriber's first AVAILABLE.
``states/``
    For every subscriber state: how many messages passed through it, their mean and p95
    time in it, and the total.
``throughput/``
    DONEs per hour.
``report.html``
    The three as tables and plots (matplotlib, inline SVG), when OUT is a local path.

Percentiles are Spark's ``percentile_approx`` (relative error 1/10,000 of the range):
exact percentiles sort every latency of a group; the approximate ones keep a summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from iqbridge.analytics.facts import in_state_column, member_facts
from iqbridge.analytics.schema import SUBSCRIBER_STATES
from iqbridge.analytics.session import read_journal

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from pyspark.sql import DataFrame, SparkSession

__all__ = ["LatencyResult", "latency"]

_KEY = ("store", "queue", "actor")


@dataclass(frozen=True, slots=True)
class LatencyResult:
    """Where the latency results went, and the percentile rows (one per subscriber)."""

    out: str
    percentiles: list[dict[str, object]]
    states: list[dict[str, object]]
    throughput: list[dict[str, object]]
    report: str | None


def latency(
    spark: SparkSession,
    journal: str | Path,
    out: str | Path,
    *,
    report: bool = True,
    accuracy: int = 10_000,
) -> LatencyResult:
    """Compute the latency tables of an exported journal and write them (and the report)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    subs = (
        member_facts(read_journal(spark, journal))
        .where(F.col("actor_kind") == "subscriber")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        base = str(out).rstrip("/") + "/latency"
        pct = _percentiles(subs, accuracy)
        pct.write.mode("overwrite").parquet(f"{base}/percentiles")
        _states(subs, accuracy).write.mode("overwrite").parquet(f"{base}/states")
        _throughput(subs).write.mode("overwrite").parquet(f"{base}/throughput")
    finally:
        subs.unpersist()
    tables = {
        name: [r.asDict() for r in spark.read.parquet(f"{base}/{name}").collect()]
        for name in ("percentiles", "states", "throughput")
    }
    for rows in tables.values():
        rows.sort(key=lambda r: tuple(str(r.get(k)) for k in (*_KEY, "state", "hour")))
    html = None
    if report:
        from iqbridge.analytics.report import write_latency_report

        html = write_latency_report(
            f"{base}/report.html", tables["percentiles"], tables["states"], tables["throughput"]
        )
    return LatencyResult(base, tables["percentiles"], tables["states"], tables["throughput"], html)


def _percentiles(subs: DataFrame, accuracy: int) -> DataFrame:
    from pyspark.sql import functions as F

    took = (F.col("done_us") - F.col("revealed_us")) / F.lit(1000.0)
    done = subs.where(F.col("done_us").isNotNull() & F.col("revealed_us").isNotNull())
    pct = F.percentile_approx(took, [0.5, 0.95, 0.99], accuracy)
    return (
        done.groupBy(*_KEY)
        .agg(
            F.count(F.lit(1)).alias("done"),
            pct.alias("_p"),
            F.avg(took).alias("mean_ms"),
            F.max(took).alias("max_ms"),
        )
        .select(
            *_KEY,
            "done",
            F.col("_p")[0].alias("p50_ms"),
            F.col("_p")[1].alias("p95_ms"),
            F.col("_p")[2].alias("p99_ms"),
            "mean_ms",
            "max_ms",
        )
    )


def _states(subs: DataFrame, accuracy: int) -> DataFrame:
    """Time in each state, long format: one row per (store, queue, actor, state)."""
    from pyspark.sql import functions as F

    # Unpivot the in_<state>_us columns with a stack() so one grouping covers all states.
    pairs = ", ".join(f"'{s}', {in_state_column(s)}" for s in SUBSCRIBER_STATES)
    long = subs.select(
        *_KEY, F.expr(f"stack({len(SUBSCRIBER_STATES)}, {pairs}) as (state, us)")
    ).where(F.col("us") > 0)
    ms = F.col("us") / F.lit(1000.0)
    return long.groupBy(*_KEY, "state").agg(
        F.count(F.lit(1)).alias("messages"),
        F.avg(ms).alias("mean_ms"),
        F.percentile_approx(ms, 0.95, accuracy).alias("p95_ms"),
        (F.sum("us") / F.lit(1_000_000.0)).alias("total_s"),
    )


def _throughput(subs: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    hour = F.date_trunc("hour", F.timestamp_micros(F.col("done_us"))).alias("hour")
    return (
        subs.where(F.col("done_us").isNotNull())
        .groupBy(*_KEY, hour)
        .agg(F.count(F.lit(1)).alias("done"))
    )
