"""Housekeeping: what time has made due, and purge."""

from __future__ import annotations

import logging
from datetime import timedelta

from iqbridge import engine
from iqbridge.adapter import TakesOver
from iqbridge.errors import MessageNotFound
from iqbridge.model import Filter
from iqbridge.queue_core import QueueCore, to_seconds
from iqbridge.states import SubscriberState

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
        for state in (SubscriberState.FETCHED, SubscriberState.IN_PROCESS):
            while True:
                hits = self._store.search(
                    self.name, Filter(state=state, subscriber=subscriber, limit=500)
                )
                fresh = [h for h in hits if h.msg_id not in seen]
                for hit in fresh:
                    seen.add(hit.msg_id)
                    try:
                        change = self._apply(
                            hit.msg_id, lambda r: engine.reclaim(r, owner, self._now(), why)
                        )
                    except MessageNotFound:
                        continue
                    if change is not None:
                        self._wake(change.record)
                        out.append(hit.msg_id)
                        if self._native:
                            self.hub.redeliveries.add((self.name, subscriber))
                if len(hits) < 500 or not fresh:
                    break
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
