"""The claim behind one delivery, shared by the delivery that shows it and the queue part
that moves it (:mod:`iqbridge.settling`)."""

from __future__ import annotations

from dataclasses import dataclass

from iqbridge.model import MessageRecord
from iqbridge.states import SubscriberState

__all__ = ["Hold"]


@dataclass(slots=True, eq=False)
class Hold:
    """The claim behind one delivery: its message, subscriber and lease token, the record
    as of its last move, and its state. The queue's settling part reads and moves it;
    the delivery shows it."""

    msg_id: str
    subscriber: str
    token: str
    record: MessageRecord | None = None
    state: SubscriberState = SubscriberState.FETCHED

    def settled(self, record: MessageRecord) -> None:
        """The message is now ``record``: the hold's state follows."""
        self.record = record
        state = record.members[self.subscriber].state
        if state is not None:
            self.state = state
