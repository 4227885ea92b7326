"""States, events and the one transition table of the intelligent-queue model.

Every state change in iqbridge, for every adapter and index store, is looked up here
(:func:`publisher_move`, :func:`subscriber_move`). A move that is not in the table
raises :class:`~iqbridge.errors.IllegalTransition`; the engine works on a copy of the
record, so a refused move changes nothing.

Publisher view::

    (new) ─put─▶ PUT ─reveal─▶ REVEALED ─(every member JOURNALLED)─▶ JOURNALLED
                  │               │                                      │
                  └──withdraw──▶ UNAVAILABLE ─(every member JOURNALLED)──┤
                                                 REVEALED ◀─re-reveal────┘

Subscriber view (one machine per intended subscriber)::

    (unrevealed) ─reveal─▶ AVAILABLE ─get─▶ GET ─fetch─▶ FETCHED ─process─▶ IN_PROCESS
    FETCHED / IN_PROCESS ─done─▶ DONE ─journal─▶ JOURNALLED
    GET / FETCHED / IN_PROCESS ─unusable─▶ UNUSABLE ─journal─▶ JOURNALLED
    (unrevealed) / AVAILABLE ─expire─▶ EXPIRED ─journal─▶ JOURNALLED
    GET / FETCHED / IN_PROCESS ─release─▶ AVAILABLE        (lease expiry, undo, release)
    UNUSABLE / JOURNALLED(after UNUSABLE) ─rereveal─▶ AVAILABLE
    EXPIRED / JOURNALLED(after EXPIRED) ─reopen─▶ AVAILABLE (pool reopened)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from iqbridge.errors import IllegalTransition

__all__ = [
    "IN_DOUBT",
    "PUBLISHER_TABLE",
    "SUBSCRIBER_TABLE",
    "TERMINAL",
    "ActorKind",
    "Mode",
    "PubEvent",
    "PublisherState",
    "SubEvent",
    "SubscriberState",
    "Transition",
    "publisher_move",
    "subscriber_move",
]


class PublisherState(enum.StrEnum):
    """The message as its publisher sees it."""

    PUT = "PUT"
    REVEALED = "REVEALED"
    UNAVAILABLE = "UNAVAILABLE"
    JOURNALLED = "JOURNALLED"


class SubscriberState(enum.StrEnum):
    """The message as one intended subscriber sees it."""

    AVAILABLE = "AVAILABLE"
    GET = "GET"
    FETCHED = "FETCHED"
    IN_PROCESS = "IN_PROCESS"
    DONE = "DONE"
    UNUSABLE = "UNUSABLE"
    EXPIRED = "EXPIRED"
    JOURNALLED = "JOURNALLED"


class Mode(enum.StrEnum):
    """How a message's audience is served."""

    PUBSUB = "pubsub"
    POOL = "pool"
    COMBINED = "combined"


class ActorKind(enum.StrEnum):
    """Whose state machine a journal record belongs to."""

    PUBLISHER = "publisher"
    SUBSCRIBER = "subscriber"


class PubEvent(enum.StrEnum):
    """Events that move the publisher's state."""

    PUT = "put"
    REVEAL = "reveal"
    WITHDRAW = "withdraw"
    JOURNAL = "journal"
    REREVEAL = "rereveal"


class SubEvent(enum.StrEnum):
    """Events that move one subscriber's state."""

    REVEAL = "reveal"
    GET = "get"
    FETCH = "fetch"
    PROCESS = "process"
    DONE = "done"
    UNUSABLE = "unusable"
    EXPIRE = "expire"
    JOURNAL = "journal"
    RELEASE = "release"
    REREVEAL = "rereveal"
    REOPEN = "reopen"


#: States in which a subscriber holds a lease (in doubt if the lease has run out).
IN_DOUBT = frozenset({SubscriberState.GET, SubscriberState.FETCHED, SubscriberState.IN_PROCESS})
#: Outcomes that are followed by JOURNALLED.
TERMINAL = frozenset({SubscriberState.DONE, SubscriberState.UNUSABLE, SubscriberState.EXPIRED})


@dataclass(frozen=True, slots=True)
class Transition:
    """One row of the table: ``event`` moves ``src`` to ``dst``.

    ``outcome`` restricts a move out of JOURNALLED to members whose journalled outcome
    (the state before JOURNALLED) is that value.
    """

    event: str
    src: PublisherState | SubscriberState | None
    dst: PublisherState | SubscriberState
    outcome: SubscriberState | None = None


P = PublisherState
S = SubscriberState

