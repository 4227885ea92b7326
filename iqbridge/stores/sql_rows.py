"""Rows of the SQL index store (:mod:`iqbridge.stores.sql`): the columns it reads, and
records and changes turned into the parameters of its statements and back."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from iqbridge.engine import Change
from iqbridge.model import Member, MessageRecord
from iqbridge.states import ActorKind, Mode, PublisherState, SubscriberState

_SUB = {s.value: s for s in SubscriberState}
_PUB = {s.value: s for s in PublisherState}
_MODE = {m.value: m for m in Mode}
_KIND = {k.value: k for k in ActorKind}

#: Ids per IN (...) list (Oracle allows at most 1000).
_CHUNK = 500

_MSG_COLS = (
    "seq",
    "msg_id",
    "queue",
    "publisher",
    "ordering_key",
    "correlation_id",
    "priority",
    "audience_mode",
    "parents",
    "native_ref",
    "content_type",
    "body_size",
    "created_at",
    "expires_at",
    "max_attempts",
    "publisher_state",
    "withdrawn",
    "updated_at",
    "lock_id",
    "lock_owner",
    "lock_until",
    "version",
)
_MEMBER_COLS = (
    "subscriber",
    "pool",
    "state",
    "outcome",
    "attempt",
    "lease_token",
    "lease_owner",
    "lease_until",
    "not_before",
    "reason",
    "updated_at",
)
_N = len(_MSG_COLS)


def _cas_row(change: Change) -> dict[str, Any]:
    """The parameters of the compare-and-set update of a change's message row."""
    rec = change.record
    return {
        "b_msg_id": rec.msg_id,
        "b_expected": change.expected_version,
        "b_pub": rec.publisher_state,
        "b_withdrawn": int(rec.withdrawn),
        "b_updated": rec.updated_at,
        "b_lock_id": rec.lock_id,
        "b_lock_owner": rec.lock_owner,
        "b_lock_until": rec.lock_until,
        "b_version": rec.version,
        "b_due": rec.due_at(),
    }


def _member_rows(change: Change) -> list[dict[str, Any]]:
    """The parameters of the updates of the member rows a change moved."""
    rec = change.record
    rows = []
    for name in sorted(change.dirty):
        m = rec.members[name]
        rows.append(
            {
                "b_msg_id": rec.msg_id,
                "b_sub": name,
                "b_state": m.state,
                "b_outcome": m.outcome,
                "b_attempt": m.attempt,
                "b_token": m.lease_token,
                "b_owner": m.lease_owner,
                "b_until": m.lease_until,
                "b_not_before": m.not_before,
                "b_reason": m.reason,
                "b_updated": m.updated_at,
            }
        )
    return rows


def _message_row(rec: MessageRecord) -> dict[str, Any]:
    return {
        "msg_id": rec.msg_id,
        "queue": rec.queue,
        "publisher": rec.publisher,
        "ordering_key": rec.ordering_key,
        "correlation_id": rec.correlation_id,
        "priority": rec.priority,
        "audience_mode": rec.mode.value,
        "parents": json.dumps(list(rec.parents)) if rec.parents else None,
        "native_ref": rec.native_ref,
        "content_type": rec.content_type,
        "body_size": rec.size,
        "created_at": rec.created_at,
        "expires_at": rec.expires_at,
        "max_attempts": rec.max_attempts,
        "publisher_state": rec.publisher_state,
        "withdrawn": int(rec.withdrawn),
        "updated_at": rec.updated_at,
        "lock_id": rec.lock_id,
        "lock_owner": rec.lock_owner,
        "lock_until": rec.lock_until,
        "version": rec.version,
        "next_due": rec.due_at(),
    }


def _record(rows: Sequence[Sequence[Any]], head: Sequence[Any] | None = None) -> MessageRecord:
    """A record from rows of message columns followed by one member's columns each."""
    r = head if head is not None else rows[0]
    members: dict[str, Member] = {}
    for row in rows:
        m = Member.__new__(Member)
        m.__dict__.update(
            subscriber=row[_N],
            pool=row[_N + 1],
            state=_SUB[row[_N + 2]] if row[_N + 2] else None,
            outcome=_SUB[row[_N + 3]] if row[_N + 3] else None,
            attempt=row[_N + 4],
            lease_token=row[_N + 5],
            lease_owner=row[_N + 6],
            lease_until=row[_N + 7],
            not_before=row[_N + 8],
            reason=row[_N + 9],
            updated_at=row[_N + 10],
        )
        members[m.subscriber] = m
    rec = MessageRecord.__new__(MessageRecord)
    rec.__dict__.update(
        seq=int(r[0]),
        msg_id=r[1],
        queue=r[2],
        publisher=r[3],
        ordering_key=r[4],
        correlation_id=r[5],
        priority=r[6],
        mode=_MODE[r[7]],
        parents=tuple(json.loads(r[8])) if r[8] else (),
        native_ref=r[9],
        content_type=r[10],
        size=r[11],
        created_at=r[12],
        expires_at=r[13],
        max_attempts=r[14],
        publisher_state=_PUB[r[15]] if r[15] else None,
        withdrawn=bool(r[16]),
        updated_at=r[17],
        lock_id=r[18],
        lock_owner=r[19],
        lock_until=r[20],
        version=r[21],
        members=members,
    )
    return rec
