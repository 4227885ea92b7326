"""``iq analytics audit|latency|lineage|retention``: the Spark jobs over an exported journal.

The same commands run under ``spark-submit`` through :mod:`iqbridge.analytics.__main__`
(``spark-submit …/iqbridge/analytics/__main__.py audit --journal DIR``): they take the
session ``spark-submit`` made, or build one for ``--master`` (default ``local[*]``).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from iqbridge.analytics.schema import JOURNAL, MESSAGES
from iqbridge.analytics.session import AnalyticsError
from iqbridge.cli.context import settings
from iqbridge.cli.parsing import parse_duration

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["VIOLATION_EXIT", "analytics_app"]

#: The exit code of ``iq analytics audit`` when it finds a violation of once-only.
VIOLATION_EXIT = 3

analytics_app = typer.Typer(
    help="Spark jobs over an exported journal (see docs/analytics.md).", no_args_is_help=True
)

JournalOpt = Annotated[
    str,
    typer.Option("--journal", help="The directory `iq journal export --to` wrote (or a URL)."),
]
OutOpt = Annotated[
    str | None, typer.Option("--out", help="Where results go (default: JOURNAL/reports).")
]
MasterOpt = Annotated[
    str | None,
    typer.Option(
        "--master", envvar="IQ_SPARK_MASTER", help="Spark master URL (default: local[*])."
    ),
]
ConfOpt = Annotated[
    list[str] | None, typer.Option("--conf", help="A Spark setting KEY=VALUE (repeatable).")
]
AsOfOpt = Annotated[
    str | None,
    typer.Option("--as-of", help="Measure ages at this ISO time (default: now, UTC)."),
]


def _session(
    journal: str, master: str | None, conf: list[str] | None, *datasets: str
) -> SparkSession:
    """The Spark session, once every argument Spark would read has been checked: a bad
    one costs no JVM start."""
    from iqbridge.analytics.session import check_journal, check_master, spark_session

    try:
        check_master(master)
    except AnalyticsError as exc:
        raise typer.BadParameter(str(exc), param_hint="--master") from None
    extra: dict[str, str] = {}
    for item in conf or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{item!r}: write KEY=VALUE", param_hint="--conf")
        extra[key.strip()] = value
    check_journal(journal, JOURNAL, *datasets)
    if _local(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return spark_session(master, conf=extra)


def _local(master: str | None) -> bool:
    return master is None or master.startswith("local")


def _out(journal: str, out: str | None) -> str:
    return out or f"{journal.rstrip('/')}/reports"


def _as_of(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not an ISO time (e.g. 2026-11-25T10:00:00Z)", param_hint="--as-of"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _age(text: str, option: str) -> timedelta:
    return timedelta(seconds=parse_duration(text, option))


@analytics_app.command("audit")
def audit_cmd(
    ctx: typer.Context,
    journal: JournalOpt,
    out: OutOpt = None,
    master: MasterOpt = None,
    conf: ConfOpt = None,
    as_of: AsOfOpt = None,
    stuck_after: Annotated[
        str, typer.Option("--stuck-after", help="In doubt longer than this is stuck.")
    ] = "15m",
    lost_after: Annotated[
        str, typer.Option("--lost-after", help="Passed over and AVAILABLE longer than this.")
    ] = "15m",
) -> int:
    """Once-only violations, lost messages, stuck deliveries, inconsistencies.

    Exits 3 when a subscriber processed a message twice."""
    from iqbridge.analytics.audit import audit

    cfg = settings(ctx)
    when = _as_of(as_of)
    stuck, lost = _age(stuck_after, "--stuck-after"), _age(lost_after, "--lost-after")
    spark = _session(journal, master, conf)
    result = audit(
        spark, journal, _out(journal, out), as_of=when, stuck_after=stuck, lost_after=lost
    )
    table = Table(title="audit", box=box.SIMPLE_HEAD)
    for col in ("finding", "violates once-only", "count", "first msg_ids"):
        table.add_column(col)
    for f in result.findings:
        ids = ", ".join(f.msg_ids[:5]) + (" …" if len(f.msg_ids) > 5 else "")
        table.add_row(f.finding, "yes" if f.violation else "no", str(f.count), escape(ids))
    cfg.out.print(table)
    cfg.out.print(f"findings written to {escape(result.out)}", soft_wrap=True)
    if result.violations:
        cfg.err.print(f"iq: audit: {result.violations} once-only violation(s)")
        return VIOLATION_EXIT
    return 0


@analytics_app.command("latency")
def latency_cmd(
    ctx: typer.Context,
    journal: JournalOpt,
    out: OutOpt = None,
    master: MasterOpt = None,
    conf: ConfOpt = None,
    report: Annotated[bool, typer.Option("--report/--no-report", help="Write report.html.")] = True,
) -> None:
    """REVEALED to DONE percentiles, time in each state, throughput per hour."""
    from iqbridge.analytics.latency import latency

    cfg = settings(ctx)
    result = latency(_session(journal, master, conf), journal, _out(journal, out), report=report)
    table = Table(title="REVEALED to DONE (ms)", box=box.SIMPLE_HEAD)
    for col in ("queue", "subscriber", "done", "p50", "p95", "p99"):
        table.add_column(col, justify="left" if col in ("queue", "subscriber") else "right")
    for r in result.percentiles:
        table.add_row(
            escape(str(r["queue"])),
            escape(str(r["actor"])),
            str(r["done"]),
            *(f"{float(r[k]):,.1f}" for k in ("p50_ms", "p95_ms", "p99_ms")),  # type: ignore[arg-type]
        )
    cfg.out.print(table)
    where = result.report or result.out
    cfg.out.print(f"results written to {escape(where)}", soft_wrap=True)


@analytics_app.command("lineage")
def lineage_cmd(
    ctx: typer.Context,
    journal: JournalOpt,
    out: OutOpt = None,
    master: MasterOpt = None,
    conf: ConfOpt = None,
    inbound: Annotated[
        str | None, typer.Option("--inbound", help="Plan for this inbound queue only (A).")
    ] = None,
    outbound: Annotated[
        str | None, typer.Option("--outbound", help="Plan for this outbound queue only (B).")
    ] = None,
) -> None:
    """Parent/child trees, orphans and the cross-queue recovery plan."""
    from iqbridge.analytics.lineage import lineage

    cfg = settings(ctx)
    spark = _session(journal, master, conf, MESSAGES)
    result = lineage(spark, journal, _out(journal, out), inbound=inbound, outbound=outbound)
    cfg.out.print(
        f"{result.edges} parent link(s), {result.trees} tree member(s), "
        f"{len(result.orphans)} orphan(s)"
    )
    table = Table(title="recovery plan (seed 000)", box=box.SIMPLE_HEAD)
    for col in ("step", "action", "queue", "msg_id", "subscriber", "why"):
        table.add_column(col)
    for r in result.plan:
        table.add_row(
            *(
                escape(str(r[k] if r[k] is not None else ""))
                for k in ("step", "action", "queue", "msg_id", "actor", "reason")
            )
        )
    cfg.out.print(table)
    cfg.out.print(f"results written to {escape(result.out)}", soft_wrap=True)


@analytics_app.command("retention")
def retention_cmd(
    ctx: typer.Context,
    journal: JournalOpt,
    out: OutOpt = None,
    master: MasterOpt = None,
    conf: ConfOpt = None,
    as_of: AsOfOpt = None,
    keep: Annotated[
        str, typer.Option("--keep", help="Keep journalled messages this long (every queue).")
    ] = "7d",
    rule: Annotated[
        list[str] | None,
        typer.Option(
            "--rule",
            help="QUEUE=AGE: a queue's own rule; QUEUE may be a pattern such as "
            "'audit-*' (repeatable; an exact name wins, then the first pattern).",
        ),
    ] = None,
) -> None:
    """Archive journalled messages past their rule and write the purge plan."""
    from iqbridge.analytics.retention import retention

    cfg = settings(ctx)
    rules: dict[str, timedelta] = {}
    for item in rule or []:
        queue, sep, age = item.rpartition("=")
        if not sep or not queue:
            raise typer.BadParameter(
                f"{item!r}: write QUEUE=AGE, e.g. orders=30d", param_hint="--rule"
            )
        rules[queue] = _age(age, "--rule")
    kept, when = _age(keep, "--keep"), _as_of(as_of)
    spark = _session(journal, master, conf)
    result = retention(spark, journal, _out(journal, out), keep=kept, rules=rules, as_of=when)
    cfg.out.print(
        f"archived {result.archived} message(s) ({result.with_payload} with payload) to "
        f"{escape(result.out)}/archive",
        soft_wrap=True,
    )
    for queue, n in sorted(result.per_queue.items()):
        cfg.out.print(f"  {escape(queue)}: {n}", soft_wrap=True)
    plan = escape(result.plan)
    cfg.out.print(f"purge plan: {plan} (apply with: iq purge --from-plan {plan})", soft_wrap=True)
