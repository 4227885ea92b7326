"""Commands that look at messages: state, search, browse (and unlock), purge (by age, or
exactly the messages a retention job's purge plan lists)."""

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from iqbridge.analytics.schema import unescape_partition
from iqbridge.cli.context import CommandError, open_hub, open_queue, settings
from iqbridge.cli.parsing import parse_duration, parse_priority, parse_state, parse_time
from iqbridge.cli.render import (
    body_text,
    payload_json,
    state_json,
    summaries_table,
    summary_json,
    timeline_table,
)
from iqbridge.errors import IQError
from iqbridge.model import Envelope, Filter

__all__ = [
    "PLAN_COLUMNS",
    "PlanRow",
    "PurgePlanError",
    "browse",
    "purge",
    "read_plan",
    "search",
    "state",
    "unlock",
]

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
ParentOpt = Annotated[
    str | None, typer.Option("--parent", help="Children of this msg_id (put with parents=).")
]
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
    parent: str | None = None,
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
        parent=parent,
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
    parent: ParentOpt = None,
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
        parent=parent,
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
    peeked: dict[str, Envelope | IQError] = {}
    with open_hub(ctx, create=False) as hub:
        q = open_queue(hub, queue)
        found = q.browse(flt, lock=lock, lock_for=lock_s)
        if payloads:
            for item in found.messages:
                try:
                    peeked[item.msg_id] = q.peek(item.msg_id)
                except IQError as exc:
                    peeked[item.msg_id] = exc
    if as_json:
        data: dict[str, Any] = {
            "lock_id": found.lock_id,
            "messages": [
                summary_json(m) | (_payload_fields(peeked[m.msg_id]) if payloads else {})
                for m in found.messages
            ],
        }
        _print_json(data)
        return
    cfg = settings(ctx)
    shown = {k: _payload_shown(v) for k, v in peeked.items()} if payloads else None
    title = f"{escape(queue)}: {len(found.messages)} message(s)"
    cfg.out.print(summaries_table(found.messages, payloads=shown, title=title))
    if found.lock_id:
        cfg.out.print(
            f"lock id: {found.lock_id}  (get with --lock-id, or: iq unlock "
            f"{escape(queue)} {found.lock_id})",
            soft_wrap=True,
        )


def _payload_fields(got: Envelope | IQError) -> dict[str, Any]:
    """The payload keys of a browsed message's JSON (see render.payload_json)."""
    if isinstance(got, IQError):
        return {"content_type": None, "payload": None, "payload_error": _why(got)}
    return {"content_type": got.content_type, "payload": payload_json(got.body, got.content_type)}


def _payload_shown(got: Envelope | IQError) -> str:
    if isinstance(got, IQError):
        return f"<{_why(got)}>"
    return body_text(got.body, got.content_type, 120)


def _why(exc: IQError) -> str:
    return f"{type(exc).__name__}: {exc}"


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
    queue: Annotated[
        str | None,
        typer.Argument(
            help="Queue name (needed with --older-than; with --from-plan, only its rows).",
            metavar="QUEUE",
            show_default=False,
        ),
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            help="Journalled for longer than this: 30s, 15m, 12h, 7d, seconds.",
            show_default=False,
        ),
    ] = None,
    from_plan: Annotated[
        Path | None,
        typer.Option(
            "--from-plan",
            metavar="PLAN",
            help="Exactly the messages a purge plan lists (a Parquet file or directory, "
            "written by the analytics retention job), if still JOURNALLED since before "
            "their rule's cutoff.",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="With --from-plan: count what it lists, delete nothing."),
    ] = False,
) -> None:
    """Delete journalled messages (payload included; the journal is kept): those journalled
    for longer than --older-than, or exactly those a purge plan lists (--from-plan)."""
    if (older_than is None) == (from_plan is None):
        raise typer.BadParameter(
            "give exactly one of --older-than (with QUEUE) and --from-plan",
            param_hint="'--older-than' / '--from-plan'",
        )
    if from_plan is not None:
        _purge_from_plan(ctx, from_plan, queue, dry_run)
        return
    assert older_than is not None
    if dry_run:
        raise typer.BadParameter("only goes with --from-plan", param_hint="'--dry-run'")
    if queue is None:
        raise typer.BadParameter("--older-than needs the queue to purge", param_hint="QUEUE")
    secs = parse_duration(older_than, "--older-than")
    with open_hub(ctx, create=False) as hub:
        count = open_queue(hub, queue).purge(secs)
    settings(ctx).out.print(f"purged {count} message(s)")


# --- purge plans ------------------------------------------------------------------------

#: The columns of a purge plan, as the analytics retention job writes them.
PLAN_COLUMNS = ("store", "queue", "msg_id", "journalled_at", "before")
_TEXT_COLUMNS = ("store", "queue", "msg_id")
_TIME_COLUMNS = ("journalled_at", "before")
#: Microseconds per unit of a Parquet timestamp.
_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}


