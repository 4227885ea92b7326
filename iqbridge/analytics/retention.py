"""Retention: archive journalled messages past their rule, and plan their purge.

A message whose publisher is JOURNALLED is finished for every subscriber; it stays in the
index (and its payload on the broker or in the store's retained copy) until a rule says
it may go. Rules are per queue: ``keep`` for every queue, ``rules`` for named ones. A
rule's name may be a shell-style pattern (``audit-*``, ``orders.[ab]``): an exact name
wins over a pattern, and among patterns the first listed that matches.
Written under ``OUT/retention/``:

``archive/``
    One row per message past its rule: the message's record fields from the export
    (publisher, correlation id, priority, parents, put time, content type) with its
    payload and headers where the store retained a copy, and when it was journalled;
    partitioned by queue.
``purge_plan/``
    ``store``, ``queue``, ``msg_id``, ``journalled_at`` and ``before`` (the rule's cutoff):
    what ``iq purge --from-plan OUT/retention/purge_plan`` deletes. The purge re-checks
    each message (still JOURNALLED, last changed before ``before``), so a message
    re-revealed since the plan was made stays.

The archive is written before the plan: a plan never names a message the archive lacks.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from iqbridge.analytics.facts import member_facts, message_facts, micros
from iqbridge.analytics.session import AnalyticsError, read_journal, read_messages

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Mapping
    from pathlib import Path

    from pyspark.sql import SparkSession

__all__ = ["RetentionResult", "retention"]


@dataclass(frozen=True, slots=True)
class RetentionResult:
    """Where the archive and the plan went, and how many messages per queue."""

    out: str
    archived: int
    with_payload: int
    per_queue: dict[str, int]
    plan: str


def retention(
    spark: SparkSession,
    journal: str | Path,
    out: str | Path,
    *,
    keep: timedelta = timedelta(days=7),
    rules: Mapping[str, timedelta] | None = None,
    as_of: datetime | None = None,
) -> RetentionResult:
    """Archive the journalled messages older than their queue's rule and write the plan.

    ``rules`` maps a queue name, or a shell-style pattern of names, to its age (see the
    module documentation for which rule a queue takes)."""
    from pyspark.sql import functions as F

    when = as_of or datetime.now(UTC)
    now_us = micros(when)
    rules = dict(rules or {})
    for queue, age in [("(default)", keep), *rules.items()]:
        if age < timedelta(0):
            raise AnalyticsError(f"retention rule for {queue}: a negative age ({age})")
    facts = message_facts(member_facts(read_journal(spark, journal)))
    # The outermost "when" decides: the default, then patterns from the last listed to
    # the first (the first that matches wins), then exact names (an exact name wins).
    cutoff_us = F.lit(now_us - _us(keep))
    patterns = [(name, age) for name, age in rules.items() if _is_pattern(name)]
    for name, age in reversed(patterns):
        matched = F.col("queue").rlike("^" + fnmatch.translate(name))
        cutoff_us = F.when(matched, F.lit(now_us - _us(age))).otherwise(cutoff_us)
    for name, age in rules.items():
        if not _is_pattern(name):
            cutoff_us = F.when(F.col("queue") == name, F.lit(now_us - _us(age))).otherwise(
                cutoff_us
            )
    due = (
        facts.where(F.col("pub_state") == "JOURNALLED")
        .withColumn("before_us", cutoff_us)
        .where(F.col("pub_since_us") < F.col("before_us"))
        .select(
            "store",
            "queue",
            "msg_id",
            F.timestamp_micros("pub_since_us").alias("journalled_at"),
            F.timestamp_micros("before_us").alias("before"),
        )
    )
    try:
        msgs = read_messages(spark, journal).drop("date", "queue")
    except AnalyticsError:
        msgs = None
    base = str(out).rstrip("/") + "/retention"
    archive = due.join(msgs, ["store", "msg_id"], "left") if msgs is not None else due
    archive.write.mode("overwrite").partitionBy("queue").parquet(f"{base}/archive")
    # The plan comes from what the archive holds, so it never names an unarchived message.
    kept = spark.read.parquet(f"{base}/archive")
    plan = kept.select("store", "queue", "msg_id", "journalled_at", "before")
    plan.coalesce(1).write.mode("overwrite").parquet(f"{base}/purge_plan")
    counts = kept.groupBy("queue").agg(
        F.count(F.lit(1)).alias("n"),
        F.count("payload").alias("p") if "payload" in kept.columns else F.lit(0).alias("p"),
    )
    rows = counts.collect()
    return RetentionResult(
        base,
        sum(int(r["n"]) for r in rows),
        sum(int(r["p"]) for r in rows),
        {str(r["queue"]): int(r["n"]) for r in rows},
        f"{base}/purge_plan",
    )


def _us(delta: timedelta) -> int:
    return int(delta.total_seconds() * 1_000_000)


def _is_pattern(name: str) -> bool:
    """Whether a rule's name is a shell-style pattern rather than a queue name."""
    return any(ch in name for ch in "*?[")
