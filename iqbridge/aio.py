"""The asyncio API: the same core as the sync API, run off the event loop.

Every coroutine delegates to the synchronous :class:`~iqbridge.queue.Queue` in a worker
thread (:func:`asyncio.to_thread`), so there is one implementation of every rule, and a
blocking ``get(timeout=...)`` never stalls the loop::

    from iqbridge import aio

    async with await aio.connect("sqlite:///app.db") as hub:
        q = hub.queue("orders")
        await q.put({"order": 7}, to=["billing"])
        async with await q.get("billing", timeout=5) as delivery:
            print(delivery.payload)
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

from iqbridge.batch import Batch, Settled
from iqbridge.delivery import Delivery
from iqbridge.housekeeping import RecoveryAction
from iqbridge.hub import DEFAULT_URL, Hub
from iqbridge.hub import connect as _connect
from iqbridge.model import Envelope, Filter, MessageState, MessageSummary, QueueCounts
from iqbridge.queue import Browse, Queue
from iqbridge.states import SubscriberState
from iqbridge.stores.base import IndexStore

__all__ = ["AsyncBatch", "AsyncDelivery", "AsyncHub", "AsyncQueue", "connect"]


async def connect(
    url: str = DEFAULT_URL,
    index: str | IndexStore | None = None,
    *,
    publisher: str | None = None,
    clock: Callable[[], float] | None = None,
) -> AsyncHub:
    """Open a hub without blocking the loop (see :func:`iqbridge.connect`)."""
    hub = await asyncio.to_thread(_connect, url, index, publisher=publisher, clock=clock)
    return AsyncHub(hub)


class AsyncHub:
    """An asyncio view of a :class:`~iqbridge.hub.Hub`."""

    def __init__(self, hub: Hub) -> None:
        self.sync = hub

    def queue(self, name: str, **options: Any) -> AsyncQueue:
        """An asyncio view of ``hub.queue(name, **options)``."""
        return AsyncQueue(self.sync.queue(name, **options))

    async def close(self) -> None:
        """Close the hub."""
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncHub:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class AsyncQueue:
    """An asyncio view of a :class:`~iqbridge.queue.Queue`; same arguments, awaitable."""

    def __init__(self, queue: Queue) -> None:
        self.sync = queue
        self.name = queue.name

    async def put(self, payload: object, **options: Any) -> str:
        """See :meth:`Queue.put`."""
        return await asyncio.to_thread(self.sync.put, payload, **options)

    async def put_many(self, payloads: Iterable[object], **options: Any) -> list[str]:
        """See :meth:`Queue.put_many`."""
        items = list(payloads)
        return await asyncio.to_thread(self.sync.put_many, items, **options)

    async def get(self, subscriber: str, **options: Any) -> AsyncDelivery | None:
        """See :meth:`Queue.get`; waits off the loop."""
        delivery = await asyncio.to_thread(self.sync.get, subscriber, **options)
        return AsyncDelivery(delivery) if delivery is not None else None

    async def get_many(self, subscriber: str, max: int, **options: Any) -> AsyncBatch:
        """See :meth:`Queue.get_many`; waits off the loop."""
        batch = await asyncio.to_thread(self.sync.get_many, subscriber, max, **options)
        return AsyncBatch(batch)

    async def confirm_put(self, msg_id: str, *, detail: str | None = None) -> None:
        """See :meth:`Queue.confirm_put`."""
        await asyncio.to_thread(functools.partial(self.sync.confirm_put, msg_id, detail=detail))

    async def confirm_get(self, confirm_id: str) -> None:
        """See :meth:`Queue.confirm_get`."""
        await asyncio.to_thread(self.sync.confirm_get, confirm_id)

    async def reveal(
        self, msg_id: str, to: str | None = None, *, detail: str | None = None
    ) -> None:
        """See :meth:`Queue.reveal`."""
        await asyncio.to_thread(functools.partial(self.sync.reveal, msg_id, to, detail=detail))

    async def withdraw(self, msg_id: str, reason: str = "withdrawn by publisher") -> None:
        """See :meth:`Queue.withdraw`."""
        await asyncio.to_thread(self.sync.withdraw, msg_id, reason)

    async def undo(self, confirm_id: str) -> None:
        """See :meth:`Queue.undo`."""
        await asyncio.to_thread(self.sync.undo, confirm_id)

    async def state(self, msg_id: str) -> MessageState:
        """See :meth:`Queue.state`."""
        return await asyncio.to_thread(self.sync.state, msg_id)

    async def search(self, flt: Filter | None = None, **criteria: Any) -> list[MessageSummary]:
        """See :meth:`Queue.search`."""
        return await asyncio.to_thread(self.sync.search, flt, **criteria)

    async def counts(self) -> QueueCounts:
        """See :meth:`Queue.counts`."""
        return await asyncio.to_thread(self.sync.counts)

    async def browse(self, flt: Filter | None = None, **options: Any) -> Browse:
        """See :meth:`Queue.browse`."""
        return await asyncio.to_thread(self.sync.browse, flt, **options)

    async def unlock(self, lock_id: str) -> int:
        """See :meth:`Queue.unlock`."""
        return await asyncio.to_thread(self.sync.unlock, lock_id)

    async def peek(self, msg_id: str) -> Envelope:
        """See :meth:`Queue.peek`."""
        return await asyncio.to_thread(self.sync.peek, msg_id)

    async def recover(self, limit: int = 1000) -> int:
        """See :meth:`Queue.recover`."""
        return await asyncio.to_thread(self.sync.recover, limit)

    async def purge(self, older_than: float) -> int:
        """See :meth:`Queue.purge`."""
        return await asyncio.to_thread(self.sync.purge, older_than)

    async def purge_listed(self, ids: Sequence[str], before: datetime | int) -> int:
        """See :meth:`Queue.purge_listed`."""
        return await asyncio.to_thread(self.sync.purge_listed, ids, before)

    async def apply_recovery(
        self,
        msg_id: str,
        action: RecoveryAction,
        *,
        subscriber: str | None = None,
        detail: str,
    ) -> bool:
        """See :meth:`Queue.apply_recovery`."""
        return await asyncio.to_thread(
            functools.partial(
                self.sync.apply_recovery, msg_id, action, subscriber=subscriber, detail=detail
            )
        )


class AsyncDelivery:
    """An asyncio view of a :class:`~iqbridge.delivery.Delivery`.

    As an async context manager it behaves like the sync one: IN_PROCESS on entry, DONE
    on a clean exit, retry or UNUSABLE (per the queue's policy) on an exception.
    """

    def __init__(self, delivery: Delivery) -> None:
        self.sync = delivery

    def __getattr__(self, name: str) -> Any:
        # Read-only attributes (payload, headers, msg_id, attempt, ...) come straight
        # from the sync delivery: no I/O happens when reading them.
        return getattr(self.sync, name)

    @property
    def state(self) -> SubscriberState:
        """The last state this delivery moved to."""
        return self.sync.state

    async def in_process(self) -> None:
        """FETCHED -> IN_PROCESS."""
        await asyncio.to_thread(self.sync.in_process)

    async def done(self) -> None:
        """-> DONE."""
        await asyncio.to_thread(self.sync.done)

    async def unusable(self, reason: str) -> None:
        """-> UNUSABLE with the reason."""
        await asyncio.to_thread(self.sync.unusable, reason)

    async def release(self, delay: float = 0.0, reason: str = "released") -> None:
        """Give it back for another attempt."""
        await asyncio.to_thread(self.sync.release, delay, reason)

    async def renew(self, lease: float | None = None) -> None:
        """Extend the lease."""
        await asyncio.to_thread(self.sync.renew, lease)

    async def __aenter__(self) -> AsyncDelivery:
        await self.in_process()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.sync.__exit__, exc_type, exc, tb)


class AsyncBatch:
    """An asyncio view of a :class:`~iqbridge.batch.Batch`: a sequence of
    :class:`AsyncDelivery`; recording an outcome is plain (no I/O), settling is awaited.

    As an async context manager it behaves like the sync one: every delivery IN_PROCESS
    on entry, :meth:`done` on a clean exit, the retry policy on an exception.
    """

    def __init__(self, batch: Batch) -> None:
        self.sync = batch
        self._views = [AsyncDelivery(d) for d in batch]

    def __len__(self) -> int:
        return len(self._views)

    def __iter__(self) -> Iterator[AsyncDelivery]:
        return iter(self._views)

    def __getitem__(self, index: int) -> AsyncDelivery:
        return self._views[index]

    def __bool__(self) -> bool:
        return bool(self._views)

    @property
    def msg_ids(self) -> list[str]:
        """The msg_ids of the batch, in delivery order."""
        return self.sync.msg_ids

    def unusable(self, delivery: AsyncDelivery | Delivery, reason: str) -> None:
        """See :meth:`Batch.unusable`."""
        self.sync.unusable(_sync(delivery), reason)

    def release(
        self, delivery: AsyncDelivery | Delivery, delay: float = 0.0, reason: str = "released"
    ) -> None:
        """See :meth:`Batch.release`."""
        self.sync.release(_sync(delivery), delay, reason)

    async def done(self, transaction: object = None, *, partial: bool = False) -> Settled:
        """See :meth:`Batch.done`."""
        return await asyncio.to_thread(
            functools.partial(self.sync.done, partial=partial), transaction
        )

    async def in_process(self) -> None:
        """See :meth:`Batch.in_process`."""
        await asyncio.to_thread(self.sync.in_process)

    async def renew(self, lease: float | None = None, *, within: float | None = None) -> Settled:
        """See :meth:`Batch.renew`."""
        return await asyncio.to_thread(functools.partial(self.sync.renew, lease, within=within))

    async def __aenter__(self) -> AsyncBatch:
        await self.in_process()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.sync.__exit__, exc_type, exc, tb)


def _sync(delivery: AsyncDelivery | Delivery) -> Delivery:
    return delivery.sync if isinstance(delivery, AsyncDelivery) else delivery
