"""In-process index store: dictionaries behind one lock. For tests and the memory:// adapter.

Records are copied in and out, so nobody can change stored state except through
:meth:`MemoryStore.commit`. Named stores (``memory://name``) are shared within a process.

Like the SQLite store it claims a consumer group's entries and settles a batch where it
keeps the messages (:class:`~iqbridge.stores.base.ClaimsReceived`,
:class:`~iqbridge.stores.base.SettlesHeld`), with the same common path and the same
answers: the facade then takes the same get and done paths over the memory:// broker as
over Kafka or RabbitMQ on a SQLite index, and the stateful tests check them. Its records
are objects already, so the batch engine moves them (the one transition table). It
claims no ready messages itself (:class:`~iqbridge.stores.base.ClaimsReady`): that
claim is undone when a payload turns out gone, and :meth:`MemoryStore.atomic` is a lock,
not a transaction to roll back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar

from iqbridge import engine_batch
from iqbridge.engine import Change
from iqbridge.engine_batch import ClaimPlan, SettlePlan
from iqbridge.errors import MessageNotFound
from iqbridge.model import (
    Filter,
    JournalEntry,
    MessageRecord,
    MessageSummary,
    Retained,
    Subscriptions,
)
from iqbridge.redaction import redact
from iqbridge.states import PublisherState, SubscriberState
from iqbridge.stores.base import AvailableQueries, ClaimedRow, PurgedMessage, StaleRecord
from iqbridge.stores.codec import matches, summary
from iqbridge.stores.row_moves import Claimed, claim_entries_in_order
from iqbridge.writes import Writes

__all__ = ["MemoryStore"]

_AVAILABLE = SubscriberState.AVAILABLE


class MemoryStore(AvailableQueries):
    """An index store in process memory. Thread-safe; not shared across processes."""

    _named: ClassVar[dict[str, MemoryStore]] = {}
    _named_lock = threading.Lock()

    def __init__(self, name: str = "") -> None:
        self.url = redact(f"memory://{name}")
        self._lock = threading.RLock()
        self._records: dict[str, MessageRecord] = {}
        self._by_queue: dict[str, dict[str, None]] = {}
        self._history: dict[str, list[JournalEntry]] = {}
        self._journal: list[JournalEntry] = []
        self._retained: dict[str, Retained] = {}
        self._subs: dict[str, Subscriptions] = {}
        self._seq = 0

    @classmethod
    def from_url(cls, url: str) -> MemoryStore:
        """``memory://`` (private) or ``memory://name`` (shared in this process)."""
        return cls.named(url.split("://", 1)[1].strip("/"))

    @classmethod
    def named(cls, name: str) -> MemoryStore:
        """The process-wide store of that name (a new anonymous one for "")."""
        if not name:
            return cls()
        with cls._named_lock:
            store = cls._named.get(name)
            if store is None:
                store = cls._named[name] = cls(name)
            return store

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """Hold the store's lock: the calls inside see and make one consistent change."""
        with self._lock:
            yield

    def commit(self, change: Change) -> None:
        """Apply one change with compare-and-set on the version."""
        with self._lock:
            self._check(change)
            self._apply(change)

    def commit_many(self, changes: Sequence[Change]) -> None:
        """Apply several changes, all or none."""
        with self._lock:
            for change in changes:
                self._check(change)
            for change in changes:
                self._apply(change)

    def commit_each(self, changes: Sequence[Change]) -> list[bool]:
        """Apply every change whose compare-and-set holds; skip the others."""
        with self._lock:
            seen: set[str] = set()
            applied: list[bool] = []
            for change in changes:
                ok = change.msg_id not in seen and self._current(change)
                seen.add(change.msg_id)
                if ok:
                    self._apply(change)
                applied.append(ok)
            return applied

    def commit_writes(self, writes: Writes) -> list[bool]:
        """Apply a batch's writes: every record whose compare-and-set holds, with its
        journal entries; one pass under the lock, no change objects."""
        if not len(writes):
            return []
        with self._lock:
            flags: list[bool] = []
            seen: set[str] = set()
            for rec in writes.created:
                ok = rec.msg_id not in seen and rec.msg_id not in self._records
                seen.add(rec.msg_id)
                flags.append(ok)
            for before, after in writes.moved:
                current = self._records.get(after.msg_id)
                ok = (
                    after.msg_id not in seen
                    and current is not None
                    and current.version == before.version
                )
                seen.add(after.msg_id)
                flags.append(ok)
            made = len(writes.created)
            held = {r.msg_id for r, ok in zip(writes.created, flags[:made], strict=True) if ok}
            held.update(
                a.msg_id for (_, a), ok in zip(writes.moved, flags[made:], strict=True) if ok
            )
            for i, rec in enumerate(writes.created):
                if rec.msg_id in held:
                    self._seq += 1
                    rec.seq = self._seq
                    self._by_queue.setdefault(rec.queue, {})[rec.msg_id] = None
                    self._history[rec.msg_id] = []
                    kept = writes.retain[i] if writes.retain else None
                    if kept is not None:
                        self._retained[rec.msg_id] = _copy(kept)
                    self._records[rec.msg_id] = rec.copy()
            for _, after in writes.moved:
                if after.msg_id in held:
                    after.native_ref = after.native_ref or self._records[after.msg_id].native_ref
                    self._records[after.msg_id] = after.copy()
            for msg_id, entry in writes.flat():
                if msg_id in held:
                    stored = entry._replace(seq=len(self._journal) + 1)
                    self._journal.append(stored)
                    self._history[msg_id].append(stored)
            for change in writes.changes:
                ok = change.msg_id not in seen and self._current(change)
                seen.add(change.msg_id)
                if ok:
                    self._apply(change)
                flags.append(ok)
            return flags

    def claim_received(
        self,
        queue: str,
        plan: ClaimPlan,
        at: int,
        entries: Sequence[tuple[str, str, str]],
        tokens: Sequence[str],
    ) -> list[ClaimedRow | None]:
        """Claim the messages of a consumer group's broker entries (see
        :class:`~iqbridge.stores.base.ClaimsReceived`)."""
        with self._lock:
            mine: list[MessageRecord] = []

            def pick(msg_id: str, ref: str, token: str) -> Claimed | None:
                rec = self._records.get(msg_id)
                if (
                    rec is None
                    or rec.queue != queue
                    or rec.native_ref != ref
                    or not _claimable(rec, plan, at, ref)
                ):
                    return None
                mine.append(rec)
                attempt = rec.members[plan.subscriber].attempt
                return Claimed(msg_id, ref, attempt, rec.max_attempts, token)

            picked = claim_entries_in_order(entries, tokens, pick)
            claimed = self._claim(queue, plan, at, mine, tokens)
            return [claimed[p.msg_id] if p is not None else None for p in picked]

    def _claim(
        self,
        queue: str,
        plan: ClaimPlan,
        at: int,
        recs: Sequence[MessageRecord],
        tokens: Sequence[str],
    ) -> dict[str, ClaimedRow]:
        """Claim ``recs`` (each on the common path, checked under the lock), the n-th
        under ``tokens[n]``, by the batch engine; their claims by msg_id."""
        if not recs:
            return {}
        mine = tokens[: len(recs)]
        moved, steps, off = engine_batch.claim(
            recs, plan.subscriber, at, mine, owner=plan.owner, lease_until=plan.lease_until
        )
        assert not off, "a record on the common path the batch engine would not claim"
        self.commit_writes(Writes(queue, moved=moved, journal=steps))
        return {
            b.msg_id: (
                b.msg_id,
                b.native_ref or "",
                b.members[plan.subscriber].attempt,
                b.max_attempts,
                token,
            )
            for (b, _), token in zip(moved, mine, strict=True)
        }

    def settle_held(
        self, queue: str, plan: SettlePlan, at: int, held: Sequence[tuple[str, str]]
    ) -> list[bool]:
        """Settle held messages of one subscriber by ``plan`` (see
        :class:`~iqbridge.stores.base.SettlesHeld`)."""
        sub = plan.subscriber
        with self._lock:
            picked: list[MessageRecord] = []
            flags: list[bool] = []
            seen: set[str] = set()
            for msg_id, token in held:
                rec = self._records.get(msg_id)
                m = rec.members.get(sub) if rec is not None else None
                ok = (
                    rec is not None
                    and m is not None
                    and msg_id not in seen
                    and rec.queue == queue
                    and rec.expires_at is None
                    and rec.lock_id is None
                    and m.state in plan.moves
                    and m.lease_token == token
                )
                seen.add(msg_id)
                if ok and rec is not None:
                    picked.append(rec)
                flags.append(ok)
            if picked:
                journals = any(last is not None for _, last, _ in plan.moves.values())
                moved, steps, off = engine_batch.settle(
                    picked,
                    sub,
                    [r.members[sub].lease_token for r in picked],
                    plan.kind,
                    at,
                    auto_journal=journals,
                )
                assert not off, "a held message the batch engine would not settle"
                self.commit_writes(Writes(queue, moved=moved, journal=steps))
            return flags

    def _current(self, change: Change) -> bool:
        current = self._records.get(change.msg_id)
        if change.created:
            return current is None
        return current is not None and current.version == change.expected_version

    def _check(self, change: Change) -> None:
        if not self._current(change):
            raise StaleRecord(change.msg_id)

    def _apply(self, change: Change) -> None:
        rec = change.record
        if change.created:
            self._seq += 1
            rec.seq = self._seq
            self._by_queue.setdefault(rec.queue, {})[rec.msg_id] = None
            self._history[rec.msg_id] = []
            if change.retain is not None:
                self._retained[rec.msg_id] = _copy(change.retain)
        else:
            rec.native_ref = rec.native_ref or self._records[rec.msg_id].native_ref
        self._records[rec.msg_id] = rec.copy()
        hist = self._history[rec.msg_id]
        for entry in change.journal:
            stored = entry._replace(seq=len(self._journal) + 1)
            self._journal.append(stored)
            hist.append(stored)

    def load(self, msg_id: str) -> MessageRecord:
        """A copy of the current record."""
        with self._lock:
            rec = self._records.get(msg_id)
            if rec is None:
                raise MessageNotFound(msg_id)
            return rec.copy()

    def load_many(self, msg_ids: Sequence[str]) -> dict[str, MessageRecord]:
        """Copies of the current records of the known ones of ``msg_ids``."""
        with self._lock:
            return {i: self._records[i].copy() for i in msg_ids if i in self._records}

    def set_native_ref(self, msg_id: str, native_ref: str) -> None:
        """Record where the payload lives."""
        with self._lock:
            rec = self._records.get(msg_id)
            if rec is None:
                raise MessageNotFound(msg_id)
            rec.native_ref = native_ref

    def set_native_refs(self, refs: Sequence[tuple[str, str]]) -> None:
        """Record where the payloads live; unknown ids are skipped."""
        with self._lock:
            for msg_id, native_ref in refs:
                rec = self._records.get(msg_id)
                if rec is not None:
                    rec.native_ref = native_ref

    def retained(self, msg_ids: Sequence[str]) -> dict[str, Retained]:
        """Copies of the retained payloads of those of ``msg_ids`` that have one."""
        with self._lock:
            return {i: _copy(self._retained[i]) for i in msg_ids if i in self._retained}

    def _ordered(self, queue: str) -> list[MessageRecord]:
        ids = self._by_queue.get(queue, {})
        return [self._records[i] for i in ids]

    def _available(
        self,
        queue: str,
        subscriber: str,
        now: int,
        limit: int,
        lock_id: str | None,
        min_attempt: int,
    ) -> list[str]:
        with self._lock:
            hits: list[tuple[int, int, str]] = []
            for rec in self._ordered(queue):
                m = rec.members.get(subscriber)
                if m is None or m.state is not _AVAILABLE or m.attempt < min_attempt:
                    continue
                if m.not_before is not None and m.not_before > now:
                    continue
                if rec.expires_at is not None and rec.expires_at <= now:
                    continue
                locked = rec.lock_id is not None and (
                    rec.lock_until is None or rec.lock_until > now
                )
                if (lock_id is None and locked) or (
                    lock_id is not None and (not locked or rec.lock_id != lock_id)
                ):
                    continue
                hits.append((-rec.priority, rec.seq or 0, rec.msg_id))
            hits.sort()
            return [h[2] for h in hits[:limit]]

    def due(self, queue: str | None, now: int, limit: int) -> list[str]:
        """Ids with a lapsed lease, time limit or browse lock."""
        with self._lock:
            out: list[str] = []
            recs = self._ordered(queue) if queue else list(self._records.values())
            for rec in recs:
                if _is_due(rec, now):
                    out.append(rec.msg_id)
                    if len(out) >= limit:
                        break
            return out

    def history(self, msg_id: str) -> list[JournalEntry]:
        """The message's journal entries."""
        with self._lock:
            if msg_id not in self._history:
                raise MessageNotFound(msg_id)
            return list(self._history[msg_id])

    def search(self, queue: str, flt: Filter) -> list[MessageSummary]:
        """Filter on index fields only."""
        with self._lock:
            out: list[MessageSummary] = []
            for rec in self._ordered(queue):
                if matches(rec, flt):
                    out.append(summary(rec))
                    if len(out) >= flt.limit:
                        break
            return out

    def journal(self, after: int = 0, limit: int = 1000) -> list[JournalEntry]:
        """Journal entries after a sequence number."""
        with self._lock:
            return self._journal[after : after + limit]

    def purge(
        self,
        queue: str,
        before: int,
        limit: int = 1000,
        ids: Sequence[str] | None = None,
    ) -> list[PurgedMessage]:
        """Drop journalled messages last changed before ``before`` (only ``ids``, if given)."""
        with self._lock:
            if ids is None:
                recs = self._ordered(queue)
            else:
                listed = self._by_queue.get(queue, {})
                recs = sorted(
                    (self._records[i] for i in dict.fromkeys(ids) if i in listed),
                    key=lambda r: r.seq or 0,
                )
            gone: list[PurgedMessage] = []
            for rec in recs:
                if len(gone) >= limit:
                    break
                if rec.publisher_state is PublisherState.JOURNALLED and rec.updated_at < before:
                    gone.append(PurgedMessage(rec.msg_id, rec.native_ref))
            for p in gone:
                del self._records[p.msg_id]
                del self._by_queue[queue][p.msg_id]
                self._retained.pop(p.msg_id, None)  # its history stays, as the journal does
            return gone

    def declare_queue(self, queue: str) -> None:
        """Make the queue known."""
        with self._lock:
            self._by_queue.setdefault(queue, {})
            self._subs.setdefault(queue, Subscriptions())

    def queues(self) -> list[str]:
        """Known queues."""
        with self._lock:
            return sorted(self._by_queue)

    def subscriptions(self, queue: str) -> Subscriptions:
        """Standing audience of a queue."""
        with self._lock:
            return self._subs.get(queue, Subscriptions())

    def set_subscriptions(self, queue: str, subs: Subscriptions) -> None:
        """Replace the standing audience."""
        with self._lock:
            self._by_queue.setdefault(queue, {})
            self._subs[queue] = subs

    def close(self) -> None:
        """Nothing to release."""


def _copy(retained: Retained) -> Retained:
    # Headers are a mapping the caller may still hold and change.
    return Retained(bytes(retained.body), dict(retained.headers))


def _is_due(rec: MessageRecord, now: int) -> bool:
    due = rec.due_at()
    return due is not None and due <= now


def _claimable(rec: MessageRecord, plan: ClaimPlan, at: int, ref: str | None) -> bool:
    """Whether a stored record is on a batch claim's common path, as the SQLite store
    decides it: the member AVAILABLE in no pool, the message REVEALED, no time limit, no
    browse lock (even a lapsed one), past any retry delay, its broker reference known."""
    m = rec.members.get(plan.subscriber)
    return (
        m is not None
        and m.pool is None
        and m.state is plan.src
        and rec.publisher_state is plan.revealed
        and rec.expires_at is None
        and rec.lock_id is None
        and ref is not None
        and (m.not_before is None or at >= m.not_before)
    )
