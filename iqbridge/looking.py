"""Looking without getting: state, search, peek, browse with lock."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from iqbridge import engine
from iqbridge.adapter import LocksNatively
from iqbridge.durations import to_seconds
from iqbridge.engine import Change
from iqbridge.errors import (
    InvalidArgument,
    IQError,
    LockedError,
    MessageNotFound,
    PayloadNotRetained,
)
from iqbridge.ids import new_token
from iqbridge.model import (
    Envelope,
    Filter,
    MessageRecord,
    MessageState,
    MessageSummary,
    QueueCounts,
    SubscriberView,
    from_micros,
    tally,
)
from iqbridge.queue_core import Part
from iqbridge.redaction import get_logger
from iqbridge.states import ActorKind, PublisherState, SubscriberState
from iqbridge.stores.base import Counting

#: A search limit that means "every match" (stores without a counting query).
_ALL = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Browse:
    """What a browse found; with ``lock_id`` when the messages were locked for the caller."""

    messages: list[MessageSummary]
    lock_id: str | None = None


__all__ = ["Looking"]

log = get_logger("iqbridge")


class Looking(Part):
    """Looking without getting: state, search, peek, and browse with lock.

    One part of :class:`~iqbridge.queue.Queue`."""

    def state(self, msg_id: str) -> MessageState:
        """The publisher's and every subscriber's state and history, with timestamps."""
        rec = self._store.load(msg_id)
        if rec.queue != self.name:
            raise MessageNotFound(msg_id, self.name, rec.queue)
        journal = self._store.history(msg_id)
        pub_hist = tuple(
            (PublisherState(e.dst), from_micros(e.at))
            for e in journal
            if e.actor_kind is ActorKind.PUBLISHER
        )
        views: dict[str, SubscriberView] = {}
        for name, m in rec.members.items():
            hist = tuple(
                (SubscriberState(e.dst), from_micros(e.at))
                for e in journal
                if e.actor_kind is ActorKind.SUBSCRIBER and e.actor == name
            )
            views[name] = SubscriberView(
                subscriber=name,
                pool=m.pool,
                state=m.state,
                history=hist,
                attempt=m.attempt,
                reason=m.reason,
                lease_owner=m.lease_owner,
                lease_until=from_micros(m.lease_until) if m.lease_until else None,
            )
        return MessageState(
            msg_id=rec.msg_id,
            queue=rec.queue,
            publisher=rec.publisher,
            mode=rec.mode,
            correlation_id=rec.correlation_id,
            priority=rec.priority,
            parents=rec.parents,
            publisher_state=rec.publisher_state,
            publisher_history=pub_hist,
            subscribers=views,
            journal=tuple(journal),
        )

    def search(self, /, flt: Filter | None = None, **criteria: object) -> list[MessageSummary]:
        """Messages matching a :class:`~iqbridge.model.Filter` (or its fields as keywords),
        answered from the index without reading payloads."""
        if flt is None:
            try:
                flt = Filter(**criteria)  # type: ignore[arg-type]
            except TypeError as exc:
                raise InvalidArgument(f"bad search criteria: {exc}") from None
        elif criteria:
            raise InvalidArgument("pass a Filter or keyword criteria, not both")
        return self._store.search(self.name, flt)

    def counts(self) -> QueueCounts:
        """How many messages are in each publisher and subscriber state, and each
        subscriber's oldest message still to process, from the index (no payloads)."""
        store = self._store
        if isinstance(store, Counting):
            return store.counts(self.name)
        return tally(self.name, store.search(self.name, Filter(limit=_ALL)))

    def peek(self, msg_id: str) -> Envelope:
        """The stored payload and envelope of a message, without changing any state."""
        rec = self._store.load(msg_id)
        if rec.queue != self.name:
            raise MessageNotFound(msg_id, self.name, rec.queue)
        env = self._envelopes([rec]).get(msg_id)
        if env is None:
            if self._adapter.capabilities.forgets:
                raise PayloadNotRetained(msg_id, self.name, self._adapter.url, "peek at")
            raise MessageNotFound(msg_id, self.name)
        return env

    def browse(
        self,
        /,
        flt: Filter | None = None,
        *,
        lock: bool = False,
        owner: str | None = None,
        lock_for: float | timedelta = 60.0,
        **criteria: object,
    ) -> Browse:
        """Find messages; with ``lock=True`` also lock them for the caller.

        Locked messages are hidden from every get except ``get(..., lock_id=...)`` until
        :meth:`unlock`, a get under the lock, or ``lock_for`` seconds pass. Messages
        already locked by someone else are left out of a locking browse.
        """
        found = self.search(flt, **criteria)
        if not lock:
            return Browse(found)
        lock_id = new_token()
        until_s = to_seconds(lock_for, "lock_for")
        who = owner or self.hub.client_id
        locked: list[MessageSummary] = []
        for item in found:

            def op(r: MessageRecord) -> Change:
                now = self._now()
                until = now + int(until_s * 1_000_000) if until_s is not None else None
                return engine.lock(r, lock_id, who, now, until)

            try:
                self._apply(item.msg_id, op)
            except LockedError:
                continue
            locked.append(item)
        if locked and isinstance(self._adapter, LocksNatively):
            self._lock_natively(self._adapter, lock_id, [i.msg_id for i in locked], until_s)
        return Browse(locked, lock_id)

    def _lock_natively(
        self, adapter: LocksNatively, lock_id: str, ids: list[str], lock_for: float | None
    ) -> None:
        """Lock the broker's entries of the messages too, for each group still to get
        them (IBM MQ: plain MQ clients then pass them by as well)."""
        entries: list[tuple[str, str]] = []
        for rec in self._store.load_many(ids).values():
            if rec.native_ref is None:
                continue
            for subscriber, member in rec.members.items():
                if member.state is SubscriberState.AVAILABLE:
                    entry = (self._group_of(rec, subscriber), rec.native_ref)
                    if entry not in entries:
                        entries.append(entry)
        until = None if lock_for is None else self._now() + int(lock_for * 1_000_000)
        try:
            if adapter.lock_natively(self.name, entries, lock_id, lock_for):
                self.hub.native_locks[(self.name, lock_id)] = until
        except IQError as exc:
            log.warning(
                "queue %s: browse lock %s held in the index only: %s", self.name, lock_id, exc
            )

    def unlock(self, lock_id: str) -> int:
        """Release every message locked under ``lock_id``; return how many."""
        if (self.name, lock_id) in self.hub.native_locks:
            self.hub.native_locks.pop((self.name, lock_id), None)
            assert isinstance(self._adapter, LocksNatively)
            self._adapter.unlock_natively(self.name, lock_id)
        count = 0
        for item in self._store.search(self.name, Filter(lock_id=lock_id, limit=100_000)):
            try:
                change = self._apply(item.msg_id, lambda r: engine.unlock(r, lock_id, self._now()))
            except LockedError:
                continue
            if change is not None:
                self._wake(change.record)
            count += 1
        if count:
            self.hub.notify()
        return count