class PurgePlanError(CommandError):
    """A purge plan that cannot be applied: missing, unreadable, or not shaped as the
    retention job writes it. The message names the file and what is wrong with it."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"purge plan {path}: {problem}")


@dataclass(frozen=True, slots=True)
class PlanRow:
    """One message a purge plan lists: the store and queue it is in, its id, and the
    cutoff (microseconds) its record must have last changed before."""

    store: str
    queue: str
    msg_id: str
    before: int


def read_plan(path: Path) -> list[PlanRow]:
    """Every row of a purge plan: a Parquet file, or a directory of them (as Spark writes
    it: names starting with ``_`` or ``.`` are skipped, ``key=value`` directories give
    their column). Raises :class:`PurgePlanError` naming the file and the problem, or
    :class:`CommandError` if pyarrow is not installed."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise CommandError(
            "reading a purge plan needs pyarrow: pip install 'iqbridge[spark]'"
        ) from None
    rows: list[PlanRow] = []
    for file in _plan_files(path):
        try:
            table = pq.read_table(file)
        except (pa.ArrowException, OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise PurgePlanError(file, f"not a readable Parquet file ({first})") from None
        table = _with_partition_columns(pa, table, file.relative_to(path).parent.parts)
        rows.extend(_plan_rows(pa, file, table))
    return rows


def _plan_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise PurgePlanError(path, "no such file or directory")
    files = sorted(
        f
        for f in path.rglob("*")
        if f.is_file() and not any(p.startswith(("_", ".")) for p in f.relative_to(path).parts)
    )
    if not files:
        raise PurgePlanError(path, "the directory holds no Parquet files")
    return files


def _with_partition_columns(pa: Any, table: Any, dirs: tuple[str, ...]) -> Any:
    for part in dirs:
        key, sep, value = part.partition("=")
        if sep and key in _TEXT_COLUMNS and key not in table.column_names:
            column = pa.array([unescape_partition(value)] * table.num_rows, pa.string())
            table = table.append_column(key, column)
    return table


def _plan_rows(pa: Any, file: Path, table: Any) -> list[PlanRow]:
    names = list(table.column_names)
    missing = [c for c in PLAN_COLUMNS if c not in names]
    if missing:
        has = ", ".join(names) or "none"
        raise PurgePlanError(
            file, f"missing column(s) {', '.join(missing)} (it has {has}); is it a purge plan?"
        )
    columns: dict[str, list[Any]] = {}
    for name in PLAN_COLUMNS:
        col = table.column(name)
        if name in _TIME_COLUMNS:
            if not pa.types.is_timestamp(col.type):
                raise PurgePlanError(file, f"column {name} is {col.type}, not a timestamp")
            unit = col.type.unit
            raw = col.cast(pa.int64()).to_pylist()
            columns[name] = [
                None if v is None else (v // 1000 if unit == "ns" else v * _PER_UNIT[unit])
                for v in raw
            ]
        else:
            try:
                columns[name] = col.cast(pa.string()).to_pylist()
            except (pa.ArrowException, ValueError):
                raise PurgePlanError(file, f"column {name} is {col.type}, not text") from None
        if name != "journalled_at" and col.null_count:
            raise PurgePlanError(file, f"column {name} has {col.null_count} empty value(s)")
    return [
        PlanRow(store, queue, msg_id, before)
        for store, queue, msg_id, before in zip(
            columns["store"], columns["queue"], columns["msg_id"], columns["before"], strict=True
        )
    ]


def _purge_from_plan(ctx: typer.Context, plan: Path, queue: str | None, dry_run: bool) -> None:
    rows = read_plan(plan)
    cfg = settings(ctx)
    with open_hub(ctx, create=False) as hub:
        url = hub.store.url
        listed: dict[str, dict[str, int]] = {}  # queue -> msg_id -> the earliest cutoff
        elsewhere: Counter[str] = Counter()
        other_queues = 0
        for row in rows:
            if row.store != url:
                elsewhere[row.store] += 1
            elif queue is not None and row.queue != queue:
                other_queues += 1
            else:
                ids = listed.setdefault(row.queue, {})
                ids[row.msg_id] = min(row.before, ids.get(row.msg_id, row.before))
        known = set(hub.queues())
        unknown = {q: len(ids) for q, ids in listed.items() if q not in known}
        purged = tried = 0
        for name in sorted(listed):
            ids = listed[name]
            if dry_run:
                note = "" if name in known else " (no such queue)"
                cfg.out.print(f"{escape(name)}: {len(ids)} listed{note}", soft_wrap=True)
                continue
            if name not in known:
                continue
            by_cutoff: dict[int, list[str]] = {}
            for msg_id, before in ids.items():
                by_cutoff.setdefault(before, []).append(msg_id)
            q = open_queue(hub, name)
            for before, group in sorted(by_cutoff.items()):
                purged += q.purge_listed(group, before)
                tried += len(group)
    parts = [
        (
            f"dry run: {sum(len(i) for i in listed.values())} message(s) listed for this "
            f"store in {plan}, nothing deleted"
            if dry_run
            else f"purged {purged} message(s) from {plan}; {tried - purged} listed no longer "
            f"purgeable (re-revealed, too recent or gone)"
        ),
        _elsewhere(elsewhere),
    ]
    if unknown:
        names = ", ".join(sorted(unknown))
        parts.append(f"{sum(unknown.values())} for unknown queue(s) ({names})")
    if other_queues:
        parts.append(f"{other_queues} for other queues")
    cfg.out.print(escape("; ".join(parts)), soft_wrap=True)


def _elsewhere(counts: Counter[str]) -> str:
    """How many rows a plan has for other stores, and which (to rerun with their URL)."""
    total = sum(counts.values())
    if not total:
        return "0 for other stores"
    named = sorted(counts)
    shown = ", ".join(named[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
    which = "it" if len(named) == 1 else "each"
    return f"{total} for other stores ({shown}; rerun with --url/--index naming {which})"
