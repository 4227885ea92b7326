"""``iq recover --from URL:QUEUE --to URL:QUEUE``: seed 000's cross-queue recovery."""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import typer

import iqbridge
from iqbridge.cli.context import CommandError, Settings, open_queue
from iqbridge.redaction import url_secrets

if TYPE_CHECKING:  # recovery/ is installed as iqbridge.recovery; mypy reads it as its own root
    from recovery.crossqueue import CrossQueueRecovery, Plan  # noqa: TID251

__all__ = ["UNRESOLVED_EXIT", "parse_endpoint", "plan_json", "run_cross_queue"]

#: The exit code when children were left undecided (everything else was applied).
UNRESOLVED_EXIT = 3


def parse_endpoint(value: str, option: str) -> tuple[str, str]:
    """Split ``URL:QUEUE`` at its last colon (URLs have colons of their own)."""
    url, sep, queue = value.rpartition(":")
    if not sep or not url or not queue or "/" in queue or queue.isdigit():
        raise CommandError(
            f"{option} takes URL:QUEUE (e.g. sqlite:///in.db:orders or "
            f"redis://127.0.0.1:6379/0:approvals); got {value!r}"
        )
    return url, queue


@contextlib.contextmanager
def _opened(
    cfg: Settings, end: str | None, index: str | None, option: str
) -> Iterator[iqbridge.Queue | None]:
    if end is None:
        yield None
        return
    url, name = parse_endpoint(end, option)
    cfg.more_secrets.extend([*url_secrets(url), *url_secrets(index)])
    hub = iqbridge.connect(url, index, publisher="recovery")
    try:
        yield open_queue(hub, name)
    finally:
        hub.close()


def _print_plan(cfg: Settings, plan: Plan) -> None:
    """The plan as a table that stays readable in 80 columns: each move stacks its
    message (queue, msg_id, whose state from which) in one cell, the reason beside it."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title="recovery plan", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("move", no_wrap=True)
    table.add_column("message", min_width=36, overflow="fold")
    table.add_column("reason", min_width=12)
    for i, r in enumerate(plan.rows, 1):
        move = Text(f"step {r.step}\n") + Text(r.action, style="bold")
        message = Text(f"{r.side} {r.queue}\n", style="dim") + Text(r.msg_id)
        message.append(f"\n{r.subscriber or '(publisher)'} from {r.state}")
        table.add_row(str(i), move, message, Text(r.reason), end_section=True)
    cfg.out.print(table)
    for u in plan.unresolved:
        cfg.out.print(Text(f"left as it is: {u.msg_id}: {u.reason}"), soft_wrap=True)
    cfg.out.print(f"plan: {plan.summary()}")


def plan_json(plan: Plan, run: str, dry_run: bool) -> dict[str, Any]:
    """The plan as JSON-ready data, in the admin API's shape (``POST /recovery``):
    ``dry_run``, ``run``, ``summary``, ``rows`` (``step``, ``action``, ``side``,
    ``queue``, ``msg_id``, ``subscriber``, ``state``: the state the move starts from,
    ``reason``), ``unresolved`` (msg_id: reason), ``applied`` and ``already`` (0 on a dry
    run); plus the ``source`` and ``target`` queues as ``URL:QUEUE``."""
    return {
        "dry_run": dry_run,
        "run": run,
        "summary": plan.summary(),
        "source": plan.source,
        "target": plan.target,
        "rows": [
            {
                "step": r.step,
                "action": r.action,
                "side": r.side,
                "queue": r.queue,
                "msg_id": r.msg_id,
                "subscriber": r.subscriber,
                "state": r.state,
                "reason": r.reason,
            }
            for r in plan.rows
        ],
        "unresolved": {u.msg_id: u.reason for u in plan.unresolved},
        "applied": 0,
        "already": 0,
    }


def run_cross_queue(
    cfg: Settings,
    *,
    source: str | None,
    target: str | None,
    source_index: str | None,
    target_index: str | None,
    via: str | None,
    dry_run: bool,
    as_json: bool = False,
) -> int:
    """Print the plan, then (unless ``dry_run``) apply it; the exit code. With
    ``as_json`` one JSON document on stdout: the plan, ``dry_run``, and what was applied
    (``result``, null on a dry run)."""
    with (
        _opened(cfg, source, source_index, "--from") as a,
        _opened(cfg, target, target_index, "--to") as b,
    ):
        cls: type[CrossQueueRecovery] = importlib.import_module(
            "iqbridge.recovery.crossqueue"
        ).CrossQueueRecovery
        job = cls(a, b, via=via)
        plan = job.plan()
        if not as_json:
            _print_plan(cfg, plan)
        result = None if dry_run else job.apply(plan)
    if as_json:
        data = plan_json(plan, job.run, dry_run)
        if result is not None:
            data |= {"applied": result.applied, "already": result.already}
        typer.echo(json.dumps(data, ensure_ascii=False, indent=2))
    elif result is None:
        cfg.out.print("dry run: nothing changed")
    else:
        cfg.out.print(
            f"recovery {result.run}: {result.applied} move(s) applied, "
            f"{result.already} already made"
        )
    return UNRESOLVED_EXIT if plan.unresolved else 0
