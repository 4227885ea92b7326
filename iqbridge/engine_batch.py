"""The state engine for batches: many messages decided in one pass.

The same model as :mod:`iqbridge.engine`, with the same transition table
(:mod:`iqbridge.states`): a batch function looks each transition of the common path up
in the table once per batch, applies it to every message on that path, and writes the
journal as templates (:class:`~iqbridge.writes.Steps`). A message off the common path (a
pool member's claim, a browse lock, a time limit, a retry delay, a lease taken over) is
left to the caller, who moves it with the per-message engine: its rules live there
alone.

Records are never changed in place: a moved record is a new object sharing the members
that did not move with the record it came from, so a caller's record (a delivery's) is
intact if the commit does not hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from iqbridge.model import Audience, Member, MessageRecord
from iqbridge.states import (
    IN_DOUBT,
    ActorKind,
    PubEvent,
    PublisherState,
    SubEvent,
    SubscriberState,
    publisher_move,
    subscriber_move,
)
from iqbridge.writes import Step, Steps

__all__ = [
    "ClaimPlan",
    "NewItem",
    "SettlePlan",
    "claim",
    "claim_plan",
    "create",
    "settle",
    "settle_plan",
]

S = SubscriberState
P = PublisherState
_PUB = ActorKind.PUBLISHER
_SUB = ActorKind.SUBSCRIBER

#: One message of a put: msg_id, publisher, ordering key (None: the publisher's),
#: correlation id, priority, parents, time limit (µs), content type, size.
NewItem = tuple[str, str, str | None, str | None, int, tuple[str, ...], int | None, str, int]


def create(
    queue: str,
    audience: Audience,
    now: int,
    items: Sequence[NewItem],
    *,
    confirm: bool = False,
    max_attempts: int = 5,
) -> tuple[list[MessageRecord], list[Steps]]:
    """New messages to one audience: PUT, then REVEALED to every member unless the put
    awaits confirmation. The records (version 1) and their journal, one template per
    publisher."""
    audience.validate()
    if not items:
        return [], []
    first = items[0][0]
    put = publisher_move(first, items[0][1], None, PubEvent.PUT)
    members = list(audience.members())
    state = put
    member_state: SubscriberState | None = None
    if not confirm:
        state = publisher_move(first, items[0][1], put, PubEvent.REVEAL)
        member_state = subscriber_move(first, members[0][0], None, SubEvent.REVEAL)
    mode = audience.mode
    groups: dict[str, Steps] = {}
    records: list[MessageRecord] = []
    for msg_id, publisher, key, corr, priority, parents, expires, ctype, size in items:
        rec = MessageRecord.__new__(MessageRecord)
        rec.__dict__.update(
            msg_id=msg_id,
            queue=queue,
            publisher=publisher,
            ordering_key=key if key is not None else publisher,
            priority=priority,
            mode=mode,
            created_at=now,
            correlation_id=corr,
            parents=parents,
            native_ref=None,
            content_type=ctype,
            size=size,
            expires_at=expires,
            max_attempts=max_attempts,
            publisher_state=state,
            withdrawn=False,
            updated_at=now,
            lock_id=None,
            lock_owner=None,
            lock_until=None,
            version=1,
            seq=None,
            members={
                name: Member(name, pool, member_state, updated_at=now) for name, pool in members
            },
        )
        records.append(rec)
        group = groups.get(publisher)
        if group is None:
            steps = [Step(publisher, _PUB, None, put.value, "confirm pending" if confirm else None)]
            if not confirm:
                steps.append(Step(publisher, _PUB, put.value, state.value))
                steps += [Step(name, _SUB, None, S.AVAILABLE.value) for name, _ in members]
            group = groups[publisher] = Steps(now, tuple(steps))
        group.items.append((msg_id, 1))
    return records, list(groups.values())


def _derive(rec: MessageRecord, at: int) -> tuple[MessageRecord, int]:
    """A new record object for ``rec``'s next version, with its own members dict, and
    the instant its moves are stamped: never before the record's last change."""
    stamp = at if at >= rec.updated_at else rec.updated_at
    new = MessageRecord.__new__(MessageRecord)
    new.__dict__.update(rec.__dict__)
    new.members = dict(rec.members)
    new.version = rec.version + 1
    new.updated_at = stamp
    return new, stamp


def _moved_member(old: Member, state: SubscriberState, stamp: int) -> Member:
    m = Member.__new__(Member)
    m.__dict__.update(old.__dict__)
    m.state = state
    m.updated_at = stamp
    return m


