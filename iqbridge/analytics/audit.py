"""The audit: did any subscriber process a message twice, and what else is wrong.

Four findings, each a row per (message, actor) with its msg_id:

``duplicate_done``
    A subscriber reached DONE more than once for one message: once-only was violated.
    The only finding that is a *violation*; ``iq analytics audit`` exits 3 when it finds one.
``stuck``
    A subscriber in GET, FETCHED or IN_PROCESS for longer than ``stuck_after``: in doubt,
    waiting for its lease to lapse or for an operator (``iq recover``).
``lost``
    A subscriber that still sees the message AVAILABLE after ``lost_after`` although it
    has since taken a message of the same queue revealed to it later, at the same or a
    lower priority: it was passed over, so the broker no longer delivers it (the index
    and the broker disagree, e.g. a payload gone from the broker). Not in doubt, not
    finished, and not waiting its turn either.
``inconsistent``
    The publisher's state contradicts a subscriber's: the publisher JOURNALLED while a
    subscriber is not, or a subscriber past AVAILABLE on a message its publisher never
    revealed.

The result is written under ``OUT/audit/``: ``findings/`` (Parquet, one row per finding:
finding, store, queue, msg_id, actor, state, since, dones, detail) and ``summary/``
(Parquet: finding, violation, count, the first msg_ids), and returned as an
:class:`AuditResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from iqbridge.analytics.facts import member_facts, message_facts, micros
from iqbridge.analytics.schema import IN_DOUBT
from iqbridge.analytics.session import read_journal, read_messages

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["FINDINGS", "AuditResult", "Finding", "audit"]

#: Every finding the audit reports, and whether it violates once-only.
FINDINGS: dict[str, bool] = {
    "duplicate_done": True,
    "stuck": False,
    "lost": False,
    "inconsistent": False,
}
#: How many msg_ids of each finding the summary names.
SAMPLE = 20


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of the summary: a finding, how many rows it has and the first msg_ids."""

    finding: str
    violation: bool
    count: int
    msg_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AuditResult:
    """What the audit found, in :data:`FINDINGS` order, and where it wrote it."""

    findings: tuple[Finding, ...]
    out: str
    as_of: datetime
    rows: dict[str, list[dict[str, object]]] = field(default_factory=dict)

    @property
    def violations(self) -> int:
        """How many findings violate once-only (duplicate DONEs)."""
        return sum(f.count for f in self.findings if f.violation)

    def count(self, finding: str) -> int:
        """The number of rows of one finding."""
        return next((f.count for f in self.findings if f.finding == finding), 0)


def audit(
    spark: SparkSession,
    journal: str | Path,
    out: str | Path,
    *,
    as_of: datetime | None = None,
    stuck_after: timedelta = timedelta(minutes=15),
    lost_after: timedelta = timedelta(minutes=15),
    collect: int = 0,
) -> AuditResult:
    """Audit an exported journal; write ``OUT/audit/findings`` and ``OUT/audit/summary``.

    ``as_of``: the time ages are measured at (default now, UTC). ``collect``: also return
    up to that many rows of each finding in :attr:`AuditResult.rows` (for tests and the
    CLI's detail view).
    """

    from pyspark import StorageLevel

    when = as_of or datetime.now(UTC)
    now_us = micros(when)
    # Four findings read the fold: persisted, the journal is grouped once, not four times.
    members = member_facts(read_journal(spark, journal)).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return _audit(spark, journal, out, members, when, now_us, stuck_after, lost_after, collect)
    finally:
        members.unpersist()


def _audit(
    spark: SparkSession,
    journal: str | Path,
    out: str | Path,
    members: DataFrame,
    when: datetime,
    now_us: int,
    stuck_after: timedelta,
    lost_after: timedelta,
    collect: int,
) -> AuditResult:
    from pyspark.sql import functions as F

    subs = members.where(F.col("actor_kind") == "subscriber")

    dup = subs.where(F.col("dones") > 1).select(
        *_finding("duplicate_done"), F.concat(F.lit("DONE "), F.col("dones"), F.lit(" times"))
    )
    stuck = subs.where(
        F.col("state").isin(*IN_DOUBT) & (F.col("since_us") < now_us - _us(stuck_after))
    ).select(*_finding("stuck"), F.concat(F.lit("attempt "), F.col("attempt").cast("string")))
    lost = _lost(spark, journal, subs, now_us - _us(lost_after)).select(
        *_finding("lost"), F.lit("passed over by a later message")
    )
    mfacts = message_facts(members)
    inconsistent = _inconsistent(subs, mfacts)
    found = dup.unionAll(stuck).unionAll(lost).unionAll(inconsistent).toDF(*_COLUMNS)

    base = str(out).rstrip("/") + "/audit"
    found.write.mode("overwrite").parquet(f"{base}/findings")
    written = spark.read.parquet(f"{base}/findings")
    counts = {
        r["finding"]: (r["n"], r["ids"])
        for r in written.groupBy("finding")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.slice(F.array_sort(F.collect_set("msg_id")), 1, SAMPLE).alias("ids"),
        )
        .collect()
    }
    findings = tuple(
        Finding(name, bad, int(counts.get(name, (0, []))[0]), tuple(counts.get(name, (0, []))[1]))
        for name, bad in FINDINGS.items()
    )
    summary = spark.createDataFrame(
        [(f.finding, f.violation, f.count, list(f.msg_ids)) for f in findings],
        "finding string, violation boolean, count long, msg_ids array<string>",
    )
    summary.coalesce(1).write.mode("overwrite").parquet(f"{base}/summary")
    rows: dict[str, list[dict[str, object]]] = {}
    if collect:
        for name in FINDINGS:
            picked = written.where(F.col("finding") == name).orderBy("msg_id", "actor")
            rows[name] = [r.asDict() for r in picked.limit(collect).collect()]
    return AuditResult(findings, base, when, rows)


