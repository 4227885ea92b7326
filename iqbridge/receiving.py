"""Getting from a broker's consumer groups: each broker delivery resolved against the
index (claimed, skipped once-only, left pending, adopted when a stranger put it)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence

from iqbridge import engine, engine_batch
from iqbridge.adapter import ClaimOnReceive
from iqbridge.delivery import Delivery
from iqbridge.errors import ConcurrentUpdate, IllegalTransition, LockedError
from iqbridge.holding import Hold
from iqbridge.ids import LeaseTokens, adopted_id, new_token
from iqbridge.model import Audience, MessageRecord, Received, Retained
from iqbridge.put_paths import SEND_FIRST_WINDOW
from iqbridge.queue_core import CAS_ATTEMPTS, Part, QueueCore
from iqbridge.redaction import get_logger
from iqbridge.settling import Settling
from iqbridge.states import IN_DOUBT, TERMINAL, SubscriberState
from iqbridge.stores.base import ClaimsReceived, StaleRecord
from iqbridge.writes import Writes

__all__ = ["Receiving"]

#: How many reads one get makes of a group past entries it must skip.
_RECEIVE_SKIPS = 100
#: An entry without its record, put by a put that sends first (see
#: Capabilities.index_after_send): given back at once for this long after its put began,
#: then left pending; acknowledged as purged only past the put's window, twice over.
_RETRY_SOON_US = 5_000_000
_IN_FLIGHT_US = int(2 * SEND_FIRST_WINDOW * 1_000_000)

log = get_logger("iqbridge")

#: One read of a subscriber's groups: ``fetch(count)`` -> broker deliveries.
_Fetch = Callable[[int], list[Received]]


class Receiving(Part):
    """Deliveries from the broker's consumer groups (native-group adapters), each
    resolved against the index: claimed (in one commit for a batch, or by the receive
    itself where the index is on the broker's server), acknowledged once-only when the
    subscriber finished it, left pending when someone holds it, adopted when a client
    that knows nothing of iqbridge put it.

    One part of :class:`~iqbridge.queue.Queue`, used by the getting part; how the
    groups are read (one fused round trip over every group on a co-located index, else
    one read per group) is chosen once, when the queue opens."""

    def __init__(self, core: QueueCore, settling: Settling) -> None:
        super().__init__(core)
        self._settling = settling
        self._fetches: Callable[
            [str, Sequence[str], str, int | None, float],
            tuple[list[_Fetch], ClaimOnReceive | None],
        ]
        self._fetches = self._fused_fetch if self.hub.colocated is not None else self._group_fetches
        #: How a read's entries are resolved against the index, chosen once: where a
        #: store apart from the broker keeps the messages, by a plan from the transition
        #: table and no record per message (ClaimsReceived); else through the records.
        store = self._store
        self._claims_received: ClaimsReceived | None = (
            store if self.hub.colocated is None and isinstance(store, ClaimsReceived) else None
        )

    def receive(
        self, subscriber: str, want: int, owner: str, lease_us: int | None, min_idle: float
    ) -> list[Delivery]:
        """Up to ``want`` deliveries for ``subscriber`` read from its groups and claimed
        (each under ``lease_us`` from its claim; None: no lease)."""
        groups = self._subscriptions().groups_for(subscriber)
        self._declare_groups(groups)
        fetches, fused = self._fetches(subscriber, groups, owner, lease_us, min_idle)
        out: list[Delivery] = []
        for fetch in fetches:
            # A group also carries entries this subscriber must skip (addressed to others,
            # finished, hidden): read on past them, so a message behind them is found now.
            for _ in range(_RECEIVE_SKIPS):
                need = want - len(out)
                received = fetch(need)
                if not received:
                    break
                if fused is not None and fused.tokens:
                    out += self._accept_fused(received, subscriber, owner, lease_us, fused)
                elif self._claims_received is not None:
                    out += self._accept_in_store(
                        self._claims_received, received, subscriber, owner, lease_us
                    )
                else:
                    out += self._accept_many(received, subscriber, owner, lease_us)
                if len(out) >= want or len(received) < need:
                    break
            if len(out) >= want:
                break
        return out

    def _fused_fetch(
        self,
        subscriber: str,
        groups: Sequence[str],
        owner: str,
        lease_us: int | None,
        min_idle: float,
    ) -> tuple[list[_Fetch], ClaimOnReceive | None]:
        """One round trip over all the subscriber's groups, index records included, the
        common path's claims made on the way (the index on the broker's server)."""
        colocated = self.hub.colocated
        assert colocated is not None
        fused = ClaimOnReceive(subscriber, owner, lease_us, self._now)
        fetch = functools.partial(
            colocated.receive_indexed,
            self.name,
            groups,
            subscriber,
            min_idle=min_idle,
            store=self._store,
            claim=fused,
        )
        return [lambda count: fetch(count=count)], fused

    def _group_fetches(
        self,
        subscriber: str,
        groups: Sequence[str],
        owner: str,
        lease_us: int | None,
        min_idle: float,
    ) -> tuple[list[_Fetch], ClaimOnReceive | None]:
        """One read per group, resolved against the index afterwards."""
        receive = self._adapter.receive
        name = self.name
        return [
            functools.partial(
                lambda group, count: receive(
                    name, group, subscriber, count=count, timeout=0.0, min_idle=min_idle
                ),
                group,
            )
            for group in groups
        ], None

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

    def _accept_in_store(
        self,
        store: ClaimsReceived,
        batch: Sequence[Received],
        subscriber: str,
        owner: str,
        lease_us: int | None,
    ) -> list[Delivery]:
        """Resolve broker deliveries of ``subscriber``'s own group where the index store
        keeps their messages: the common path claimed there in one transaction, no
        record per message (each delivery's hold knows its group, entry and lease); the
        rest (other groups' entries, strangers' messages, anything the store leaves
        off the common path) by :meth:`_accept_many`. In the order of ``batch``."""
        mine = [i for i, r in enumerate(batch) if r.group == subscriber]
        if not mine:
            return self._accept_many(batch, subscriber, owner, lease_us)
        at = self._now()
        until = at + lease_us if lease_us is not None else None
        plan = engine_batch.claim_plan(subscriber, owner, until)
        # A stranger's entry is adopted on the per-message path: named by no msg_id
        # here, it is off the common path and holds back the later entries of its key.
        entries = [
            (
                "" if batch[i].adopted else batch[i].envelope.msg_id,
                batch[i].native_ref,
                batch[i].envelope.ordering_key,
            )
            for i in mine
        ]
        claims = store.claim_received(self.name, plan, at, entries, LeaseTokens(len(mine)))
        got: dict[int, Delivery] = {}
        for i, claim in zip(mine, claims, strict=True):
            if claim is None:
                continue
            r = batch[i]
            msg_id, ref, attempt, most, token = claim
            hold = Hold(msg_id, subscriber, token, group=r.group, ref=ref, lease_until=until)
            got[i] = Delivery(
                self._settling, r.envelope, subscriber, token, attempt, most, hold=hold
            )
        if len(got) == len(batch):
            return [got[i] for i in range(len(batch))]
        rest = [r for i, r in enumerate(batch) if i not in got]
        by_id = {d.msg_id: d for d in self._accept_many(rest, subscriber, owner, lease_us)}
        out: list[Delivery] = []
        for i, r in enumerate(batch):
            d = got.get(i) or by_id.pop(r.envelope.msg_id, None)
            if d is not None:
                out.append(d)
        return out + list(by_id.values())

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
        got: dict[str, Delivery] = {}
        at, until = fused.at, fused.lease_until
        for r in batch:
            token = tokens.get(r.native_ref)
            if token is None or r.claimed is None:
                continue
            attempt, most, read = r.claimed
            hold = Hold(
                r.envelope.msg_id,
                subscriber,
                token,
                make=functools.partial(
                    self._claimed_record,
                    read,
                    r.envelope.msg_id,
                    subscriber,
                    at,
                    token,
                    owner,
                    until,
                ),
                group=r.group,
                ref=r.native_ref,
                lease_until=until,
            )
            got[r.native_ref] = Delivery(
                self._settling, r.envelope, subscriber, token, attempt, most, hold=hold
            )
        mine = [
            (r, tokens[r.native_ref])
            for r in batch
            if r.native_ref in tokens and r.record and r.native_ref not in got
        ]
        taken = {r.native_ref for r, _ in mine} | set(got)
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

    def _claimed_record(
        self,
        read: Callable[[], MessageRecord | None],
        msg_id: str,
        subscriber: str,
        at: int,
        token: str,
        owner: str,
        until: int | None,
    ) -> MessageRecord | None:
        """The record of a claim the receive made, when a move needs it: the claim applied
        to the record as read before it (the batch engine, as the script made it), or,
        where that would not have made it, the index's record as it stands."""
        before = read()
        if before is not None:
            moved, _, _ = engine_batch.claim(
                [before], subscriber, at, [token], owner=owner, lease_until=until
            )
            if moved:
                return moved[0][1]
        return self._store.load_many([msg_id]).get(msg_id)

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
