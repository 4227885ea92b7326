"""The claim behind one delivery, shared by the delivery that shows it and the queue part
that moves it (:mod:`iqbridge.settling`)."""

from __future__ import annotations

from collections.abc import Callable

from iqbridge.model import MessageRecord
from iqbridge.states import SubscriberState

__all__ = ["Hold"]


class Hold:
    """The claim behind one delivery: its message, subscriber and lease token, the record
    as of its last move, and its state. The queue's settling part reads and moves it;
    the delivery shows it.

    A claim made where the index lives (the Redis Streams receive script) knows its
    consumer group, broker entry and lease without a record: its record is made from what
    the receive read only when a move needs it (``make``), and a batch settled where the
    index lives (:meth:`~iqbridge.settling.Settling.settle_many`) never needs it."""

    __slots__ = (
        "_make",
        "_record",
        "group",
        "lease_until",
        "msg_id",
        "ref",
        "state",
        "subscriber",
        "token",
    )

    def __init__(
        self,
        msg_id: str,
        subscriber: str,
        token: str,
        record: MessageRecord | None = None,
        state: SubscriberState = SubscriberState.FETCHED,
        *,
        make: Callable[[], MessageRecord | None] | None = None,
        group: str | None = None,
        ref: str | None = None,
        lease_until: int | None = None,
    ) -> None:
        self.msg_id = msg_id
        self.subscriber = subscriber
        self.token = token
        self._record = record
        self._make = make
        self.state = state
        #: The consumer group and broker entry the claim was read from (None: ask the
        #: record).
        self.group = group
        self.ref = ref
        #: When the lease runs out (µs), as of the last move; None: no lease.
        self.lease_until = lease_until
        if record is not None:
            self._follow(record)

    @property
    def record(self) -> MessageRecord | None:
        """The record as of the claim's last move (None: unknown, read it anew)."""
        make = self._make
        if make is not None:
            self._make = None
            self._record = make()
        return self._record

    @record.setter
    def record(self, record: MessageRecord | None) -> None:
        self._make = None
        self._record = record
        if record is not None:
            self._follow(record)

    @property
    def known(self) -> MessageRecord | None:
        """The record if it is at hand (never made for asking)."""
        return self._record

    @property
    def unknown(self) -> bool:
        """True when the hold has no record and cannot make one: a move reads it anew."""
        return self._record is None and self._make is None

    def _follow(self, record: MessageRecord) -> None:
        member = record.members.get(self.subscriber)
        self.lease_until = member.lease_until if member is not None else None

    def settled(self, record: MessageRecord) -> None:
        """The message is now ``record``: the hold's state follows."""
        self.record = record
        state = record.members[self.subscriber].state
        if state is not None:
            self.state = state

    def moved(self, state: SubscriberState, *, held: bool) -> None:
        """The message moved to ``state`` where the index lives, without a record: the
        record this hold knew is stale (a later move reads it anew); ``held``: the lease
        still runs (in process), else it ended."""
        self._make = None
        self._record = None
        self.state = state
        if not held:
            self.lease_until = None

    def __repr__(self) -> str:
        return (
            f"Hold(msg_id={self.msg_id!r}, subscriber={self.subscriber!r}, "
            f"state={self.state.value})"
        )
