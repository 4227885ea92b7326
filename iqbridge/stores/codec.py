"""Serialisation and filtering shared by the index stores.

Compact JSON forms of what a store persists (member states, journal entries, whole
records, subscriptions), and the search filter and summary evaluated on a record, so
every store encodes, matches and reports the same way. Nothing here reads a payload.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from iqbridge.model import (
    UNDONE,
    Filter,
    JournalEntry,
    Member,
    MessageRecord,
    MessageSummary,
    Pool,
    QueueCounts,
    Subscriptions,
    from_micros,
    to_micros,
)
from iqbridge.states import IN_DOUBT, ActorKind, Mode, PublisherState, SubscriberState

__all__ = [
    "JOURNAL_PER_ROW",
    "batch_entries_to_json",
    "counted",
    "encode",
    "entries_from_json",
    "entries_to_json",
    "matches",
    "member_row_json",
    "record_fixed",
    "members_from_json",
    "members_to_json",
    "record_from_json",
    "record_json_around_size",
    "record_to_json",
    "subscriptions_from_json",
    "subscriptions_to_json",
    "summary",
]

#: Stores that keep one journal row per committed change number its entries
#: ``row seq * JOURNAL_PER_ROW + position`` (increasing, as the contract asks).
JOURNAL_PER_ROW = 65536


def encode(value: Any) -> str:
    """Compact JSON text (no spaces, UTF-8 kept as is), by orjson: the stores encode a
    record and a journal entry on every commit, and orjson does it about nine times
    faster than the standard library (the Redis Streams benchmark's client spends about
    8 % less CPU per message)."""
    return orjson.dumps(value).decode()


_SUB = {s.value: s for s in SubscriberState}
_PUB = {s.value: s for s in PublisherState}
_MODE = {m.value: m for m in Mode}
_KIND = {k.value: k for k in ActorKind}

#: Version tag of the record array written by :func:`record_to_json`.
_RECORD_FORMAT = 1


def member_moves(m: Member) -> tuple[Any, ...]:
    """A member's values that move with its state, in the stores' column order (state
    to updated_at, as the SQL store's ``_MEMBER_COLS``)."""
    return (
        m.state,
        m.outcome,
        m.attempt,
        m.lease_token,
        m.lease_owner,
        m.lease_until,
        m.not_before,
        m.reason,
        m.updated_at,
    )


def _member_rows(rec: MessageRecord) -> list[list[Any]]:
    return [[m.subscriber, m.pool, *member_moves(m)] for m in rec.members.values()]


def _members(rows: list[list[Any]]) -> dict[str, Member]:
    out: dict[str, Member] = {}
    for r in rows:
        m = Member.__new__(Member)
        m.__dict__.update(
            subscriber=r[0],
            pool=r[1],
            state=_SUB[r[2]] if r[2] else None,
            outcome=_SUB[r[3]] if r[3] else None,
            attempt=r[4],
            lease_token=r[5],
            lease_owner=r[6],
            lease_until=r[7],
            not_before=r[8],
            reason=r[9],
            updated_at=r[10],
        )
        out[r[0]] = m
    return out


#: Where each value of a member row (:func:`members_to_json`) stands, for code that moves
#: members on their rows without making Member objects (the SQLite store's claim and
#: settle in place).
ROW_NAME, ROW_POOL, ROW_STATE, ROW_OUTCOME, ROW_ATTEMPT = 0, 1, 2, 3, 4
ROW_TOKEN, ROW_OWNER, ROW_UNTIL, ROW_NOT_BEFORE, ROW_UPDATED = 5, 6, 7, 8, 10
_IN_DOUBT = frozenset(s.value for s in IN_DOUBT)


def leases_due(rows: Sequence[Sequence[Any]]) -> int | None:
    """The earliest lease end of the member rows in doubt (GET, FETCHED, IN_PROCESS):
    :meth:`MessageRecord.due_at <iqbridge.model.MessageRecord.due_at>` of a message with
    neither a time limit nor a browse lock."""
    return min(
        (m[ROW_UNTIL] for m in rows if m[ROW_STATE] in _IN_DOUBT and m[ROW_UNTIL] is not None),
        default=None,
    )


def member_row_json(m: Member) -> str:
    """One member's row, as :func:`members_to_json` writes each."""
    return encode([m.subscriber, m.pool, *member_moves(m)])


def members_to_json(rec: MessageRecord) -> str:
    """Every member of a record as a compact JSON array of rows."""
    return encode(_member_rows(rec))


def members_from_json(text: str) -> dict[str, Member]:
    """Members from :func:`members_to_json` output, by subscriber name."""
    return _members(orjson.loads(text))


#: Where a record's size stands in :func:`_record_values` (and so in its JSON).
_SIZE_AT = 9


def _record_values(rec: MessageRecord) -> list[Any]:
    """The values of :func:`record_to_json`'s array, in order."""
    return [
        _RECORD_FORMAT,
        rec.queue,
        rec.publisher,
        rec.ordering_key,
        rec.correlation_id,
        rec.priority,
        rec.mode,
        list(rec.parents),
        rec.content_type,
        rec.size,
        rec.created_at,
        rec.expires_at,
        rec.max_attempts,
        rec.publisher_state,
        int(rec.withdrawn),
        rec.updated_at,
        rec.lock_id,
        rec.lock_owner,
        rec.lock_until,
        _member_rows(rec),
    ]


def record_json_around_size(rec: MessageRecord) -> tuple[str, str]:
    """:func:`record_to_json` of ``rec`` cut around its size: what comes before and
    after it, so that ``before + str(size) + after`` is the JSON of a record that
    differs from ``rec`` only in its size."""
    values = _record_values(rec)
    head, tail = encode(values[:_SIZE_AT]), encode(values[_SIZE_AT + 1 :])
    return head[:-1] + ",", "," + tail[1:]


def record_to_json(rec: MessageRecord) -> str:
    """A record as one compact JSON array, members included.

    ``msg_id``, ``version``, ``seq`` and ``native_ref`` are left out: stores keep them
    beside the record (as its key, for compare-and-set, as the put order, and because
    the broker reference is set apart from state changes).
    """
    return encode(_record_values(rec))


#: The values of a record's JSON (:func:`record_to_json`) other than its members, its
#: publisher state and its last change's time: what a move of members only leaves as
#: it was.
record_fixed = operator.attrgetter(
    "queue",
    "publisher",
    "ordering_key",
    "correlation_id",
    "priority",
    "mode",
    "parents",
    "content_type",
    "size",
    "created_at",
    "expires_at",
    "max_attempts",
    "withdrawn",
    "lock_id",
    "lock_owner",
    "lock_until",
)


def record_from_json(
    msg_id: str, text: str | bytes, *, version: int, seq: int | None, native_ref: str | None
) -> MessageRecord:
    """The record :func:`record_to_json` wrote, with the fields kept beside it."""
    r = orjson.loads(text)
    if r[0] != _RECORD_FORMAT:
        raise ValueError(f"record {msg_id}: unknown record format {r[0]!r}")
    rec = MessageRecord.__new__(MessageRecord)
    rec.__dict__.update(
        msg_id=msg_id,
        queue=r[1],
        publisher=r[2],
        ordering_key=r[3],
        correlation_id=r[4],
        priority=r[5],
        mode=_MODE[r[6]],
        parents=tuple(r[7]),
        native_ref=native_ref,
        content_type=r[8],
        size=r[9],
        created_at=r[10],
        expires_at=r[11],
        max_attempts=r[12],
        publisher_state=_PUB[r[13]] if r[13] else None,
        withdrawn=bool(r[14]),
        updated_at=r[15],
        lock_id=r[16],
        lock_owner=r[17],
        lock_until=r[18],
        version=version,
        seq=seq,
        members=_members(r[19]),
    )
    return rec


def entries_to_json(entries: Sequence[JournalEntry]) -> str:
    """Journal entries of one message (one change) as compact JSON, without msg_id and
    queue (kept once beside them) and without seq (assigned by the store)."""
    return encode(
        [[e.actor, e.actor_kind, e.src, e.dst, e.at, e.attempt, e.detail] for e in entries]
    )


def batch_entries_to_json(groups: Sequence[Sequence[Any]]) -> str:
    """The templated journal entries of a batch (:class:`~iqbridge.writes.Steps`) as one
    journal row: ``{"b": [[at, [[actor, kind, src, dst, detail], ...], [[msg_id,
    attempt], ...]], ...]}``. Every message of a group made every step of it."""
    return encode({"b": groups})


def entries_from_json(
    row_seq: int, msg_id: str, queue: str, text: str | bytes
) -> list[JournalEntry]:
    """The entries of one journal row, numbered ``row_seq * JOURNAL_PER_ROW + position``:
    one change's (an array, ``msg_id`` beside it) or a batch's (an object, see
    :func:`batch_entries_to_json`), expanded group by group, message by message, step by
    step."""
    base = row_seq * JOURNAL_PER_ROW
    data = orjson.loads(text)
    if isinstance(data, list):
        return [
            JournalEntry(msg_id, queue, e[0], _KIND[e[1]], e[2], e[3], e[4], e[5], e[6], base + i)
            for i, e in enumerate(data)
        ]
    out: list[JournalEntry] = []
    pos = base
    publisher = ActorKind.PUBLISHER
    for at, steps, items in data["b"]:
        kinds = [_KIND[s[1]] for s in steps]
        for mid, attempt in items:
            for s, kind in zip(steps, kinds, strict=True):
                out.append(
                    JournalEntry(
                        mid,
                        queue,
                        s[0],
                        kind,
                        s[2],
                        s[3],
                        at,
                        1 if kind is publisher else attempt,
                        s[4],
                        pos,
                    )
                )
                pos += 1
    return out


def subscriptions_to_json(subs: Subscriptions) -> str:
    """Serialised subscriptions."""
    return encode(
        {
            "subscribers": list(subs.subscribers),
            "pools": [{"name": p.name, "members": list(p.members)} for p in subs.pools],
            "adhoc_pools": [{"name": p.name, "members": list(p.members)} for p in subs.adhoc_pools],
        }
    )


def subscriptions_from_json(text: str | bytes) -> Subscriptions:
    """Subscriptions from :func:`subscriptions_to_json` output."""
    data = orjson.loads(text)
    return Subscriptions(
        tuple(data.get("subscribers", ())),
        tuple(Pool(p["name"], p["members"]) for p in data.get("pools", ())),
        tuple(Pool(p["name"], p["members"]) for p in data.get("adhoc_pools", ())),
    )


def matches(rec: MessageRecord, flt: Filter) -> bool:
    """Whether a record passes a search filter (index fields only; ``limit`` aside)."""
    if flt.msg_id is not None and rec.msg_id != flt.msg_id:
        return False
    if flt.correlation_id is not None and rec.correlation_id != flt.correlation_id:
        return False
    if flt.publisher is not None and rec.publisher != flt.publisher:
        return False
    if flt.priority is not None:
        lo, hi = flt.priority if isinstance(flt.priority, tuple) else (flt.priority, flt.priority)
        if not lo <= rec.priority <= hi:
            return False
    if flt.since is not None and rec.created_at < to_micros(flt.since):
        return False
    if flt.until is not None and rec.created_at >= to_micros(flt.until):
        return False
    if flt.lock_id is not None and rec.lock_id != flt.lock_id:
        return False
    if flt.parent is not None and flt.parent not in rec.parents:
        return False
    if flt.subscriber is not None and flt.subscriber not in rec.members:
        return False
    if isinstance(flt.state, PublisherState):
        return rec.publisher_state is flt.state
    if isinstance(flt.state, SubscriberState):
        members = (
            [rec.members[flt.subscriber]]
            if flt.subscriber is not None
            else list(rec.members.values())
        )
        return any(m.state is flt.state for m in members)
    return True


def summary(rec: MessageRecord) -> MessageSummary:
    """The search view of a record."""
    return MessageSummary(
        msg_id=rec.msg_id,
        queue=rec.queue,
        publisher=rec.publisher,
        correlation_id=rec.correlation_id,
        priority=rec.priority,
        mode=rec.mode,
        publisher_state=rec.publisher_state,
        created_at=from_micros(rec.created_at),
        subscribers={k: m.state for k, m in rec.members.items()},
        parents=rec.parents,
        outcomes={
            k: m.outcome
            for k, m in rec.members.items()
            if m.state is SubscriberState.JOURNALLED and m.outcome is not None
        },
    )


def counted(
    queue: str,
    publisher_rows: Iterable[Sequence[Any]],
    member_rows: Iterable[Sequence[Any]],
) -> QueueCounts:
    """:class:`~iqbridge.model.QueueCounts` from a store's grouped rows:
    ``(publisher_state, count)`` and ``(subscriber, state, count, min created_at µs)``."""
    pub: dict[PublisherState, int] = {}
    messages = 0
    for state, n in publisher_rows:
        messages += int(n)
        if state is not None:
            pub[PublisherState(state)] = int(n)
    subs: dict[str, dict[SubscriberState, int]] = {}
    oldest: dict[str, int] = {}
    for name, state, n, first in member_rows:
        st = SubscriberState(state)
        subs.setdefault(name, {})[st] = int(n)
        if st in UNDONE and first is not None:
            oldest[name] = min(int(first), oldest.get(name, int(first)))
    return QueueCounts(queue, messages, pub, subs, {k: from_micros(v) for k, v in oldest.items()})
