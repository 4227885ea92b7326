"""Lineage: parent/child trees across queues and brokers, orphans, and the recovery plan.

A message's parents are msg_ids, possibly of other queues, stores and brokers (the bridge
records them across brokers); the exported ``messages`` dataset carries them. Written
under ``OUT/lineage/``:

``edges/``
    One row per (child, parent): both sides' store and queue (the parent's is null when
    the export holds no record of it), whether the parent reached DONE, the child's
    publisher state.
``trees/``
    One row per (root, descendant): ``depth`` 1 for a root's children, 2 for theirs...
    A root is a message with children and no parents.
``orphans/``
    Children none of whose parents reached DONE (a parent the export does not know counts
    as not DONE and says so).
``plan/``
    What seed 000's cross-queue recovery would do now, step by step, as a table (see
    :func:`recovery_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from iqbridge.analytics.facts import member_facts, message_facts
from iqbridge.analytics.schema import IN_DOUBT
from iqbridge.analytics.session import read_journal, read_messages

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from pyspark.sql import DataFrame, SparkSession

__all__ = ["LineageResult", "lineage", "recovery_plan"]

#: How deep the trees are followed (a cycle of ids cannot occur: ids are never reused).
MAX_DEPTH = 32


@dataclass(frozen=True, slots=True)
class LineageResult:
    """Where the lineage tables went, their sizes, and the recovery plan's rows."""

    out: str
    edges: int
    trees: int
    orphans: list[dict[str, object]]
    plan: list[dict[str, object]]


def lineage(
    spark: SparkSession,
    journal: str | Path,
    out: str | Path,
    *,
    inbound: str | None = None,
    outbound: str | None = None,
) -> LineageResult:
    """Write the lineage tables of an exported journal. ``inbound``/``outbound`` restrict
    the recovery plan to one pair of queues (seed 000's A and B)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    msgs = read_messages(spark, journal).select("store", "queue", "msg_id", "parents")
    members = member_facts(read_journal(spark, journal)).persist(StorageLevel.MEMORY_AND_DISK)
    facts = message_facts(members).select(
        "store", "queue", "msg_id", "pub_state", F.coalesce("done", F.lit(False)).alias("done")
    )
    try:
        base = str(out).rstrip("/") + "/lineage"
        edges = _edges(msgs, facts)
        edges.write.mode("overwrite").parquet(f"{base}/edges")
        written = spark.read.parquet(f"{base}/edges")
        _trees(written).write.mode("overwrite").parquet(f"{base}/trees")
        orphans = (
            written.groupBy("child_store", "child_queue", "child", "child_state")
            .agg(
                F.max(F.col("parent_done")).alias("any_done"),
                F.array_sort(F.collect_list("parent")).alias("parents"),
                F.count(F.when(F.col("parent_queue").isNull(), 1)).alias("unknown"),
            )
            .where(~F.col("any_done"))
            .select(
                F.col("child_store").alias("store"),
                F.col("child_queue").alias("queue"),
                F.col("child").alias("msg_id"),
                F.col("child_state").alias("state"),
                "parents",
                F.when(F.col("unknown") > 0, "a parent is not in the export")
                .otherwise("no parent reached DONE")
                .alias("reason"),
            )
        )
        orphans.write.mode("overwrite").parquet(f"{base}/orphans")
        plan = recovery_plan(msgs, facts, members, inbound=inbound, outbound=outbound)
        plan.write.mode("overwrite").parquet(f"{base}/plan")
    finally:
        members.unpersist()
    order = ["step", "store", "queue", "msg_id", "actor"]
    return LineageResult(
        base,
        spark.read.parquet(f"{base}/edges").count(),
        spark.read.parquet(f"{base}/trees").count(),
        [r.asDict() for r in spark.read.parquet(f"{base}/orphans").orderBy("msg_id").collect()],
        [r.asDict() for r in spark.read.parquet(f"{base}/plan").orderBy(*order).collect()],
    )


def _edges(msgs: DataFrame, facts: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    children = msgs.where(F.size("parents") > 0).select(
        F.col("store").alias("child_store"),
        F.col("queue").alias("child_queue"),
        F.col("msg_id").alias("child"),
        F.explode("parents").alias("parent"),
    )
    child_state = facts.select(
        F.col("store").alias("child_store"),
        F.col("msg_id").alias("child"),
        F.col("pub_state").alias("child_state"),
    )
    parent = facts.select(
        F.col("msg_id").alias("parent"),
        F.col("store").alias("parent_store"),
        F.col("queue").alias("parent_queue"),
        F.col("done").alias("parent_done"),
    )
    return (
        children.join(child_state, ["child_store", "child"], "left")
        .join(parent, ["parent"], "left")
        .select(
            "child_store",
            "child_queue",
            "child",
            "child_state",
            "parent",
            "parent_store",
            "parent_queue",
            F.coalesce("parent_done", F.lit(False)).alias("parent_done"),
        )
    )


def _trees(edges: DataFrame) -> DataFrame:
    """Every root's descendants, level by level (one small join per level)."""
    from pyspark.sql import functions as F

    links = edges.select("parent", "child", "child_store", "child_queue")
    has_parents = links.select(F.col("child").alias("parent")).distinct()
    roots = links.select("parent").distinct().join(has_parents, ["parent"], "left_anti")
    level = links.join(roots, ["parent"], "left_semi").select(
        F.col("parent").alias("root"),
        F.col("child").alias("msg_id"),
        F.col("child_store").alias("store"),
        F.col("child_queue").alias("queue"),
        F.lit(1).alias("depth"),
    )
    found = level.localCheckpoint()
    frontier = found
    for depth in range(2, MAX_DEPTH + 1):
        nxt = (
            frontier.select("root", F.col("msg_id").alias("parent"))
            .join(links, ["parent"])
            .select(
                "root",
                F.col("child").alias("msg_id"),
                F.col("child_store").alias("store"),
                F.col("child_queue").alias("queue"),
                F.lit(depth).alias("depth"),
            )
            .localCheckpoint()
        )
        if nxt.isEmpty():
            break
        found = found.unionByName(nxt)
        frontier = nxt
    return found


