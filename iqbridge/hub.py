"""Connecting: a :class:`Hub` is one broker (adapter) plus one side-index store."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType

from iqbridge.adapter import Adapter, Colocated
from iqbridge.durations import seconds
from iqbridge.errors import InvalidArgument, UnknownQueueError
from iqbridge.model import JournalEntry, check_name
from iqbridge.queue import Queue
from iqbridge.queue_core import QueueCore
from iqbridge.registry import open_adapter, open_store, redact
from iqbridge.retry import RetryPolicy
from iqbridge.stores.base import IndexStore

__all__ = ["DEFAULT_URL", "Hub", "connect"]

#: The zero-server default: an embedded queue and index in one SQLite file.
DEFAULT_URL = "sqlite:///iqbridge.db"


def connect(
    url: str = DEFAULT_URL,
    index: str | IndexStore | None = None,
    *,
    publisher: str | None = None,
    clock: Callable[[], float] | None = None,
) -> Hub:
    """Open a broker and its state index; return a :class:`Hub`.

    ``url`` picks the broker by scheme (``sqlite:///file.db``, ``memory://``, ...).
    ``index`` is the side-index store's URL (or an open store); by default the broker's
    own choice: the same SQLite file for ``sqlite://``, process memory for ``memory://``.
    ``publisher`` names this client when it puts (default ``host:pid``); ``clock``
    returns seconds since the epoch (tests pass a fake one to move time).
    """
    adapter = open_adapter(url)
    try:
        if index is None:
            default = getattr(adapter, "default_index", None)
            if default is None:
                raise InvalidArgument(
                    f"the broker at {redact(url)} has no default index store; pass index="
                    f"'sqlite:///iqbridge-index.db' or another store URL"
                )
            store: IndexStore = default()
        elif isinstance(index, str):
            store = open_store(index)
        else:
            store = index
    except BaseException:
        adapter.close()
        raise
    return Hub(adapter, store, publisher=publisher, clock=clock)


class Hub:
    """A broker plus its state index. Thread-safe; make one per process and share it.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        adapter: Adapter,
        store: IndexStore,
        *,
        publisher: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.adapter = adapter
        self.store = store
        self.client_id = f"{socket.gethostname()}:{os.getpid()}"
        self.publisher = check_name("publisher", publisher or self.client_id)
        self._clock = clock
        self._arrivals = threading.Condition()
        #: (queue, subscriber) pairs this process gave a message back to (native-group
        #: brokers): their next get asks the index for redeliveries at once.
        self.redeliveries: set[tuple[str, str]] = set()
        #: Browse locks this process also holds on the broker (IBM MQ's MQGMO_LOCK), by
        #: (queue, lock_id): when they end, in microseconds by the hub's clock (None: at
        #: unlock). A get releases those past their end.
        self.native_locks: dict[tuple[str, str], int | None] = {}
        adapter_db = getattr(adapter, "db", None)
        #: Broker rows and index live in one database: one transaction covers both.
        self.shares_transaction = bool(
            adapter.capabilities.shares_index_transaction
            and adapter_db is not None
            and adapter_db is getattr(store, "db", None)
        )
        #: The broker can run the index's writes in its own round trips (one server).
        self.colocated: Colocated | None = (
            adapter if isinstance(adapter, Colocated) and adapter.colocated(store) else None
        )

    def now_us(self) -> int:
        """Now, in microseconds since the epoch (UTC), from the hub's clock."""
        if self._clock is None:
            return time.time_ns() // 1000
        return int(self._clock() * 1_000_000)

    def queue(
        self,
        name: str,
        *,
        create: bool = True,
        retry: RetryPolicy | None = None,
        lease: float | timedelta = 30.0,
        max_bytes: int = 16 * 1024 * 1024,
        auto_journal: bool = True,
        sweep_interval: float = 1.0,
        retain: bool | None = None,
    ) -> Queue:
        """A handle on the queue ``name``.

        ``create=False`` raises UnknownQueueError for a queue nobody has used yet.
        ``retry`` decides what an exception in processing does (and ``max_attempts`` of
        messages put here); ``lease`` is how long a get holds a message before it is in
        doubt; ``max_bytes`` caps payload size; ``auto_journal`` journals a subscriber's
        message as soon as it is DONE, UNUSABLE or EXPIRED.

        ``retain`` keeps a copy of each payload put here beside the index (written in the
        put's commit, removed by purge), for peek, browse under a lock, re-reveal and
        redelivery through the index: by default exactly when the broker cannot give a
        payload again (``adapter.capabilities.forgets``: RabbitMQ, IBM MQ, Kafka past its
        retention). ``retain=False`` on such a broker keeps none: peek and re-reveal then
        raise PayloadNotRetained, and a redelivery waits for the broker's own.
        """
        check_name("queue", name)
        lease_s = seconds(lease, "lease", positive=True)
        sweep_s = seconds(sweep_interval, "sweep_interval")
        if max_bytes <= 0:
            raise InvalidArgument(f"max_bytes must be positive, got {max_bytes}")
        if create:
            self.store.declare_queue(name)
            self.adapter.declare(name, [])
        elif name not in self.store.queues():
            known = ", ".join(self.store.queues()) or "none"
            raise UnknownQueueError(
                f"queue {name!r} does not exist on {self.adapter.url} (known: {known}); "
                f"check the name, or open it with create=True"
            )
        return Queue(
            QueueCore(
                self,
                name,
                retry=retry or RetryPolicy(),
                lease=lease_s,
                max_bytes=max_bytes,
                auto_journal=auto_journal,
                sweep_interval=sweep_s,
                retain=retain,
            )
        )

    def queues(self) -> list[str]:
        """Every queue the index knows."""
        return self.store.queues()

    def journal(self, after: int = 0, limit: int = 1000) -> list[JournalEntry]:
        """Journal entries of every queue after sequence number ``after``."""
        return self.store.journal(after, limit)

    def recover(self) -> int:
        """Apply due lease expiries, time limits and lock lapses on every queue."""
        return sum(self.queue(q).recover() for q in self.queues())

    def notify(self) -> None:
        """Wake getters of this process waiting for new messages."""
        with self._arrivals:
            self._arrivals.notify_all()

    def wait(self, timeout: float) -> None:
        """Sleep until :meth:`notify` or ``timeout`` seconds (getters poll other processes)."""
        with self._arrivals:
            self._arrivals.wait(timeout)

    def close(self) -> None:
        """Close the adapter and the index store."""
        try:
            self.adapter.close()
        finally:
            self.store.close()

    def __enter__(self) -> Hub:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Hub broker={self.adapter.url} index={self.store.url}>"
