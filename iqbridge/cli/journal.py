"""``iq journal export``: the state journal as Parquet, for Spark, DuckDB or pyarrow."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import Progress, ProgressColumn, SpinnerColumn, Task, TextColumn
from rich.text import Text

from iqbridge.analytics.export import export_journal
from iqbridge.cli.context import open_hub, settings
from iqbridge.cli.parsing import parse_duration
from iqbridge.registry import open_store
from iqbridge.stores.base import IndexStore

__all__ = ["export", "journal_app"]

journal_app = typer.Typer(
    help="The state journal: export it for analytics (see docs/analytics.md).",
    no_args_is_help=True,
)


class _Rate(ProgressColumn):
    """Rows per second (the total is unknown)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} rows/s" if speed else "", style="progress.data.speed")


@contextlib.contextmanager
def _store(ctx: typer.Context) -> Iterator[IndexStore]:
    """The index store of the global options: ``--index`` alone when given (the broker
    is not needed), else the broker's own index."""
    cfg = settings(ctx)
    if cfg.index:
        store = open_store(cfg.index)
        try:
            yield store
        finally:
            store.close()
        return
    with open_hub(ctx, create=False) as hub:
        yield hub.store


@journal_app.command("export")
def export(
    ctx: typer.Context,
    to: Annotated[
        Path,
        typer.Option("--to", help="The export directory (created if new).", show_default=False),
    ],
    page_size: Annotated[
        int, typer.Option("--page-size", min=1, help="Journal entries read and written at a time.")
    ] = 50_000,
    payloads: Annotated[
        bool,
        typer.Option("--payloads/--no-payloads", help="Include retained payloads and headers."),
    ] = True,
    gap_grace: Annotated[
        str,
        typer.Option(
            "--gap-grace",
            help="How long a sequence number a SQL store has not committed yet is waited "
            "for before it counts as rolled back (e.g. 30s, 5m).",
        ),
    ] = "5m",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> int:
    """Export the index's journal to Parquet under --to, from where the last export of
    this index into it stopped (each transition exactly once, also after a crash)."""
    cfg = settings(ctx)
    grace = parse_duration(gap_grace, "--gap-grace")
    with _store(ctx) as store:
        show = not quiet and cfg.err.is_terminal
        with Progress(
            SpinnerColumn(),
            TextColumn("exporting the journal"),
            TextColumn("{task.completed:,.0f} rows"),
            _Rate(),
            console=cfg.err,
            transient=True,
            disable=not show,
        ) as bar:
            task = bar.add_task("export", total=None)
            result = export_journal(
                store,
                to,
                page_size=page_size,
                payloads=payloads,
                gap_grace=grace,
                progress=lambda rows: bar.update(task, completed=rows),
            )
    gaps = f", {result.gaps} seq gap(s) awaiting late commits" if result.gaps else ""
    cfg.out.print(
        escape(
            f"exported {result.rows} transition(s), {result.messages} message(s) from "
            f"{result.store} to {to} (watermark {result.high}{gaps})"
        ),
        soft_wrap=True,
    )
    return 0
