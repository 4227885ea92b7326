"""Housekeeping: what time has made due, and purge."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Literal

from iqbridge import engine
from iqbridge.adapter import TakesOver
from iqbridge.durations import seconds
from iqbridge.errors import InvalidArgument, MessageNotFound
from iqbridge.model import MessageRecord, to_micros
from iqbridge.queue_core import Part
from iqbridge.redaction import get_logger
from iqbridge.states import PublisherState
from iqbridge.stores.base import PurgedMessage

__all__ = ["Housekeeping", "RecoveryAction"]

#: The moves of seed 000's cross-queue recovery: a child's put revealed or withdrawn, a
#: parent's member in doubt marked DONE or made available again.
RecoveryAction = Literal["reveal", "withdraw", "done", "release"]

log = get_logger("iqbridge")

#: Messages a purge asks the store for at a time (and ids it lists in one call).
_PURGE_PAGE = 1000


class Housekeeping(Part):
    """What time has made due (leases, time limits, locks), and purge.

    One part of :class:`~iqbridge.queue.Queue`."""

    def recover(self, limit: int = 1000) -> int:
        """Apply what time has made due now: lapsed leases go back to AVAILABLE (attempt + 1)
        or UNUSABLE after max attempts, passed time limits expire, stale locks lapse.
        Runs by itself during get(); returns how many messages changed."""
        now = self._now()
        changed = 0
        for msg_id in self._store.due(self.name, now, limit):
            try:
                change = self._apply(msg_id, lambda r: engine.expire_due(r, self._now()))
            except MessageNotFound:
                continue
            if change is not None:
                self._wake(change.record)
                changed += 1
        if changed:
            self.hub.notify()
        return changed

    def reclaim(
        self, subscriber: str, owner: str | None = None, reason: str | None = None
    ) -> list[str]:
        """Give back now every message ``subscriber`` holds under ``owner`` (the
        ``subscriber@client_id`` a get records; None: whoever holds it), as if the
        holder's leases had run out: for a holder known to be gone, without waiting for
        its leases (a restarted process, a bridge route taken over). With ``owner=None``
        the broker's own pending entries of the subscriber's group are given back too
        (call it before this process reads the subscriber). Returns the
        msg_ids given back (AVAILABLE with attempt + 1, or UNUSABLE past max_attempts),
        oldest first. Every change goes through the state engine and is journalled."""
        why = reason or (f"holder {owner} is gone" if owner else "holder is gone")
        if owner is None and isinstance(self._adapter, TakesOver) and self._native:
            for group in self._subscriptions().groups_for(subscriber):
                self._adapter.take_over(self.name, group)
        out: list[str] = []
        seen: set[str] = set()
        # Held messages have a lease, so a due time: the due index lists them (and the
        # messages with a time limit or a browse lock), without a scan of the queue.
        horizon = self._now() + 10 * 365 * 86_400 * 1_000_000
        while True:
            fresh = [m for m in self._store.due(self.name, horizon, 1000) if m not in seen]
            if not fresh:
                break
            seen.update(fresh)
            # One read and one commit per page; a record someone moved meanwhile is
            # decided again on its own.
            now = self._now()
            recs = self._store.load_many(fresh)
            changes = [
                c
                for m in fresh
                if m in recs
                if (c := engine.reclaim(recs[m], subscriber, owner, now, why)) is not None
            ]
            oks = self._store.commit_each(changes)
            moved = [c for c, ok in zip(changes, oks, strict=True) if ok]
            for c, ok in zip(changes, oks, strict=True):
                if not ok:
                    with contextlib.suppress(MessageNotFound):
                        again = self._apply(
                            c.msg_id,
                            lambda r: engine.reclaim(r, subscriber, owner, self._now(), why),
                        )
                        if again is not None:
                            moved.append(again)
            for change in moved:
                self._wake(change.record)
                out.append(change.msg_id)
                if self._native:
                    self.hub.redeliveries.add((self.name, subscriber))
        if out:
            self.hub.notify()
        return out

    def apply_recovery(
        self,
        msg_id: str,
        action: RecoveryAction,
        *,
        subscriber: str | None = None,
        detail: str,
    ) -> bool:
        """Apply one row of a cross-queue recovery plan (:mod:`iqbridge.recovery.crossqueue`)
        through the state engine, journalled with ``detail`` (which names the recovery).

        ``reveal`` and ``withdraw`` move a put still awaiting confirmation (PUT);
        ``done`` and ``release`` settle ``subscriber``'s member in doubt for a holder known
        to be gone. Returns False when there is nothing left to do (an earlier run got
        there), so an interrupted recovery run again applies nothing twice.
        """
        if action in ("done", "release") and subscriber is None:
            raise InvalidArgument(f"recovery action {action!r} needs the subscriber it settles")

        def op(rec: MessageRecord) -> engine.Change | None:
            now = self._now()
            if action in ("reveal", "withdraw"):
                if rec.publisher_state is not PublisherState.PUT:
                    return None
                if action == "reveal":
                    return engine.reveal(rec, now, detail)
                return engine.withdraw(rec, now, detail)
            assert subscriber is not None
            return engine.resolve(
                rec,
                subscriber,
                now,
                done=action == "done",
                detail=detail,
                auto_journal=self.auto_journal,
            )

        change = self._apply(msg_id, op)
        if change is None:
            return False
        rec = change.record
        if action == "done" and self._native and rec.native_ref:
            assert subscriber is not None
            group = self._group_of(rec, subscriber)
            ack = functools.partial(self._adapter.ack, self.name, group, [rec.native_ref])
            self._broker_call(ack)
        self._wake(rec)
        self.hub.notify()
        return True

    def purge(self, older_than: float | timedelta) -> int:
        """Delete messages JOURNALLED longer than ``older_than`` (seconds or timedelta),
        payload included; the journal is kept. Returns how many were purged."""
        secs = seconds(older_than, "older_than")
        before = self._now() - int(secs * 1_000_000)
        total = 0
        while True:
            gone = self._purged(self._store.purge(self.name, before, limit=_PURGE_PAGE))
            total += gone
            if gone < _PURGE_PAGE:
                return total

    def purge_listed(self, ids: Sequence[str], before: datetime | int) -> int:
        """Delete exactly the listed messages that may go: those of this queue whose
        publisher is JOURNALLED and whose record last changed before ``before`` (an aware
        datetime, a naive one read as UTC, or microseconds since the epoch), payload
        included; the journal is kept. Ids of other queues, unknown (or already purged)
        ids and messages no longer JOURNALLED (re-revealed since the list was made) or
        changed since ``before`` are left alone. This is how a purge plan is applied
        (``iq purge --from-plan``): the analytics retention job archives what it lists,
        and nothing it did not archive goes. Returns how many were purged."""
        if isinstance(ids, str):
            raise InvalidArgument("ids must be a sequence of message ids, not one string")
        if isinstance(before, datetime):
            cutoff = to_micros(before)
        elif isinstance(before, int) and not isinstance(before, bool):
            cutoff = before
        else:
            raise InvalidArgument(
                f"before must be a datetime or microseconds since the epoch, not {before!r}"
            )
        listed = list(dict.fromkeys(ids))
        total = 0
        for i in range(0, len(listed), _PURGE_PAGE):
            chunk = listed[i : i + _PURGE_PAGE]
            total += self._purged(self._store.purge(self.name, cutoff, limit=len(chunk), ids=chunk))
        return total

    def _purged(self, gone: Sequence[PurgedMessage]) -> int:
        """Delete from the broker the payloads of messages the store purged; how many."""
        refs = [g.native_ref for g in gone if g.native_ref]
        if refs:
            self._adapter.delete(self.name, refs)
        return len(gone)
