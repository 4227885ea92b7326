"""The subscriber side: getting deliveries, from the index or from a broker's groups."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence

from iqbridge import engine, engine_batch
from iqbridge.adapter import ClaimOnReceive, LocksNatively
from iqbridge.batch import Batch
from iqbridge.delivery import Delivery
from iqbridge.durations import seconds, to_seconds
from iqbridge.engine import Change
from iqbridge.errors import ConcurrentUpdate, IllegalTransition, InvalidArgument, LockedError
from iqbridge.housekeeping import Housekeeping
from iqbridge.ids import adopted_id, new_token
from iqbridge.model import Audience, MessageRecord, Received, Retained, check_name
from iqbridge.observability import tracing
from iqbridge.putting import SEND_FIRST_WINDOW
from iqbridge.queue_core import CAS_ATTEMPTS, CLAIM_BATCH, Part, QueueCore
from iqbridge.redaction import get_logger
from iqbridge.settling import Settling
from iqbridge.states import IN_DOUBT, TERMINAL, SubscriberState
from iqbridge.stores.base import StaleRecord
from iqbridge.writes import Steps, Writes

_RECEIVE_SKIPS = 100
#: An entry without its record, put by a put that sends first (see
#: Capabilities.index_after_send): given back at once for this long after its put began,
#: then left pending; acknowledged as purged only past the put's window, twice over.
_RETRY_SOON_US = 5_000_000
_IN_FLIGHT_US = int(2 * SEND_FIRST_WINDOW * 1_000_000)

__all__ = ["Getting"]


log = get_logger("iqbridge")


class Getting(Part):
    """The subscriber side: get a delivery, from the index (index-driven brokers,
    redeliveries, browse locks) or from the broker's consumer groups, resolved against
    the index (claim, once-only skip, adoption of strangers' messages).

    One part of :class:`~iqbridge.queue.Queue`; its deliveries move through the
    settling part, and the housekeeping part sweeps what lapsed on its schedule."""

    def __init__(self, core: QueueCore, settling: Settling, housekeeping: Housekeeping) -> None:
        super().__init__(core)
        self._settling = settling
        self._housekeeping = housekeeping
        self._next_sweep = 0.0

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
        got = self._get(subscriber, 1, timeout, confirm, lease, lock_id)
        return got[0] if got else None

    def get_many(
        self,
        subscriber: str,
        max: int,
        *,
        timeout: float = 0.0,
        lease: float | None = None,
        lock_id: str | None = None,
    ) -> Batch:
        """Up to ``max`` messages for ``subscriber`` at once, as a :class:`~iqbridge.batch.Batch`
        (empty if none arrives within ``timeout``; it returns as soon as there is one).

        The batch is claimed in one index commit after one broker read: every delivery
        is FETCHED under its own lease, as from :meth:`get`; a message another consumer
        won meanwhile is simply not in the batch. Settle the whole batch in one index
        commit and one broker acknowledgement with ``batch.done()`` (per-delivery
        outcomes first with ``batch.unusable(d, reason)`` or ``batch.release(d)``), or
        move any delivery alone as usual. Claimed and not settled, a delivery comes
        back after its lease with attempt + 1, like any other.
        """
        if not isinstance(max, int) or isinstance(max, bool) or max < 1:
            raise InvalidArgument(f"max must be a positive int, got {max!r}")
        return Batch(self._settling, self._get(subscriber, max, timeout, False, lease, lock_id))

    @tracing.traced_get
    def _get(
        self,
        subscriber: str,
        want: int,
        timeout: float,
        confirm: bool,
        lease: float | None,
        lock_id: str | None,
    ) -> list[Delivery]:
        check_name("subscriber", subscriber)
        wait = seconds(timeout, "timeout")
        lease_s = to_seconds(lease, "lease", positive=True)
        if lease_s is None and not confirm:
            lease_s = self.lease
        deadline = time.monotonic() + wait
        pause = 0.002
        while True:
            got = self._get_once(subscriber, want, lease_s, lock_id)
            if got:
                return got
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self.hub.wait(min(pause, remaining))
            pause = min(pause * 2, 0.05)

    def _lapse_native_locks(self, now: int) -> None:
        """Release the broker's side of this queue's browse locks that ended by now
        (their index side lapses by itself), before the broker is asked for messages."""
        adapter = self._adapter
        for (queue, lock_id), until in list(self.hub.native_locks.items()):
            if queue == self.name and until is not None and until <= now:
                self.hub.native_locks.pop((queue, lock_id), None)
                if isinstance(adapter, LocksNatively):
                    self._broker_call(
                        functools.partial(adapter.unlock_natively, self.name, lock_id)
                    )

    def _get_once(
        self, subscriber: str, want: int, lease_s: float | None, lock_id: str | None
    ) -> list[Delivery]:
        now = self._now()
        if self.hub.native_locks:
            self._lapse_native_locks(now)
        sweep = time.monotonic() >= self._next_sweep
        if sweep:
            self._next_sweep = time.monotonic() + self.sweep_interval
            self._housekeeping.recover(limit=200)
        owner = f"{subscriber}@{self.hub.client_id}"
        # A lease runs from its claim's commit, not from here: a broker read can be slow
        # (a consumer group joining), and a lease that lapsed before the claim was made
        # would hand the message to the next get at once.
        lease_us = int(lease_s * 1_000_000) if lease_s is not None else None
        ask = max(want, CLAIM_BATCH)
        if not self._native or lock_id is not None:
            # Candidates are read outside the claim's transaction, so other consumers can
            # take every one of them first: only an empty list means there is nothing.
            for _ in range(CAS_ATTEMPTS):
                ids = self._store.claimable(self.name, subscriber, now, ask, lock_id)
                if not ids:
                    return []
                got = self._claim_by_index(subscriber, ids, want, now, owner, lease_us, lock_id)
                if got:
                    return got
            return []
        # Given back (released, undone, re-revealed, lease lapsed): the index knows; the
        # broker keeps such an entry pending or acknowledged. Asked on the sweep's
        # schedule, or at once after this process gave one back, not on every get (one
        # index round trip each).
        out: list[Delivery] = []
        if sweep or (self.name, subscriber) in self.hub.redeliveries:
            due = self._store.redeliverable(self.name, subscriber, now, ask)
            if due:
                out = self._claim_by_index(
                    subscriber, due, want, now, owner, lease_us, None, owned_only=True
                )
            if not out:
                self.hub.redeliveries.discard((self.name, subscriber))
            elif len(out) >= want:
                return out
        min_idle = lease_s if lease_s is not None else self.lease
        groups = self._subscriptions().groups_for(subscriber)
        self._declare_groups(groups)
        colocated = self.hub.colocated
        fetches: list[Callable[..., list[Received]]]
        fused: ClaimOnReceive | None = None
        if colocated is not None:
            # One round trip over all the subscriber's groups, index records included,
            # the common path's claims made on the way.
            fused = ClaimOnReceive(subscriber, owner, lease_us, self._now)
            fetches = [
                functools.partial(
                    colocated.receive_indexed,
                    self.name,
                    groups,
                    subscriber,
                    min_idle=min_idle,
                    store=self._store,
                    claim=fused,
                )
            ]
        else:
            fetches = [
                functools.partial(self._receive, group, subscriber, min_idle=min_idle)
                for group in groups
            ]
        for fetch in fetches:
            # A group also carries entries this subscriber must skip (addressed to others,
            # finished, hidden): read on past them, so a message behind them is found now.
            for _ in range(_RECEIVE_SKIPS):
                need = want - len(out)
                received = fetch(count=need)
                if not received:
                    break
                if fused is not None and fused.tokens:
                    out += self._accept_fused(received, subscriber, owner, lease_us, fused)
                else:
                    out += self._accept_many(received, subscriber, owner, lease_us)
                if len(out) >= want or len(received) < need:
                    break
            if len(out) >= want:
                return out
        if not out and not self._adapter.capabilities.single_active_groups:
            out = self._claim_read_ahead(subscriber, groups, want, owner, lease_us)
        return out

    def _receive(
        self, group: str, subscriber: str, *, count: int, min_idle: float
    ) -> list[Received]:
        return self._adapter.receive(
            self.name, group, subscriber, count=count, timeout=0.0, min_idle=min_idle
        )

    def _claim_read_ahead(
        self,
        subscriber: str,
        groups: Sequence[str],
        want: int,
        owner: str,
        lease_us: int | None,
    ) -> list[Delivery]:
        """For a pool member whose groups had nothing: messages still AVAILABLE whose
        entries another member read ahead (they wait in that member's process, not in the
        group), claimed through the index; the other member then finds them taken."""
        if all(group == subscriber for group in groups):
            return []  # no pool: nobody else reads this subscriber's group
        now = self._now()  # after the groups' reads
        ids = self._store.claimable(self.name, subscriber, now, max(want, CLAIM_BATCH))
        if not ids:
            return []
        return self._claim_by_index(subscriber, ids, want, now, owner, lease_us, None)

    def _claim_by_index(
        self,
        subscriber: str,
        ids: Sequence[str],
        want: int,
        now: int,
        owner: str,
        lease_us: int | None,
        lock_id: str | None,
        *,
        owned_only: bool = False,
    ) -> list[Delivery]:
        """Claim up to ``want`` of the candidates ``ids`` through the index: one read of
        their records, one read of their payloads, one commit (each claim applies only if
        its compare-and-set holds; one another consumer won is left out). Each claim is
        held for ``lease_us`` microseconds from when it is made (None: no lease).

        ``owned_only``: on an adapter that fences keys (:class:`~iqbridge.adapter.Fenced`),
        only messages whose partition this process reads (another process's reader hands
        its own out again, in key order)."""
        store = self._store
        fenced = self._fenced if owned_only else None
        # (record before, record after, token, the per-message change off the common path)
        claims: list[tuple[MessageRecord, MessageRecord, str, Change | None]] = []
        journal: list[Steps] = []
        with store.atomic():
            # Waiting for another process's write lock can take a while: the claim
            # happens once we hold the transaction, so stamp it and start its lease then.
            at = max(now, self._now())
            until = at + lease_us if lease_us is not None else None
            # Records are read as many at a time as claims are still wanted: the usual
            # single get reads one.
            pos = 0
            while len(claims) < want and pos < len(ids):
                chunk = ids[pos : pos + want - len(claims)]
                pos += len(chunk)
                recs = store.load_many(chunk)
                cands: list[MessageRecord] = []
                for msg_id in chunk:
                    rec = recs.get(msg_id)
                    if rec is None or rec.queue != self.name:
                        continue
                    if fenced is not None:
                        member = rec.members.get(subscriber)
                        if (
                            member is None
                            or rec.native_ref is None
                            or not fenced.owns(self.name, member.pool or subscriber, rec.native_ref)
                        ):
                            continue
                    if rec.native_ref is None and at - rec.created_at < self.lease * 1_000_000:
                        # Put through the broker apart from the index (another store): the
                        # payload's reference is recorded just after the record. Not yet.
                        continue
                    cands.append(rec)
                claims += self._decide_claims(cands, subscriber, at, owner, until, lock_id, journal)
            if not claims:
                return []
            envs = self._envelopes([before for before, _, _, _ in claims])
            writes = Writes(self.name)
            for before, after, token, change in claims:
                if before.msg_id in envs:
                    if change is None:
                        writes.moved.append((before, after))
                    else:
                        writes.changes.append(change)
                elif self._native and not self._reads_by_ref:
                    # A broker that forgets, and no retained copy (retain=False): only the
                    # broker can hand it over again, from the entry it still holds.
                    self._wake(before)
                else:
                    missing = self._payload_missing(before, subscriber, token, owner, at)
                    writes.changes.append(missing)
            held = {a.msg_id for _, a in writes.moved}
            for group in journal:
                group.items = [it for it in group.items if it[0] in held]
            writes.journal = journal
            flags = store.commit_writes(writes) if len(writes) else []
        done = {a.msg_id: a for (_, a), ok in zip(writes.moved, flags, strict=False) if ok}
        for change, ok in zip(writes.changes, flags[len(writes.moved) :], strict=True):
            if ok:
                done[change.msg_id] = change.record
        out: list[Delivery] = []
        if lock_id is not None and done and isinstance(self._adapter, LocksNatively):
            refs = [b.native_ref for b, _, _, _ in claims if b.msg_id in done and b.native_ref]
            self._broker_call(
                functools.partial(self._adapter.unlock_natively, self.name, lock_id, refs)
            )
        for before, _, token, _ in claims:
            claimed = done.get(before.msg_id)
            env = envs.get(before.msg_id)
            if claimed is None or env is None:
                continue
            if lock_id is not None:
                self._wake(claimed)  # the lock is gone for the other members too
            attempt = claimed.members[subscriber].attempt
            out.append(
                Delivery(
                    self._settling, env, subscriber, token, attempt, before.max_attempts, claimed
                )
            )
        return out

    def _decide_claims(
        self,
        recs: Sequence[MessageRecord],
        subscriber: str,
        at: int,
        owner: str,
        until: int | None,
        lock_id: str | None,
        journal: list[Steps],
    ) -> list[tuple[MessageRecord, MessageRecord, str, Change | None]]:
        """GET then FETCHED for ``subscriber`` on each record: the common path in one
        pass of the batch engine (its journal added to ``journal``), the others one at a
        time by the engine; records that cannot be claimed (taken, locked, ...) are left
        out."""
        tokens = [new_token() for _ in recs]
        out: list[tuple[MessageRecord, MessageRecord, str, Change | None]] = []
        if lock_id is None:
            moved, steps, off = engine_batch.claim(
                recs, subscriber, at, tokens, owner=owner, lease_until=until
            )
            journal += steps
            skip = set(off)
            on = [i for i in range(len(recs)) if i not in skip]
            out += [(b, a, tokens[i], None) for i, (b, a) in zip(on, moved, strict=True)]
        else:
            off = list(range(len(recs)))
        for i in off:
            rec = recs[i]
            try:
                change = engine.claim(
                    rec,
                    subscriber,
                    at,
                    token=tokens[i],
                    owner=owner,
                    lease_until=until,
                    lock_id=lock_id,
                )
            except (IllegalTransition, LockedError):
                continue
            out.append((rec, change.record, tokens[i], change))
        return out

    def _payload_missing(
        self, rec: MessageRecord, subscriber: str, token: str, owner: str, at: int
    ) -> Change:
        """The broker lost the payload and no copy is kept: GET (never FETCHED), then
        unusable for this member, saying why."""
        log.error("message %s: payload missing on %s", rec.msg_id, self._adapter.url)
        got = engine.claim(
            rec, subscriber, at, token=token, owner=owner, lease_until=None, fetched=False
        )
        return engine.chain(
            got,
            lambda r: engine.unusable(
                r,
                subscriber,
                token,
                at,
                "payload missing on the broker",
                auto_journal=self.auto_journal,
            ),
        )

    def _accept(
        self, received: Received, subscriber: str, owner: str, lease_us: int | None
    ) -> Delivery | None:
        """Resolve one broker delivery against the index (native-group adapters)."""
        got = self._accept_many([received], subscriber, owner, lease_us)
        return got[0] if got else None

    def _accept_many(
        self,
        batch: Sequence[Received],
        subscriber: str,
        owner: str,
        lease_us: int | None,
    ) -> list[Delivery]:
        """Resolve broker deliveries against the index: the claimable ones are claimed in
        one commit; one whose compare-and-set fails is decided again on a fresh read.

        Decided and claimed as of now, after the broker's read: each claim is held for
        ``lease_us`` microseconds from then (None: no lease)."""
        out: list[Delivery] = []
        pending = list(batch)
        for _ in range(CAS_ATTEMPTS):
            now = self._now()
            until = now + lease_us if lease_us is not None else None
            claims, writes, again = self._plan(pending, subscriber, now, owner, until)
            # One flag per write: the moves first, then the one-by-one changes (each
            # claim knows its position).
            flags = self._store.commit_writes(writes) if claims else []
            refs: list[tuple[str, str]] = []
            for received, rec, token, at in claims:
                if not flags[at]:
                    again.append(received)
                    continue
                out.append(self._delivered(received, rec, token, subscriber, refs))
            if refs:
                self._store.set_native_refs(refs)
            if not again:
                return out
            pending = [dataclasses.replace(r, record=None) for r in again]
        raise ConcurrentUpdate(pending[0].envelope.msg_id, CAS_ATTEMPTS)

    def _accept_fused(
        self,
        batch: Sequence[Received],
        subscriber: str,
        owner: str,
        lease_us: int | None,
        fused: ClaimOnReceive,
    ) -> list[Delivery]:
        """Broker deliveries some of which the receive claimed already (``fused.tokens``):
        those become deliveries of the same claim applied to the records they came with
        (the batch engine; where it would not have made the claim, the index's record is
        read and taken as it stands); the rest are resolved by :meth:`_accept_many`. In
        the order of ``batch``."""
        tokens = fused.tokens
        mine = [(r, tokens[r.native_ref]) for r in batch if r.native_ref in tokens and r.record]
        taken = {r.native_ref for r, _ in mine}
        moved, _, off = engine_batch.claim(
            [r.record for r, _ in mine if r.record is not None],
            subscriber,
            fused.at,
            [t for _, t in mine],
            owner=owner,
            lease_until=fused.lease_until,
        )
        skip = set(off)
        common = iter(moved)
        got: dict[str, Delivery] = {}
        stray: list[tuple[Received, str]] = []
        for k, (received, token) in enumerate(mine):
            if k in skip:
                stray.append((received, token))
                continue
            after = next(common)[1]
            m = after.members[subscriber]
            got[received.native_ref] = Delivery(
                self._settling,
                received.envelope,
                subscriber,
                token,
                m.attempt,
                after.max_attempts,
                after,
            )
        if stray:
            known = self._store.load_many([r.envelope.msg_id for r, _ in stray])
            for received, token in stray:
                rec = known.get(received.envelope.msg_id)
                member = rec.members.get(subscriber) if rec is not None else None
                if rec is None or member is None or member.lease_token != token:
                    log.warning(
                        "queue %s: message %s claimed on receive is no longer held",
                        self.name,
                        received.envelope.msg_id,
                    )
                    continue
                got[received.native_ref] = Delivery(
                    self._settling,
                    received.envelope,
                    subscriber,
                    token,
                    member.attempt,
                    rec.max_attempts,
                    rec,
                )
        rest = [r for r in batch if r.native_ref not in taken]
        others = self._accept_many(rest, subscriber, owner, lease_us) if rest else []
        by_id = {d.msg_id: d for d in others}
        out: list[Delivery] = []
        for received in batch:
            d = got.get(received.native_ref) or by_id.pop(received.envelope.msg_id, None)
            if d is not None:
                out.append(d)
        return out + list(by_id.values())

    def _plan(
        self,
        batch: Sequence[Received],
        subscriber: str,
        now: int,
        owner: str,
        lease_until: int | None,
    ) -> tuple[list[tuple[Received, MessageRecord, str, int]], Writes, list[Received]]:
        """Decide what each broker delivery is for this subscriber: a claim (returned with
        its record as claimed, its token and its position among the writes, in the
        batch's order, and the writes that make the claims: the common path in one pass
        of the batch engine, the others one at a time), an acknowledgement (sent here:
        not addressed to the group, finished already, purged), nothing (held by someone
        else: it stays pending), or a decision to make again on a fresh read (returned
        apart)."""
        store = self._store
        hints: dict[int, MessageRecord] = {}
        unread: list[str] = []
        for i, received in enumerate(batch):
            hint = received.record
            if hint is not None and self._claimable_hint(hint, subscriber, received.group, now):
                hints[i] = hint  # compare-and-set on the claim catches a stale hint
            elif received.envelope.msg_id:
                unread.append(received.envelope.msg_id)
        loaded = store.load_many(unread) if unread else {}
        acks: dict[str, list[str]] = {}
        pending: dict[str, list[str]] = {}
        fenced = self._fenced is not None
        after_send = self._adapter.capabilities.index_after_send
        #: (group, ordering key) of deliveries left pending: a later one of the same key
        #: in this batch is given back, not claimed (a fencing adapter keeps key order).
        held_keys: set[tuple[str, str]] = set()
        #: (position in the batch, delivery, record) of the members AVAILABLE to claim.
        cands: list[tuple[int, Received, MessageRecord]] = []
        claiming: set[str] = set()
        again: list[Received] = []
        for i, received in enumerate(batch):
            env = received.envelope
            group = received.group
            rec = hints.get(i) or loaded.get(env.msg_id)
            if rec is None:
                if not received.adopted and after_send and now - env.put_at < _IN_FLIGHT_US:
                    # A put that sends first has not committed its record yet: given back
                    # at once while it is young, then left pending (handed out again when
                    # idle); acknowledged below as purged only once it is old.
                    if now - env.put_at < _RETRY_SOON_US:
                        self._adapter.requeue(self.name, group, received.native_ref)
                    else:
                        pending.setdefault(group, []).append(received.native_ref)
                    if env.ordering_key:
                        held_keys.add((group, env.ordering_key))
                    continue
                if not received.adopted:
                    log.warning(
                        "queue %s: broker entry %s has no index record (purged?); acked",
                        self.name,
                        env.msg_id,
                    )
                    acks.setdefault(group, []).append(received.native_ref)
                    continue
                rec = self._adopt(received)
            member = rec.members.get(subscriber)
            if member is None or (member.pool or member.subscriber) != group:
                # Not addressed to this subscriber through this group: the group is done
                # with it.
                if not any((m.pool or m.subscriber) == group for m in rec.members.values()):
                    acks.setdefault(group, []).append(received.native_ref)
                continue
            if (
                member.state in IN_DOUBT
                and member.lease_until is not None
                and (member.lease_until <= now)
            ):
                self._apply(rec.msg_id, lambda r: engine.expire_due(r, self._now()))
                rec = store.load(rec.msg_id)
                member = rec.members[subscriber]
            if member.state is SubscriberState.AVAILABLE:
                if fenced and (group, env.ordering_key) in held_keys:
                    self._adapter.requeue(self.name, group, received.native_ref)
                    continue
                if rec.msg_id in claiming:
                    # A second entry of one message in this batch: decided on a fresh
                    # read, once the first one's claim is made.
                    again.append(received)
                    continue
                claiming.add(rec.msg_id)
                cands.append((i, received, rec))
            elif member.state in TERMINAL or member.state is SubscriberState.JOURNALLED:
                # Once-only: a redelivery of something this subscriber finished is acked,
                # never processed again.
                acks.setdefault(group, []).append(received.native_ref)
            else:
                # Held by someone (or not yet revealed): leave it pending; it comes back
                # when idle.
                pending.setdefault(group, []).append(received.native_ref)
                if env.ordering_key:
                    held_keys.add((group, env.ordering_key))
        for group, refs in acks.items():
            self._adapter.ack(self.name, group, refs)
        if pending and self._fenced is not None:
            for group, refs in pending.items():
                self._fenced.left_pending(self.name, group, refs)
        claims, writes = self._claims(cands, hints, subscriber, now, owner, lease_until, again)
        return claims, writes, again

    def _claims(
        self,
        cands: Sequence[tuple[int, Received, MessageRecord]],
        hints: dict[int, MessageRecord],
        subscriber: str,
        now: int,
        owner: str,
        lease_until: int | None,
        again: list[Received],
    ) -> tuple[list[tuple[Received, MessageRecord, str, int]], Writes]:
        """GET then FETCHED for ``subscriber`` on each candidate: the common path in one
        pass of the batch engine, the others (pools, locks, retry delays, ...) one at a
        time; one the engine refuses is left out (or decided again on a fresh read when it
        was decided on a record read with the entry, which may have gone stale)."""
        writes = Writes(self.name)
        if not cands:
            return [], writes
        tokens = [new_token() for _ in cands]
        moved, steps, off = engine_batch.claim(
            [rec for _, _, rec in cands],
            subscriber,
            now,
            tokens,
            owner=owner,
            lease_until=lease_until,
        )
        writes.moved = moved
        writes.journal = steps
        #: Candidate position -> its record as claimed and its position among the writes.
        after: dict[int, tuple[MessageRecord, int]] = {}
        skip = set(off)
        on = (j for j in range(len(cands)) if j not in skip)
        for k, (j, (_, a)) in enumerate(zip(on, moved, strict=True)):
            after[j] = (a, k)
        for j in off:
            i, received, rec = cands[j]
            try:
                change = engine.claim(
                    rec, subscriber, now, token=tokens[j], owner=owner, lease_until=lease_until
                )
            except (IllegalTransition, LockedError):
                if i in hints:
                    # Decided on the record read with the entry, which went stale (say the
                    # message was withdrawn since): decide again on a fresh read, which may
                    # acknowledge the entry.
                    again.append(received)
                continue
            after[j] = (change.record, len(moved) + len(writes.changes))
            writes.changes.append(change)
        claims = [(cands[j][1], after[j][0], tokens[j], after[j][1]) for j in sorted(after)]
        return claims, writes

    def _delivered(
        self,
        received: Received,
        rec: MessageRecord,
        token: str,
        subscriber: str,
        refs: list[tuple[str, str]],
    ) -> Delivery:
        """The delivery of a claimed broker entry (``rec``: its record as claimed);
        ``refs`` collects native references the index still lacks."""
        if rec.native_ref is None:
            # The putter has not recorded it yet (or died first): the delivery's record
            # must know it too, or its done() would have no entry to acknowledge.
            refs.append((rec.msg_id, received.native_ref))
            rec.native_ref = received.native_ref
        elif rec.native_ref != received.native_ref:
            # A second broker entry of one message (an idempotent put repeated after the
            # broker took the first but before its reference was recorded): the delivery
            # finishes the recorded entry; the group is done with this one.
            group = received.group
            ref = received.native_ref
            self._broker_call(lambda: self._adapter.ack(self.name, group, [ref]))
        m = rec.members[subscriber]
        return Delivery(
            self._settling, received.envelope, subscriber, token, m.attempt, rec.max_attempts, rec
        )

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

    def adopt(self, received: Received) -> MessageRecord:
        """Track a broker entry put by a client that knows nothing of iqbridge, as a get
        that met it would (reconciliation's ``--adopt``): a record in the index for the
        queue's standing audience (or the groups the broker says it reached), with the
        envelope's ids; the record is returned (the one already there, when another
        consumer adopted it first). Raises AudienceError when there is no one to adopt
        it for."""
        return self._adopt(received)

    def _adopt(self, received: Received) -> MessageRecord:
        """Track a message put by a client that knows nothing of iqbridge."""
        env = received.envelope
        msg_id = env.msg_id or adopted_id(self._adapter.url, self.name, received.native_ref)
        audience = self._adopted_audience(env.groups)
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
        if self.retain:
            change.retain = Retained(env.body, dict(env.headers))
        with contextlib.suppress(StaleRecord):  # another consumer adopted it first
            self._store.commit(change)
        return self._store.load(msg_id)

    def _adopted_audience(self, groups: Sequence[str]) -> Audience:
        """Who a stranger's message is for: the queue's standing audience, or, where the
        broker says which groups it reached (a RabbitMQ queue holds one group's messages),
        the subscribers and pools of those groups only: the others never see it."""
        subs = self._subscriptions()
        if not groups:
            return subs.audience().validate()
        if any(g not in subs.subscribers and subs.pool(g) is None for g in groups):
            subs = self._subscriptions(fresh=True)  # a pool declared since the last read?
        pools = tuple(p for g in groups if (p := subs.pool(g)) is not None)
        pooled = {p.name for p in pools}
        named = tuple(g for g in groups if g not in pooled)
        return Audience(named, pools).validate()