_COLUMNS = ("finding", "store", "queue", "msg_id", "actor", "state", "since", "dones", "detail")


def _us(delta: timedelta) -> int:
    return int(delta.total_seconds() * 1_000_000)


def _finding(name: str) -> list[Column]:
    from pyspark.sql import functions as F

    return [
        F.lit(name),
        F.col("store"),
        F.col("queue"),
        F.col("msg_id"),
        F.col("actor"),
        F.col("state"),
        F.timestamp_micros(F.col("since_us")),
        F.col("dones"),
    ]


def _lost(spark: SparkSession, journal: str | Path, subs: DataFrame, before_us: int) -> DataFrame:
    """AVAILABLE members passed over: their subscriber has since taken a message of the
    same queue revealed to it later, at the same or a lower priority."""
    from pyspark.sql import functions as F

    waiting = subs.where((F.col("state") == "AVAILABLE") & (F.col("since_us") < before_us))
    # Only the subscribers with a waiting member need the priority join: usually few.
    who = waiting.select("store", "queue", "actor").distinct()
    taken = subs.where(F.col("gets") > 0).join(
        F.broadcast(who), ["store", "queue", "actor"], "left_semi"
    )
    priority = _priorities(spark, journal)
    if priority is not None:
        taken = taken.join(priority, ["store", "msg_id"], "left")
        waiting = waiting.join(priority, ["store", "msg_id"], "left")
    else:
        taken = taken.withColumn("priority", F.lit(None).cast("int"))
        waiting = waiting.withColumn("priority", F.lit(None).cast("int"))
    default = F.lit(4)
    latest = taken.groupBy(
        "store", "queue", "actor", F.coalesce("priority", default).alias("p")
    ).agg(F.max("revealed_us").alias("taken_revealed_us"))
    w, t = waiting.alias("w"), latest.alias("t")
    cond = [
        F.col("w.store") == F.col("t.store"),
        F.col("w.queue") == F.col("t.queue"),
        F.col("w.actor") == F.col("t.actor"),
        F.col("t.p") <= F.coalesce(F.col("w.priority"), default),
        F.col("t.taken_revealed_us") > F.col("w.since_us"),
    ]
    return w.join(t, cond, "left_semi")


def _priorities(spark: SparkSession, journal: str | Path) -> DataFrame | None:
    from iqbridge.analytics.session import AnalyticsError

    try:
        return read_messages(spark, journal).select("store", "msg_id", "priority")
    except AnalyticsError:
        return None


def _inconsistent(subs: DataFrame, mfacts: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    suspects = mfacts.where(
        ((F.col("pub_state") == "JOURNALLED") & (F.col("not_journalled") > 0))
        | ((F.col("busy") > 0) & F.col("pub_revealed_us").isNull())
    ).select("store", "queue", "msg_id", "pub_state", "pub_revealed_us")
    joined = subs.join(suspects, ["store", "queue", "msg_id"], "inner").where(
        ((F.col("pub_state") == "JOURNALLED") & (F.col("state") != "JOURNALLED"))
        | ((F.col("gets") > 0) & F.col("pub_revealed_us").isNull())
    )
    detail = F.when(
        F.col("pub_state") == "JOURNALLED",
        F.concat(F.lit("publisher JOURNALLED, subscriber "), F.col("state")),
    ).otherwise(
        F.concat(
            F.lit("subscriber took it; publisher never REVEALED, is "),
            F.coalesce(F.col("pub_state"), F.lit("unknown")),
        )
    )
    return joined.select(*_finding("inconsistent"), detail)
