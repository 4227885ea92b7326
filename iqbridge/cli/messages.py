"""Commands that move messages: put, get, confirm, undo, withdraw, reveal."""

from typing import Annotated

import typer
from rich.markup import escape

from iqbridge.cli.context import open_hub, open_queue, settings
from iqbridge.cli.parsing import (
    parse_duration,
    parse_header,
    parse_optional_duration,
    parse_pool,
    read_payload,
)
from iqbridge.cli.render import body_text, payload_text
from iqbridge.errors import PayloadError
from iqbridge.model import Pool
from iqbridge.states import SubscriberState

__all__ = ["confirm", "get", "put", "reveal", "undo", "withdraw"]

QueueArg = Annotated[str, typer.Argument(help="Queue name.", show_default=False)]


def put(
    ctx: typer.Context,
    queue: QueueArg,
    payload: Annotated[
        str | None, typer.Argument(help="The payload (text; JSON with --json).")
    ] = None,
    file: Annotated[
        str | None, typer.Option("--file", "-f", help="Read the payload from a file; - = stdin.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Parse the payload as JSON.")] = False,
    to: Annotated[
        list[str] | None,
        typer.Option("--to", help="A subscriber (or declared pool) to reveal it to; repeatable."),
    ] = None,
    pool: Annotated[
        list[str] | None,
        typer.Option("--pool", help="A pool NAME=a,b,c (one member gets it); repeatable."),
    ] = None,
    correlation_id: Annotated[
        str | None, typer.Option("--correlation-id", help="Searchable correlation id.")
    ] = None,
    priority: Annotated[
        int, typer.Option("--priority", min=0, max=9, help="0 (lowest) to 9 (highest).")
    ] = 4,
    key: Annotated[
        str | None, typer.Option("--key", help="Ordering key (default: the publisher).")
    ] = None,
    ttl: Annotated[
        str | None, typer.Option("--ttl", help="Time limit: seconds or 30s/15m/12h/7d.")
    ] = None,
    confirm: Annotated[
        bool, typer.Option("--confirm", help="Keep it PUT (hidden) until `iq confirm`.")
    ] = False,
    header: Annotated[
        list[str] | None, typer.Option("--header", help="Header KEY=VALUE; repeatable.")
    ] = None,
    publisher: Annotated[
        str | None, typer.Option("--publisher", help="Publisher name (default host:pid).")
    ] = None,
) -> None:
    """Put a message; print its msg_id.

    Without --to/--pool it goes to the queue's standing subscribers (iq subscribe).
    """
    value = read_payload(payload, file, as_json)
    audience: list[str | Pool] = [*(to or []), *(parse_pool(p) for p in pool or [])]
    headers = dict(parse_header(h) for h in header or [])
    ttl_s = parse_duration(ttl, "--ttl") if ttl is not None else None
    cfg = settings(ctx)
    with open_hub(ctx) as hub:
        q = open_queue(hub, queue, create=True)
        msg_id = q.put(
            value,
            to=audience or None,
            publisher=publisher,
            correlation_id=correlation_id,
            priority=priority,
            ordering_key=key,
            ttl=ttl_s,
            confirm=confirm,
            headers=headers,
        )
    cfg.out.print(msg_id, soft_wrap=True)
    if confirm:
        cfg.err.print(f"PUT and hidden until: iq confirm {escape(queue)} {msg_id}")