def claim(
    records: Sequence[MessageRecord],
    subscriber: str,
    at: int,
    tokens: Sequence[str],
    *,
    owner: str,
    lease_until: int | None,
) -> tuple[list[tuple[MessageRecord, MessageRecord]], list[Steps], list[int]]:
    """GET then FETCHED for ``subscriber`` on every record on the common path: the
    member AVAILABLE and not in a pool, the message REVEALED, not browse-locked, within
    its time limit, past any retry delay. Each claim takes the token of the same
    position in ``tokens``.

    Returns the moved (before, after) pairs, their journal, and the positions of the
    records off the common path (for :func:`iqbridge.engine.claim`)."""
    moved: list[tuple[MessageRecord, MessageRecord]] = []
    off: list[int] = []
    groups: dict[tuple[object, ...], Steps] = {}
    got = fetched = None
    detail = f"by {owner}"
    for i, rec in enumerate(records):
        m = rec.members.get(subscriber)
        if (
            m is None
            or m.state is not S.AVAILABLE
            or m.pool is not None
            or rec.publisher_state is not P.REVEALED
            or (rec.lock_id is not None and (rec.lock_until is None or rec.lock_until > at))
            or (rec.expires_at is not None and at >= rec.expires_at)
            or (m.not_before is not None and at < m.not_before)
        ):
            off.append(i)
            continue
        if got is None:
            got = subscriber_move(rec.msg_id, subscriber, S.AVAILABLE, SubEvent.GET)
            fetched = subscriber_move(rec.msg_id, subscriber, got, SubEvent.FETCH)
        assert fetched is not None
        new, stamp = _derive(rec, at)
        nm = _moved_member(m, fetched, stamp)
        nm.lease_token = tokens[i]
        nm.lease_owner = owner
        nm.lease_until = lease_until
        nm.not_before = None
        new.members[subscriber] = nm
        moved.append((rec, new))
        group = groups.get((stamp,))
        if group is None:
            steps = (
                Step(subscriber, _SUB, S.AVAILABLE.value, got.value, detail),
                Step(subscriber, _SUB, got.value, fetched.value),
            )
            group = groups[(stamp,)] = Steps(stamp, steps)
        group.items.append((rec.msg_id, m.attempt))
    return moved, list(groups.values()), off


def settle(
    records: Sequence[MessageRecord],
    subscriber: str,
    tokens: Sequence[str | None],
    kind: str,
    at: int,
    *,
    auto_journal: bool = True,
) -> tuple[list[tuple[MessageRecord, MessageRecord]], list[Steps], list[int]]:
    """``kind`` ("done" or "process") for ``subscriber`` on every record it holds under
    the token of the same position (None: any holder): done is DONE, then JOURNALLED
    (with ``auto_journal``), and the publisher JOURNALLED once every member is; process
    is FETCHED -> IN_PROCESS.

    Returns the moved (before, after) pairs, their journal, and the positions of the
    records off the common path (another state, another holder: for the per-message
    engine, which raises the right error)."""
    event = SubEvent.DONE if kind == "done" else SubEvent.PROCESS
    moved: list[tuple[MessageRecord, MessageRecord]] = []
    off: list[int] = []
    groups: dict[tuple[object, ...], Steps] = {}
    table: dict[SubscriberState, SubscriberState] = {}
    journalled: dict[SubscriberState, SubscriberState] = {}
    for i, rec in enumerate(records):
        m = rec.members.get(subscriber)
        token = tokens[i]
        if (
            m is None
            or m.state not in IN_DOUBT
            or m.state is S.GET
            or (token is not None and m.lease_token != token)
            or (kind == "process" and m.state is not S.FETCHED)
        ):
            off.append(i)
            continue
        src = m.state
        dst = table.get(src)
        if dst is None:
            dst = table[src] = subscriber_move(rec.msg_id, subscriber, src, event)
        new, stamp = _derive(rec, at)
        nm = _moved_member(m, dst, stamp)
        last: SubscriberState | None = None
        if dst is S.DONE:
            nm.lease_until = None
            if auto_journal:
                last = journalled.get(dst)
                if last is None:
                    last = journalled[dst] = subscriber_move(
                        rec.msg_id, subscriber, dst, SubEvent.JOURNAL
                    )
                nm.state = last
                nm.outcome = dst
        new.members[subscriber] = nm
        pub = rec.publisher_state
        publisher: str | None = None
        done: PublisherState | None = None
        if (
            last is S.JOURNALLED
            and pub in (P.REVEALED, P.UNAVAILABLE)
            and all(x.state is S.JOURNALLED for x in new.members.values())
        ):
            assert pub is not None
            publisher = rec.publisher
            done = publisher_move(rec.msg_id, publisher, pub, PubEvent.JOURNAL)
            new.publisher_state = done
        moved.append((rec, new))
        key = (stamp, src, last, publisher, pub if done is not None else None)
        group = groups.get(key)
        if group is None:
            steps: tuple[Step, ...] = (Step(subscriber, _SUB, src.value, dst.value),)
            if last is not None:
                steps += (Step(subscriber, _SUB, dst.value, last.value),)
            if done is not None and pub is not None and publisher is not None:
                steps += (Step(publisher, _PUB, pub.value, done.value),)
            group = groups[key] = Steps(stamp, steps)
        group.items.append((rec.msg_id, m.attempt))
    return moved, list(groups.values()), off


