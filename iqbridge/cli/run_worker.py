"""``iq worker``: run an :class:`iqbridge.worker.Worker` with a live count of what it did."""

import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from iqbridge.cli.context import CommandError, open_hub, open_queue, settings
from iqbridge.cli.render import payload_text
from iqbridge.delivery import Delivery

if TYPE_CHECKING:
    from iqbridge.worker import WorkerStats

__all__ = ["load_handler", "worker"]

Handler = Callable[[Delivery], object]


@contextlib.contextmanager
def _signals_set(flag: threading.Event) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM set ``flag`` instead of raising (main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        flag.set()

    wanted = (signal.SIGINT, signal.SIGTERM)
    previous: dict[int, Any] = {s: signal.signal(s, handler) for s in wanted}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


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
        float | None, typer.Option("--lease", min=0.001, help="Lease seconds per message.")
    ] = None,
    until_idle: Annotated[
        float | None, typer.Option("--until-idle", min=0, help="Stop after idle seconds.")
    ] = None,
    max_messages: Annotated[
        int | None, typer.Option("--max-messages", min=1, help="Stop after this many.")
    ] = None,
) -> None:
    """Consume SUBSCRIBER's messages (in order per ordering key); Ctrl-C drains and stops.

    The default handler prints each message; --handler module:function replaces it.
    A handler that raises is retried per the queue's retry policy, then goes UNUSABLE.
    """
    from iqbridge.worker import Worker, WorkerStats

    cfg = settings(ctx)
    func = load_handler(handler) if handler else _printer(cfg.out)
    outcome: list[WorkerStats] = []
    failure: list[BaseException] = []
    with open_hub(ctx, create=False) as hub:
        q = open_queue(hub, queue)
        w = Worker(q, subscriber, func, threads=threads, lease=lease)

        def run() -> None:
            try:
                outcome.append(w.run(until_idle=until_idle, max_messages=max_messages))
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
            # Ctrl-C (and SIGTERM) only set a flag: an interrupt raised at any point of
            # this loop could land inside a lock of the worker's and leave it held.
            interrupted = threading.Event()
            with _signals_set(interrupted):
                runner.start()
                while runner.is_alive() and not interrupted.is_set():
                    runner.join(0.1)
                    stats = w.stats
                    progress.update(task, completed=stats.processed, counts=_describe(stats))
            if interrupted.is_set():
                progress.update(task, description="stopping: finishing held messages")
                w.stop(drain=True)
                runner.join()
            stats = outcome[0] if outcome else w.stats
            progress.update(task, completed=stats.processed, counts=_describe(stats))
    if failure:
        raise failure[0]
    cfg.out.print(f"processed {stats.processed} message(s) in {stats.elapsed:.1f} s")
