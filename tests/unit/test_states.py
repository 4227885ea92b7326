"""The transition table, as a specification."""

from __future__ import annotations

import pytest

from iqbridge.errors import IllegalTransition
from iqbridge.states import (
    PubEvent,
    PublisherState,
    SubEvent,
    SubscriberState,
    publisher_move,
    subscriber_move,
)

S = SubscriberState
P = PublisherState


@pytest.mark.parametrize(
    ("src", "event", "dst"),
    [
        (None, SubEvent.REVEAL, S.AVAILABLE),
        (S.AVAILABLE, SubEvent.GET, S.GET),
        (S.GET, SubEvent.FETCH, S.FETCHED),
        (S.FETCHED, SubEvent.PROCESS, S.IN_PROCESS),
        (S.FETCHED, SubEvent.DONE, S.DONE),
        (S.IN_PROCESS, SubEvent.DONE, S.DONE),
        (S.GET, SubEvent.UNUSABLE, S.UNUSABLE),
        (S.IN_PROCESS, SubEvent.UNUSABLE, S.UNUSABLE),
        (S.AVAILABLE, SubEvent.EXPIRE, S.EXPIRED),
        (S.DONE, SubEvent.JOURNAL, S.JOURNALLED),
        (S.IN_PROCESS, SubEvent.RELEASE, S.AVAILABLE),
        (S.UNUSABLE, SubEvent.REREVEAL, S.AVAILABLE),
        (S.EXPIRED, SubEvent.REOPEN, S.AVAILABLE),
    ],
)
def test_legal_subscriber_moves(src: S | None, event: SubEvent, dst: S) -> None:
    assert subscriber_move("m", "s", src, event) is dst


@pytest.mark.parametrize(
    ("src", "event"),
    [
        (S.AVAILABLE, SubEvent.DONE),
        (S.GET, SubEvent.DONE),
        (S.DONE, SubEvent.DONE),
        (S.DONE, SubEvent.GET),
        (S.DONE, SubEvent.RELEASE),
        (S.JOURNALLED, SubEvent.GET),
        (S.EXPIRED, SubEvent.REREVEAL),
        (S.DONE, SubEvent.REREVEAL),
        (None, SubEvent.GET),
    ],
)
def test_illegal_subscriber_moves_name_everything(src: S | None, event: SubEvent) -> None:
    with pytest.raises(IllegalTransition) as info:
        subscriber_move("msg-1", "billing", src, event)
    err = info.value
    assert (err.msg_id, err.actor, err.src, err.event) == ("msg-1", "billing", src, event)
    assert "msg-1" in str(err) and "billing" in str(err) and "nothing was changed" in str(err)


def test_journalled_moves_depend_on_outcome() -> None:
    assert subscriber_move("m", "s", S.JOURNALLED, SubEvent.REREVEAL, S.UNUSABLE) is S.AVAILABLE
    assert subscriber_move("m", "s", S.JOURNALLED, SubEvent.REOPEN, S.EXPIRED) is S.AVAILABLE
    with pytest.raises(IllegalTransition, match="journalled after DONE"):
        subscriber_move("m", "s", S.JOURNALLED, SubEvent.REREVEAL, S.DONE)
    with pytest.raises(IllegalTransition):
        subscriber_move("m", "s", S.JOURNALLED, SubEvent.REOPEN, S.UNUSABLE)


def test_publisher_table() -> None:
    assert publisher_move("m", "p", None, PubEvent.PUT) is P.PUT
    assert publisher_move("m", "p", P.PUT, PubEvent.REVEAL) is P.REVEALED
    assert publisher_move("m", "p", P.REVEALED, PubEvent.WITHDRAW) is P.UNAVAILABLE
    assert publisher_move("m", "p", P.UNAVAILABLE, PubEvent.JOURNAL) is P.JOURNALLED
    assert publisher_move("m", "p", P.JOURNALLED, PubEvent.REREVEAL) is P.REVEALED
    for src, event in [
        (P.JOURNALLED, PubEvent.WITHDRAW),
        (P.PUT, PubEvent.JOURNAL),
        (P.UNAVAILABLE, PubEvent.REVEAL),
        (P.REVEALED, PubEvent.PUT),
    ]:
        with pytest.raises(IllegalTransition):
            publisher_move("m", "p", src, event)
