"""The side-index store contract.

A store persists what the engine decides; it never decides what is legal. It keeps the
message records (index fields and every subscriber's current state), the journal of
every transition, and each queue's standing subscriptions. Every store passes the shared
suite in :mod:`iqbridge.testing.store_contract`.

Atomicity: :meth:`IndexStore.commit` applies one :class:`~iqbridge.engine.Change` all
or nothing, and only if the record still has ``change.expected_version`` (compare-and-set);
otherwise it raises :class:`StaleRecord` and the caller re-reads and retries.
:meth:`IndexStore.atomic` groups several calls in one transaction where the store can
(SQLite, SQL); stores without interactive transactions return a no-op context and rely on
compare-and-set alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from iqbridge.engine import Change
from iqbridge.engine_batch import ClaimPlan, SettlePlan
from iqbridge.model import (
    Filter,
    JournalEntry,
    MessageRecord,
    MessageSummary,
    QueueCounts,
    Retained,
    Subscriptions,
)
from iqbridge.writes import Writes

__all__ = [
    "AvailableQueries",
    "BatchWrites",
    "ClaimedRow",
    "ClaimsReady",
    "ClaimsReceived",
    "Counting",
    "IndexStore",
    "LateJournal",
    "PurgedMessage",
    "SettlesHeld",
    "StaleRecord",
]


class StaleRecord(Exception):
    """The record changed since it was read; re-read and retry. Never escapes the facade."""

    def __init__(self, msg_id: str) -> None:
        self.msg_id = msg_id
        super().__init__(f"message {msg_id} changed concurrently")


class AvailableQueries:
    """``claimable`` and ``redeliverable`` for a store that answers both with one query,
    ``_available(queue, subscriber, now, limit, lock_id, min_attempt)``."""

    def _available(
        self,
        queue: str,
        subscriber: str,
        now: int,
        limit: int,
        lock_id: str | None,
        min_attempt: int,
    ) -> list[str]:
        raise NotImplementedError

    def claimable(
        self, queue: str, subscriber: str, now: int, limit: int, lock_id: str | None = None
    ) -> list[str]:
        """Available ids for a subscriber: priority first, then put order."""
        return self._available(queue, subscriber, now, limit, lock_id, 1)

    def redeliverable(self, queue: str, subscriber: str, now: int, limit: int) -> list[str]:
        """Available ids on attempt 2 or later."""
        return self._available(queue, subscriber, now, limit, None, 2)


class BatchWrites:
    """:meth:`IndexStore.commit_writes` as one :meth:`IndexStore.commit_each` of a change
    per message: what a store without a batch form of its own commits."""

    def commit_each(self, changes: Sequence[Change]) -> list[bool]:
        raise NotImplementedError

    def commit_writes(self, writes: Writes) -> list[bool]:
        """Commit a batch's writes (see :meth:`IndexStore.commit_writes`)."""
        # Through the class: one round trip, however a caller wraps the instance's methods.
        return type(self).commit_each(self, writes.as_changes()) if len(writes) else []


@dataclass(frozen=True, slots=True)
class PurgedMessage:
    """A message removed from the index by a purge, with where its payload lived."""

    msg_id: str
    native_ref: str | None


