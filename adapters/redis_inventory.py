"""Listing a Redis stream without consuming it (``Inventory``, for reconciliation).

* entries: ``XRANGE`` over the whole stream, a page at a time;
* a group's view: ``XINFO GROUPS`` gives its last-delivered id; an entry after it is
  unread, one in the group's PEL (``XPENDING``) is pending, any other was acknowledged.

Kept apart from :mod:`iqbridge.adapters.redis_streams`, whose methods call these.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from iqbridge.inventory import Entry, Unacked

__all__ = ["redis_entries", "redis_unacked"]

_PAGE = 1000

Call = Callable[[Callable[[], Any]], Any]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def redis_entries(call: Call, client: Any, key: str) -> Iterator[Entry]:
    """Every entry of the stream, oldest first, with the msg_id the facade knows it by
    (an entry without ``iq-id`` is a stranger's: the id its adoption derives)."""
    from .redis_wire import decode_fields  # noqa: TID251

    start = "-"
    while True:
        rows: Any = call(functools.partial(client.xrange, key, start, "+", count=_PAGE))
        for ref, fields in rows:
            text = _text(ref)
            env, stranger = decode_fields(key, text, fields)
            yield Entry(text, env.msg_id, stranger, env if stranger else None)
        if len(rows) < _PAGE:
            return
        start = "(" + _text(rows[-1][0])


def redis_dead_letters(call: Call, client: Any, key: str, count: int) -> list[dict[str, str]]:
    """The latest ``count`` entries of the dead-letter stream ``key``, each as its fields
    and ``id``."""
    rows: Any = call(lambda: client.xrevrange(key, count=count))
    return [
        {_text(k): _text(v) for k, v in fields.items()} | {"id": _text(ref)} for ref, fields in rows
    ]


def _ids_after(call: Call, client: Any, key: str, start: str) -> set[str]:
    """Ids of the entries after ``start`` (exclusive; ``-`` for all)."""
    out: set[str] = set()
    while True:
        rows: Any = call(functools.partial(client.xrange, key, start, "+", count=_PAGE))
        out.update(_text(ref) for ref, _ in rows)
        if len(rows) < _PAGE:
            return out
        start = "(" + _text(rows[-1][0])


def redis_unacked(call: Call, client: Any, key: str, group: str) -> Unacked:
    """The group's pending entries (its PEL) and the entries after its last-delivered id.

    A group that does not exist yet starts at id 0 when declared: every entry is unread."""
    if not call(functools.partial(client.exists, key)):
        return Unacked(frozenset(), frozenset())
    infos: Any = call(functools.partial(client.xinfo_groups, key))
    last: str | None = None
    for info in infos:
        if _text(info.get("name")) == group:
            last = _text(info.get("last-delivered-id") or "0-0")
    if last is None:
        return Unacked(frozenset(), frozenset(_ids_after(call, client, key, "-")))
    pending: set[str] = set()
    start = "-"
    while True:
        rows: Any = call(
            functools.partial(client.xpending_range, key, group, min=start, max="+", count=_PAGE)
        )
        pending.update(_text(p["message_id"]) for p in rows)
        if len(rows) < _PAGE:
            break
        start = "(" + _text(rows[-1]["message_id"])
    return Unacked(frozenset(pending), frozenset(_ids_after(call, client, key, "(" + last)))
