"""``iq reconcile URL QUEUE``: compare a queue's index with its broker, and repair safely.

Prints a table of findings and a summary line (or the report as JSON); exits 0 when
the two agree or every finding was repaired, 3 when findings remain.
"""

from __future__ import annotations

import importlib
import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from iqbridge.cli.context import open_hub, open_queue, settings

if TYPE_CHECKING:  # recovery/ is installed as iqbridge.recovery; mypy reads it as its own root
    from recovery.reconcile import Report  # noqa: TID251

__all__ = ["FINDINGS_REMAIN", "reconcile"]

#: Exit code when findings remain after the run.
FINDINGS_REMAIN = 3


def _table(report: Report) -> Table:
    table = Table(
        title=f"reconcile {escape(report.queue)} on {escape(report.broker)}", box=box.SIMPLE_HEAD
    )
    for name in ("kind", "message", "group", "index says", "broker says", "fix", "applied"):
        # Ids are folded, never cut: an operator copies them.
        table.add_column(name, no_wrap=name in ("kind", "applied"), overflow="fold")
    for f in report.findings:
        message = f.msg_id or ""
        if f.native_ref:
            message += f" @ {f.native_ref}" if message else f.native_ref
        table.add_row(
            f.kind.value,
            escape(message),
            escape(f.group or ""),
            escape(f.index_says),
            escape(f.broker_says),
            escape(f.fix),
            "yes" if f.repaired else "no",
        )
    return table


def reconcile(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(metavar="URL", help="Broker URL.", show_default=False)],
    queue: Annotated[str, typer.Argument(metavar="QUEUE", help="Queue name.", show_default=False)],
    index: Annotated[
        str | None, typer.Option("--index", help="Index store URL (default: the broker's).")
    ] = None,
    repair: Annotated[
        bool, typer.Option("--repair", help="Apply the safe fixes (see docs/reconcile.md).")
    ] = False,
    adopt: Annotated[
        bool, typer.Option("--adopt", help="Adopt entries put by clients without iqbridge.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output for scripts.")] = False,
) -> None:
    """Compare a queue's index with its broker: unknown entries, missing payloads,
    contradicted states. Exit 3 when findings remain."""
    cfg = settings(ctx)
    cfg.url = url
    if index is not None:
        cfg.index = index
    module = importlib.import_module("iqbridge.recovery.reconcile")
    with open_hub(ctx, create=False) as hub:
        report: Report = module.reconcile(open_queue(hub, queue), repair=repair, adopt=adopt)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), ensure_ascii=False, indent=2))
    else:
        if report.findings:
            cfg.out.print(_table(report))
        for note in report.notes:
            cfg.out.print(f"note: {note.check.value}: {escape(note.text)}", soft_wrap=True)
        cfg.out.print(escape(report.summary()), soft_wrap=True)
    if not report.consistent:
        raise typer.Exit(FINDINGS_REMAIN)