class SettlePlan(NamedTuple):
    """A batch settle decided from the transition table once, for a store that applies
    it to each message where the message lives (the Redis index's settle script): what
    :func:`settle` does, as data.

    ``moves`` maps each state a held member may be settled from to the state it moves
    to, the state it is journalled to next (or None) and the journal steps of those
    moves (JSON-ready ``[actor, kind, src, dst, detail]``); ``publisher`` maps the
    publisher states that move once every member is ``JOURNALLED`` to where they move,
    with their step as ``[kind, src, dst, detail]`` (the actor is each message's publisher).
    A message whose member is in none of the ``moves`` states, or held under another
    token, is left to the per-message engine (it raises the right error)."""

    subscriber: str
    kind: str
    moves: dict[SubscriberState, tuple[SubscriberState, SubscriberState | None, list[list[Any]]]]
    publisher: dict[PublisherState, tuple[PublisherState, list[Any]]]


def settle_plan(subscriber: str, kind: str, *, auto_journal: bool = True) -> SettlePlan:
    """:func:`settle`'s moves for ``kind`` ("done" or "process") of ``subscriber``'s
    held members, looked up in the transition table once (see :class:`SettlePlan`)."""
    event = SubEvent.DONE if kind == "done" else SubEvent.PROCESS
    moves: dict[SubscriberState, tuple[SubscriberState, SubscriberState | None, list[list[Any]]]]
    moves = {}
    srcs = (S.FETCHED, S.IN_PROCESS) if kind == "done" else (S.FETCHED,)
    for src in srcs:
        dst = subscriber_move("", subscriber, src, event)
        steps: list[list[Any]] = [[subscriber, _SUB.value, src.value, dst.value, None]]
        last: SubscriberState | None = None
        if dst is S.DONE and auto_journal:
            last = subscriber_move("", subscriber, dst, SubEvent.JOURNAL)
            steps.append([subscriber, _SUB.value, dst.value, last.value, None])
        moves[src] = (dst, last, steps)
    publisher: dict[PublisherState, tuple[PublisherState, list[Any]]] = {}
    if any(last is S.JOURNALLED for _, last, _ in moves.values()):
        for pub in (P.REVEALED, P.UNAVAILABLE):
            done = publisher_move("", "", pub, PubEvent.JOURNAL)
            publisher[pub] = (done, [_PUB.value, pub.value, done.value, None])
    return SettlePlan(subscriber, kind, moves, publisher)


class ClaimPlan(NamedTuple):
    """A batch claim decided from the transition table once, for a store that applies it
    to each message where the message lives (the SQLite index's claim of ready rows):
    what :func:`claim` does, as data.

    ``subscriber``'s member moves from ``src`` (AVAILABLE) to ``dst`` (FETCHED, through
    GET), held by ``owner`` until ``lease_until`` (None: no lease), journalled as
    ``steps`` (JSON-ready ``[actor, kind, src, dst, detail]``). A message off the common
    path (a pool's member, another state, the message not ``revealed``, a time limit, a
    browse lock, a retry delay still running) is left to the per-message engine."""

    subscriber: str
    owner: str
    lease_until: int | None
    src: SubscriberState
    dst: SubscriberState
    revealed: PublisherState
    steps: list[list[Any]]


def claim_plan(subscriber: str, owner: str, lease_until: int | None) -> ClaimPlan:
    """:func:`claim`'s moves (GET then FETCHED) for ``subscriber``, looked up in the
    transition table once (see :class:`ClaimPlan`)."""
    got = subscriber_move("", subscriber, S.AVAILABLE, SubEvent.GET)
    fetched = subscriber_move("", subscriber, got, SubEvent.FETCH)
    steps: list[list[Any]] = [
        [subscriber, _SUB.value, S.AVAILABLE.value, got.value, f"by {owner}"],
        [subscriber, _SUB.value, got.value, fetched.value, None],
    ]
    return ClaimPlan(subscriber, owner, lease_until, S.AVAILABLE, fetched, P.REVEALED, steps)
