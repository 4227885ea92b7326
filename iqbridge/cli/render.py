"""Rich tables for the CLI: message timelines (the seed's message-state table), search hits,
and their JSON forms for scripting."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from iqbridge.errors import PayloadError
from iqbridge.model import JournalEntry, MessageState, MessageSummary
from iqbridge.payload import decode
from iqbridge.states import IN_DOUBT, ActorKind, SubscriberState

__all__ = [
    "STATE_STYLES",
    "Flow",
    "audience_text",
    "body_text",
    "fmt_time",
    "payload_json",
    "payload_text",
    "state_json",
    "summaries_table",
    "summary_json",
    "timeline_rows",
    "timeline_table",
]

#: Colour of each state name (publisher and subscriber states share names where equal).
STATE_STYLES: dict[str, str] = {
    "PUT": "blue",
    "REVEALED": "cyan",
    "UNAVAILABLE": "yellow",
    "AVAILABLE": "cyan",
    "GET": "blue",
    "FETCHED": "blue",
    "IN_PROCESS": "magenta",
    "DONE": "bold green",
    "UNUSABLE": "bold red",
    "EXPIRED": "yellow",
    "JOURNALLED": "dim",
}

_ARROW = " → "


def fmt_time(value: datetime) -> str:
    """Local wall-clock time as HH:MM:SS.mmm."""
    local = value.astimezone()
    return local.strftime("%H:%M:%S.") + f"{local.microsecond // 1000:03d}"


def _fmt_when(value: datetime) -> str:
    local = value.astimezone()
    if local.date() == datetime.now().astimezone().date():
        return fmt_time(local)
    return local.strftime("%Y-%m-%d ") + fmt_time(local)


def _state(name: str | None) -> Text:
    label = name or "-"
    return Text(label, style=STATE_STYLES.get(label, ""))


@dataclass(frozen=True, slots=True)
class Flow:
    """Units joined by arrows, wrapped between units only (never inside ``STATE time``)."""

    units: Sequence[Text]

    def _joined(self) -> Text:
        return Text(_ARROW).join(self.units)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        if not self.units:
            return Measurement(1, 1)
        widest = max(u.cell_len for u in self.units) + len(_ARROW)
        return Measurement(min(widest, options.max_width), self._joined().cell_len)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        line = Text()
        for k, unit in enumerate(self.units):
            piece = unit if k == 0 else Text(_ARROW if line.plain else _ARROW.lstrip()) + unit
            if line.plain and line.cell_len + piece.cell_len > width:
                yield line
                line = Text()
                piece = Text(_ARROW.lstrip()) + unit
            if piece.cell_len > width:
                yield from piece.wrap(console, width)
                continue
            line.append_text(piece)
        if line.plain:
            yield line


def _note(text: str) -> Text:
    return Text(f" ({text})", style="dim italic")


def _default_note(entry: JournalEntry) -> str | None:
    # A GET's detail names the consumer: shown only while it still holds the message.
    return entry.detail if entry.dst != SubscriberState.GET.value else None


def _units(
    entries: Sequence[JournalEntry],
    held_by: str | None = None,
    note: Callable[[JournalEntry], str | None] = _default_note,
) -> list[Text]:
    """One unit per instant: states reached in one atomic step are joined with '+'."""
    units: list[Text] = []
    i = 0
    while i < len(entries):
        j = i
        while j + 1 < len(entries) and entries[j + 1].at == entries[i].at:
            j += 1
        group = entries[i : j + 1]
        unit = Text("+").join(_state(e.dst) for e in group)
        unit.append(" " + fmt_time(group[0].timestamp))
        notes = [n for n in map(note, group) if n]
        for text in dict.fromkeys(notes):
            unit.append_text(_note(text))
        units.append(unit)
        i = j + 1
    if held_by and units:
        units[-1].append_text(_note(f"held by {held_by}"))
    return units


def _segments(entries: Sequence[JournalEntry]) -> list[tuple[int, list[JournalEntry]]]:
    """A subscriber's entries split by attempt, in order."""
    out: list[tuple[int, list[JournalEntry]]] = []
    for e in entries:
        if not out or out[-1][0] != e.attempt:
            out.append((e.attempt, []))
        out[-1][1].append(e)
    return out


