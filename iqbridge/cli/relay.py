"""``iq relay``: publish a transactional outbox to a broker, with a live count."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from iqbridge.cli.context import CommandError, Settings, open_hub, settings
from iqbridge.cli.parsing import parse_duration
from iqbridge.errors import IQError
from iqbridge.redaction import get_logger, scrub, url_secrets

if TYPE_CHECKING:
    from iqbridge.outbox import Outbox
    from iqbridge.relay import Relay, RelayStats

__all__ = ["relay"]


class _OneLine(logging.Handler):
    """Relay log records as one line each on stderr: parked rows, retried rounds."""

    def __init__(self, cfg: Settings, secrets: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.cfg = cfg
        self.secrets = secrets

    def emit(self, record: logging.LogRecord) -> None:
        text = " ".join(scrub(record.getMessage(), [*self.secrets, *self.cfg.secrets()]).split())
        kind = "parked" if record.levelno >= logging.ERROR else "warning"
        self.cfg.err.print(f"iq: {kind}: {escape(text)}", soft_wrap=True)


@contextlib.contextmanager
def _log_to(handler: logging.Handler) -> Iterator[None]:
    logger = get_logger("iqbridge.relay")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _describe(stats: RelayStats, pending: int | None, error: str | None) -> str:
    text = f"relayed {stats.relayed}"
    if stats.parked:
        text += f" · parked {stats.parked}"
    if pending is not None:
        text += f" · pending {pending}"
    if stats.elapsed > 0:
        text += f" · {stats.relayed / stats.elapsed:,.0f}/s"
    if error:
        text += f" · retrying: {error}"
    return text


def relay(
    ctx: typer.Context,
    outbox_url: Annotated[
        str,
        typer.Option(
            "--outbox",
            envvar="IQ_OUTBOX",
            show_envvar=True,
            help="The producer's database holding the outbox (postgresql://, mysql://, "
            "sqlite:///...).",
        ),
    ],
    url: Annotated[
        str | None, typer.Option("--url", help="Broker URL (default: the global --url).")
    ] = None,
    index: Annotated[
        str | None, typer.Option("--index", help="Index store URL (default: the global --index).")
    ] = None,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Rows per round.")] = 100,
    poll: Annotated[
        str, typer.Option("--poll", help="Pause between rounds when nothing is pending.")
    ] = "0.5s",
    once: Annotated[
        bool, typer.Option("--once", help="Relay what is pending now, then exit.")
    ] = False,
    until_idle: Annotated[
        str | None, typer.Option("--until-idle", help="Exit after this long with nothing pending.")
    ] = None,
    table: Annotated[str, typer.Option("--table", help="Outbox table name.")] = "iq_outbox",
    schema: Annotated[str | None, typer.Option("--schema", help="Outbox table schema.")] = None,
    retry_parked: Annotated[
        bool, typer.Option("--retry-parked", help="Make parked rows pending again first.")
    ] = False,
) -> None:
    """Publish the outbox's rows to the broker, each exactly once; Ctrl-C or SIGTERM stops
    after the current round.

    Rows that cannot be relayed are parked (kept with the reason, one line each on
    stderr); fix the cause and run again with --retry-parked.
    """
    from iqbridge.outbox import Outbox
    from iqbridge.relay import Relay, stop_on_signals

    cfg = settings(ctx)
    cfg.url = url or cfg.url
    cfg.index = index or cfg.index
    poll_s = parse_duration(poll, "--poll")
    idle_s = parse_duration(until_idle, "--until-idle") if until_idle else None
    secrets = url_secrets(outbox_url)
    try:
        with Outbox(outbox_url, table=table, schema=schema) as outbox, open_hub(ctx) as hub:
            if retry_parked:
                cfg.err.print(f"{outbox.retry_parked()} parked row(s) made pending again")
            runner = Relay(outbox, hub, batch=batch, poll=poll_s)
            with stop_on_signals(runner), _log_to(_OneLine(cfg, secrets)):
                stats = _run(cfg, outbox, runner, once=once, until_idle=idle_s)
    except (IQError, CommandError) as exc:
        raise CommandError(scrub(str(exc), secrets)) from exc
    if stats.parked:
        cfg.err.print(
            f"{stats.parked} row(s) parked (see above): fix them, then iq relay --retry-parked"
        )
    cfg.out.print(
        f"relayed {stats.relayed} row(s), parked {stats.parked}, in {stats.elapsed:.2f} s"
    )


def _run(
    cfg: Settings, outbox: Outbox, runner: Relay, *, once: bool, until_idle: float | None
) -> RelayStats:
    outcome: list[RelayStats] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(runner.run(once=once, until_idle=until_idle))
        except BaseException as exc:
            failure.append(exc)

    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("[cyan]{task.fields[counts]}"),
        TimeElapsedColumn(),
    )
    thread = threading.Thread(target=run, name="iq-relay", daemon=True)
    with Progress(*columns, console=cfg.out) as progress:
        target = runner.hub.adapter.url
        task = progress.add_task(
            f"{escape(outbox.name)} -> {escape(target)}", total=None, counts=""
        )
        thread.start()
        pending: int | None = None
        ticks = 0
        while thread.is_alive():
            thread.join(0.2)
            if ticks % 5 == 0:
                with contextlib.suppress(IQError):
                    pending = outbox.counts().pending
            ticks += 1
            stats = runner.stats
            progress.update(task, counts=_describe(stats, pending, stats.last_error))
    if failure:
        raise failure[0]
    return outcome[0]
