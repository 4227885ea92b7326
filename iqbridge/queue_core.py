"""What every part of the queue facade shares: the queue's options, the read-decide-commit
loop every state change goes through, the subscription cache and the broker calls that
follow a change.

A :class:`~iqbridge.queue.Queue` is a composition: one :class:`QueueCore` and the parts
that hold it (:mod:`iqbridge.subscribing`, :mod:`iqbridge.putting`,
:mod:`iqbridge.getting`, :mod:`iqbridge.settling`, :mod:`iqbridge.looking`,
:mod:`iqbridge.housekeeping`), each a :class:`Part`: an object over the core, not a base
class of the queue. The core knows the hub only through :class:`HubLink`, so nothing
here imports the hub.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from iqbridge.adapter import Adapter, Colocated, Fenced, Probing
from iqbridge.engine import Change
from iqbridge.errors import ConcurrentUpdate, IQError, MessageNotFound
from iqbridge.model import Envelope, MessageRecord, Subscriptions
from iqbridge.redaction import get_logger
from iqbridge.retry import RetryPolicy
from iqbridge.states import SubscriberState
from iqbridge.stores.base import IndexStore, StaleRecord

__all__ = ["HubLink", "OverCore", "Part", "QueueCore"]

log = get_logger("iqbridge")

CAS_ATTEMPTS = 50
CLAIM_BATCH = 4
_SUBS_TTL = 1.0


class HubLink(Protocol):
    """What a queue needs of its :class:`~iqbridge.hub.Hub`."""

    adapter: Adapter
    store: IndexStore
    client_id: str
    publisher: str
    redeliveries: set[tuple[str, str]]
    native_locks: dict[tuple[str, str], int | None]
    shares_transaction: bool
    colocated: Colocated | None

    def now_us(self) -> int:
        """Now, in microseconds since the epoch."""
        ...

    def notify(self) -> None:
        """Wake this process's waiting getters."""
        ...

    def wait(self, timeout: float) -> None:
        """Sleep until notified or ``timeout`` seconds."""
        ...


