"""``iq recover --from URL:QUEUE --to URL:QUEUE``: seed 000's cross-queue recovery."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import iqbridge
from iqbridge.cli.context import CommandError, Settings, open_queue
from iqbridge.redaction import url_secrets

if TYPE_CHECKING:  # recovery/ is installed as iqbridge.recovery; mypy reads it as its own root
    from recovery.crossqueue import CrossQueueRecovery, Plan  # noqa: TID251

__all__ = ["UNRESOLVED_EXIT", "parse_endpoint", "run_cross_queue"]

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
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="recovery plan", box=box.SIMPLE_HEAD)
    for col in ("#", "step", "action", "queue", "msg_id", "subscriber", "from", "reason"):
        table.add_column(col, no_wrap=col in ("msg_id", "action"))
    for i, r in enumerate(plan.rows, 1):
        table.add_row(
            str(i),
            str(r.step),
            r.action,
            escape(f"{r.side} {r.queue}"),
            escape(r.msg_id),
            escape(r.subscriber or "(publisher)"),
            r.state,
            escape(r.reason),
        )
    cfg.out.print(table)
    for u in plan.unresolved:
        cfg.out.print(f"left as it is: {escape(u.msg_id)}: {escape(u.reason)}", soft_wrap=True)
    cfg.out.print(f"plan: {plan.summary()}")


def run_cross_queue(
    cfg: Settings,
    *,
    source: str | None,
    target: str | None,
    source_index: str | None,
    target_index: str | None,
    via: str | None,
    dry_run: bool,
) -> int:
    """Print the plan, then (unless ``dry_run``) apply it; the exit code."""
    with (
        _opened(cfg, source, source_index, "--from") as a,
        _opened(cfg, target, target_index, "--to") as b,
    ):
        cls: type[CrossQueueRecovery] = importlib.import_module(
            "iqbridge.recovery.crossqueue"
        ).CrossQueueRecovery
        job = cls(a, b, via=via)
        plan = job.plan()
        _print_plan(cfg, plan)
        if dry_run:
            cfg.out.print("dry run: nothing changed")
        else:
            result = job.apply(plan)
            cfg.out.print(
                f"recovery {result.run}: {result.applied} move(s) applied, "
                f"{result.already} already made"
            )
    return UNRESOLVED_EXIT if plan.unresolved else 0