def get(
    ctx: typer.Context,
    queue: QueueArg,
    subscriber: Annotated[str, typer.Argument(help="Who gets it.", show_default=False)],
    timeout: Annotated[
        str,
        typer.Option("--timeout", "-t", help="How long to wait for a message (30s, 2m, 0.5)."),
    ] = "0",
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="How many to get.")] = 1,
    confirm: Annotated[
        bool,
        typer.Option("--confirm", help="Hold each one; finish with `iq confirm` or `iq undo`."),
    ] = False,
    lease: Annotated[
        str | None,
        typer.Option("--lease", help="Lease while held (30s, 5m; default: the queue's)."),
    ] = None,
    lock_id: Annotated[
        str | None, typer.Option("--lock-id", help="Get a message `iq browse --lock` locked.")
    ] = None,
) -> None:
    """Get messages for SUBSCRIBER and mark them DONE (or hold them with --confirm).

    A payload that does not decode as its content type says (text that is not valid
    UTF-8, malformed JSON) is shown as its bytes and marked UNUSABLE, as a Worker would;
    the next messages are got all the same."""
    cfg = settings(ctx)
    wait = parse_duration(timeout, "--timeout")
    held = parse_optional_duration(lease, "--lease", positive=True)
    got = 0
    with open_hub(ctx, create=False) as hub:
        q = open_queue(hub, queue)
        while got < count:
            d = q.get(subscriber, timeout=wait, confirm=confirm, lease=held, lock_id=lock_id)
            if d is None:
                break
            got += 1
            line = f"[bold]{d.msg_id}[/] attempt {d.attempt} [dim]{escape(d.content_type)}[/]"
            cfg.out.print(line, soft_wrap=True)
            if confirm:
                cfg.out.print(escape(body_text(d.body, d.content_type, 10_000)), soft_wrap=True)
                cfg.out.print(f"confirm id: {d.confirm_id}", soft_wrap=True)
                continue
            try:
                with d:  # IN_PROCESS, then DONE; a payload that cannot be decoded goes UNUSABLE
                    text = payload_text(d.payload, 10_000)
            except PayloadError as exc:
                shown = body_text(d.body, d.content_type, 10_000)
                cfg.out.print(escape(shown), soft_wrap=True)
                cfg.err.print(
                    f"message {d.msg_id}: {escape(str(exc))}; {escape(subscriber)} marked it "
                    f"{_after(d.state)} (to deliver it again: iq reveal {escape(queue)} {d.msg_id} "
                    f"--to {escape(subscriber)})",
                    soft_wrap=True,
                )
                continue
            cfg.out.print(escape(text), soft_wrap=True)
    if got == 0:
        cfg.err.print(f"no message for {escape(subscriber)} on {escape(queue)}")


def _after(state: SubscriberState) -> str:
    """The state a failed delivery was left in, as the retry policy chose."""
    if state is SubscriberState.JOURNALLED:
        return "UNUSABLE (and JOURNALLED)"
    return state.value


def confirm(
    ctx: typer.Context,
    queue: QueueArg,
    ident: Annotated[
        str,
        typer.Argument(
            metavar="ID", help="A msg_id (confirm a put) or a confirm id (confirm a get)."
        ),
    ],
) -> None:
    """Confirm a held put (msg_id -> REVEALED) or a held get (confirm id -> DONE)."""
    with open_hub(ctx, create=False) as hub:
        q = open_queue(hub, queue)
        if "/" in ident:
            q.confirm_get(ident)
            what = "get confirmed: DONE"
        else:
            q.confirm_put(ident)
            what = "put confirmed: REVEALED"
    settings(ctx).out.print(what)


def undo(
    ctx: typer.Context,
    queue: QueueArg,
    ident: Annotated[
        str,
        typer.Argument(metavar="ID", help="A msg_id (held put) or a confirm id (held get)."),
    ],
) -> None:
    """Undo a held put (withdrawn) or a held get (AVAILABLE again, attempt + 1)."""
    with open_hub(ctx, create=False) as hub:
        open_queue(hub, queue).undo(ident)
    settings(ctx).out.print("get undone: AVAILABLE again" if "/" in ident else "put undone")


def withdraw(
    ctx: typer.Context,
    queue: QueueArg,
    msg_id: Annotated[str, typer.Argument(help="The message.")],
    reason: Annotated[str, typer.Option(help="Why (kept in the journal).")] = "withdrawn",
) -> None:
    """Withdraw a message: no subscriber may get it any more."""
    with open_hub(ctx, create=False) as hub:
        open_queue(hub, queue).withdraw(msg_id, reason)
    settings(ctx).out.print("withdrawn: UNAVAILABLE")


def reveal(
    ctx: typer.Context,
    queue: QueueArg,
    msg_id: Annotated[str, typer.Argument(help="The message.")],
    to: Annotated[
        str | None,
        typer.Option("--to", help="Re-reveal to this subscriber (it found it UNUSABLE)."),
    ] = None,
) -> None:
    """Reveal a held put, or re-reveal a message to one subscriber (--to)."""
    with open_hub(ctx, create=False) as hub:
        open_queue(hub, queue).reveal(msg_id, to=to)
    done = f"re-revealed to {escape(to)}: AVAILABLE again" if to else "revealed: REVEALED"
    settings(ctx).out.print(done)
