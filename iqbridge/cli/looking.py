"""Commands that look at messages: state, search, browse (and unlock), purge."""

import json
from typing import Annotated, Any

import typer
from rich.markup import escape

from iqbridge.cli.context import open_hub, open_queue, settings
from iqbridge.cli.parsing import parse_duration, parse_priority, parse_state, parse_time
from iqbridge.cli.render import (
    payload_text,
    state_json,
    summaries_table,
    summary_json,
    timeline_table,
)
from iqbridge.errors import IQError
from iqbridge.model import Filter

__all__ = ["browse", "purge", "search", "state", "unlock"]

QueueArg = Annotated[str, typer.Argument(help="Queue name.", show_default=False)]
MsgIdOpt = Annotated[str | None, typer.Option("--msg-id", help="This message only.")]
CorrOpt = Annotated[str | None, typer.Option("--correlation-id", help="Correlation id.")]
PriOpt = Annotated[str | None, typer.Option("--priority", help="N or N-M (0-9).")]
PubOpt = Annotated[str | None, typer.Option("--publisher", help="Publisher name.")]
StateOpt = Annotated[
    str | None,
    typer.Option(
        "--state",
        help="Publisher or subscriber state, any case (JOURNALLED is the subscriber's with "
        "--subscriber; prefix pub: or sub: to choose).",
    ),
]
SubOpt = Annotated[str | None, typer.Option("--subscriber", help="Subscriber in the audience.")]
SinceOpt = Annotated[str | None, typer.Option("--since", help="Put at or after (ISO 8601).")]
UntilOpt = Annotated[str | None, typer.Option("--until", help="Put before (ISO 8601).")]
LimitOpt = Annotated[int, typer.Option("--limit", min=1, help="At most this many.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON output for scripts.")]


def _filter(
    *,
    msg_id: str | None,
    correlation_id: str | None,
    priority: str | None,
    publisher: str | None,
    state: str | None,
    subscriber: str | None,
    since: str | None,
    until: str | None,
    limit: int,
) -> Filter:
    return Filter(
        msg_id=msg_id,
        correlation_id=correlation_id,
        priority=parse_priority(priority) if priority is not None else None,
        publisher=publisher,
        state=parse_state(state, subscriber=subscriber is not None) if state else None,
        subscriber=subscriber,
        since=parse_time(since, "--since") if since else None,
        until=parse_time(until, "--until") if until else None,
        limit=limit,
    )


def _print_json(data: object) -> None:
    typer.echo(json.dumps(data, ensure_ascii=False, indent=2))


def state(
    ctx: typer.Context,
    queue: QueueArg,
    msg_id: Annotated[str, typer.Argument(help="The message.")],
    as_json: JsonOpt = False,
) -> None:
    """The timeline of one message: the publisher's and every subscriber's states and times."""
    with open_hub(ctx, create=False) as hub:
        st = open_queue(hub, queue).state(msg_id)
    if as_json:
        _print_json(state_json(st))
        return
    settings(ctx).out.print(timeline_table([st]))


def search(
    ctx: typer.Context,
    queue: QueueArg,
    msg_id: MsgIdOpt = None,
    correlation_id: CorrOpt = None,
    priority: PriOpt = None,
    publisher: PubOpt = None,
    state: StateOpt = None,
    subscriber: SubOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    limit: LimitOpt = 100,
    as_json: JsonOpt = False,
) -> None:
    """Find messages from the index (never reads payloads)."""
    flt = _filter(
        msg_id=msg_id,
        correlation_id=correlation_id,
        priority=priority,
        publisher=publisher,
        state=state,
        subscriber=subscriber,
        since=since,
        until=until,
        limit=limit,
    )
    with open_hub(ctx, create=False) as hub:
        hits = open_queue(hub, queue).search(flt)
    if as_json:
        _print_json([summary_json(h) for h in hits])
        return
    cfg = settings(ctx)
    cfg.out.print(summaries_table(hits, title=f"{escape(queue)}: {len(hits)} message(s)"))


def browse(
    ctx: typer.Context,
    queue: QueueArg,
    msg_id: MsgIdOpt = None,
    correlation_id: CorrOpt = None,
    priority: PriOpt = None,
    publisher: PubOpt = None,
    state: StateOpt = None,
    subscriber: SubOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    limit: LimitOpt = 100,
    lock: Annotated[
        bool, typer.Option("--lock", help="Lock them for you; prints the lock id.")
    ] = False,
    lock_for: Annotated[
        str, typer.Option("--lock-for", help="Lock duration (seconds or 30s/15m/...).")
    ] = "60s",
    payloads: Annotated[bool, typer.Option("--payloads", help="Show payloads too.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Browse messages (with payloads if asked); --lock hides them from other gets."""
    flt = _filter(
        msg_id=msg_id,
        correlation_id=correlation_id,
        priority=priority,
        publisher=publisher,
        state=state,
        subscriber=subscriber,
        since=since,
        until=until,
        limit=limit,
    )
    lock_s = parse_duration(lock_for, "--lock-for")
    values: dict[str, Any] = {}
    with open_hub(ctx, create=False) as hub:
        q = open_queue(hub, queue)
        found = q.browse(flt, lock=lock, lock_for=lock_s)
        if payloads:
            for item in found.messages:
                try:
                    values[item.msg_id] = q.peek(item.msg_id).payload()
                except IQError as exc:
                    values[item.msg_id] = f"<{type(exc).__name__}: {exc}>"
    if as_json:
        data: dict[str, Any] = {
            "lock_id": found.lock_id,
            "messages": [summary_json(m, values.get(m.msg_id)) for m in found.messages],
        }
        _print_json(data)
        return
    cfg = settings(ctx)
    shown = {k: payload_text(v) for k, v in values.items()} if payloads else None
    title = f"{escape(queue)}: {len(found.messages)} message(s)"
    cfg.out.print(summaries_table(found.messages, payloads=shown, title=title))
    if found.lock_id:
        cfg.out.print(
            f"lock id: {found.lock_id}  (get with --lock-id, or: iq unlock "
            f"{escape(queue)} {found.lock_id})",
            soft_wrap=True,
        )


def unlock(
    ctx: typer.Context,
    queue: QueueArg,
    lock_id: Annotated[str, typer.Argument(help="The id `iq browse --lock` printed.")],
) -> None:
    """Release the messages a browse locked."""
    with open_hub(ctx, create=False) as hub:
        count = open_queue(hub, queue).unlock(lock_id)
    settings(ctx).out.print(f"unlocked {count} message(s)")


def purge(
    ctx: typer.Context,
    queue: QueueArg,
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than", help="Journalled for longer than this: 30s, 15m, 12h, 7d, seconds."
        ),
    ],
) -> None:
    """Delete journalled messages (payload included; the journal is kept)."""
    secs = parse_duration(older_than, "--older-than")
    with open_hub(ctx, create=False) as hub:
        count = open_queue(hub, queue).purge(secs)
    settings(ctx).out.print(f"purged {count} message(s)")