@runtime_checkable
class IndexStore(Protocol):
    """Where message states, histories and subscriptions live."""

    #: The store's URL with any password removed (safe to log).
    url: str

    def atomic(self) -> AbstractContextManager[None]:
        """Group the calls made inside in one transaction, where the store can."""
        ...

    def commit(self, change: Change) -> None:
        """Persist a change (a new message or a move) atomically, with compare-and-set.

        Raises StaleRecord if the stored version is no longer ``change.expected_version``,
        and leaves the store unchanged in that case. Assigns ``change.record.seq`` on insert.
        """
        ...

    def commit_many(self, changes: Sequence[Change]) -> None:
        """Commit several changes in one round trip where the store can; all or nothing."""
        ...

    def commit_each(self, changes: Sequence[Change]) -> list[bool]:
        """Commit, in one round trip (one transaction where the store has them), every
        change whose compare-and-set still holds, and skip the others.

        Returns one flag per change, in order: True when it was applied, False when its
        record no longer had ``change.expected_version`` (or, for a new message, existed
        already); a skipped change writes nothing, not even its journal entries. Never
        raises StaleRecord. Two changes of one message in one call: only the first can
        apply. This is the batch path (claims and settlements of many deliveries): a
        message another consumer won is simply left out.
        """
        ...

    def commit_writes(self, writes: Writes) -> list[bool]:
        """Commit a batch's writes (:class:`~iqbridge.writes.Writes`) in one round trip
        (one transaction where the store has them), as :meth:`commit_each` does: every
        record whose compare-and-set holds (a created one: whose msg_id is free), with
        its journal entries; the others write nothing.

        Returns one flag per record, in the order ``created``, ``moved``, ``changes``.
        Journal entries are numbered in the order :meth:`Writes.flat
        <iqbridge.writes.Writes.flat>` gives them, after those of ``changes``' or before
        them as the store's layout prefers, each message's in order."""
        ...

    def load(self, msg_id: str) -> MessageRecord:
        """The current record; raises MessageNotFound."""
        ...

    def load_many(self, msg_ids: Sequence[str]) -> dict[str, MessageRecord]:
        """The current records of several messages in one round trip, by msg_id; ids the
        store does not know are left out."""
        ...

    def set_native_ref(self, msg_id: str, native_ref: str) -> None:
        """Record where the broker keeps the payload (not a state change)."""
        ...

    def set_native_refs(self, refs: Sequence[tuple[str, str]]) -> None:
        """:meth:`set_native_ref` for several ``(msg_id, native_ref)`` pairs in one round
        trip; ids the store does not know are skipped."""
        ...

    def retained(self, msg_ids: Sequence[str]) -> dict[str, Retained]:
        """The retained payload copies (:attr:`Change.retain` of the messages' creation)
        of several messages in one round trip, by msg_id; messages put without one, or
        unknown, are left out. Purge removes a message's copy with its record."""
        ...

    def claimable(
        self, queue: str, subscriber: str, now: int, limit: int, lock_id: str | None = None
    ) -> list[str]:
        """Ids AVAILABLE to ``subscriber`` now, in delivery order (priority desc, put order).

        Excludes members delayed past ``now`` and messages whose time limit passed.
        Without ``lock_id`` excludes browse-locked messages; with it, returns only
        messages locked under it. ``min_attempt`` > 1 returns only redeliveries.
        """
        ...

    def redeliverable(self, queue: str, subscriber: str, now: int, limit: int) -> list[str]:
        """Like :meth:`claimable`, restricted to members on attempt 2 or later."""
        ...

    def due(self, queue: str | None, now: int, limit: int) -> list[str]:
        """Ids with something time has made due: a lapsed lease, time limit or lock."""
        ...

    def history(self, msg_id: str) -> list[JournalEntry]:
        """Every journal entry of one message, in order."""
        ...

    def search(self, queue: str, flt: Filter) -> list[MessageSummary]:
        """Messages matching the filter, from index fields only, in put order."""
        ...

    def journal(self, after: int = 0, limit: int = 1000) -> list[JournalEntry]:
        """Journal entries with ``seq`` greater than ``after``, oldest first."""
        ...

    def purge(
        self,
        queue: str,
        before: int,
        limit: int = 1000,
        ids: Sequence[str] | None = None,
    ) -> list[PurgedMessage]:
        """Delete messages of ``queue`` whose publisher is JOURNALLED and whose record was
        last changed (``updated_at``) before ``before``: at most ``limit`` of them, the
        oldest in put order first; returns them, in put order.

        With ``ids``, only those messages are considered (a purge plan's list): the same
        rule applies to each, and ids the store does not know, ids of another queue and
        repeated ids are ignored (an empty list purges nothing). The check and the delete
        are one step, so a message moved out of JOURNALLED meanwhile (re-revealed) stays.
        The journal is kept (it is the audit trail and the analytics source); the
        message's retained payload copy goes with its record.
        """
        ...

    def declare_queue(self, queue: str) -> None:
        """Make the queue known (idempotent)."""
        ...

    def queues(self) -> list[str]:
        """Every known queue name."""
        ...

    def subscriptions(self, queue: str) -> Subscriptions:
        """The queue's standing audience."""
        ...

    def set_subscriptions(self, queue: str, subs: Subscriptions) -> None:
        """Replace the queue's standing audience."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


@runtime_checkable
class ClaimsReady(Protocol):
    """A store that claims a subscriber's ready messages where it keeps them, by a plan
    the client looked up in the transition table once for the batch
    (:func:`iqbridge.engine_batch.claim_plan`), without a record or change object per
    message: the facade's get path for brokers that leave delivery to the index and
    hand payloads over by reference (the embedded SQLite queue)."""

    def claim_ready(
        self, queue: str, plan: ClaimPlan, at: int, tokens: Sequence[str]
    ) -> tuple[Sequence[ClaimedRow], list[str]]:
        """Claim, in one transaction, up to ``len(tokens)`` of ``plan.subscriber``'s
        ready messages of ``queue`` at ``at`` (µs), in claim order (priority, then put
        order), the n-th under ``tokens[n]``: the member moved as ``plan`` says, the
        journal written per batch. Returns the claims (msg_id, native ref, attempt, max
        attempts, token) and the msg_ids of ready messages read but off the common path
        (a pool, a time limit, a browse lock, a retry delay...), for the per-message
        engine.

        Called inside the store's :meth:`~IndexStore.atomic`, the claim is undone with
        it (the facade rolls a claim back when a payload turns out gone): only a store
        whose ``atomic()`` is a transaction may offer this."""
        ...


@runtime_checkable
class ClaimsReceived(Protocol):
    """A store that claims the messages of broker entries a subscriber's own consumer
    group delivered where it keeps them, by a plan the client looked up in the
    transition table once for the batch (:func:`iqbridge.engine_batch.claim_plan`),
    without a record or change object per message: the facade's get path for brokers
    with native consumer groups and an index apart from them (Kafka, RabbitMQ, ... on a
    SQLite index)."""

    def claim_received(
        self,
        queue: str,
        plan: ClaimPlan,
        at: int,
        entries: Sequence[tuple[str, str, str]],
        tokens: Sequence[str],
    ) -> list[ClaimedRow | None]:
        """Claim, in one transaction, the messages of ``entries`` (msg_id, broker
        reference, ordering key; in the order the broker delivered them) for
        ``plan.subscriber`` at ``at`` (µs), the n-th claim under ``tokens[n]``: the
        member moved as ``plan`` says, the journal written per batch. Returns, per
        entry, its claim (msg_id, native ref, attempt, max attempts, token), or None
        when the entry is off the common path (no record, another queue's, a second
        entry of one message, a broker reference the index does not know it by, a
        pool, a time limit, a browse lock, a retry delay, another state...) or comes
        after such an entry of its ordering key: those are for the per-message path,
        in order."""
        ...


#: One claim of :meth:`ClaimsReady.claim_ready`: msg_id, native ref, the member's
#: attempt, the message's max attempts, the lease token.
ClaimedRow = tuple[str, str, int, int, str]


@runtime_checkable
class SettlesHeld(Protocol):
    """A store that settles a batch of held messages where it keeps them, by a plan the
    client looked up in the transition table once for the batch
    (:func:`iqbridge.engine_batch.settle_plan`), without a record or change object per
    message: the facade's done and in-process path for brokers that leave delivery to
    the index (SQLite, Redis)."""

    def settle_held(
        self, queue: str, plan: SettlePlan, at: int, held: Sequence[tuple[str, str]]
    ) -> list[bool]:
        """Move each of ``held`` (msg_id, lease token) whose ``plan.subscriber`` member is
        in one of ``plan``'s states under that token as ``plan`` says, at ``at`` (µs),
        the publisher journalled once every member is, the journal written per batch, in
        one transaction (or script call). One flag per message: moved, or left as it was
        (off the common path: another state or holder, a time limit, a browse lock), for
        the per-message engine to decide."""
        ...


@runtime_checkable
class Counting(Protocol):
    """A store that counts a queue's states with one query of its own, instead of the
    facade tallying every search result (:meth:`iqbridge.queue.Queue.counts`)."""

    def counts(self, queue: str) -> QueueCounts:
        """Messages per publisher state, members per subscriber and state, and each
        subscriber's oldest message still to process."""
        ...


@runtime_checkable
class LateJournal(Protocol):
    """A store whose journal sequence numbers are handed out when a transaction writes,
    not when it commits (the SQL store's identity column): an entry can commit after a
    later one, behind a reader's cursor. A reader that must miss nothing (the metrics'
    journal tail) re-reads the gaps it saw for ``journal_settle_seconds``."""

    #: How long a gap in the sequence may still fill (a transaction's longest life).
    journal_settle_seconds: float
