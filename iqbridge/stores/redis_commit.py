"""The writes of the Redis index store (:mod:`iqbridge.stores.redis`): a change, or a
batch, turned into the arguments of ``stores/lua/commit.lua`` (the record, its index
entries before and after, journal rows, a retained payload copy, a co-located broker
entry), sent in one script call; the check, after a lost reply, of whether a commit had
applied; and native refs."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from iqbridge.engine import Change
from iqbridge.errors import MessageNotFound
from iqbridge.ids import new_token
from iqbridge.model import MessageRecord
from iqbridge.states import SubscriberState
from iqbridge.stores.base import StaleRecord
from iqbridge.stores.codec import (
    JOURNAL_PER_ROW,
    encode,
    entries_to_json,
    member_row_json,
    record_fixed,
    record_to_json,
)
from iqbridge.stores.redis_base import RedisStoreBase

__all__ = ["RedisCommits"]

_AVAILABLE = SubscriberState.AVAILABLE


def _retain_args(change: Change) -> list[Any]:
    """commit.lua's values for a new message's retained payload copy (none otherwise)."""
    kept = change.retain
    if kept is None or not change.created:
        return [0]
    return [2, bytes(kept.body), encode(dict(kept.headers))]


class RedisCommits(RedisStoreBase):
    """Writes of :class:`~iqbridge.stores.redis.RedisStore`."""

    # --- writes ------------------------------------------------------------------------

    def atomic(self) -> nullcontext[None]:
        """A no-op: Redis has no interactive transactions; compare-and-set suffices."""
        return nullcontext()

    def commit(self, change: Change) -> None:
        """Persist one change with compare-and-set (one script call)."""
        self.commit_many((change,))

    def commit_many(self, changes: Sequence[Change]) -> None:
        """Persist several changes in one script call, all or none."""
        self._commit_batch(changes, None, ())

    def commit_with_entries(
        self,
        changes: Sequence[Change],
        stream: str,
        entries: Sequence[Sequence[bytes | str]],
    ) -> list[str]:
        """Commit new messages and ``XADD`` one entry each (flat field/value lists) to
        ``stream`` on this server, in one script call: the records and the entries appear
        together or not at all, and each record keeps its entry id as native ref.

        Returns the entry ids. Raises StaleRecord (nothing written) if a record exists.
        """
        return self._commit_batch(changes, stream, entries)

    def commit_each(self, changes: Sequence[Change]) -> list[bool]:
        """Persist, in one script call, every change whose compare-and-set holds (a new
        message: whose msg_id is not taken); skip the others, and later changes of a
        message already in the batch. One flag per change: applied or not.

        The script keeps its reply under ``done:<write id>`` for a while, so a retry
        after a lost reply reads what was applied instead of committing again; when the
        reply is not there, the script never ran and runs again.
        """
        if not changes:
            return []
        if len(changes) == 1:
            # One change applies or not either way: the all-or-nothing commit, which
            # recognises a lost reply from the record itself, without a reply to keep.
            try:
                self.commit_many(changes)
            except StaleRecord:
                return [False]
            return [True]
        write_id = new_token()
        args: list[Any] = [self.keyspace, write_id, "each", self._done_ttl(), len(changes)]
        for change in changes:
            args += self._change_args(change)
        result = self._run_keeping_reply(
            self._commit, [self._seq_key], args, write_id, lambda kept: ["ok", *kept.split(",")]
        )
        applied: list[bool] = []
        for change, seq in zip(changes, result[1 : 1 + len(changes)], strict=True):
            ok = int(seq) > 0
            if ok and change.created:
                change.record.seq = int(seq)
            applied.append(ok)
        return applied

    def _done_ttl(self) -> int:
        """Seconds to keep a commit_each reply: longer than a call's retries can last."""
        if self.retry_for is None:
            return 120
        return max(120, int(self.retry_for) + 60)

    def _commit_batch(
        self,
        changes: Sequence[Change],
        stream: str | None,
        entries: Sequence[Sequence[bytes | str]],
    ) -> list[str]:
        if not changes:
            return []
        write_id = new_token()
        keys = [self._seq_key] if stream is None else [self._seq_key, stream]
        if stream is not None and len(entries) != len(changes):
            raise ValueError(f"{len(entries)} broker entries for {len(changes)} changes")
        args: list[Any] = [self.keyspace, write_id, "all", 0, len(changes)]
        for i, change in enumerate(changes):
            args += self._change_args(change, entries[i] if stream is not None else ())
        tried = False

        def attempt() -> Any:
            nonlocal tried
            if tried:
                # The last try may have applied before its reply was lost: ask the record.
                applied = self._applied(changes, write_id)
                if applied is not None:
                    seqs, refs = applied
                    return ["ok", *seqs, *(refs if stream is not None else ())]
            tried = True
            return self._direct.run(self._commit, keys, args)

        result = self._call(attempt)
        if result[0] == "stale":
            raise StaleRecord(str(result[1]))
        n = len(changes)
        refs = [str(ref) for ref in result[1 + n :]]
        for i, (change, seq) in enumerate(zip(changes, result[1 : 1 + n], strict=True)):
            if change.created:
                change.record.seq = int(seq)
            if refs and refs[i]:
                change.record.native_ref = refs[i]
        return refs

    def _applied(
        self, changes: Sequence[Change], write_id: str
    ) -> tuple[list[int], list[str]] | None:
        """The seqs and native refs of a batch if it was committed under ``write_id``,
        else None.

        Another writer may have committed to the record since (a member of the same
        message moved on): then the write id on it is theirs, and the batch applied if the
        record's history holds the first change's journal entries (the script appends them
        with the record, all or nothing; they carry actor, states and microseconds).
        """
        pipe = self._r.pipeline(transaction=False)
        for change in changes:
            pipe.hmget(self._record_key(change.msg_id), "w", "s", "n")
        rows = pipe.execute()
        if rows[0][0] is None:
            return None
        if rows[0][0] != write_id and not self._in_history(changes[0]):
            return None
        return [int(row[1]) for row in rows], [row[2] or "" for row in rows]

    def _in_history(self, change: Change) -> bool:
        mine = [e._replace(seq=None) for e in change.journal]
        if not mine:
            return False
        try:
            history = [e._replace(seq=None) for e in self._read_history(change.msg_id)]
        except MessageNotFound:
            return False
        return any(history[i : i + len(mine)] == mine for i in range(len(history)))

    def _layout(
        self, rec: MessageRecord
    ) -> tuple[list[str], list[str], int | None, dict[str, str]]:
        """Where a record stands: its index keys scored by put order and by claim order,
        its due time, and its optional hash fields (what the scripts filter on)."""
        k, q = self.keyspace, rec.queue
        by_seq = [f"{k}q:{q}"]
        if rec.publisher_state is not None:
            by_seq.append(f"{k}p:{q}/{rec.publisher_state}")
        if rec.correlation_id is not None:
            by_seq.append(f"{k}k:{q}/{rec.correlation_id}")
        if rec.lock_id is not None:
            by_seq.append(f"{k}l:{q}/{rec.lock_id}")
        opt: dict[str, str] = {}
        if rec.expires_at is not None:
            opt["x"] = str(rec.expires_at)
        if rec.lock_id is not None:
            opt["lk"] = rec.lock_id
            if rec.lock_until is not None:
                opt["lu"] = str(rec.lock_until)
        by_claim: list[str] = []
        for m in rec.members.values():
            if m.state is _AVAILABLE:
                by_claim.append(f"{k}c:{q}/{m.subscriber}")
                if m.attempt >= 2:
                    by_claim.append(f"{k}r:{q}/{m.subscriber}")
                if m.not_before is not None:
                    opt[f"b:{m.subscriber}"] = str(m.not_before)
        return by_seq, by_claim, rec.due_at(), opt

    def _change_args(self, change: Change, entry: Sequence[bytes | str] = ()) -> list[Any]:
        """A change as the positional values stores/lua/commit.lua reads: what to write
        and, from the record the change started from, which index entries and fields to
        add or take away; with a co-located put, the broker entry's field/value values;
        for a new message, its retained payload copy."""
        rec = change.record
        by_seq, by_claim, due, opt = self._layout(rec)
        before = None if change.created else change.before
        if before is None and not change.created:
            raise ValueError(
                f"change of message {change.msg_id} lacks the record it started from "
                f"(Change.before); make changes with iqbridge.engine"
            )
        if before is None:
            old_seq: list[str] = []
            old_claim: list[str] = []
            old_due: int | None = None
            old_opt: dict[str, str] = {}
        else:
            old_seq, old_claim, old_due, old_opt = self._layout(before)
        due_key = f"{self.keyspace}d:{rec.queue}"
        ix = [*by_seq, *by_claim]
        if due is not None:
            ix.append(due_key)
        gone = [key for key in old_seq if key not in by_seq]
        gone += [key for key in old_claim if key not in by_claim]
        if old_due is not None and due is None:
            gone.append(due_key)
        fields = ["u", str(rec.updated_at)]
        for name, value in opt.items():
            fields += [name, value]
        unset = [name for name in old_opt if name not in opt]
        add_seq = [key for key in by_seq if key not in old_seq]
        add_claim = [key for key in by_claim if key not in old_claim]
        entries = change.journal
        journal = [
            entries_to_json(entries[i : i + JOURNAL_PER_ROW])
            for i in range(0, len(entries), JOURNAL_PER_ROW)
        ]
        return [
            rec.msg_id,
            "1" if change.created else "0",
            str(change.expected_version),
            str(rec.version),
            rec.queue,
            str(rec.priority),
            rec.native_ref or "",
            record_to_json(rec),
            encode(ix),
            str(due) if due is not None and due != old_due else "",
            len(fields),
            *fields,
            len(unset),
            *unset,
            len(add_seq),
            *add_seq,
            len(add_claim),
            *add_claim,
            len(gone),
            *gone,
            len(journal),
            *journal,
            len(entry),
            *entry,
            *_retain_args(change),
        ]

    def set_native_ref(self, msg_id: str, native_ref: str) -> None:
        """Record where the broker keeps the payload (not a state change)."""
        found = self._call(
            lambda: self._native_ref(keys=[self._record_key(msg_id)], args=[native_ref])
        )
        if not found:
            raise MessageNotFound(msg_id)

    def set_native_refs(self, refs: Sequence[tuple[str, str]]) -> None:
        """Record where several payloads live, in one script call; unknown ids are
        skipped."""
        if not refs:
            return
        keys = [self._record_key(msg_id) for msg_id, _ in refs]
        args = [ref for _, ref in refs]
        self._call(lambda: self._native_ref(keys=keys, args=args))


def members_apart(prev: MessageRecord, rec: MessageRecord) -> str | None:
    """What the scripts need of a move from ``prev`` to ``rec`` that changed only members
    (and the publisher state): the publisher state ("-" if unchanged), then the subscriber
    and row of each member ``prev`` does not share (the batch engine makes a new member
    object for each it moves), joined by newlines (names have no whitespace, a JSON row
    no raw newline); they are written apart (``ms:<msg_id>``, see
    :mod:`~iqbridge.stores.redis_records`). None when anything else of the record
    changed: then the record JSON is written whole."""
    if (
        rec.publisher_state is None
        or rec.members.keys() != prev.members.keys()
        or record_fixed(rec) != record_fixed(prev)
    ):
        return None
    parts = ["-" if rec.publisher_state is prev.publisher_state else rec.publisher_state.value]
    for name, m in rec.members.items():
        if prev.members[name] is not m:  # the batch engine's moves make a new member
            parts += (name, member_row_json(m))
    return "\n".join(parts) if len(parts) > 1 else None
