"""``iq demo``: the main job, end to end, on the embedded SQLite default (no server).

One queue ``orders`` with three named subscribers and two pools. Messages go out in
pubsub, pool and combined mode; workers process them; one consumer *process* is killed
while it holds messages and another finishes them after the lease runs out; one
subscriber finds a message malformed (UNUSABLE) and the publisher re-reveals it. Then
every message's timeline is printed — the publisher's and each subscriber's states with
times, as in the seed's message-state table — and a verdict computed from the index:
nothing lost, nothing processed twice (exit code 1 if that does not hold).
"""

import math
import os
import queue as stdqueue
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.rule import Rule
from rich.table import Table

import iqbridge
from iqbridge.cli.context import CommandError, settings
from iqbridge.cli.demo_check import final_states, verify
from iqbridge.cli.render import timeline_table
from iqbridge.delivery import Delivery
from iqbridge.model import MessageState, Pool
from iqbridge.retry import RetryPolicy

if TYPE_CHECKING:
    from iqbridge.worker import Worker

__all__ = ["demo"]

QUEUE = "orders"
PUBLISHER = "shop"
NAMED = ("billing", "audit", "ledger")
SHIPPERS = Pool("shippers", ("ship-a", "ship-b", "ship-c"))
PICKERS = Pool("pickers", ("pick-1", "pick-2"))
COMBINED_NAMED = ("billing", "audit")
#: The subscriber whose consumer process is killed, and the lease its gets take.
CRASHED = "ledger"
CRASH_LEASE = 1.5
CRASH_HOLDS = 2
#: The subscriber that finds a message malformed.
PICKY = "audit"
_ITEMS = ("kettle", "lamp", "chair", "desk", "mug", "rug", "clock", "vase")
_IDLE = 0.6


@dataclass
class Planned:
    """One message the demo puts and what it expects to happen to it."""

    number: int
    mode: str
    to: list[str | Pool]
    groups: frozenset[str]
    payload: dict[str, Any]
    correlation_id: str | None
    priority: int
    key: str
    msg_id: str = ""

    @property
    def label(self) -> str:
        """``#3 pool``."""
        return f"#{self.number} {self.mode}"


def plan(count: int) -> list[Planned]:
    """``count`` messages: a third pubsub, a third pool, a third combined.

    The last pubsub message has no ``currency`` (audit schema v1 rejects it); the
    second is a rush order (priority 8); combined ones share cart correlation ids.
    """
    n_pubsub = math.ceil(count / 3)
    n_pool = math.ceil((count - n_pubsub) / 2)
    out: list[Planned] = []
    for i in range(count):
        order = 1001 + i
        payload: dict[str, Any] = {
            "order": order,
            "item": _ITEMS[i % len(_ITEMS)],
            "qty": i % 3 + 1,
            "amount": round(9.5 + 7.25 * i, 2),
            "currency": "EUR",
        }
        key = f"customer-{'ABCD'[i % 4]}"
        if i < n_pubsub:
            if i == n_pubsub - 1:
                del payload["currency"]
            out.append(
                Planned(
                    i + 1,
                    "pubsub",
                    list(NAMED),
                    frozenset(NAMED),
                    payload,
                    f"order-{order}",
                    8 if i == 1 else 4,
                    key,
                )
            )
        elif i < n_pubsub + n_pool:
            out.append(
                Planned(
                    i + 1,
                    "pool",
                    [SHIPPERS.name],
                    frozenset({SHIPPERS.name}),
                    payload,
                    None,
                    7 if i == n_pubsub else 4,
                    key,
                )
            )
        else:
            cart = (i - n_pubsub - n_pool) // 2 + 1
            out.append(
                Planned(
                    i + 1,
                    "combined",
                    [PICKERS.name, *COMBINED_NAMED],
                    frozenset({PICKERS.name, *COMBINED_NAMED}),
                    payload,
                    f"cart-{cart}",
                    4,
                    key,
                )
            )
    return out


