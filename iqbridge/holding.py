"""The claim behind one delivery, shared by the delivery that shows it and the queue part
that moves it (:mod:`iqbridge.settling`)."""

from __future__ import annotations

from iqbridge.model import MessageRecord
from iqbridge.states import SubscriberState

__all__ = ["Hold"]


class Hold:
    """The claim behind one delivery: its message, subscriber and lease token, the record
    as of its last move, and its state. The queue's settling part reads and moves it;
    the delivery shows it."""

    __slots__ = ("msg_id", "record", "state", "subscriber", "token")

    def __init__(
        self,
        msg_id: str,
        subscriber: str,
        token: str,
        record: MessageRecord | None = None,
        state: SubscriberState = SubscriberState.FETCHED,
    ) -> None:
        self.msg_id = msg_id
        self.subscriber = subscriber
        self.token = token
        self.record = record
        self.state = state

    def settled(self, record: MessageRecord) -> None:
        """The message is now ``record``: the hold's state follows."""
        self.record = record
        state = record.members[self.subscriber].state
        if state is not None:
            self.state = state
