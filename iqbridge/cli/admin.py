"""Queue administration: subscribe, unsubscribe, queues, recover."""

import json
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from iqbridge.cli.context import open_hub, open_queue, settings
from iqbridge.cli.parsing import parse_pool
from iqbridge.model import Subscriptions

__all__ = ["queues", "recover", "subscribe", "unsubscribe"]


def _audience(subs: Subscriptions) -> str:
    parts = list(subs.subscribers)
    parts.extend(f"{p.name}{{{','.join(p.members)}}}" for p in subs.pools)
    return ", ".join(parts) or "(none)"


def subscribe(
    ctx: typer.Context,
    queue: Annotated[str, typer.Argument(help="Queue name (created if new).")],
    names: Annotated[
        list[str] | None, typer.Argument(metavar="NAME...", help="Subscribers to add.")
    ] = None,
    pool: Annotated[
        list[str] | None,
        typer.Option("--pool", help="Declare a pool NAME=a,b,c (one member gets each)."),
    ] = None,
) -> None:
    """Add standing subscribers or pools: puts without --to/--pool go to them."""
    pools = [parse_pool(p) for p in pool or []]
    if not names and not pools:
        raise typer.BadParameter("name at least one subscriber or --pool NAME=a,b,c")
    for p in pools:
        if not p.members:
            raise typer.BadParameter(
                f"pool {p.name!r} needs members: NAME=a,b,c", param_hint="--pool"
            )
    with open_hub(ctx) as hub:
        q = open_queue(hub, queue, create=True)
        q.subscriptions().adding(queue, names or (), pools)  # refused before any change
        if names:
            q.subscribe(*names)
        for p in pools:
            q.subscribe_pool(p.name, p.members)
        subs = q.subscriptions()
    settings(ctx).out.print(f"{escape(queue)}: {escape(_audience(subs))}", soft_wrap=True)


def unsubscribe(
    ctx: typer.Context,
    queue: Annotated[str, typer.Argument(help="Queue name.", show_default=False)],
    names: Annotated[
        list[str] | None,
        typer.Argument(metavar="NAME...", help="Standing subscribers (or pools) to remove."),
    ] = None,
    pool: Annotated[
        list[str] | None,
        typer.Option("--pool", metavar="NAME", help="A standing pool to remove; repeatable."),
    ] = None,
) -> None:
    """Remove standing subscribers or pools: later puts without --to/--pool no longer go
    to them. Messages already put keep their audience."""
    if not names and not pool:
        raise typer.BadParameter("name at least one subscriber or --pool NAME")
    with open_hub(ctx, create=False) as hub:
        q = open_queue(hub, queue)
        standing = {p.name for p in q.subscriptions().pools}
        for p in pool or []:
            if p not in standing:
                q.unsubscribe_pool(p)  # raises AudienceError naming it: nothing removed yet
        if names:
            q.unsubscribe(*names)
        for p in pool or []:
            q.unsubscribe_pool(p)
        subs = q.subscriptions()
    settings(ctx).out.print(f"{escape(queue)}: {escape(_audience(subs))}", soft_wrap=True)


def queues(ctx: typer.Context) -> None:
    """Every queue the index knows, with its standing subscribers and pools."""
    cfg = settings(ctx)
    with open_hub(ctx, create=False) as hub:
        table = Table(title=f"queues on {escape(cfg.safe_url)}", box=box.SIMPLE_HEAD)
        table.add_column("queue", no_wrap=True)
        table.add_column("subscribers and pools")
        for name in hub.queues():
            table.add_row(escape(name), escape(_audience(hub.queue(name).subscriptions())))
    cfg.out.print(table)


def recover(
    ctx: typer.Context,
    queue: Annotated[str | None, typer.Argument(help="One queue (default: all).")] = None,
    source: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="URL:QUEUE",
            help="Cross-queue recovery: the inbound queue (the parents).",
        ),
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(
            "--to",
            metavar="URL:QUEUE",
            help="Cross-queue recovery: the outbound queue (the children).",
        ),
    ] = None,
    source_index: Annotated[
        str | None, typer.Option("--from-index", help="Index store of --from, if not its own.")
    ] = None,
    target_index: Annotated[
        str | None, typer.Option("--to-index", help="Index store of --to, if not its own.")
    ] = None,
    via: Annotated[
        str | None,
        typer.Option("--via", help="The module's subscriber (or pool) name in the --from queue."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan and change nothing.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="JSON output for scripts (the plan and the result).")
    ] = False,
) -> int:
    """Apply lapsed leases, time limits and locks now (in-doubt messages back to AVAILABLE).

    With --from/--to: seed 000's cross-queue recovery between an inbound and an outbound
    queue on any two stores. The plan is printed before anything changes; exits 3 when
    children were left undecided."""
    if source is not None or target is not None:
        if queue is not None:
            raise typer.BadParameter("give QUEUE, or --from/--to, not both")
        from iqbridge.cli.recovering import run_cross_queue

        return run_cross_queue(
            settings(ctx),
            source=source,
            target=target,
            source_index=source_index,
            target_index=target_index,
            via=via,
            dry_run=dry_run,
            as_json=as_json,
        )
    with open_hub(ctx, create=False) as hub:
        count = open_queue(hub, queue).recover() if queue else hub.recover()
    if as_json:
        typer.echo(json.dumps({"recovered": count}))
    else:
        settings(ctx).out.print(f"recovered {count} message(s)")
    return 0