def _rereveal_note(entry: JournalEntry, journal: Sequence[JournalEntry]) -> str | None:
    """The publisher's JOURNALLED -> REVEALED: who the message was revealed to again."""
    if entry.src != "JOURNALLED":
        return None
    again = [
        e.actor
        for e in journal
        if e.at == entry.at and e.actor_kind is ActorKind.SUBSCRIBER and e.dst == "AVAILABLE"
    ]
    return "again for " + ", ".join(dict.fromkeys(again)) if again else None


def audience_text(state: MessageState) -> str:
    """``to billing, audit`` / ``pool shippers{a,b}`` / both, from the subscriber views."""
    named = [v.subscriber for v in state.subscribers.values() if v.pool is None]
    pools: dict[str, list[str]] = {}
    for v in state.subscribers.values():
        if v.pool is not None:
            pools.setdefault(v.pool, []).append(v.subscriber)
    parts = ["to " + ", ".join(named)] if named else []
    parts.extend(f"pool {p}{{{','.join(m)}}}" for p, m in pools.items())
    return " + ".join(parts)


def timeline_rows(state: MessageState) -> list[tuple[Text, str, Flow]]:
    """(who, attempt, timeline) rows: the publisher, then each subscriber per attempt."""
    pub = [e for e in state.journal if e.actor_kind is ActorKind.PUBLISHER]
    who_pub = Text(state.publisher, style="bold") + Text(" publisher", style="dim")
    pub_units = _units(pub, note=lambda e: e.detail or _rereveal_note(e, state.journal))
    rows: list[tuple[Text, str, Flow]] = [(who_pub, "", Flow(pub_units))]
    for name, view in state.subscribers.items():
        mine = [
            e for e in state.journal if e.actor_kind is ActorKind.SUBSCRIBER and e.actor == name
        ]
        who = Text(name, style="bold")
        if view.pool is not None:
            who.append(f"\npool {view.pool}", style="dim")
        segments = _segments(mine) or [(view.attempt, [])]
        for k, (attempt, entries) in enumerate(segments):
            held_by = None
            last = entries[-1] if entries else None
            if last is not None and last.dst in {s.value for s in IN_DOUBT}:
                gets = [e for e in entries if e.dst == SubscriberState.GET.value and e.detail]
                if gets and gets[-1].detail:
                    held_by = gets[-1].detail.removeprefix("by ")
            rows.append((who if k == 0 else Text(""), str(attempt), Flow(_units(entries, held_by))))
    return rows


def timeline_table(
    states: Iterable[MessageState],
    *,
    labels: Mapping[str, str] | None = None,
    notes: Mapping[str, str] | None = None,
    title: str | None = None,
) -> Table:
    """One block per message: its header, the publisher's row, then every subscriber's
    rows (one per attempt), each state with its time — the seed's message-state table."""
    table = Table(
        title=title,
        box=box.SQUARE,
        show_lines=False,
        expand=False,
        pad_edge=False,
        caption="times are HH:MM:SS.mmm local; A+B = moves made in one atomic step",
        caption_style="dim",
    )
    table.add_column("who", no_wrap=True, min_width=8)
    table.add_column("att", justify="right", no_wrap=True)
    table.add_column("states and times")
    for state in states:
        label = (labels or {}).get(state.msg_id, state.mode.value)
        head = Text(state.msg_id, style="bold")
        extras = [audience_text(state)]
        if state.correlation_id:
            extras.append(f"corr {state.correlation_id}")
        extras.append(f"pri {state.priority}")
        head.append("  " + " · ".join(extras), style="dim")
        if notes and state.msg_id in notes:
            head.append("\n" + notes[state.msg_id], style="yellow")
        table.add_row(Text(label, style="bold reverse"), "", head)
        rows = timeline_rows(state)
        for k, (who, attempt, flow) in enumerate(rows):
            table.add_row(who, attempt, flow, end_section=k == len(rows) - 1)
    return table


