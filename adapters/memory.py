"""In-process broker with consumer groups, for fast tests: ``memory://`` or ``memory://name``.

Features: one append-only log per queue; consumer groups that each see every entry
(pubsub = a group per subscriber, pool = one group whose consumers compete); entries
stay pending until acked; idle pending entries can be claimed by another consumer
(``min_idle``); requeue; dead letters; read by reference; entries kept after ack until
deleted (journalled retention). It behaves like a small Redis Streams, so the facade's
native-group path is exercised without a server.

URL: ``memory://`` gives a private broker; ``memory://name`` one shared by every hub of
that name in this process. No options. Its default index is the memory store of the
same name.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar
from urllib.parse import urlsplit

from iqbridge.adapter import Capabilities
from iqbridge.errors import ConfigurationError, UnknownQueueError
from iqbridge.model import Envelope, Received
from iqbridge.stores.memory import MemoryStore

__all__ = ["MemoryAdapter", "MemoryBroker"]


@dataclass
class _Pending:
    consumer: str
    since: float
    count: int


@dataclass
class _Group:
    cursor: int = 0
    pending: dict[int, _Pending] = field(default_factory=dict)
    ready: deque[int] = field(default_factory=deque)
    dead: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class _Queue:
    log: list[Envelope | None] = field(default_factory=list)
    groups: dict[str, _Group] = field(default_factory=dict)


class MemoryBroker:
    """The broker state behind one or more MemoryAdapter instances."""

    _named: ClassVar[dict[str, MemoryBroker]] = {}
    _named_lock = threading.Lock()

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.cond = threading.Condition()
        self.queues: dict[str, _Queue] = {}

    @classmethod
    def named(cls, name: str) -> MemoryBroker:
        """The process-wide broker of that name (a private one for "")."""
        if not name:
            return cls()
        with cls._named_lock:
            broker = cls._named.get(name)
            if broker is None:
                broker = cls._named[name] = cls(name)
            return broker


class MemoryAdapter:
    """Adapter over a :class:`MemoryBroker`."""

    capabilities = Capabilities(native_groups=True, read_by_ref=True)

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.url = f"memory://{broker.name}"

    @classmethod
    def from_url(cls, url: str) -> MemoryAdapter:
        """``memory://`` (private) or ``memory://name`` (shared in this process)."""
        parts = urlsplit(url)
        if parts.path not in ("", "/") or parts.query:
            raise ConfigurationError(f"memory URL takes only a name: memory://name, not {url!r}")
        return cls(MemoryBroker.named(parts.netloc))

    def default_index(self) -> MemoryStore:
        """The memory index store of the same name."""
        return MemoryStore.named(self.broker.name)

    def _queue(self, queue: str) -> _Queue:
        q = self.broker.queues.get(queue)
        if q is None:
            raise UnknownQueueError(f"queue {queue!r} is not declared on {self.url}")
        return q

    def _group(self, queue: str, group: str) -> _Group:
        q = self._queue(queue)
        g = q.groups.get(group)
        if g is None:
            g = q.groups[group] = _Group()
        return g

    def declare(self, queue: str, groups: Sequence[str]) -> None:
        """Create the queue and groups (groups start at the beginning of the log)."""
        with self.broker.cond:
            q = self.broker.queues.setdefault(queue, _Queue())
            for g in groups:
                q.groups.setdefault(g, _Group())

    def send(self, queue: str, envelopes: Sequence[Envelope]) -> list[str]:
        """Append to the log; wake waiting consumers."""
        with self.broker.cond:
            log = self._queue(queue).log
            refs = []
            for env in envelopes:
                log.append(dataclasses.replace(env))
                refs.append(str(len(log) - 1))
            self.broker.cond.notify_all()
            return refs

    def receive(
        self,
        queue: str,
        group: str,
        consumer: str,
        *,
        count: int,
        timeout: float,
        min_idle: float | None = None,
    ) -> list[Received]:
        """Requeued entries first, then idle ones (with ``min_idle``), then new ones."""
        deadline = time.monotonic() + max(timeout, 0.0)
        with self.broker.cond:
            while True:
                out = self._take(queue, group, consumer, count, min_idle)
                remaining = deadline - time.monotonic()
                if out or remaining <= 0:
                    return out
                self.broker.cond.wait(min(remaining, 0.05 if min_idle else remaining))

    def _take(
        self, queue: str, group: str, consumer: str, count: int, min_idle: float | None
    ) -> list[Received]:
        q = self._queue(queue)
        g = self._group(queue, group)
        now = time.monotonic()
        out: list[Received] = []

        def hand(idx: int, delivered: int) -> None:
            env = q.log[idx]
            if env is None:
                g.pending.pop(idx, None)
                return
            g.pending[idx] = _Pending(consumer, now, delivered)
            out.append(
                Received(str(idx), group, dataclasses.replace(env), delivery_count=delivered)
            )

        while g.ready and len(out) < count:
            idx = g.ready.popleft()
            p = g.pending.get(idx)
            if p is not None:
                hand(idx, p.count + 1)
        if min_idle is not None and len(out) < count:
            for idx, p in list(g.pending.items()):
                if len(out) >= count:
                    break
                if now - p.since >= min_idle and p.consumer != consumer:
                    hand(idx, p.count + 1)
        while len(out) < count and g.cursor < len(q.log):
            idx = g.cursor
            g.cursor += 1
            hand(idx, 1)
        return out

    def ack(self, queue: str, group: str, refs: Sequence[str]) -> None:
        """Drop entries from the group's pending list."""
        with self.broker.cond:
            g = self._group(queue, group)
            for ref in refs:
                g.pending.pop(int(ref), None)

    def requeue(self, queue: str, group: str, ref: str) -> None:
        """Deliver a pending entry to the group again, before new ones."""
        with self.broker.cond:
            g = self._group(queue, group)
            if int(ref) in g.pending:
                g.ready.append(int(ref))
                self.broker.cond.notify_all()

    def dead_letter(self, queue: str, group: str, ref: str, reason: str) -> None:
        """Ack and remember the entry as dead for this group."""
        with self.broker.cond:
            g = self._group(queue, group)
            g.pending.pop(int(ref), None)
            g.dead.append((int(ref), reason))

    def read(self, queue: str, ref: str) -> Envelope | None:
        """The envelope at a reference, if still stored."""
        with self.broker.cond:
            log = self._queue(queue).log
            idx = int(ref)
            env = log[idx] if 0 <= idx < len(log) else None
            return dataclasses.replace(env) if env is not None else None

    def delete(self, queue: str, refs: Sequence[str]) -> None:
        """Forget stored entries."""
        with self.broker.cond:
            log = self._queue(queue).log
            for ref in refs:
                log[int(ref)] = None

    def pending(self, queue: str, group: str) -> dict[str, str]:
        """Pending entries of a group: reference -> consumer (for tests and admin)."""
        with self.broker.cond:
            return {str(i): p.consumer for i, p in self._group(queue, group).pending.items()}

    def inject(self, queue: str, group: str, ref: str) -> None:
        """Deliver an entry to a group again even if it was acked (a broker redelivery)."""
        with self.broker.cond:
            g = self._group(queue, group)
            g.pending.setdefault(int(ref), _Pending("", 0.0, 1))
            g.ready.append(int(ref))
            self.broker.cond.notify_all()

    def close(self) -> None:
        """Nothing to release: the broker lives as long as the process."""
