"""What the dashboard's templates draw, worked out from the service's answers: a
message's timeline as swimlanes (one row per instant, one lane per actor) and a search's
page links.

The timeline is a table, not a drawing to scale: each instant at which any actor moved is
a row, in time order, with its time and how long after the previous row and the first
one it came; each actor (the publisher, then every subscriber) is a lane whose cell
holds the states it entered at that instant. Transitions microseconds apart land in rows
of their own, so their labels can never be drawn over one another.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from iqbridge.admin.schemas import MessageOut, StepOut
from iqbridge.admin.service import SearchPage

__all__ = ["PER_PAGE", "duration", "paging", "timeline"]

#: Messages a search page shows unless told otherwise.
PER_PAGE = 100


def duration(delta: timedelta) -> str:
    """A time span for people: ``840 µs``, ``4.2 ms``, ``1.25 s``, ``3 min 4 s``,
    ``2 h 5 min``, ``3 d 4 h``."""
    us = max(0, delta // timedelta(microseconds=1))
    if us < 1_000:
        return f"{us} µs"
    if us < 1_000_000:
        return f"{us / 1_000:.1f} ms"
    secs = us / 1_000_000
    if secs < 60:
        return f"{secs:.2f} s"
    whole = int(secs)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def timeline(msg: MessageOut) -> dict[str, Any]:
    """The message's swimlanes: ``lanes`` (the publisher, then each subscriber with its
    pool) and ``rows``, one per distinct instant in time order, each with ``at`` (the
    ISO time), ``clock`` (the UTC time of day to the millisecond), ``date`` (on the
    first row and when it changes, else None), ``since_prev``/``since_first``
    (durations, None on the first row) and ``cells``: per lane, the states it entered
    at that instant, in the order entered."""
    lanes: list[tuple[dict[str, Any], list[StepOut]]] = [
        ({"name": "publisher", "pool": None}, list(msg.publisher_history))
    ]
    lanes += [({"name": v.subscriber, "pool": v.pool}, list(v.history)) for v in msg.subscribers]
    instants = sorted({step.at.astimezone(UTC) for _, hist in lanes for step in hist})
    index = {at: n for n, at in enumerate(instants)}
    cells: list[list[list[dict[str, str]]]] = [[[] for _ in lanes] for _ in instants]
    for lane, (_, hist) in enumerate(lanes):
        for step in hist:
            cells[index[step.at.astimezone(UTC)]][lane].append(
                {"state": step.state, "at": step.at.isoformat(timespec="microseconds")}
            )
    rows: list[dict[str, Any]] = []
    prev: datetime | None = None
    for n, at in enumerate(instants):
        same_day = prev is not None and prev.date() == at.date()
        rows.append(
            {
                "at": at.isoformat(timespec="microseconds"),
                "clock": at.strftime("%H:%M:%S.") + f"{at.microsecond // 1000:03d}",
                "date": None if same_day else at.date().isoformat(),
                "since_prev": None if prev is None else duration(at - prev),
                "since_first": None if n == 0 else duration(at - instants[0]),
                "cells": cells[n],
            }
        )
        prev = at
    return {"lanes": [lane for lane, _ in lanes], "rows": rows}


def _fmt(n: int) -> str:
    return f"{n:,}"


def paging(path: str, form: dict[str, str], page: SearchPage, per_page: int) -> dict[str, Any]:
    """The search page's count line (``messages 101-200 of 2,002``) and the links to
    the previous and next pages, each keeping the search's filters."""
    shown = len(page.rows)
    total = _fmt(page.total) if page.exact else f"more than {_fmt(page.total)}"
    if shown == 1:
        summary = f"message {_fmt(page.offset + 1)} of {total}"
    elif shown:
        first, last = page.offset + 1, page.offset + shown
        summary = f"messages {_fmt(first)}-{_fmt(last)} of {total}"
    elif page.total and page.offset:
        summary = f"no messages past the first {_fmt(page.offset)}; {total} match"
    else:
        summary = "no message matches"
    kept = {k: v for k, v in form.items() if v.strip() and k != "offset"}
    if kept.get("limit", "").strip() == str(PER_PAGE):
        del kept["limit"]

    def link(offset: int) -> str:
        query = dict(kept, offset=str(offset)) if offset else kept
        return f"{path}?{urlencode(query)}" if query else path

    after = page.offset + per_page
    more = after < page.total or not page.exact
    return {
        "summary": summary,
        "prev": link(max(0, page.offset - per_page)) if page.offset else None,
        "next": link(after) if more and after < page.bound else None,
        "first": link(0) if page.offset else None,
        "page": page.offset // per_page + 1,
        "pages": -(-page.total // per_page) if page.exact else None,
        "bounded": not page.exact or page.total > page.bound,
        "bound": _fmt(page.bound),
    }