class QueueCore:
    """The state and plumbing one queue's parts share (see the module documentation)."""

    def __init__(
        self,
        hub: HubLink,
        name: str,
        *,
        retry: RetryPolicy,
        lease: float,
        max_bytes: int,
        auto_journal: bool,
        sweep_interval: float,
        retain: bool | None = None,
    ) -> None:
        self.hub = hub
        self.name = name
        self.retry = retry
        self.lease = lease
        self.max_bytes = max_bytes
        self.auto_journal = auto_journal
        self.sweep_interval = sweep_interval
        self.store = hub.store
        self.adapter = hub.adapter
        self.native = hub.adapter.capabilities.native_groups
        self.shared_txn = hub.shares_transaction
        self._subs: Subscriptions | None = None
        self._subs_at = 0.0
        self._declared: set[str] = set()
        forgets = hub.adapter.capabilities.forgets
        #: Puts keep a copy of each payload beside the index (the broker forgets them).
        self.retain = forgets if retain is None else retain
        self.reads_by_ref = hub.adapter.capabilities.read_by_ref
        #: The adapter fences ordering keys (Kafka), asked once, not on every get.
        self.fenced: Fenced | None = hub.adapter if isinstance(hub.adapter, Fenced) else None
        #: The adapter can say which in-doubt puts reached the broker.
        self.probing: Probing | None = hub.adapter if isinstance(hub.adapter, Probing) else None

    def now(self) -> int:
        """Now, in microseconds since the epoch, on the hub's clock."""
        return self.hub.now_us()

    def apply(
        self,
        msg_id: str,
        op: Callable[[MessageRecord], Change | None],
        hint: MessageRecord | None = None,
    ) -> Change | None:
        """Read, let the engine decide, commit with compare-and-set; retry on a lost race.

        ``hint`` is a record the caller already holds (a delivery's own last change): it
        saves the read when nothing changed meanwhile; if it is stale, compare-and-set
        fails or the engine refuses, and the decision is made again on a fresh read.
        """
        store = self.store
        for _ in range(CAS_ATTEMPTS):
            with store.atomic():
                if hint is not None:
                    rec, hint = hint, None
                    try:
                        change = op(rec)
                    except IQError:
                        continue
                else:
                    rec = store.load(msg_id)
                    if rec.queue != self.name:
                        raise MessageNotFound(msg_id, self.name, rec.queue)
                    change = op(rec)
                if change is None:
                    return None
                try:
                    store.commit(change)
                except StaleRecord:
                    continue
                self.note_redeliveries(change.record)
                return change
        raise ConcurrentUpdate(msg_id, CAS_ATTEMPTS)

    def note_redeliveries(self, rec: MessageRecord) -> None:
        """Native-group brokers: a member given back (released, reopened, re-revealed,
        lease lapsed) is found through the index; its subscriber's next get asks at once."""
        if self.native:
            for m in rec.members.values():
                if m.attempt > 1 and m.state is SubscriberState.AVAILABLE:
                    self.hub.redeliveries.add((self.name, m.subscriber))

    def envelopes(self, recs: Sequence[MessageRecord]) -> dict[str, Envelope]:
        """The payloads of several messages by msg_id: read by reference from the broker
        in one call where it can, else (or where it no longer has one) from the retained
        copies beside the index, in one more call. Messages found in neither are left out."""
        out: dict[str, Envelope] = {}
        if self.reads_by_ref:
            refd = [r for r in recs if r.native_ref]
            if refd:
                envs = self.adapter.read_many(self.name, [r.native_ref or "" for r in refd])
                for rec, env in zip(refd, envs, strict=True):
                    if env is not None:
                        out[rec.msg_id] = env
        missing = [r for r in recs if r.msg_id not in out]
        if missing:
            kept = self.store.retained([r.msg_id for r in missing])
            for rec in missing:
                copy = kept.get(rec.msg_id)
                if copy is not None:
                    out[rec.msg_id] = rec.envelope(copy)
        return out

    def subscriptions(self, fresh: bool = False) -> Subscriptions:
        """The queue's standing subscriptions, from a cache at most a second old (or
        read now, ``fresh``)."""
        now = time.monotonic()
        if fresh or self._subs is None or now - self._subs_at > _SUBS_TTL:
            self._subs = self.store.subscriptions(self.name)
            self._subs_at = now
        return self._subs

    def cached(self, subs: Subscriptions) -> None:
        """Subscriptions just written: the cache holds them from now."""
        self._subs, self._subs_at = subs, time.monotonic()

    def declare_groups(self, groups: Iterable[str]) -> None:
        """Declare on the broker the consumer groups this process has not yet declared."""
        missing = [g for g in groups if g not in self._declared]
        if missing:
            self.adapter.declare(self.name, missing)
            self._declared.update(missing)

    def group_of(self, rec: MessageRecord, subscriber: str) -> str:
        """The consumer group ``subscriber`` reads ``rec`` through: its pool or itself."""
        member = rec.members[subscriber]
        return member.pool or member.subscriber

    def wake(self, rec: MessageRecord) -> None:
        """Requeue on the broker what it handed out while the index hid the message.

        A native-group broker keeps an entry the facade declined (put awaiting confirm,
        browse-locked) pending with the consumer that read it and never hands it to that
        consumer again; once members are AVAILABLE, their groups must see it again.
        """
        ref = rec.native_ref
        if not self.native or ref is None:
            return
        groups = {
            m.pool or m.subscriber
            for m in rec.members.values()
            if m.state is SubscriberState.AVAILABLE
        }
        for group in sorted(groups):
            self.broker_call(functools.partial(self.adapter.requeue, self.name, group, ref))

    def broker_call(self, call: Callable[[], object]) -> None:
        """Tell the broker of an outcome the index already holds. If the broker cannot
        be told now, the failure is logged: its redelivery is recognised later
        (once-only) and acknowledged then."""
        try:
            call()
        except IQError as exc:
            log.warning("queue %s: broker acknowledgement deferred: %s", self.name, exc)


class OverCore:
    """An object over one queue's :class:`QueueCore` that shows the queue's options: the
    queue itself and each of its parts."""

    def __init__(self, core: QueueCore) -> None:
        self.core = core
        self.hub = core.hub
        self.name = core.name
        self.retry = core.retry
        self.lease = core.lease
        self.max_bytes = core.max_bytes
        self.auto_journal = core.auto_journal
        self.sweep_interval = core.sweep_interval
        #: Puts keep a copy of each payload beside the index (the broker forgets them).
        self.retain = core.retain


class Part(OverCore):
    """One part of a queue: an object over the queue's :class:`QueueCore`, naming the
    core's members it uses (the parts never inherit from one another)."""

    def __init__(self, core: QueueCore) -> None:
        super().__init__(core)
        self._store = core.store
        self._adapter = core.adapter
        self._native = core.native
        self._shared_txn = core.shared_txn
        self._reads_by_ref = core.reads_by_ref
        self._fenced = core.fenced
        self._probing = core.probing
        self._now = core.now
        self._apply = core.apply
        self._note_redeliveries = core.note_redeliveries
        self._envelopes = core.envelopes
        self._subscriptions = core.subscriptions
        self._declare_groups = core.declare_groups
        self._group_of = core.group_of
        self._wake = core.wake
        self._broker_call = core.broker_call
