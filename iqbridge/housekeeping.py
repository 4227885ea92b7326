"""Housekeeping: what time has made due, and purge."""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta

from iqbridge import engine
from iqbridge.adapter import TakesOver
from iqbridge.errors import MessageNotFound
from iqbridge.queue_core import QueueCore, to_seconds

__all__ = ["Housekeeping"]

log = logging.getLogger("iqbridge")


class Housekeeping(QueueCore):
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

    def purge(self, older_than: float | timedelta) -> int:
        """Delete messages JOURNALLED longer than ``older_than`` (seconds or timedelta),
        payload included; the journal is kept. Returns how many were purged."""
        secs = to_seconds(older_than, "older_than")
        assert secs is not None
        before = self._now() - int(secs * 1_000_000)
        total = 0
        while True:
            gone = self._store.purge(self.name, before, limit=1000)
            refs = [g.native_ref for g in gone if g.native_ref]
            if refs:
                self._adapter.delete(self.name, refs)
            total += len(gone)
            if len(gone) < 1000:
                return total
