"""What a batch of transitions writes, for an index store to commit in one go.

The batch engine (:mod:`iqbridge.engine_batch`) moves many messages at once. Most of
them make the same transitions at the same instant (every message of a put is PUT then
REVEALED to the same audience; every claim of a batch is GET then FETCHED; every done is
DONE then JOURNALLED): their journal entries are written as templates, one
:class:`Steps` for every message that made them, not one entry object per message per
transition. Messages off that common path (a pool member's claim, a lock, a lapsed
lease, a re-reveal...) come as ordinary per-message :class:`~iqbridge.engine.Change`\\ s.

A store commits a :class:`Writes` with :meth:`IndexStore.commit_writes
<iqbridge.stores.base.IndexStore.commit_writes>`: every record whose compare-and-set
holds (a created one: whose msg_id is free), and only their journal entries. Readers see
one entry per message per transition, as ever: :meth:`Writes.entries` expands the
templates in the order a store numbers them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from iqbridge.engine import Change
from iqbridge.model import JournalEntry, MessageRecord, Retained
from iqbridge.states import ActorKind

__all__ = ["Step", "Steps", "Writes"]


@dataclass(frozen=True, slots=True)
class Step:
    """One transition as a journal entry without its message: whose state machine moved
    (``actor``, ``kind``), from ``src`` to ``dst``, and why (``detail``)."""

    actor: str
    kind: ActorKind
    src: str | None
    dst: str
    detail: str | None = None


@dataclass(slots=True)
class Steps:
    """Transitions that several messages made alike at the instant ``at``: every message
    of ``items`` (msg_id, the member's attempt) made every step, in order. A publisher's
    step is on attempt 1, as the engine journals it."""

    at: int
    steps: tuple[Step, ...]
    items: list[tuple[str, int]] = field(default_factory=list)

    def entries(self, queue: str, msg_id: str, attempt: int) -> list[JournalEntry]:
        """The journal entries one message of this group made."""
        return [
            JournalEntry(
                msg_id,
                queue,
                s.actor,
                s.kind,
                s.src,
                s.dst,
                self.at,
                1 if s.kind is ActorKind.PUBLISHER else attempt,
                s.detail,
            )
            for s in self.steps
        ]


@dataclass(slots=True)
class Writes:
    """One batch's writes to the index of ``queue``.

    ``created`` are new records (version 1; ``retain`` holds their retained payload
    copies, in the same order, or is empty); ``moved`` pairs each moved record's state
    before with its state after (compare-and-set on the version before); ``journal``
    holds the journal entries of both as templates; ``changes`` are moves made one
    message at a time, with their own entries.

    ``kinds`` (empty, or one number per created record) says which created records are
    alike: records of one kind, made by one put with the same options, differ only in
    msg_id and size (and their broker envelopes only in msg_id and body), so a store
    may send what they share once (the Redis index's co-located put does)."""

    queue: str
    created: list[MessageRecord] = field(default_factory=list)
    retain: list[Retained | None] = field(default_factory=list)
    moved: list[tuple[MessageRecord, MessageRecord]] = field(default_factory=list)
    journal: list[Steps] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.created) + len(self.moved) + len(self.changes)

    def flat(self) -> Iterator[tuple[str, JournalEntry]]:
        """Every templated journal entry with its msg_id, in the order a store numbers
        them: group by group, message by message, step by step."""
        queue = self.queue
        for group in self.journal:
            for msg_id, attempt in group.items:
                for entry in group.entries(queue, msg_id, attempt):
                    yield msg_id, entry

    def entries(self) -> dict[str, list[JournalEntry]]:
        """The templated journal entries by msg_id."""
        out: dict[str, list[JournalEntry]] = {}
        for msg_id, entry in self.flat():
            out.setdefault(msg_id, []).append(entry)
        return out

    def as_changes(self) -> list[Change]:
        """The same writes as one :class:`~iqbridge.engine.Change` per message, in the
        order created, moved, changes (what a store without a batch form commits)."""
        entries = self.entries()
        out: list[Change] = []
        for i, rec in enumerate(self.created):
            out.append(
                Change(
                    rec,
                    entries.get(rec.msg_id, []),
                    0,
                    set(rec.members),
                    created=True,
                    retain=self.retain[i] if self.retain else None,
                )
            )
        for before, after in self.moved:
            dirty = {name for name, m in after.members.items() if m is not before.members.get(name)}
            out.append(
                Change(after, entries.get(after.msg_id, []), before.version, dirty, before=before)
            )
        out.extend(self.changes)
        return out
