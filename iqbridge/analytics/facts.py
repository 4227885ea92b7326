"""What every job starts from: the journal folded to one row per (message, actor).

:func:`member_facts` groups the journal once by ``(store, queue, msg_id, actor_kind,
actor)`` and keeps, per actor, its current state (the destination of its last transition
by sequence number), when it got there, when the message was first revealed to it, its
first DONE, how many DONEs it made, and the time it spent in each state. The time in a
state needs no window over the journal: every transition leaves the state it came from
(``src``) and enters another (``dst``), so the time spent in ``S`` is the sum of the times
it left ``S`` minus the sum of the times it entered ``S``, plus the open stay when ``S`` is
the current state. One grouping, no sort: the fold the audit, the latency report, lineage
and retention all share.

Every expression is a Spark SQL function (no Python UDF), so a cluster's executors need
nothing of iqbridge.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from iqbridge.analytics.schema import SUBSCRIBER_STATES

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import Column, DataFrame

__all__ = ["KEYS", "in_state_column", "member_facts", "message_facts", "micros"]

#: The key of a member fact: one actor's view of one message in one store.
KEYS = ("store", "queue", "msg_id", "actor_kind", "actor")
#: Every state name, subscriber and publisher (their positions code them in the fold).
_STATES = (*SUBSCRIBER_STATES, "PUT", "REVEALED", "UNAVAILABLE")


def in_state_column(state: str) -> str:
    """The member-fact column holding the microseconds spent in ``state``."""
    return f"in_{state.lower()}_us"


def micros(when: datetime) -> int:
    """Microseconds since the epoch of an aware datetime."""
    return int(when.timestamp() * 1_000_000)


def member_facts(journal: DataFrame) -> DataFrame:
    """One row per actor of every message (the publisher and each subscriber).

    Columns: the :data:`KEYS`; ``state`` and ``since_us`` (current state and when it was
    entered); ``first_us``; ``revealed_us`` (first REVEALED for the publisher, first
    AVAILABLE for a subscriber); ``done_us`` (first DONE); ``dones``; ``gets`` (times it
    entered GET); ``attempt`` (highest); ``in_<state>_us`` for every subscriber state (null when the
    member's transitions do not chain, e.g. an entry written around the engine).
    """
    from pyspark.sql import functions as F

    at = F.unix_micros(F.col("at"))
    dst, src = F.col("dst"), F.col("src")
    # max_by over a small integer (the state's position in _STATES) instead of the name:
    # a fixed-width aggregation buffer keeps Spark on its hash aggregate.
    names = F.array(*(F.lit(s) for s in _STATES))
    code = F.array_position(names, dst).cast("int")
    aggs: list[Column] = [
        F.max_by(code, F.col("seq")).alias("_state"),
        F.max(at).alias("since_us"),
        F.min(at).alias("first_us"),
        F.min(F.when(dst.isin("AVAILABLE", "REVEALED"), at)).alias("revealed_us"),
        F.min(F.when(dst == "DONE", at)).alias("done_us"),
        F.count(F.when(dst == "DONE", 1)).alias("dones"),
        F.count(F.when(dst == "GET", 1)).alias("gets"),
        F.max("attempt").alias("attempt"),
    ]
    for state in SUBSCRIBER_STATES:
        aggs.append(F.sum(F.when(src == state, at)).alias(f"_leave_{state}"))
        aggs.append(F.sum(F.when(dst == state, at)).alias(f"_enter_{state}"))
        aggs.append(F.count(F.when(src == state, 1)).alias(f"_nleave_{state}"))
        aggs.append(F.count(F.when(dst == state, 1)).alias(f"_nenter_{state}"))
    folded = journal.groupBy(*KEYS).agg(*aggs)
    folded = folded.withColumn(
        "state", F.when(F.col("_state") > 0, F.element_at(names, F.col("_state")))
    )
    stays = [
        # Null where the member's chain of transitions is broken (a state left more often
        # than entered: an entry written around the engine); the audit reports those.
        F.when(
            F.col(f"_nleave_{s}")
            == F.col(f"_nenter_{s}") - F.when(F.col("state") == s, 1).otherwise(0),
            F.coalesce(F.col(f"_leave_{s}"), F.lit(0))
            - F.coalesce(F.col(f"_enter_{s}"), F.lit(0))
            + F.when(F.col("state") == s, F.col("since_us")).otherwise(F.lit(0)),
        ).alias(in_state_column(s))
        for s in SUBSCRIBER_STATES
    ]
    keep = [c for c in folded.columns if not c.startswith("_")]
    return folded.select(*keep, *stays)


def message_facts(members: DataFrame) -> DataFrame:
    """One row per message: the publisher's state beside a summary of its subscribers.

    Columns: ``store``, ``queue``, ``msg_id``; ``pub_state``, ``pub_since_us``,
    ``pub_revealed_us`` (None when the journal holds no publisher transition); ``members``;
    ``not_journalled`` (subscribers not JOURNALLED); ``done`` (some subscriber reached
    DONE); ``busy`` (subscribers that moved past AVAILABLE).
    """
    from pyspark.sql import functions as F

    pub = F.col("actor_kind") == "publisher"
    sub = F.col("actor_kind") == "subscriber"
    return members.groupBy("store", "queue", "msg_id").agg(
        F.max(F.when(pub, F.col("state"))).alias("pub_state"),
        F.max(F.when(pub, F.col("since_us"))).alias("pub_since_us"),
        F.max(F.when(pub, F.col("revealed_us"))).alias("pub_revealed_us"),
        F.count(F.when(sub, 1)).alias("members"),
        F.count(F.when(sub & (F.col("state") != "JOURNALLED"), 1)).alias("not_journalled"),
        F.max(F.when(sub, F.col("dones") > 0)).alias("done"),
        F.count(F.when(sub & (F.col("gets") > 0), 1)).alias("busy"),
    )