PUBLISHER_TABLE: tuple[Transition, ...] = (
    Transition(PubEvent.PUT, None, P.PUT),
    Transition(PubEvent.REVEAL, P.PUT, P.REVEALED),
    Transition(PubEvent.WITHDRAW, P.PUT, P.UNAVAILABLE),
    Transition(PubEvent.WITHDRAW, P.REVEALED, P.UNAVAILABLE),
    Transition(PubEvent.JOURNAL, P.REVEALED, P.JOURNALLED),
    Transition(PubEvent.JOURNAL, P.UNAVAILABLE, P.JOURNALLED),
    Transition(PubEvent.REREVEAL, P.JOURNALLED, P.REVEALED),
)

SUBSCRIBER_TABLE: tuple[Transition, ...] = (
    Transition(SubEvent.REVEAL, None, S.AVAILABLE),
    Transition(SubEvent.GET, S.AVAILABLE, S.GET),
    Transition(SubEvent.FETCH, S.GET, S.FETCHED),
    Transition(SubEvent.PROCESS, S.FETCHED, S.IN_PROCESS),
    Transition(SubEvent.DONE, S.FETCHED, S.DONE),
    Transition(SubEvent.DONE, S.IN_PROCESS, S.DONE),
    Transition(SubEvent.UNUSABLE, S.GET, S.UNUSABLE),
    Transition(SubEvent.UNUSABLE, S.FETCHED, S.UNUSABLE),
    Transition(SubEvent.UNUSABLE, S.IN_PROCESS, S.UNUSABLE),
    Transition(SubEvent.EXPIRE, None, S.EXPIRED),
    Transition(SubEvent.EXPIRE, S.AVAILABLE, S.EXPIRED),
    Transition(SubEvent.JOURNAL, S.DONE, S.JOURNALLED),
    Transition(SubEvent.JOURNAL, S.UNUSABLE, S.JOURNALLED),
    Transition(SubEvent.JOURNAL, S.EXPIRED, S.JOURNALLED),
    Transition(SubEvent.RELEASE, S.GET, S.AVAILABLE),
    Transition(SubEvent.RELEASE, S.FETCHED, S.AVAILABLE),
    Transition(SubEvent.RELEASE, S.IN_PROCESS, S.AVAILABLE),
    Transition(SubEvent.REREVEAL, S.UNUSABLE, S.AVAILABLE),
    Transition(SubEvent.REREVEAL, S.JOURNALLED, S.AVAILABLE, outcome=S.UNUSABLE),
    Transition(SubEvent.REOPEN, S.EXPIRED, S.AVAILABLE),
    Transition(SubEvent.REOPEN, S.JOURNALLED, S.AVAILABLE, outcome=S.EXPIRED),
)

_PUB_INDEX: dict[tuple[str, PublisherState | None], PublisherState] = {
    (t.event, t.src): t.dst  # type: ignore[misc]
    for t in PUBLISHER_TABLE
}
_SUB_INDEX: dict[tuple[str, SubscriberState | None, SubscriberState | None], SubscriberState] = {
    (t.event, t.src, t.outcome): t.dst  # type: ignore[misc]
    for t in SUBSCRIBER_TABLE
}
_SUB_EVENTS_WITH_OUTCOME = frozenset(t.event for t in SUBSCRIBER_TABLE if t.outcome is not None)


def publisher_move(
    msg_id: str, actor: str, src: PublisherState | None, event: PubEvent
) -> PublisherState:
    """Return the publisher state that ``event`` leads to from ``src``, or raise."""
    dst = _PUB_INDEX.get((event, src))
    if dst is None:
        raise IllegalTransition(msg_id, actor, src, _intended_pub(event), event)
    return dst


def subscriber_move(
    msg_id: str,
    actor: str,
    src: SubscriberState | None,
    event: SubEvent,
    outcome: SubscriberState | None = None,
) -> SubscriberState:
    """Return the subscriber state that ``event`` leads to from ``src``, or raise.

    ``outcome`` is the member's journalled outcome; it matters only for moves out of
    JOURNALLED (re-reveal needs UNUSABLE, reopen needs EXPIRED).
    """
    dst = _SUB_INDEX.get((event, src, None))
    if dst is None and src is SubscriberState.JOURNALLED and event in _SUB_EVENTS_WITH_OUTCOME:
        dst = _SUB_INDEX.get((event, src, outcome))
    if dst is None:
        why = None
        if src is SubscriberState.JOURNALLED and outcome is not None:
            why = f"journalled after {outcome.value}"
        raise IllegalTransition(msg_id, actor, src, _intended_sub(event), event, why)
    return dst


def _intended_pub(event: PubEvent) -> PublisherState | str:
    targets = {t.dst for t in PUBLISHER_TABLE if t.event == event}
    return targets.pop() if len(targets) == 1 else event


def _intended_sub(event: SubEvent) -> SubscriberState | str:
    targets = {t.dst for t in SUBSCRIBER_TABLE if t.event == event}
    return targets.pop() if len(targets) == 1 else event
