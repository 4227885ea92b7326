"""The subscriber side: getting deliveries, from the index or from a broker's groups."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence

from iqbridge import engine
from iqbridge.delivery import Delivery
from iqbridge.errors import IllegalTransition, LockedError, MessageNotFound
from iqbridge.housekeeping import Housekeeping
from iqbridge.ids import adopted_id, new_token
from iqbridge.model import MessageRecord, Received, check_name
from iqbridge.queue_core import CAS_ATTEMPTS, CLAIM_BATCH, to_seconds
from iqbridge.settling import Settling
from iqbridge.states import IN_DOUBT, TERMINAL, SubscriberState
from iqbridge.stores.base import StaleRecord

_RECEIVE_SKIPS = 100

__all__ = ["Getting"]

log = logging.getLogger("iqbridge")


class Getting(Settling, Housekeeping):
    """The subscriber side: get a delivery, from the index (index-driven brokers,
    redeliveries, browse locks) or from the broker's consumer groups, resolved against
    the index (claim, once-only skip, adoption of strangers' messages).

    One part of :class:`~iqbridge.queue.Queue`."""

    def get(
        self,
        subscriber: str,
        *,
        timeout: float = 0.0,
        confirm: bool = False,
        lease: float | None = None,
        lock_id: str | None = None,
    ) -> Delivery | None:
        """The next message for ``subscriber``, or None if none arrives within ``timeout``.

        The delivery is FETCHED and held under a lease (``lease`` seconds, default the
        queue's); if the holder dies, the message returns to AVAILABLE with attempt + 1
        when the lease runs out. With ``confirm=True`` the get is held until
        :meth:`confirm_get` or :meth:`undo` of ``delivery.confirm_id`` (no lease unless
        one is given). ``lock_id`` gets a message that a browse locked under that id.
        """
        check_name("subscriber", subscriber)
        lease_s = to_seconds(lease, "lease")
        if lease_s is None and not confirm:
            lease_s = self.lease
        deadline = time.monotonic() + max(timeout, 0.0)
        pause = 0.002
        while True:
            delivery = self._get_once(subscriber, lease_s, lock_id)
            if delivery is not None:
                return delivery
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.hub.wait(min(pause, remaining))
            pause = min(pause * 2, 0.05)

    def _get_once(
        self, subscriber: str, lease_s: float | None, lock_id: str | None
    ) -> Delivery | None:
        now = self._now()
        sweep = time.monotonic() >= self._next_sweep
        if sweep:
            self._next_sweep = time.monotonic() + self.sweep_interval
            self.recover(limit=200)
        owner = f"{subscriber}@{self.hub.client_id}"
        lease_until = now + int(lease_s * 1_000_000) if lease_s is not None else None
        if not self._native or lock_id is not None:
            # Candidates are read outside the claim's transaction, so other consumers can
            # take every one of them first: only an empty list means there is nothing.
            for _ in range(CAS_ATTEMPTS):
                ids = self._store.claimable(self.name, subscriber, now, CLAIM_BATCH, lock_id)
                if not ids:
                    return None
                delivery = self._claim_by_index(subscriber, ids, now, owner, lease_until, lock_id)
                if delivery is not None:
                    return delivery
            return None
        # Given back (released, undone, re-revealed, lease lapsed): the index knows; the
        # broker keeps such an entry pending or acknowledged. Asked on the sweep's
        # schedule, or at once after this process gave one back, not on every get (one
        # index round trip each).
        due: list[str] = []
        if sweep or (self.name, subscriber) in self.hub.redeliveries:
            due = self._store.redeliverable(self.name, subscriber, now, CLAIM_BATCH)
            if not due:
                self.hub.redeliveries.discard((self.name, subscriber))
        if due:
            delivery = self._claim_by_index(subscriber, due, now, owner, lease_until, None)
            if delivery is not None:
                return delivery
        min_idle = lease_s if lease_s is not None else self.lease
        groups = self._subscriptions().groups_for(subscriber)
        self._declare_groups(groups)
        colocated = self.hub.colocated
        fetches: list[Callable[[], list[Received]]]
        if colocated is not None:
            # One round trip over all the subscriber's groups, index records included.
            fetches = [
                functools.partial(
                    colocated.receive_indexed,
                    self.name,
                    groups,
                    subscriber,
                    count=1,
                    min_idle=min_idle,
                    store=self._store,
                )
            ]
        else:
            fetches = [
                functools.partial(
                    self._adapter.receive,
                    self.name,
                    group,
                    subscriber,
                    count=1,
                    timeout=0.0,
                    min_idle=min_idle,
                )
                for group in groups
            ]
        for fetch in fetches:
            # A group also carries entries this subscriber must skip (addressed to others,
            # finished, hidden): read on past them, so a message behind them is found now.
            for _ in range(_RECEIVE_SKIPS):
                batch = fetch()
                if not batch:
                    break
                for received in batch:
                    delivery = self._accept(received, subscriber, now, owner, lease_until)
                    if delivery is not None:
                        return delivery
        return self._claim_read_ahead(subscriber, groups, now, owner, lease_until)

    def _claim_read_ahead(
        self, subscriber: str, groups: Sequence[str], now: int, owner: str, lease_until: int | None
    ) -> Delivery | None:
        """For a pool member whose groups had nothing: messages still AVAILABLE whose
        entries another member read ahead (they wait in that member's process, not in the
        group), claimed through the index; the other member then finds them taken."""
        if all(group == subscriber for group in groups):
            return None  # no pool: nobody else reads this subscriber's group
        ids = self._store.claimable(self.name, subscriber, now, CLAIM_BATCH)
        if not ids:
            return None
        return self._claim_by_index(subscriber, ids, now, owner, lease_until, None)

    def _claim_by_index(
        self,
        subscriber: str,
        ids: Sequence[str],
        now: int,
        owner: str,
        lease_until: int | None,
        lock_id: str | None,
    ) -> Delivery | None:
        store = self._store
        for msg_id in ids:
            token = new_token()
            with store.atomic():
                # Waiting for another process's write lock can take a while: the claim
                # happens once we hold the transaction, so stamp it and start its lease then.
                at = max(now, self._now())
                until = lease_until + (at - now) if lease_until is not None else None
                try:
                    rec = store.load(msg_id)
                    change = engine.claim(
                        rec,
                        subscriber,
                        at,
                        token=token,
                        owner=owner,
                        lease_until=until,
                        lock_id=lock_id,
                    )
                except (IllegalTransition, LockedError, MessageNotFound):
                    continue
                if rec.native_ref is None and at - rec.created_at < self.lease * 1_000_000:
                    # Put through the broker apart from the index (another store): the
                    # payload's reference is recorded just after the record. Not yet.
                    continue
                env = self._adapter.read(self.name, rec.native_ref) if rec.native_ref else None
                if env is None:
                    # The broker lost the payload: GET (never FETCHED), then unusable for
                    # this member, and say why.
                    got = engine.claim(
                        rec,
                        subscriber,
                        now,
                        token=token,
                        owner=owner,
                        lease_until=lease_until,
                        lock_id=lock_id,
                        fetched=False,
                    )
                    bad = engine.chain(
                        got,
                        lambda r, token=token, at=at: engine.unusable(  # type: ignore[misc]
                            r,
                            subscriber,
                            token,
                            at,
                            "payload missing on the broker",
                            auto_journal=self.auto_journal,
                        ),
                    )
                    with contextlib.suppress(StaleRecord):
                        store.commit(bad)
                    log.error("message %s: payload missing on %s", msg_id, self._adapter.url)
                    continue
                try:
                    store.commit(change)
                except StaleRecord:
                    continue
            if lock_id is not None:
                self._wake(change.record)  # the lock is gone for the other members too
            member = change.record.members[subscriber]
            return Delivery(
                self, env, subscriber, token, member.attempt, rec.max_attempts, change.record
            )
        return None

    def _accept(
        self, received: Received, subscriber: str, now: int, owner: str, lease_until: int | None
    ) -> Delivery | None:
        """Resolve one broker delivery against the index (native-group adapters)."""
        env = received.envelope
        group = received.group
        ack = self._adapter.ack
        hint = received.record
        try:
            if hint is not None and self._claimable_hint(hint, subscriber, group, now):
                rec = hint  # compare-and-set on the claim catches a stale hint
            else:
                rec = self._store.load(env.msg_id)
        except MessageNotFound:
            if not received.adopted:
                log.warning(
                    "queue %s: broker entry %s has no index record (purged?); acked",
                    self.name,
                    env.msg_id,
                )
                ack(self.name, group, [received.native_ref])
                return None
            rec = self._adopt(received)
        member = rec.members.get(subscriber)
        if member is None or (member.pool or member.subscriber) != group:
            # Not addressed to this subscriber through this group: the group is done with it.
            if not any((m.pool or m.subscriber) == group for m in rec.members.values()):
                ack(self.name, group, [received.native_ref])
            return None
        if (
            member.state in IN_DOUBT
            and member.lease_until is not None
            and (member.lease_until <= now)
        ):
            self._apply(rec.msg_id, lambda r: engine.expire_due(r, self._now()))
            rec = self._store.load(rec.msg_id)
            member = rec.members[subscriber]
        if member.state is SubscriberState.AVAILABLE:
            token = new_token()
            try:
                change = self._apply(
                    rec.msg_id,
                    lambda r: engine.claim(
                        r, subscriber, now, token=token, owner=owner, lease_until=lease_until
                    ),
                    rec,
                )
            except (IllegalTransition, LockedError):
                if rec is hint:
                    # Decided on the record read with the entry, which went stale (say the
                    # message was withdrawn since): decide again on a fresh read, which may
                    # acknowledge the entry.
                    fresh = dataclasses.replace(received, record=None)
                    return self._accept(fresh, subscriber, now, owner, lease_until)
                return None
            assert change is not None
            if change.record.native_ref is None:
                # The putter has not recorded it yet (or died first): the delivery's record
                # must know it too, or its done() would have no entry to acknowledge.
                self._store.set_native_ref(rec.msg_id, received.native_ref)
                change.record.native_ref = received.native_ref
            elif change.record.native_ref != received.native_ref:
                # A second broker entry of one message (an idempotent put repeated after
                # the broker took the first but before its reference was recorded): the
                # delivery finishes the recorded entry; the group is done with this one.
                self._broker_call(lambda: ack(self.name, group, [received.native_ref]))
            m = change.record.members[subscriber]
            return Delivery(
                self, env, subscriber, token, m.attempt, rec.max_attempts, change.record
            )
        if member.state in TERMINAL or member.state is SubscriberState.JOURNALLED:
            # Once-only: a redelivery of something this subscriber finished is acked, never
            # processed again.
            ack(self.name, group, [received.native_ref])
            return None
        # Held by someone (or not yet revealed): leave it pending; it comes back when idle.
        return None

    @staticmethod
    def _claimable_hint(rec: MessageRecord, subscriber: str, group: str, now: int) -> bool:
        """Whether a record read with the broker entry may stand in for a fresh read: only
        when it shows the member AVAILABLE through this group, now (the claim's
        compare-and-set then settles it). Any other decision is made on a fresh read."""
        member = rec.members.get(subscriber)
        return (
            member is not None
            and member.state is SubscriberState.AVAILABLE
            and (member.pool or member.subscriber) == group
            and (member.not_before is None or member.not_before <= now)
        )

    def _adopt(self, received: Received) -> MessageRecord:
        """Track a message put by a client that knows nothing of iqbridge."""
        env = received.envelope
        msg_id = env.msg_id or adopted_id(self._adapter.url, self.name, received.native_ref)
        audience = self._subscriptions().audience().validate()
        change = engine.new_message(
            msg_id=msg_id,
            queue=self.name,
            publisher=env.publisher or "(legacy)",
            audience=audience,
            now=self._now(),
            ordering_key=env.ordering_key or None,
            correlation_id=env.correlation_id,
            priority=env.priority,
            max_attempts=self.retry.max_attempts,
            content_type=env.content_type,
            size=len(env.body),
            native_ref=received.native_ref,
        )
        with contextlib.suppress(StaleRecord):  # another consumer adopted it first
            self._store.commit(change)
        return self._store.load(msg_id)