def payload_text(value: object, limit: int = 60) -> str:
    """A payload shortened for one table cell."""
    if isinstance(value, bytes):
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            text = ""
        if not text or not "".join(text.split()).isprintable():  # control bytes: hex
            text = f"<{len(value)} bytes> " + value[:16].hex()
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def payload_json(body: bytes, content_type: str) -> Any:
    """A stored payload as JSON-ready data, the one form every ``--json`` output uses: a
    text payload as a string, a JSON payload as its value, and any other (binary, or text
    or JSON that does not decode) as ``{"encoding": "base64", "data": "..."}``. The
    message's ``content_type``, printed beside it, tells the three apart."""
    try:
        value = decode(body, content_type)
    except PayloadError:
        value = body
    if isinstance(value, bytes):
        return {"encoding": "base64", "data": base64.b64encode(value).decode("ascii")}
    return value


def body_text(body: bytes, content_type: str, limit: int = 60) -> str:
    """A stored payload shortened for display: :func:`payload_text` of its value, or of
    its bytes (hex, as a binary payload) when it does not decode as its content type
    says, with why."""
    try:
        return payload_text(decode(body, content_type), limit)
    except PayloadError:
        pass
    return payload_text(body, limit) + f" (not valid {content_type})"


def _members_text(members: Mapping[str, SubscriberState | None]) -> Text:
    out = Text()
    for k, (name, st) in enumerate(members.items()):
        if k:
            out.append("\n")
        out.append(f"{name} ")
        out.append_text(_state(st.value if st else None))
    return out


def summaries_table(
    items: Sequence[MessageSummary],
    *,
    payloads: Mapping[str, str] | None = None,
    title: str | None = None,
) -> Table:
    """Search or browse hits: index fields and current states. A payload given is shown
    under its message's id and facts, folded over as many lines as it takes (a column
    of its own would be a few characters wide in 80 columns)."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column(
        "message" if payloads is None else "message, payload", min_width=36, overflow="fold"
    )
    table.add_column("publisher", overflow="fold")
    table.add_column("subscribers", overflow="fold")
    for item in items:
        facts = [item.mode.value, f"pri {item.priority}", _fmt_when(item.created_at)]
        if item.correlation_id:
            facts.append(f"corr {item.correlation_id}")
        ident = Text(item.msg_id, style="bold") + Text("\n" + " · ".join(facts), style="dim")
        if payloads is not None:
            ident.append("\n" + payloads.get(item.msg_id, ""), style="green")
        pub = Text(item.publisher + "\n")
        pub.append_text(_state(item.publisher_state.value if item.publisher_state else None))
        table.add_row(ident, pub, _members_text(item.subscribers))
    return table


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def summary_json(item: MessageSummary) -> dict[str, Any]:
    """A search hit as JSON-ready data."""
    return {
        "msg_id": item.msg_id,
        "queue": item.queue,
        "publisher": item.publisher,
        "correlation_id": item.correlation_id,
        "priority": item.priority,
        "mode": item.mode.value,
        "publisher_state": item.publisher_state.value if item.publisher_state else None,
        "created_at": _iso(item.created_at),
        "subscribers": {k: (v.value if v else None) for k, v in item.subscribers.items()},
        "parents": list(item.parents),
    }


def state_json(state: MessageState) -> dict[str, Any]:
    """A message's state and full journal as JSON-ready data."""
    return {
        "msg_id": state.msg_id,
        "queue": state.queue,
        "publisher": state.publisher,
        "mode": state.mode.value,
        "correlation_id": state.correlation_id,
        "priority": state.priority,
        "parents": list(state.parents),
        "publisher_state": state.publisher_state.value if state.publisher_state else None,
        "subscribers": {
            name: {
                "pool": v.pool,
                "state": v.state.value if v.state else None,
                "attempt": v.attempt,
                "reason": v.reason,
                "lease_owner": v.lease_owner,
                "lease_until": _iso(v.lease_until),
            }
            for name, v in state.subscribers.items()
        },
        "journal": [
            {
                "actor": e.actor,
                "kind": e.actor_kind.value,
                "from": e.src,
                "to": e.dst,
                "at": e.timestamp.isoformat(),
                "attempt": e.attempt,
                "detail": e.detail,
            }
            for e in state.journal
        ],
    }
