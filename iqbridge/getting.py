"""The subscriber side: getting deliveries, from the index or from a broker's groups."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

from iqbridge import engine, engine_batch
from iqbridge.adapter import LocksNatively
from iqbridge.batch import Batch
from iqbridge.delivery import Delivery
from iqbridge.durations import seconds, to_seconds
from iqbridge.engine import Change
from iqbridge.errors import IllegalTransition, InvalidArgument, LockedError
from iqbridge.holding import Hold
from iqbridge.housekeeping import Housekeeping
from iqbridge.ids import LeaseTokens, new_token
from iqbridge.model import MessageRecord, check_name
from iqbridge.observability import tracing
from iqbridge.queue_core import CAS_ATTEMPTS, CLAIM_BATCH, Part, QueueCore
from iqbridge.receiving import Receiving
from iqbridge.redaction import get_logger
from iqbridge.settling import Settling
from iqbridge.stores.base import ClaimsReady
from iqbridge.writes import Steps, Writes

__all__ = ["Getting"]


log = get_logger("iqbridge")


class _PayloadAway(Exception):
    """A claimed message's payload is not on the broker: undo the claim's transaction."""


class Getting(Part):
    """The subscriber side: get a delivery, from the index (index-driven brokers,
    redeliveries, browse locks) or from the broker's consumer groups, resolved against
    the index (claim, once-only skip, adoption of strangers' messages).

    One part of :class:`~iqbridge.queue.Queue`; its deliveries move through the
    settling part, and the housekeeping part sweeps what lapsed on its schedule."""

    def __init__(
        self,
        core: QueueCore,
        settling: Settling,
        housekeeping: Housekeeping,
        receiving: Receiving,
    ) -> None:
        super().__init__(core)
        self._settling = settling
        self._housekeeping = housekeeping
        self._receiving = receiving
        self._next_sweep = 0.0
        # The path a get without a browse lock takes, chosen once for the hub's broker:
        # the index's candidates, or the broker's consumer groups resolved against it.
        self._get_unlocked = self._get_from_groups if self._native else self._get_by_index
        #: Where an index-driven get claims, chosen once: in the index store, by a plan
        #: from the transition table and no record per message, when the store can
        #: (ClaimsReady) and the broker hands payloads over by reference; else through
        #: the records (the batch engine, then one commit).
        store = self._store
        self._claims_ready: ClaimsReady | None = (
            store
            if not self._native and self._reads_by_ref and isinstance(store, ClaimsReady)
            else None
        )
        #: Whether a pool member may find messages another member read ahead (every
        #: native-group broker but those whose groups have one active reader).
        self._others_read_ahead = not self._adapter.capabilities.single_active_groups

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
        if lock_id is not None:
            return self._get_by_index(subscriber, want, now, owner, lease_us, lock_id, sweep)
        return self._get_unlocked(subscriber, want, now, owner, lease_us, None, sweep)

    def _get_by_index(
        self,
        subscriber: str,
        want: int,
        now: int,
        owner: str,
        lease_us: int | None,
        lock_id: str | None,
        sweep: bool,
    ) -> list[Delivery]:
        """Claim what the index says is there (index-driven brokers, and browse locks on
        every broker)."""
        got: list[Delivery] = []
        if lock_id is None and self._claims_ready is not None:
            ready = self._claim_ready(self._claims_ready, subscriber, want, now, owner, lease_us)
            if ready is not None:
                got, off = ready
                if not off or len(got) >= want:
                    return got
                # Off the common path (a pool, a time limit, a retry delay...): the
                # per-message engine decides those; what it cannot claim (a payload not
                # yet on the broker, say) must not hide the messages behind it, which
                # the candidates below reach.
                got += self._claim_by_index(
                    subscriber, off, want - len(got), now, owner, lease_us, None
                )
                if len(got) >= want:
                    return got
        rest = want - len(got)
        ask = max(rest, CLAIM_BATCH)
        # Candidates are read outside the claim's transaction, so other consumers can
        # take every one of them first: only an empty list means there is nothing.
        for _ in range(CAS_ATTEMPTS):
            ids = self._store.claimable(self.name, subscriber, now, ask, lock_id)
            if not ids:
                return got
            more = self._claim_by_index(subscriber, ids, rest, now, owner, lease_us, lock_id)
            if more:
                return got + more
        return got

    def _claim_ready(
        self,
        store: ClaimsReady,
        subscriber: str,
        want: int,
        now: int,
        owner: str,
        lease_us: int | None,
    ) -> tuple[list[Delivery], list[str]] | None:
        """Claim up to ``want`` ready messages where the index keeps them (one
        transaction, no record per message) and read their payloads by reference in it:
        the deliveries, and the ready messages off the common path. None, with nothing
        claimed, when a payload is not on the broker (the per-record path then decides
        what becomes of it)."""
        tokens = LeaseTokens(want)
        try:
            with self._store.atomic():
                # Stamped once the write lock is held, as the per-record path does.
                at = max(now, self._now())
                until = at + lease_us if lease_us is not None else None
                plan = engine_batch.claim_plan(subscriber, owner, until)
                claimed, off = store.claim_ready(self.name, plan, at, tokens)
                envs = (
                    self._adapter.read_many(self.name, [row[1] for row in claimed])
                    if claimed
                    else []
                )
                if any(env is None for env in envs):
                    raise _PayloadAway
        except _PayloadAway:
            return None
        out: list[Delivery] = []
        for (msg_id, ref, attempt, most, token), env in zip(claimed, envs, strict=True):
            assert env is not None
            # The hold knows no record: a settle where the index lives needs none, and
            # any other move reads it (a batch's in one call).
            hold = Hold(msg_id, subscriber, token, group=subscriber, ref=ref, lease_until=until)
            out.append(Delivery(self._settling, env, subscriber, token, attempt, most, hold=hold))
        return out, off

    def _get_from_groups(
        self,
        subscriber: str,
        want: int,
        now: int,
        owner: str,
        lease_us: int | None,
        lock_id: str | None,
        sweep: bool,
    ) -> list[Delivery]:
        """Redeliveries the index knows of, then the broker's consumer groups (the
        receiving part), then what another pool member read ahead (native-group
        brokers)."""
        # Given back (released, undone, re-revealed, lease lapsed): the index knows; the
        # broker keeps such an entry pending or acknowledged. Asked on the sweep's
        # schedule, or at once after this process gave one back, not on every get (one
        # index round trip each).
        out: list[Delivery] = []
        if sweep or (self.name, subscriber) in self.hub.redeliveries:
            due = self._store.redeliverable(self.name, subscriber, now, max(want, CLAIM_BATCH))
            if due:
                out = self._claim_by_index(
                    subscriber, due, want, now, owner, lease_us, None, owned_only=True
                )
            if not out:
                self.hub.redeliveries.discard((self.name, subscriber))
            elif len(out) >= want:
                return out
        min_idle = lease_us / 1_000_000 if lease_us is not None else self.lease
        out += self._receiving.receive(subscriber, want - len(out), owner, lease_us, min_idle)
        if not out and self._others_read_ahead:
            out = self._claim_read_ahead(subscriber, want, owner, lease_us)
        return out

    def _claim_read_ahead(
        self,
        subscriber: str,
        want: int,
        owner: str,
        lease_us: int | None,
    ) -> list[Delivery]:
        """For a pool member whose groups had nothing: messages still AVAILABLE whose
        entries another member read ahead (they wait in that member's process, not in the
        group), claimed through the index; the other member then finds them taken."""
        if all(group == subscriber for group in self._subscriptions().groups_for(subscriber)):
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
