"""A batch's writes (:class:`~iqbridge.writes.Writes`) committed to the Redis index store
in one script call (``stores/lua/writes.lua``), for :mod:`iqbridge.stores.redis`.

What records moved alike share (the index keys they enter and leave, the optional
fields they set and drop: their *shape*) is sent once per batch; each record sends
only what is its own (msg_id, versions, priority, the record, its due time and field
values). The templated journal goes as one head per group with the records' numbers,
and the script writes it per group in as few stream entries as fit, only for the
records whose compare-and-set held.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from iqbridge.engine_batch import ClaimPlan, SettlePlan
from iqbridge.ids import new_token
from iqbridge.model import MessageRecord, Retained
from iqbridge.states import SubscriberState
from iqbridge.stores.base import ClaimedRow, StaleRecord
from iqbridge.stores.codec import (
    JOURNAL_PER_ROW,
    encode,
    entries_to_json,
    record_json_around_size,
    record_to_json,
)
from iqbridge.stores.redis_commit import RedisCommits, members_apart
from iqbridge.writes import Writes

__all__ = ["RedisWrites"]

_Layout = tuple[list[str], list[str], int | None, dict[str, str]]
#: Messages per settle.lua call: their journal entries (at most three each) fit one
#: journal row.
_SETTLE_CHUNK = 5000
_DOUBT = (
    SubscriberState.GET.value,
    SubscriberState.FETCHED.value,
    SubscriberState.IN_PROCESS.value,
    SubscriberState.JOURNALLED.value,
)
_EMPTY: _Layout = ([], [], None, {})


class _Packer:
    """The arguments of one writes.lua call, built record by record."""

    __slots__ = ("due_key", "layout", "records", "shapes")

    def __init__(self, store: RedisWrites, queue: str) -> None:
        self.layout = store._layout
        self.due_key = f"{store.keyspace}d:{queue}"
        self.shapes: dict[tuple[Any, ...], int] = {}
        self.records: list[Any] = []

    def add(
        self,
        rec: MessageRecord,
        before: _Layout | None,
        expected: int,
        journal: Sequence[str] = (),
        entry: Sequence[bytes | str] = (),
        retain: Retained | None = None,
        prev: MessageRecord | None = None,
    ) -> None:
        """One record: created (``before`` None) or moved from the layout ``before``;
        moved from the record ``prev`` by the batch engine (new member objects for the
        members it moved, the others shared), a move that changed only members (and the
        publisher state) sends their rows, not the record JSON."""
        by_seq, by_claim, due, opt = self.layout(rec)
        old_seq, old_claim, old_due, old_opt = before if before is not None else _EMPTY
        ix = [*by_seq, *by_claim]
        if due is not None:
            ix.append(self.due_key)
        gone = [k for k in old_seq if k not in by_seq]
        gone += [k for k in old_claim if k not in by_claim]
        if old_due is not None and due is None:
            gone.append(self.due_key)
        key = (
            tuple(ix),
            tuple(k for k in by_seq if k not in old_seq),
            tuple(k for k in by_claim if k not in old_claim),
            tuple(gone),
            tuple(opt),
            tuple(n for n in old_opt if n not in opt),
        )
        shape = self.shapes.get(key)
        if shape is None:
            shape = self.shapes[key] = len(self.shapes) + 1
        rows = members_apart(prev, rec) if prev is not None else None
        self.records += [
            rec.msg_id,
            "1" if before is None else "0" if rows is None else "2",
            str(expected),
            str(rec.version),
            shape,
            str(rec.priority),
            rec.native_ref or "",
            record_to_json(rec) if rows is None else rows,
            str(due) if due is not None and due != old_due else "",
            str(rec.updated_at),
            *opt.values(),
            len(journal),
            *journal,
            len(entry),
            *entry,
        ]
        if retain is None:
            self.records.append(0)
        else:
            self.records += [2, bytes(retain.body), encode(dict(retain.headers))]

    def args(self) -> list[Any]:
        out: list[Any] = [len(self.shapes)]
        for ix, add_seq, add_claim, gone, opt, unset in self.shapes:
            out += [encode(list(ix)), len(add_seq), *add_seq, len(add_claim), *add_claim]
            out += [len(gone), *gone, len(opt) + 1, "u", *opt, len(unset), *unset]
        return out


class RedisWrites(RedisCommits):
    """:meth:`commit_writes` of :class:`~iqbridge.stores.redis.RedisStore`, and the
    co-located put of a batch (:meth:`commit_writes_with_entries`)."""

    def commit_writes(self, writes: Writes) -> list[bool]:
        """Commit a batch's writes in one script call: every record whose
        compare-and-set holds (a created one: whose msg_id is free), with its journal
        entries, the templated ones written per group; one flag per record, in the
        order created, moved, changes."""
        if not len(writes):
            return []
        seqs, _ = self._run_writes(writes, "each", None, ())
        return [seq > 0 for seq in seqs]

    def commit_writes_acking(
        self, writes: Writes, stream: str, acks: Sequence[tuple[int, str, str]]
    ) -> list[bool]:
        """:meth:`commit_writes`, and in the same script call ``XACK`` on ``stream`` (on
        this server) the entries of the records that hold: ``acks`` are (the record's
        position in the order created, moved, changes; the consumer group; the entry
        id)."""
        if not len(writes):
            return []
        seqs, _ = self._run_writes(writes, "each", stream, (), acks)
        return [seq > 0 for seq in seqs]

    def settle_held(
        self, queue: str, plan: SettlePlan, at: int, held: Sequence[tuple[str, str]]
    ) -> list[bool]:
        """Settle held messages (msg_id, lease token) of one subscriber where they live,
        as :meth:`settle_held_acking` does, with no broker entry to acknowledge (a
        broker that leaves delivery to the index; see
        :class:`~iqbridge.stores.base.SettlesHeld`)."""
        return self.settle_held_acking(
            queue, self._seq_key, plan, at, [(msg_id, token, "", "") for msg_id, token in held]
        )

    def settle_held_acking(
        self,
        queue: str,
        stream: str,
        plan: SettlePlan,
        at: int,
        held: Sequence[tuple[str, str, str, str]],
    ) -> list[bool]:
        """Settle held messages of one subscriber where they live (``stores/lua/settle.lua``):
        ``plan``'s moves, looked up in the transition table once, applied to each message
        whose member is in one of its states under the given token, the publisher
        journalled once every member is, the journal written per group, and the entries
        of what moved acknowledged on ``stream`` (on this server), in one script call per
        up to 5,000 messages. ``held`` is (msg_id, token, consumer group, entry id or "")
        per message (an entry is acknowledged by a done only); the client sends no record.
        One flag per message: settled, or left as it was (off the common path: for the
        per-message engine)."""
        if not held:
            return []
        head: list[Any] = [str(at), len(plan.moves)]
        for src, (dst, last, steps) in plan.moves.items():
            head += [src.value, dst.value, last.value if last else ""]
            head.append(",".join(encode(step) for step in steps))
        head.append(len(plan.publisher))
        for pub, (done, step) in plan.publisher.items():
            head += [pub.value, done.value, encode(step)[1:]]
        head += _DOUBT
        acking = plan.kind == "done"
        flags: list[bool] = []
        for i in range(0, len(held), _SETTLE_CHUNK):
            chunk = held[i : i + _SETTLE_CHUNK]
            write_id = new_token()
            args: list[Any] = [self.keyspace, write_id, self._done_ttl(), queue, plan.subscriber]
            args += head
            args.append(len(chunk))
            for msg_id, token, group, ref in chunk:
                # Only a done acknowledges its entry: one in process stays pending, for
                # the group to hand out again if its holder dies.
                args += (msg_id, token, group, ref if acking else "")
            result = self._run_keeping_reply(self._settle, [stream], args, write_id, _spaced)
            flags += [flag == "1" for flag in _text(result[1]).split(",")]
        return flags

    def claim_received(
        self,
        queue: str,
        plan: ClaimPlan,
        at: int,
        entries: Sequence[tuple[str, str, str]],
        tokens: Sequence[str],
    ) -> list[ClaimedRow | None]:
        """Claim the messages of a consumer group's broker entries where they live
        (``stores/lua/claim.lua``, the claim of the Redis Streams receive script applied
        to entries the client read from another broker), by ``plan``, in one script call
        per up to 5,000 entries; the client sends no record (see
        :class:`~iqbridge.stores.base.ClaimsReceived`)."""
        out: list[ClaimedRow | None] = []
        head = [
            queue,
            plan.subscriber,
            str(at),
            "" if plan.lease_until is None else str(plan.lease_until),
            plan.owner,
            plan.dst.value,
            orjson.dumps(plan.steps).decode(),
            plan.src.value,
            plan.revealed.value,
        ]
        taken = 0
        for i in range(0, len(entries), _SETTLE_CHUNK):
            chunk = entries[i : i + _SETTLE_CHUNK]
            mine = [tokens[taken + k] for k in range(len(chunk))]
            write_id = new_token()
            args: list[Any] = [self.keyspace, write_id, self._done_ttl(), *head, len(chunk)]
            for msg_id, ref, key in chunk:
                args += (msg_id, ref, key)
            args += mine
            keys = [self._seq_key]  # a key of the index's hash tag: the node that has them
            result = self._run_keeping_reply(self._claim, keys, args, write_id, _spaced)
            made = 0
            for (msg_id, ref, _), got in zip(chunk, _text(result[1]).split(","), strict=True):
                if got == "-":
                    out.append(None)
                    continue
                attempt, most = got.split(":")
                out.append((msg_id, ref, int(attempt), int(most), mine[made]))
                made += 1
            taken += made
        return out

    def commit_writes_with_entries(
        self, writes: Writes, stream: str, entries: Sequence[Sequence[bytes | str]]
    ) -> list[str]:
        """Create ``writes.created`` and ``XADD`` one entry each (flat field/value lists,
        in the same order) to ``stream`` on this server, in one script call, all or
        nothing; each record keeps its entry id as native ref. Returns the entry ids.
        Raises StaleRecord (nothing written) if a msg_id is taken."""
        if writes.moved or writes.changes:
            raise ValueError("a put with broker entries creates records only")
        if len(entries) != len(writes.created):
            raise ValueError(f"{len(entries)} broker entries for {len(writes.created)} records")
        if not writes.created:
            return []
        _, refs = self._run_writes(writes, "all", stream, entries)
        for rec, ref in zip(writes.created, refs, strict=True):
            rec.native_ref = ref
        return refs

    def put_with_entries(
        self,
        writes: Writes,
        stream: str,
        fields: tuple[str, str],
        kind_entries: Sequence[Sequence[bytes | str]],
        bodies: Sequence[bytes],
    ) -> list[str]:
        """Create ``writes.created`` and ``XADD`` one entry each to ``stream`` on this
        server, in one script call (``stores/lua/put.lua``), all or nothing; each record
        keeps its entry id as native ref. Returns the entry ids. Raises StaleRecord
        (nothing written) if a msg_id is taken.

        What records of one kind (``writes.kinds``) share goes once: each message sends
        its msg_id, size and body only. A message's entry is its body under
        ``fields[0]``, its msg_id under ``fields[1]``, then its kind's field/value values
        (``kind_entries``, by kind number). A put whose records are not all of a kind, or
        that keeps retained payload copies, goes through :meth:`commit_writes_with_entries`
        (the caller's choice)."""
        created = writes.created
        kinds = writes.kinds
        if writes.moved or writes.changes or writes.retain:
            raise ValueError("a put by kinds creates records only, without retained copies")
        if len(kinds) != len(created) or len(bodies) != len(created):
            raise ValueError(
                f"{len(kinds)} kinds and {len(bodies)} bodies for {len(created)} records"
            )
        if not created:
            return []
        queue = writes.queue
        group_of: dict[str, int] = {}
        heads: list[Any] = [len(writes.journal)]
        for g, group in enumerate(writes.journal, 1):
            steps = [[s.actor, s.kind, s.src, s.dst, s.detail] for s in group.steps]
            heads += [encode([group.at, steps])[:-1], len(steps)]
            for msg_id, tries in group.items:
                if tries != 1:
                    raise ValueError(f"message {msg_id} of a put is on attempt {tries}, not 1")
                group_of[msg_id] = g
        number: dict[int, int] = {}
        shared: list[Any] = []
        layout = self._layout
        due_key = f"{self.keyspace}d:{queue}"
        for rec, kind in zip(created, kinds, strict=True):
            if kind in number:
                continue
            if kind >= len(kind_entries) or kind < 0:
                raise ValueError(f"kind {kind} has no broker entry fields")
            number[kind] = len(number) + 1
            by_seq, by_claim, due, opt = layout(rec)
            ix = [*by_seq, *by_claim]
            if due is not None:
                ix.append(due_key)
            pre, post = record_json_around_size(rec)
            own = ["u", str(rec.updated_at)]
            for name, value in opt.items():
                own += [name, value]
            entry = kind_entries[kind]
            shared += [pre, post, str(rec.priority), "" if due is None else str(due)]
            shared += [encode(ix), len(by_seq), *by_seq, len(by_claim), *by_claim]
            shared += [len(own), *own, len(entry), *entry]
        write_id = new_token()
        args: list[Any] = [self.keyspace, write_id, self._done_ttl(), queue, *fields]
        args += heads
        args.append(len(number))
        args += shared
        args.append(len(created))
        for rec, kind, body in zip(created, kinds, bodies, strict=True):
            args += (rec.msg_id, number[kind], group_of.get(rec.msg_id, 0), rec.size, body)
        keys = [self._seq_key, stream]
        result: list[Any] = self._run_keeping_reply(self._put, keys, args, write_id, _spaced)
        if result[0] == "stale":
            raise StaleRecord(_text(result[1]))
        refs = _text(result[2]).split(",")
        for rec, seq, ref in zip(created, _text(result[1]).split(","), refs, strict=True):
            rec.seq = int(seq)
            rec.native_ref = ref
        return refs

    def _run_writes(
        self,
        writes: Writes,
        mode: str,
        stream: str | None,
        entries: Sequence[Sequence[bytes | str]],
        acks: Sequence[tuple[int, str, str]] = (),
    ) -> tuple[list[int], list[str]]:
        """Run writes.lua; each record's seq (0: it did not hold) and, with ``entries``,
        broker entry id."""
        put = bool(entries)
        queue = writes.queue
        pack = _Packer(self, queue)
        number: dict[str, int] = {}
        retain = writes.retain
        for i, rec in enumerate(writes.created):
            number.setdefault(rec.msg_id, i + 1)
            pack.add(
                rec,
                None,
                0,
                entry=entries[i] if put else (),
                retain=retain[i] if retain else None,
            )
        layout = self._layout
        base = len(writes.created)
        for i, (before, after) in enumerate(writes.moved):
            number.setdefault(after.msg_id, base + i + 1)
            pack.add(after, layout(before), before.version, prev=before)
        for change in writes.changes:
            if change.record.queue != queue:
                raise ValueError(
                    f"change of message {change.msg_id} is of queue {change.record.queue!r}, "
                    f"not {queue!r}"
                )
            old = change.before
            if old is None and not change.created:
                raise ValueError(
                    f"change of message {change.msg_id} lacks the record it started from "
                    f"(Change.before); make changes with iqbridge.engine"
                )
            own = change.journal
            pack.add(
                change.record,
                None if old is None or change.created else layout(old),
                change.expected_version,
                [
                    entries_to_json(own[i : i + JOURNAL_PER_ROW - 1])
                    for i in range(0, len(own), JOURNAL_PER_ROW - 1)
                ],
                retain=change.retain if change.created else None,
            )
        groups: list[Any] = []
        ngroups = 0
        for group in writes.journal:
            steps = [[s.actor, s.kind, s.src, s.dst, s.detail] for s in group.steps]
            items: list[Any] = []
            for msg_id, tries in group.items:
                n = number.get(msg_id)
                if n is not None:
                    items += [n, tries]
            if items:
                groups += [encode([group.at, steps])[:-1], len(steps), len(items) // 2, *items]
                ngroups += 1
        write_id = new_token()
        args: list[Any] = [self.keyspace, write_id, mode, self._done_ttl(), queue]
        args += pack.args()
        args.append(len(writes))
        args += pack.records
        args.append(ngroups)
        args += groups
        if acks:
            args.append(len(acks))
            for n, name, ref in acks:
                args += [n + 1, name, ref]
        keys = [self._seq_key] if stream is None else [self._seq_key, stream]
        result: list[Any] = self._run_keeping_reply(self._writes, keys, args, write_id, _spaced)
        if result[0] == "stale":
            raise StaleRecord(_text(result[1]))
        seqs = [int(seq) for seq in _text(result[1]).split(",")]
        refs = _text(result[2]).split(",") if put else []
        for rec, seq in zip(writes.created, seqs, strict=False):
            if seq > 0:
                rec.seq = seq
        base = len(writes.created) + len(writes.moved)
        for change, seq in zip(writes.changes, seqs[base:], strict=True):
            if seq > 0 and change.created:
                change.record.seq = seq
        return seqs, refs


def _spaced(kept: str) -> list[str]:
    """A reply writes.lua and settle.lua kept: its values joined by spaces."""
    return kept.split(" ")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
