"""A message handed to one subscriber, and the moves it can make from there."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from iqbridge.holding import Hold
from iqbridge.model import Envelope, MessageRecord, from_micros
from iqbridge.moves import DONE, PROCESS, Move, after_failure
from iqbridge.observability import tracing
from iqbridge.payload import decode
from iqbridge.states import IN_DOUBT, SubscriberState

if TYPE_CHECKING:
    from iqbridge.retry import RetryPolicy
    from iqbridge.settling import Settled

__all__ = ["Delivery", "Mover"]


class Mover(Protocol):
    """What a delivery and a batch need of their queue's settling part."""

    name: str
    retry: RetryPolicy

    def move(self, hold: Hold, move: Move, transaction: object = None) -> None:
        """Make ``move`` of ``hold`` (in ``transaction``, for a DONE)."""
        ...

    def settle_many(
        self,
        moves: Sequence[tuple[Hold, Move]],
        transaction: object = None,
        partial: bool = False,
    ) -> Settled:
        """Make many holds' moves in one index commit."""
        ...


_UNSET: Any = object()


class Delivery:
    """A message as fetched by one subscriber: payload, headers, ids and attempt.

    It is FETCHED when you get it and moves on with :meth:`in_process`, :meth:`done`,
    :meth:`unusable` or :meth:`release`. As a context manager it marks IN_PROCESS on
    entry and DONE on a clean exit; on an exception the queue's retry policy either
    releases it for another attempt (after a backoff delay) or marks it UNUSABLE with the
    exception as the reason, and the exception propagates.

    Every move is fenced by the delivery's lease token: if the lease ran out and the
    message was handed to someone else, the move raises
    :class:`~iqbridge.errors.LeaseLost` and changes nothing.
    """

    __slots__ = (
        "_envelope",
        "_mover",
        "_payload",
        "_span",
        "attempt",
        "hold",
        "max_attempts",
        "msg_id",
        "subscriber",
    )

    def __init__(
        self,
        mover: Mover,
        envelope: Envelope,
        subscriber: str,
        token: str,
        attempt: int,
        max_attempts: int,
        record: MessageRecord | None = None,
        hold: Hold | None = None,
    ) -> None:
        self._mover = mover
        self._envelope = envelope
        self._payload: Any = _UNSET
        self.msg_id = envelope.msg_id
        self.subscriber = subscriber
        self.attempt = attempt
        self.max_attempts = max_attempts
        #: The claim behind this delivery (what the queue moves; iqbridge's own).
        self.hold = hold if hold is not None else Hold(envelope.msg_id, subscriber, token, record)
        self._span: tracing.Open | None = None

    @property
    def state(self) -> SubscriberState:
        """The last state this delivery moved to."""
        return self.hold.state

    @property
    def mover(self) -> Mover:
        """The queue part that moves this delivery (iqbridge's own; a batch uses it)."""
        return self._mover

    # --- what was delivered -----------------------------------------------------------

    @property
    def body(self) -> bytes:
        """The payload bytes exactly as stored on the broker."""
        return self._envelope.body

    @property
    def payload(self) -> Any:
        """The decoded payload: bytes, str or a JSON value (by content type).

        Raises :class:`~iqbridge.errors.PayloadError` for malformed data.
        """
        if self._payload is _UNSET:
            self._payload = decode(self._envelope.body, self._envelope.content_type)
        return self._payload

    @property
    def content_type(self) -> str:
        """The payload's content type."""
        return self._envelope.content_type

    @property
    def headers(self) -> Mapping[str, str]:
        """Application headers given at put."""
        return self._envelope.headers

    @property
    def correlation_id(self) -> str | None:
        """The correlation id given at put."""
        return self._envelope.correlation_id

    @property
    def priority(self) -> int:
        """0 (lowest) to 9 (highest)."""
        return self._envelope.priority

    @property
    def publisher(self) -> str:
        """Who put the message."""
        return self._envelope.publisher

    @property
    def ordering_key(self) -> str:
        """Messages with the same key are processed in put order by a Worker."""
        return self._envelope.ordering_key

    @property
    def parents(self) -> tuple[str, ...]:
        """Ids of the messages this one was derived from."""
        return self._envelope.parents

    @property
    def put_at(self) -> datetime:
        """When it was put (UTC)."""
        return from_micros(self._envelope.put_at)

    @property
    def queue(self) -> str:
        """The queue's name."""
        return self._mover.name

    @property
    def lease_until(self) -> datetime | None:
        """When this delivery's lease runs out (UTC), as of its last move; None when it
        has no lease (or is no longer held)."""
        us = self.lease_until_us
        return None if us is None else from_micros(us)

    @property
    def lease_until_us(self) -> int | None:
        """:attr:`lease_until` in microseconds since the epoch, on the hub's clock."""
        hold = self.hold
        return hold.lease_until if hold.state in IN_DOUBT else None

    @property
    def confirm_id(self) -> str:
        """The id that confirm_get and undo take, usable from any process."""
        return f"{self.msg_id}/{self.subscriber}/{self.hold.token}"

    # --- moves ------------------------------------------------------------------------

    def in_process(self) -> None:
        """FETCHED -> IN_PROCESS."""
        self._mover.move(self.hold, PROCESS)

    def done(self, transaction: object = None) -> None:
        """-> DONE (and JOURNALLED): never delivered to this subscriber again.

        ``transaction``: a :meth:`Queue.transaction <iqbridge.Queue.transaction>` or a
        SQLAlchemy ``Connection`` on the database of the hub's SQL index. DONE is then
        written in that transaction and commits or rolls back with your own rows
        (exactly-once); until it commits the delivery stays held under its lease.
        """
        self._mover.move(self.hold, DONE, transaction)

    def unusable(self, reason: str) -> None:
        """-> UNUSABLE (and JOURNALLED) with the reason; the publisher may re-reveal it."""
        self._mover.move(self.hold, Move("unusable", reason=reason))

    def release(self, delay: float = 0.0, reason: str = "released") -> None:
        """Give it back: AVAILABLE again after ``delay`` seconds, attempt + 1."""
        self._mover.move(self.hold, Move("release", reason=reason, delay=delay))

    def renew(self, lease: float | None = None) -> None:
        """Extend the lease by ``lease`` seconds from now (default: the queue's lease)."""
        self._mover.move(self.hold, Move("renew", lease=lease))

    def __enter__(self) -> Delivery:
        self.in_process()
        self._span = tracing.begin(
            self._mover,
            self.subscriber,
            msg_id=self.msg_id,
            correlation_id=self.correlation_id,
            messages=(self,),
        )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with tracing.finishing(self._span, exc):
            if exc is None:
                self.done()
                return
            move = after_failure(self._mover.retry, exc, self.attempt, self.max_attempts)
            if move.kind == "unusable":
                self.unusable(move.reason)
            else:
                self.release(move.delay, move.reason)

    def __repr__(self) -> str:
        return (
            f"<Delivery {self.msg_id} to {self.subscriber!r} attempt {self.attempt} "
            f"{self.state.value}>"
        )