def recovery_plan(
    msgs: DataFrame,
    facts: DataFrame,
    members: DataFrame,
    *,
    inbound: str | None = None,
    outbound: str | None = None,
) -> DataFrame:
    """Seed 000's cross-queue recovery, as the rows it would apply (nothing is changed).

    Outbound queues (B) are those holding children; inbound queues (A) those holding
    their parents. Steps: (1) children in B not REVEALED (still PUT); (2) follow their
    parents; (3) if any parent reached DONE, ``reveal`` the child and mark ``done`` every
    parent's subscriber still in doubt; if none did, ``withdraw`` the child and
    ``release`` (back to AVAILABLE) every parent's subscriber in doubt; (4) a child
    without parents is revealed; (5) every subscriber in A still in doubt (GET, FETCHED,
    IN_PROCESS) is released. A subscriber both marked done and released is marked done:
    a child of its message was already revealed.

    Columns: step, action (reveal, withdraw, done, release), store, queue, msg_id, actor
    (null for the publisher's actions), reason.
    """
    from pyspark.sql import functions as F

    out_q = msgs.where(F.size("parents") > 0).select("store", "queue").distinct()
    if outbound is not None:
        out_q = out_q.where(F.col("queue") == outbound)
    pub = facts.select("store", "queue", "msg_id", "pub_state")
    children = (
        msgs.join(out_q, ["store", "queue"], "left_semi")
        .join(pub, ["store", "queue", "msg_id"], "left")
        .where(F.col("pub_state") == "PUT")
    )
    links = children.select("store", "queue", "msg_id", F.explode_outer("parents").alias("parent"))
    parent_facts = facts.select(
        F.col("msg_id").alias("parent"),
        F.col("store").alias("p_store"),
        F.col("queue").alias("p_queue"),
        F.col("done").alias("p_done"),
    )
    if inbound is not None:
        parent_facts = parent_facts.where(F.col("p_queue") == inbound)
    linked = links.join(parent_facts, ["parent"], "left")
    verdict = linked.groupBy("store", "queue", "msg_id").agg(
        F.count("parent").alias("n_parents"),
        F.max(F.coalesce("p_done", F.lit(False))).alias("any_done"),
    )
    reveal = (F.col("n_parents") == 0) | F.col("any_done")
    child_rows = verdict.select(
        F.when(F.col("n_parents") == 0, 4).otherwise(3).alias("step"),
        F.when(reveal, "reveal").otherwise("withdraw").alias("action"),
        "store",
        "queue",
        "msg_id",
        F.lit(None).cast("string").alias("actor"),
        F.when(F.col("n_parents") == 0, "child without parents")
        .when(F.col("any_done"), "a parent reached DONE")
        .otherwise("no parent reached DONE")
        .alias("reason"),
    )
    in_doubt = members.where(
        (F.col("actor_kind") == "subscriber") & F.col("state").isin(*IN_DOUBT)
    ).select("store", "queue", "msg_id", "actor")
    per_parent = (
        linked.where(F.col("p_store").isNotNull())
        .join(verdict, ["store", "queue", "msg_id"])
        .select(
            F.col("p_store").alias("store"),
            F.col("p_queue").alias("queue"),
            F.col("parent").alias("msg_id"),
            F.when(F.col("any_done"), "done").otherwise("release").alias("action"),
        )
    )
    parent_rows = per_parent.join(in_doubt, ["store", "queue", "msg_id"]).select(
        F.lit(3).alias("step"),
        "action",
        "store",
        "queue",
        "msg_id",
        "actor",
        F.when(F.col("action") == "done", "its child is revealed")
        .otherwise("its child is withdrawn")
        .alias("reason"),
    )
    in_q = (
        msgs.where(F.size("parents") > 0)
        .join(out_q, ["store", "queue"], "left_semi")
        .select(F.explode("parents").alias("parent"))
        .join(parent_facts, ["parent"])
        .select(F.col("p_store").alias("store"), F.col("p_queue").alias("queue"))
        .distinct()
    )
    step5 = in_doubt.join(in_q, ["store", "queue"], "left_semi").select(
        F.lit(5).alias("step"),
        F.lit("release").alias("action"),
        "store",
        "queue",
        "msg_id",
        "actor",
        F.lit("in doubt in an inbound queue").alias("reason"),
    )
    # A subscriber marked done in step 3 is not released in step 5 (or by another child).
    subs = parent_rows.unionByName(step5)
    rank = F.when(F.col("action") == "done", 0).otherwise(1)
    best = (
        subs.withColumn("_rank", rank)
        .groupBy("store", "queue", "msg_id", "actor")
        .agg(F.min(F.struct("_rank", "step", "action", "reason")).alias("_b"))
    )
    member_rows = best.select(
        F.col("_b.step").alias("step"),
        F.col("_b.action").alias("action"),
        "store",
        "queue",
        "msg_id",
        "actor",
        F.col("_b.reason").alias("reason"),
    )
    return child_rows.unionByName(member_rows)
