"""``iq worker``: run an :class:`iqbridge.worker.Worker` with a live count of what it did."""

import importlib
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from iqbridge.cli.context import CommandError, Settings, open_hub, open_queue, settings
from iqbridge.cli.parsing import parse_optional_duration
from iqbridge.cli.render import payload_text
from iqbridge.delivery import Delivery
from iqbridge.signals import StopSignals

if TYPE_CHECKING:
    from iqbridge.worker import WorkerStats

__all__ = ["load_handler", "worker"]

Handler = Callable[[Delivery], object]


def load_handler(spec: str) -> Handler:
    """The function named by ``module:function`` (the current directory is importable)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise typer.BadParameter(f"{spec!r} is not module:function", param_hint="--handler")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandError(f"cannot import handler module {module_name!r}: {exc}") from None
    func = module
    for part in attr.split("."):
        func = getattr(func, part, None)  # type: ignore[assignment]
        if func is None:
            raise CommandError(f"module {module_name!r} has no attribute {attr!r}")
    if not callable(func):
        raise CommandError(f"{spec} is not callable")
    handler: Handler = func
    return handler


def _printer(console: Console) -> Handler:
    def show(d: Delivery) -> None:
        console.print(
            f"[bold]{d.msg_id}[/] attempt {d.attempt}: {escape(payload_text(d.payload, 200))}",
            soft_wrap=True,
        )

    return show


def _describe(stats: "WorkerStats") -> str:
    text = f"done {stats.done} · unusable {stats.unusable} · in flight {stats.in_flight}"
    if stats.retried:
        text += f" · retried {stats.retried}"
    if stats.lost:
        text += f" · lost lease {stats.lost}"
    return text


def worker(
    ctx: typer.Context,
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    subscriber: Annotated[str, typer.Argument(help="Subscriber to consume as.")],
    threads: Annotated[int, typer.Option("--threads", min=1, help="Worker threads.")] = 4,
    handler: Annotated[
        str | None,
        typer.Option("--handler", help="module:function called with each Delivery."),
    ] = None,
    lease: Annotated[
        str | None,
        typer.Option("--lease", help="Lease per message: 30s, 5m, or seconds (default: 30s)."),
    ] = None,
    until_idle: Annotated[
        str | None,
        typer.Option("--until-idle", help="Stop after this long with nothing to do (e.g. 5s)."),
    ] = None,
    max_messages: Annotated[
        int | None, typer.Option("--max-messages", min=1, help="Stop after this many.")
    ] = None,
) -> int:
    """Consume SUBSCRIBER's messages (in order per ordering key) until stopped.

    Ctrl-C or SIGTERM stops it: the messages in process finish, every other message it
    fetched goes back to AVAILABLE at once (attempt + 1) for the next consumer, and it
    exits 0. A second Ctrl-C or SIGTERM exits at once (code 130); what it still holds
    comes back when its lease runs out.

    The default handler prints each message; --handler module:function replaces it.
    A handler that raises is retried per the queue's retry policy, then goes UNUSABLE.
    """
    from iqbridge.worker import Worker, WorkerStats

    cfg = settings(ctx)
    lease_s = parse_optional_duration(lease, "--lease", positive=True)
    idle_s = parse_optional_duration(until_idle, "--until-idle")
    func = load_handler(handler) if handler else _printer(cfg.out)
    outcome: list[WorkerStats] = []
    failure: list[BaseException] = []
    with open_hub(ctx, create=False) as hub:
        q = open_queue(hub, queue)
        w = Worker(q, subscriber, func, threads=threads, lease=lease_s)

        def run() -> None:
            try:
                outcome.append(w.run(until_idle=idle_s, max_messages=max_messages))
            except BaseException as exc:
                failure.append(exc)

        columns = (
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TextColumn("[cyan]{task.fields[counts]}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=cfg.out) as progress:
            task = progress.add_task(
                f"{escape(subscriber)} on {escape(queue)}", total=max_messages, counts=""
            )
            runner = threading.Thread(target=run, name="iq-worker", daemon=True)
            # Ctrl-C and SIGTERM are only recorded (iqbridge.signals); this loop acts on
            # them. An exception raised at any point of it could land inside a lock of
            # the worker's and leave it held.
            with StopSignals() as signals:
                runner.start()
                stopping = False
                while runner.is_alive():
                    runner.join(0.1)
                    if signals.received and not stopping:
                        stopping = True
                        progress.update(task, description="stopping: finishing what is in process")
                        w.request_stop(drain=False)
                    if stopping and signals.again:
                        progress.stop()
                        _abandon(cfg, w.stats)
                    stats = w.stats
                    progress.update(task, completed=stats.processed, counts=_describe(stats))
            stats = outcome[0] if outcome else w.stats
            progress.update(task, completed=stats.processed, counts=_describe(stats))
    if failure:
        raise failure[0]
    text = f"processed {stats.processed} message(s) in {stats.elapsed:.1f} s"
    if stats.released:
        text += f"; gave back {stats.released} unstarted message(s)"
    cfg.out.print(text)
    return 0


def _abandon(cfg: Settings, stats: "WorkerStats") -> NoReturn:
    """A second stop signal: exit now. Nothing is lost: what is still in process or held
    stays FETCHED or IN_PROCESS in the index and comes back when its lease runs out."""
    cfg.err.print(
        f"iq: error: stopped at once; {stats.held} message(s) still held come back when "
        "their lease runs out",
        soft_wrap=True,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    # The worker's threads are inside handlers and index calls: closing the hub under
    # them would only add noise. A crash is what the index is built to survive.
    os._exit(130)
