"""A record of the Redis index store as its hash keeps it (:mod:`iqbridge.stores.redis`),
for the store's reads and the Redis Streams adapter's receive.

The hash ``m:<msg_id>`` holds the record JSON (``r``), its version (``v``), put-order
seq (``s``), native ref (``n``) and last change's time (``u``). A move that changes only
members (a claim made by the receive script on the index's server, a batch's claim or
settle through ``writes.lua``) does not rewrite the record JSON: it writes the moved
members' rows to the hash ``ms:<msg_id>`` (subscriber -> member row, as
:func:`~iqbridge.stores.codec.members_to_json` writes one; the publisher state, when the
move changed it, under the field ""), bumps ``v`` and ``u``, and marks the record
(``mo`` = 1). A record is the JSON with those rows over its own; the next commit that
writes the record JSON (holding every member as it stands) drops ``ms:<msg_id>`` again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from iqbridge.model import MessageRecord
from iqbridge.states import PublisherState
from iqbridge.stores.codec import members_from_json, record_from_json

__all__ = ["compose_record"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def compose_record(
    msg_id: str,
    v: Any,
    s: Any,
    n: Any,
    r: Any,
    u: Any = None,
    rows: Sequence[Any] = (),
) -> MessageRecord:
    """The record from its hash fields ``v``, ``s``, ``n`` (None or "" for none), ``r``
    and ``u``, with the member rows of ``ms:<msg_id>`` (a flat [subscriber, row, ...]
    list, empty for none; the field "" holds the publisher state) over those of the
    JSON."""
    rec = record_from_json(
        msg_id, r, version=int(v), seq=int(s), native_ref=_text(n) if n else None
    )
    if u:
        rec.updated_at = int(u)
    if rows:
        members = []
        for name, row in zip(rows[::2], rows[1::2], strict=True):
            if name in (b"", ""):
                rec.publisher_state = PublisherState(_text(row))
            else:
                members.append(_text(row))
        if members:
            rec.members.update(members_from_json("[" + ",".join(members) + "]"))
    return rec
