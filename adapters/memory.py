"""In-process broker with consumer groups, for fast tests: ``memory://`` or ``memory://name``.

Features: one append-only log per queue; consumer groups that each see every entry
(pubsub = a group per subscriber, pool = one group whose consumers compete); entries
stay pending until acked; idle pending entries can be claimed by another consumer
(``min_idle``); requeue; dead letters; read by reference; entries kept after ack until
deleted (journalled retention). It behaves like a small Redis Streams, so the facade's
native-group path is exercised without a server.

URL: ``memory://`` gives a private broker; ``memory://name`` one shared by every hub of
that name in this process. Its default index is the memory store of the same name.

Option ``?forget=true``: a broker that forgets, as RabbitMQ and IBM MQ do. An entry is
dropped once every group it is addressed to has acknowledged it (or dead-lettered it),
and nothing can be read by reference (:meth:`MemoryAdapter.read` returns None):
``Capabilities(read_by_ref=False, retains_after_ack=False)``. The facade then keeps a
retained copy of each payload beside the index for peek, browse, re-reveal and
redelivery, and the adapter contract suite proves that here without a server. A named
broker has one mode: opening it in the other raises ConfigurationError.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar
from urllib.parse import parse_qsl, urlsplit

from iqbridge.adapter import Capabilities
from iqbridge.errors import ConfigurationError, UnknownQueueError
from iqbridge.inventory import Entry, Unacked
from iqbridge.model import Envelope, Received
from iqbridge.redaction import redact
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
    #: Forgetting brokers: the groups that still have to acknowledge each entry.
    unacked: dict[int, set[str]] = field(default_factory=dict)
    #: Forgetting brokers: entries dropped on acknowledgement, kept only so a test can
    #: make the broker hand one over again as after a lost acknowledgement (inject).
    forgotten: dict[int, Envelope] = field(default_factory=dict)


class MemoryBroker:
    """The broker state behind one or more MemoryAdapter instances."""

    _named: ClassVar[dict[str, MemoryBroker]] = {}
    _named_lock = threading.Lock()

    def __init__(self, name: str = "", *, forget: bool = False) -> None:
        self.name = name
        self.forget = forget
        self.cond = threading.Condition()
        self.queues: dict[str, _Queue] = {}

    @classmethod
    def named(cls, name: str, *, forget: bool = False) -> MemoryBroker:
        """The process-wide broker of that name (a private one for "")."""
        if not name:
            return cls(forget=forget)
        with cls._named_lock:
            broker = cls._named.get(name)
            if broker is None:
                broker = cls._named[name] = cls(name, forget=forget)
            elif broker.forget != forget:
                raise ConfigurationError(
                    f"memory broker {name!r} is open with forget={str(broker.forget).lower()} "
                    f"in this process; open it with the same option or use another name"
                )
            return broker


_FORGETFUL = Capabilities(native_groups=True, read_by_ref=False, retains_after_ack=False)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class MemoryAdapter:
    """Adapter over a :class:`MemoryBroker`."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.capabilities = _FORGETFUL if broker.forget else Capabilities(native_groups=True)
        self.url = f"memory://{broker.name}" + ("?forget=true" if broker.forget else "")

    @classmethod
    def from_url(cls, url: str) -> MemoryAdapter:
        """``memory://`` (private) or ``memory://name`` (shared in this process), with
        ``?forget=true`` for a broker that forgets acknowledged entries."""
        parts = urlsplit(url)
        opts = dict(parse_qsl(parts.query, keep_blank_values=True))
        forget = opts.pop("forget", "false").lower()
        if parts.path not in ("", "/") or opts or forget not in _TRUE | _FALSE:
            raise ConfigurationError(
                f"memory URL takes a name and one option: memory://name?forget=true|false, "
                f"not {redact(url)!r}"
            )
        return cls(MemoryBroker.named(parts.netloc, forget=forget in _TRUE))

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
            q = self._queue(queue)
            log = q.log
            refs = []
            for env in envelopes:
                log.append(dataclasses.replace(env))
                refs.append(str(len(log) - 1))
                if self.broker.forget:
                    q.unacked[len(log) - 1] = set(env.groups or q.groups)
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
                self._acked(queue, group, int(ref))

    def _acked(self, queue: str, group: str, idx: int) -> None:
        """A forgetting broker drops an entry once its last group acknowledged it."""
        if not self.broker.forget:
            return
        q = self._queue(queue)
        waiting = q.unacked.get(idx)
        if waiting is None:
            return
        waiting.discard(group)
        if not waiting:
            del q.unacked[idx]
            env = q.log[idx]
            if env is not None:
                q.forgotten[idx] = env
            q.log[idx] = None

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
            self._acked(queue, group, int(ref))

    def read(self, queue: str, ref: str) -> Envelope | None:
        """The envelope at a reference, if still stored (never, on a forgetting broker)."""
        return self.read_many(queue, [ref])[0]

    def read_many(self, queue: str, refs: Sequence[str]) -> list[Envelope | None]:
        """The envelopes at several references, in order."""
        with self.broker.cond:
            log = self._queue(queue).log
            out: list[Envelope | None] = []
            for ref in refs:
                idx = int(ref)
                env = log[idx] if 0 <= idx < len(log) and not self.broker.forget else None
                out.append(dataclasses.replace(env) if env is not None else None)
            return out

    def delete(self, queue: str, refs: Sequence[str]) -> None:
        """Forget stored entries."""
        with self.broker.cond:
            q = self._queue(queue)
            for ref in refs:
                q.log[int(ref)] = None
                q.unacked.pop(int(ref), None)
                q.forgotten.pop(int(ref), None)

    def pending(self, queue: str, group: str) -> dict[str, str]:
        """Pending entries of a group: reference -> consumer (for tests and admin)."""
        with self.broker.cond:
            return {str(i): p.consumer for i, p in self._group(queue, group).pending.items()}

    def inject(self, queue: str, group: str, ref: str) -> None:
        """Deliver an entry to a group again even if it was acked (a broker redelivery,
        as after a lost acknowledgement; a forgetting broker gets the entry back)."""
        with self.broker.cond:
            q = self._queue(queue)
            idx = int(ref)
            if idx in q.forgotten:
                q.log[idx] = q.forgotten.pop(idx)
                q.unacked[idx] = {group}
            elif idx in q.unacked:
                q.unacked[idx].add(group)
            g = self._group(queue, group)
            g.pending.setdefault(int(ref), _Pending("", 0.0, 1))
            g.ready.append(int(ref))
            self.broker.cond.notify_all()

    # --- Inventory (reconciliation) ------------------------------------------------------

    def entries(self, queue: str) -> Iterator[Entry]:
        """Every entry still stored for the queue, oldest first."""
        with self.broker.cond:
            found = [(i, e.msg_id) for i, e in enumerate(self._queue(queue).log) if e is not None]
        for idx, msg_id in found:
            yield Entry(str(idx), msg_id)

    def unacked(self, queue: str, group: str) -> Unacked:
        """The group's pending entries and those past its read cursor."""
        with self.broker.cond:
            q = self._queue(queue)
            g = q.groups.get(group) or _Group()
            unread = {str(i) for i in range(g.cursor, len(q.log)) if q.log[i] is not None}
            return Unacked(frozenset(str(i) for i in g.pending), frozenset(unread))

    def redeliver(self, queue: str, group: str, ref: str) -> bool:
        """Make the group deliver an entry again, even if it acknowledged it."""
        self.inject(queue, group, ref)
        return True

    def close(self) -> None:
        """Nothing to release: the broker lives as long as the process."""