class Tally:
    """What the demo's handlers did, per (msg_id, consumer group); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.effects: Counter[tuple[str, str]] = Counter()
        self.rejected: list[str] = []

    def ran(self, msg_id: str, group: str) -> None:
        with self._lock:
            self.effects[(msg_id, group)] += 1

    def reject(self, msg_id: str) -> None:
        with self._lock:
            self.rejected.append(msg_id)


def _group_of(subscriber: str) -> str:
    for pool in (SHIPPERS, PICKERS):
        if subscriber in pool.members:
            return pool.name
    return subscriber


def _step(out: Console, number: int, title: str) -> None:
    out.print(Rule(f"[bold]{number}/6  {title}", align="left", style="dim"))


def _fresh(db: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def _progress(out: Console, *, bar: bool = True) -> Progress:
    columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description:<16}")]
    if bar:
        columns += [BarColumn(bar_width=28), MofNCompleteColumn()]
    columns += [TextColumn("[dim]{task.fields[note]}"), TimeElapsedColumn()]
    return Progress(*columns, console=out)


# --- the steps ------------------------------------------------------------------------


def _declare(out: Console, hub: iqbridge.Hub) -> iqbridge.Queue:
    _step(out, 1, f"declare queue {QUEUE!r}")
    q = _queue(hub)
    q.subscribe(*NAMED)
    q.subscribe_pool(SHIPPERS.name, SHIPPERS.members)
    q.subscribe_pool(PICKERS.name, PICKERS.members)
    out.print(
        f"subscribers {', '.join(NAMED)} · pool {SHIPPERS.name}{{{','.join(SHIPPERS.members)}}}"
        f" · pool {PICKERS.name}{{{','.join(PICKERS.members)}}}"
    )
    return q


def _queue(hub: iqbridge.Hub) -> iqbridge.Queue:
    return hub.queue(QUEUE, retry=RetryPolicy(max_attempts=3, initial_delay=0.1), lease=10.0)


def _put(out: Console, q: iqbridge.Queue, planned: list[Planned]) -> None:
    _step(out, 2, f"put {len(planned)} messages as {PUBLISHER!r}")
    with _progress(out) as progress:
        task = progress.add_task("put", total=len(planned), note="")
        for p in planned:
            p.msg_id = q.put(
                p.payload,
                to=p.to,
                correlation_id=p.correlation_id,
                priority=p.priority,
                ordering_key=p.key,
            )
            progress.update(task, advance=1, note=p.label)
    modes = Counter(p.mode for p in planned)
    out.print(
        f"pubsub {modes['pubsub']} → {', '.join(NAMED)} · pool {modes['pool']} → "
        f"{SHIPPERS.name} · combined {modes['combined']} → {PICKERS.name} + "
        f"{', '.join(COMBINED_NAMED)}"
    )


def _reader(stream: Any, lines: "stdqueue.Queue[str | None]") -> None:
    for line in stream:
        lines.put(line.strip())
    lines.put(None)


def _crash(out: Console, url: str, holds: int) -> tuple[int, list[str]]:
    """Start a consumer process for CRASHED, let it hold messages, SIGKILL it."""
    _step(out, 3, f"crash: kill a {CRASHED} consumer process while it holds messages")
    cmd = [
        sys.executable,
        "-m",
        "iqbridge.cli._demo_consumer",
        url,
        QUEUE,
        CRASHED,
        str(holds),
        str(CRASH_LEASE),
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    lines: stdqueue.Queue[str | None] = stdqueue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    held: list[str] = []
    ready = False
    try:
        with _progress(out) as progress:
            task = progress.add_task(
                f"consumer pid {proc.pid}", total=holds, note=f"get, lease {CRASH_LEASE} s"
            )
            deadline = time.monotonic() + 30.0
            while not ready and time.monotonic() < deadline:
                try:
                    line = lines.get(timeout=0.1)
                except stdqueue.Empty:
                    continue
                if line is None:
                    break
                if line.startswith("HELD "):
                    held.append(line.split()[1])
                    progress.update(task, advance=1, note="IN_PROCESS, holding")
                ready = line == "READY"
            if not ready:
                proc.kill()
                err = (proc.communicate(timeout=5)[1] or "").strip().splitlines()
                why = err[-1] if err else "it did not report in time"
                raise CommandError(f"the demo consumer process failed: {why}")
            proc.kill()  # SIGKILL on POSIX: no cleanup, no goodbye
            proc.wait(timeout=10)
            progress.update(task, note="killed")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    how = "SIGKILL" if os.name == "posix" and proc.returncode == -signal.SIGKILL else "killed"
    out.print(
        f"{how} → consumer pid {proc.pid} died holding {len(held)} message(s) IN_PROCESS "
        f"(exit {proc.returncode})"
    )
    return proc.pid, held


def _await_leases(out: Console, q: iqbridge.Queue, held: list[str]) -> int:
    _step(out, 4, "recover: wait for the dead consumer's leases, then queue.recover()")
    until = [q.state(m).subscribers[CRASHED].lease_until for m in held]
    last = max((u.timestamp() for u in until if u is not None), default=time.time())
    wait = max(last - time.time(), 0.0) + 0.05
    with _progress(out) as progress:
        task = progress.add_task("lease", total=round(wait * 1000), note="ms until it lapses")
        start = time.monotonic()
        while (spent := time.monotonic() - start) < wait:
            progress.update(task, completed=round(spent * 1000))
            time.sleep(0.05)
        progress.update(task, completed=round(wait * 1000))
    recovered = q.recover()
    views = [q.state(m).subscribers[CRASHED] for m in held]
    now = sorted({f"{v.state.value if v.state else '-'} on attempt {v.attempt}" for v in views})
    out.print(
        f"queue.recover() changed {recovered} message(s); for {CRASHED} the held ones are "
        f"now {' / '.join(now)}"
    )
    return recovered


def _handler(
    subscriber: str, tally: Tally, advance: Callable[[str, str], None], *, strict: bool
) -> Callable[[Delivery], None]:
    rng = random.Random(subscriber)
    group = _group_of(subscriber)

    def handle(d: Delivery) -> None:
        order = d.payload
        time.sleep(rng.uniform(0.02, 0.1))  # the work
        if strict and subscriber == PICKY and "currency" not in order:
            d.unusable("malformed payload: no 'currency' (audit schema v1)")
            tally.reject(d.msg_id)
            advance(group, "UNUSABLE")
            return
        tally.ran(d.msg_id, group)
        advance(group, f"attempt {d.attempt}" if d.attempt > 1 else "")

    return handle


@contextmanager
def _group_progress(out: Console, totals: dict[str, int]) -> Iterator[Callable[[str, str], None]]:
    lock = threading.Lock()
    notes: dict[str, Counter[str]] = {g: Counter() for g in totals}
    with _progress(out) as progress:
        tasks: dict[str, TaskID] = {
            g: progress.add_task(g if g in NAMED else f"pool {g}", total=n, note="")
            for g, n in totals.items()
        }

        def advance(group: str, note: str) -> None:
            with lock:
                if note:
                    notes[group][note] += 1
                text = " · ".join(f"{n} {k}" for k, n in sorted(notes[group].items()))
                progress.update(tasks[group], advance=1, note=text)

        yield advance


def _run_workers(workers: "list[Worker]") -> None:
    errors: list[BaseException] = []

    def run(w: "Worker") -> None:
        try:
            w.run(until_idle=_IDLE)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _process(out: Console, hub: iqbridge.Hub, planned: list[Planned], tally: Tally) -> None:
    from iqbridge.worker import Worker

    _step(out, 5, "workers: one per subscriber, until idle")
    totals: dict[str, int] = {}
    for p in planned:
        for g in sorted(p.groups):
            totals[g] = totals.get(g, 0) + 1
    subscribers = [*NAMED, *SHIPPERS.members, *PICKERS.members]
    with _group_progress(out, totals) as advance:
        workers = [
            Worker(_queue(hub), s, _handler(s, tally, advance, strict=True), threads=2, poll=0.05)
            for s in subscribers
        ]
        _run_workers(workers)
    if tally.rejected:
        out.print(f"{PICKY} found {len(tally.rejected)} message(s) malformed: UNUSABLE")


def _rereveal(
    out: Console, hub: iqbridge.Hub, q: iqbridge.Queue, tally: Tally, labels: dict[str, str]
) -> None:
    from iqbridge.worker import Worker

    _step(out, 6, f"re-reveal: {PICKY} is upgraded; the publisher re-reveals to it")
    rejected = list(tally.rejected)
    for msg_id in rejected:
        q.reveal(msg_id, to=PICKY)
        view = q.state(msg_id).subscribers[PICKY]
        state = view.state.value if view.state else "-"
        out.print(f"{labels[msg_id]}: re-revealed to {PICKY} → {state} attempt {view.attempt}")
    with _group_progress(out, {PICKY: len(rejected)}) as advance:
        handler = _handler(PICKY, tally, advance, strict=False)
        _run_workers([Worker(_queue(hub), PICKY, handler, threads=1, poll=0.05)])


# --- the report -----------------------------------------------------------------------


def _story_notes(
    states: list[MessageState], held: list[str], pid: int, rejected: list[str]
) -> dict[str, str]:
    notes: dict[str, str] = {}
    for m in held:
        notes[m] = f"consumer pid {pid} of {CRASHED} SIGKILLed while holding it"
    for m in rejected:
        text = f"{PICKY}: UNUSABLE, then re-revealed by the publisher"
        notes[m] = f"{notes[m]}; {text}" if m in notes else text
    return notes


def _story_checks(
    states: dict[str, MessageState], held: list[str], rejected: list[str], labels: dict[str, str]
) -> list[tuple[bool, str]]:
    """The crash and the re-reveal did what the model promises, read from the index."""
    checks: list[tuple[bool, str]] = []
    order = list(states)
    for m in sorted(held, key=order.index):
        journal = [e for e in states[m].journal if e.actor == CRASHED]
        first = [e.dst for e in journal if e.attempt == 1]
        second = [e.dst for e in journal if e.attempt == 2]
        ok = (
            bool(first)
            and first[-1] == "IN_PROCESS"
            and bool(second)
            and second[0] == "AVAILABLE"
            and "DONE" in second
        )
        checks.append(
            (ok, f"{labels[m]}: {CRASHED} IN_PROCESS (killed) → AVAILABLE attempt 2 → DONE")
        )
    for m in rejected:
        journal = [e for e in states[m].journal if e.actor == PICKY]
        dsts = [(e.dst, e.attempt) for e in journal]
        ok = ("UNUSABLE", 1) in dsts and ("AVAILABLE", 2) in dsts and ("DONE", 2) in dsts
        checks.append((ok, f"{labels[m]}: {PICKY} UNUSABLE → re-revealed → DONE on attempt 2"))
    return checks


def _summary(
    out: Console,
    states: list[MessageState],
    planned: list[Planned],
    tally: Tally,
    held: list[str],
    labels: dict[str, str],
) -> bool:
    pubs, subs = final_states(states)
    table = Table(title="final states", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("state")
    table.add_column("publisher", justify="right")
    table.add_column("subscribers", justify="right")
    for name in sorted(set(pubs) | set(subs)):
        table.add_row(name, str(pubs.get(name, "")), str(subs.get(name, "")))
    out.print(table)

    verdict = verify(states, tally.effects, {p.msg_id: p.groups for p in planned}, labels)
    by_id = {s.msg_id: s for s in states}
    story = _story_checks(by_id, held, tally.rejected, labels)
    mark = {True: "[green]✔[/]", False: "[red]✘[/]"}
    out.print(
        f"{mark[verdict.done_once == verdict.expected]} {verdict.expected} deliveries expected "
        f"(named subscribers and pools): {verdict.done_once} DONE exactly once in the index "
        f"journal, handlers completed {verdict.effects}"
    )
    for ok, text in story:
        out.print(f"{mark[ok]} {text}")
    for line in verdict.problems:
        out.print(f"[red]✘ {line}[/]")
    ok = verdict.ok and all(ok for ok, _ in story)
    if ok:
        out.print("[bold green]✔ nothing lost, nothing processed twice[/]")
    else:
        out.print("[bold red]✘ the check failed: see the lines above[/]")
    return ok


def demo(
    ctx: typer.Context,
    db: Annotated[
        Path, typer.Option("--db", help="SQLite file to use (recreated each run).")
    ] = Path("iqbridge-demo.db"),
    messages: Annotated[
        int, typer.Option("--messages", "-n", min=3, max=300, help="How many messages.")
    ] = 12,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the database afterwards to explore it.")
    ] = False,
) -> None:
    """Run the main job end to end on embedded SQLite (no server needed).

    Puts pubsub, pool and combined messages and runs a worker per subscriber.
    Kills a consumer process that holds messages; another finishes them after the lease.
    One subscriber finds a message UNUSABLE; the publisher re-reveals it to that one.
    Prints every message's timeline (publisher and subscribers, states and times).
    Checks from the index that nothing was lost or processed twice (else exit code 1).
    """
    out = settings(ctx).out
    started = time.monotonic()
    db = db.resolve()
    _fresh(db)
    url = f"sqlite:///{db}"
    planned = plan(messages)
    tally = Tally()
    labels: dict[str, str] = {}
    try:
        with iqbridge.connect(url, publisher=PUBLISHER) as hub:
            q = _declare(out, hub)
            _put(out, q, planned)
            labels = {p.msg_id: p.label for p in planned}
            holds = min(CRASH_HOLDS, sum(1 for p in planned if CRASHED in p.groups))
            pid, held = _crash(out, url, holds)
            _await_leases(out, q, held)
            _process(out, hub, planned, tally)
            _rereveal(out, hub, q, tally, labels)
            states = [q.state(p.msg_id) for p in planned]
        out.print()
        out.print(
            timeline_table(
                states,
                labels=labels,
                notes=_story_notes(states, held, pid, tally.rejected),
                title=f"message timelines of queue {QUEUE!r}",
            )
        )
        ok = _summary(out, states, planned, tally, held, labels)
    finally:
        if not keep:
            _fresh(db)
    elapsed = time.monotonic() - started
    if keep:
        out.print(
            f"database kept: iq --url {url} search {QUEUE}  ·  iq --url {url} state {QUEUE} ID",
            soft_wrap=True,
        )
    out.print(f"[dim]demo finished in {elapsed:.1f} s[/]")
    if not ok:
        raise typer.Exit(1)
