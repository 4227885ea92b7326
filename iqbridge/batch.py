"""A batch of deliveries, claimed together by ``queue.get_many`` and settled together.

A batch costs one index commit and one broker read to claim, and one index commit plus
one broker acknowledgement per consumer group to settle, however many deliveries it
holds::

    batch = queue.get_many("billing", 100, timeout=1.0)
    for delivery in batch:
        try:
            handle(delivery.payload)
        except BadOrder as exc:
            batch.unusable(delivery, str(exc))   # recorded; applied by done()
    batch.done()                                 # the rest DONE, all in one commit

Every delivery is an ordinary :class:`~iqbridge.delivery.Delivery` and can still be moved
alone (``delivery.done()``, ``delivery.release()``...); settling the batch then leaves it
as it is. Claimed and never settled, a delivery comes back after its lease with attempt
+ 1, as from ``get``: nothing is DONE twice.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, overload

from iqbridge.delivery import Delivery
from iqbridge.durations import seconds, to_seconds
from iqbridge.errors import BatchLeaseLost, InvalidArgument
from iqbridge.moves import DONE, PROCESS, Move, after_failure
from iqbridge.observability import tracing
from iqbridge.settling import Settled
from iqbridge.states import IN_DOUBT, SubscriberState

if TYPE_CHECKING:
    from iqbridge.retry import RetryPolicy

__all__ = ["Batch", "BatchQueue", "Settled"]


class _Clock(Protocol):
    def now_us(self) -> int: ...


class BatchQueue(Protocol):
    """What a batch needs of its queue: its name, retry policy and clock (the moves go
    through the part that moves its deliveries, :attr:`Delivery.mover
    <iqbridge.delivery.Delivery.mover>`)."""

    name: str
    retry: RetryPolicy

    @property
    def hub(self) -> _Clock: ...


class Batch(Sequence[Delivery]):
    """Deliveries claimed together (see the module documentation); a sequence of
    :class:`~iqbridge.delivery.Delivery`, empty when nothing arrived.

    As a context manager it marks every delivery IN_PROCESS on entry (one commit) and
    settles on exit: a clean exit is :meth:`done`; on an exception, the queue's retry
    policy releases every unsettled delivery for another attempt or marks it UNUSABLE,
    in one commit, and the exception propagates.
    """

    __slots__ = ("_deliveries", "_lost", "_outcomes", "_position", "_queue", "_span")

    def __init__(self, queue: BatchQueue, deliveries: Sequence[Delivery]) -> None:
        self._queue = queue
        self._deliveries = list(deliveries)
        self._position = {id(d): i for i, d in enumerate(self._deliveries)}
        self._outcomes: dict[int, Move] = {}
        #: msg_ids whose lease settling found taken over: no longer this batch's to move.
        self._lost: set[str] = set()
        self._span: tracing.Open | None = None

    @overload
    def __getitem__(self, index: int) -> Delivery: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Delivery]: ...

    def __getitem__(self, index: int | slice) -> Delivery | Sequence[Delivery]:
        return self._deliveries[index]

    def __len__(self) -> int:
        return len(self._deliveries)

    def __iter__(self) -> Iterator[Delivery]:
        return iter(self._deliveries)

    def __bool__(self) -> bool:
        return bool(self._deliveries)

    @property
    def msg_ids(self) -> list[str]:
        """The msg_ids of the batch, in delivery order."""
        return [d.msg_id for d in self._deliveries]

    def _index(self, delivery: Delivery) -> int:
        i = self._position.get(id(delivery))
        if i is None or self._deliveries[i] is not delivery:
            raise InvalidArgument(f"message {delivery.msg_id} is not a delivery of this batch")
        return i

    def unusable(self, delivery: Delivery, reason: str) -> None:
        """Record that ``delivery`` is to go UNUSABLE (then JOURNALLED) with ``reason``
        when the batch is settled by :meth:`done`. No I/O."""
        self._outcomes[self._index(delivery)] = Move("unusable", reason=reason)

    def release(self, delivery: Delivery, delay: float = 0.0, reason: str = "released") -> None:
        """Record that ``delivery`` is to be given back (AVAILABLE after ``delay``
        seconds, attempt + 1) when the batch is settled by :meth:`done`. No I/O."""
        seconds(delay, "delay")
        self._outcomes[self._index(delivery)] = Move("release", reason=reason, delay=delay)

    def done(self, transaction: object = None, *, partial: bool = False) -> Settled:
        """Settle the batch: every delivery still held goes DONE (then JOURNALLED), except
        those given another outcome with :meth:`unusable` or :meth:`release`, which take
        it; one index commit, one broker acknowledgement per consumer group.

        ``transaction``: as for :meth:`Delivery.done <iqbridge.Delivery.done>`, a
        :meth:`Queue.transaction <iqbridge.Queue.transaction>` or SQLAlchemy
        ``Connection`` on the SQL index's database: the batch then commits (or rolls
        back) with your own rows, and the broker hears of it after the commit.

        Returns what moved; deliveries whose lease was taken over are reported in
        ``Settled.lost`` and changed nothing; deliveries moved alone before are left as
        they are. In a transaction, a lease found taken over raises
        :class:`~iqbridge.errors.BatchLeaseLost` instead (so that your transaction rolls
        back and commits no business rows for a message another holder now has); with
        ``partial=True`` the rest is settled in it and the lost ones are reported in
        ``Settled.lost``, for you to leave out of your rows. Either way a later ``done``
        leaves the lost ones out.
        """
        moves = [(d, self._outcomes.get(i, DONE)) for i, d in self._held()]
        try:
            with tracing.settle_batch(self._queue, moves):
                result = self._settle(moves, transaction, partial)
        except BatchLeaseLost as exc:
            self._lost.update(exc.lost)
            raise
        self._lost.update(result.lost)
        self._outcomes.clear()
        return result

    @staticmethod
    def _settle(
        moves: Sequence[tuple[Delivery, Move]], transaction: object = None, partial: bool = False
    ) -> Settled:
        """Make the moves through the part that moves the deliveries, in one commit."""
        if not moves:
            return Settled()
        mover = moves[0][0].mover
        if any(d.mover is not mover for d, _ in moves):
            raise InvalidArgument("a batch settles deliveries of one queue; make one per queue")
        return mover.settle_many([(d.hold, m) for d, m in moves], transaction, partial)

    def _held(self) -> Iterator[tuple[int, Delivery]]:
        """The deliveries (with their positions) this batch may still move."""
        for i, d in enumerate(self._deliveries):
            if d.state in IN_DOUBT and d.msg_id not in self._lost:
                yield i, d

    def in_process(self) -> None:
        """Every FETCHED delivery -> IN_PROCESS, in one index commit."""
        moves = [(d, PROCESS) for d in self._deliveries if d.state is SubscriberState.FETCHED]
        if moves:
            self._settle(moves)

    def renew(self, lease: float | None = None, *, within: float | None = None) -> Settled:
        """Extend every held delivery's lease by ``lease`` seconds from now (default: the
        queue's), in one index commit.

        ``within``: only the deliveries whose lease runs out within that many seconds
        (or whose lease is not known): a heartbeat that renews what has used up half its
        lease writes nothing for deliveries it will soon settle anyway, and does not race
        their settle."""
        to_seconds(lease, "lease", positive=True)
        held = [d for _, d in self._held()]
        if within is not None:
            horizon = self._queue.hub.now_us() + int(seconds(within, "within") * 1_000_000)
            held = [d for d in held if (d.lease_until_us or 0) <= horizon]
        moves = [(d, Move("renew", lease=lease)) for d in held]
        result = self._settle(moves)
        self._lost.update(result.lost)
        return result

    def __enter__(self) -> Batch:
        self.in_process()
        if self._deliveries:
            d = self._deliveries[0]
            self._span = tracing.begin(
                self._queue, d.subscriber, count=len(self._deliveries), messages=self._deliveries
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
            for i, d in self._held():
                if i not in self._outcomes:
                    self._outcomes[i] = after_failure(
                        self._queue.retry, exc, d.attempt, d.max_attempts
                    )
            self.done()

    def __repr__(self) -> str:
        return f"<Batch of {len(self._deliveries)} from {self._queue.name!r}>"
