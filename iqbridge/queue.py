"""The facade over one logical queue: put, get, confirm, undo, browse, state, search, purge.

Every state change goes through :mod:`iqbridge.engine` (the transition table) and is
committed to the index store with compare-and-set; the adapter only moves payloads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from iqbridge import engine
from iqbridge.delivery import Delivery
from iqbridge.engine import Change
from iqbridge.errors import (
    AudienceError,
    ConcurrentUpdate,
    IllegalTransition,
    InvalidArgument,
    IQError,
    LockedError,
    MessageNotFound,
    MessageTooLarge,
)
from iqbridge.ids import adopted_id, new_id, new_token
from iqbridge.model import (
    Audience,
    Envelope,
    Filter,
    MessageRecord,
    MessageState,
    MessageSummary,
    Pool,
    Received,
    SubscriberView,
    Subscriptions,
    check_name,
    check_text,
    from_micros,
)
from iqbridge.payload import encode
from iqbridge.retry import RetryPolicy
from iqbridge.states import (
    IN_DOUBT,
    TERMINAL,
    ActorKind,
    PublisherState,
    SubscriberState,
)
from iqbridge.stores.base import StaleRecord
from iqbridge.transaction import Transaction, join

if TYPE_CHECKING:
    from iqbridge.hub import Hub

__all__ = ["Browse", "Queue"]

log = logging.getLogger("iqbridge")

_CAS_ATTEMPTS = 50
_CLAIM_BATCH = 4
_SUBS_TTL = 1.0
_RECEIVE_SKIPS = 100
_MSG_ID_MAX = 128

AudienceSpec = str | Pool | Iterable[str | Pool]


@dataclass(frozen=True, slots=True)
class Browse:
    """What a browse found; with ``lock_id`` when the messages were locked for the caller."""

    messages: list[MessageSummary]
    lock_id: str | None = None


def _seconds(value: float | timedelta | None, what: str) -> float | None:
    if value is None:
        return None
    secs = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if secs < 0:
        raise InvalidArgument(f"{what} must not be negative, got {secs}")
    return secs


class Queue:
    """One logical queue, as seen through a :class:`~iqbridge.hub.Hub`.

    Create it with ``hub.queue(name)``. Publishers :meth:`put`; subscribers :meth:`get`
    and finish each :class:`~iqbridge.delivery.Delivery`; anybody can ask for
    :meth:`state` and :meth:`search`.
    """

    def __init__(
        self,
        hub: Hub,
        name: str,
        *,
        retry: RetryPolicy,
        lease: float,
        max_bytes: int,
        auto_journal: bool,
        sweep_interval: float,
    ) -> None:
        self.hub = hub
        self.name = name
        self.retry = retry
        self.lease = lease
        self.max_bytes = max_bytes
        self.auto_journal = auto_journal
        self.sweep_interval = sweep_interval
        self._store = hub.store
        self._adapter = hub.adapter
        self._native = hub.adapter.capabilities.native_groups
        self._shared_txn = hub.shares_transaction
        self._next_sweep = 0.0
        self._subs: Subscriptions | None = None
        self._subs_at = 0.0
        self._declared: set[str] = set()

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} on {self._adapter.url}>"

    # --- plumbing ------------------------------------------------------------------------

    def _now(self) -> int:
        return self.hub.now_us()

    def _apply(
        self,
        msg_id: str,
        op: Callable[[MessageRecord], Change | None],
        hint: MessageRecord | None = None,
    ) -> Change | None:
        """Read, let the engine decide, commit with compare-and-set; retry on a lost race.

        ``hint`` is a record the caller already holds (a delivery's own last change): it
        saves the read when nothing changed meanwhile; if it is stale, compare-and-set
        fails or the engine refuses, and the decision is made again on a fresh read.
        """
        store = self._store
        for _ in range(_CAS_ATTEMPTS):
            with store.atomic():
                if hint is not None:
                    rec, hint = hint, None
                    try:
                        change = op(rec)
                    except IQError:
                        continue
                else:
                    rec = store.load(msg_id)
                    if rec.queue != self.name:
                        raise MessageNotFound(msg_id, self.name)
                    change = op(rec)
                if change is None:
                    return None
                try:
                    store.commit(change)
                except StaleRecord:
                    continue
                if self._native:
                    for m in change.record.members.values():
                        if m.attempt > 1 and m.state is SubscriberState.AVAILABLE:
                            self.hub.redeliveries.add((self.name, m.subscriber))
                return change
        raise ConcurrentUpdate(msg_id, _CAS_ATTEMPTS)

    def _subscriptions(self, fresh: bool = False) -> Subscriptions:
        now = time.monotonic()
        if fresh or self._subs is None or now - self._subs_at > _SUBS_TTL:
            self._subs = self._store.subscriptions(self.name)
            self._subs_at = now
        return self._subs

    def _declare_groups(self, groups: Iterable[str]) -> None:
        missing = [g for g in groups if g not in self._declared]
        if missing:
            self._adapter.declare(self.name, missing)
            self._declared.update(missing)

    # --- subscriptions -------------------------------------------------------------------

    def subscriptions(self) -> Subscriptions:
        """The queue's standing subscribers and pools."""
        return self._subscriptions(fresh=True)

    def subscribe(self, *subscribers: str) -> None:
        """Add named subscribers to the standing audience (each gets every message)."""
        subs = self._subscriptions(fresh=True)
        names = list(subs.subscribers)
        for s in subscribers:
            check_name("subscriber", s)
            if subs.pool(s) is not None:
                raise AudienceError(f"{s!r} already names a pool on queue {self.name!r}")
            if s not in names:
                names.append(s)
        self._set_subscriptions(Subscriptions(tuple(names), subs.pools, subs.adhoc_pools))

    def subscribe_pool(self, pool: str, members: Iterable[str]) -> None:
        """Declare (or redefine) a pool in the standing audience: one member gets each message."""
        new = Pool(pool, members)
        if not new.members:
            raise AudienceError(f"pool {pool!r} needs at least one member")
        subs = self._subscriptions(fresh=True)
        if pool in subs.subscribers:
            raise AudienceError(f"{pool!r} already names a subscriber on queue {self.name!r}")
        pools = (*(p for p in subs.pools if p.name != pool), new)
        adhoc = tuple(p for p in subs.adhoc_pools if p.name != pool)
        self._set_subscriptions(Subscriptions(subs.subscribers, pools, adhoc))

    def unsubscribe(self, name: str) -> None:
        """Remove a subscriber or pool from the standing audience (messages already put
        keep their audience)."""
        subs = self._subscriptions(fresh=True)
        self._set_subscriptions(
            Subscriptions(
                tuple(s for s in subs.subscribers if s != name),
                tuple(p for p in subs.pools if p.name != name),
                subs.adhoc_pools,
            )
        )

    def _set_subscriptions(self, subs: Subscriptions) -> None:
        self._store.set_subscriptions(self.name, subs)
        self._subs, self._subs_at = subs, time.monotonic()
        if self._native:
            self._declare_groups([*subs.subscribers, *(p.name for p in subs.pools)])

    def _audience(self, to: AudienceSpec | None) -> Audience:
        subs = self._subscriptions()
        if to is None:
            return subs.audience().validate()
        items: list[str | Pool] = [to] if isinstance(to, str | Pool) else list(to)
        names: list[str] = []
        pools: list[Pool] = []
        adhoc: list[Pool] = []
        for item in items:
            if isinstance(item, Pool):
                known = subs.pool(item.name)
                if not item.members:
                    if known is None:
                        raise AudienceError(
                            f"pool {item.name!r} is not declared on queue {self.name!r}; "
                            f"declare it with queue.subscribe_pool(name, members) or pass "
                            f"Pool(name, members)"
                        )
                    pools.append(known)
                    continue
                if (
                    known is not None
                    and set(known.members) != set(item.members)
                    and (known in subs.pools)
                ):
                    raise AudienceError(
                        f"pool {item.name!r} is declared on queue {self.name!r} with members "
                        f"{list(known.members)}, not {list(item.members)}"
                    )
                if known is None or set(known.members) != set(item.members):
                    adhoc.append(item)
                pools.append(item)
            elif isinstance(item, str):
                known = subs.pool(item)
                if known is not None:
                    pools.append(known)
                else:
                    names.append(check_name("subscriber", item))
            else:
                raise AudienceError(
                    f"audience entries must be subscriber names or Pool(...), not "
                    f"{type(item).__name__}"
                )
        audience = Audience(tuple(names), tuple(pools)).validate()
        if adhoc:
            fresh = self._subscriptions(fresh=True)
            keep = tuple(p for p in fresh.adhoc_pools if p.name not in {a.name for a in adhoc})
            self._set_subscriptions(
                Subscriptions(fresh.subscribers, fresh.pools, keep + tuple(adhoc))
            )
        return audience

    # --- publisher side --------------------------------------------------------------------

    def put(
        self,
        payload: object,
        *,
        to: AudienceSpec | None = None,
        publisher: str | None = None,
        correlation_id: str | None = None,
        priority: int = 4,
        ordering_key: str | None = None,
        ttl: float | timedelta | None = None,
        confirm: bool = False,
        parents: Iterable[str] = (),
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
        msg_id: str | None = None,
    ) -> str:
        """Put one message; return its msg_id.

        ``to`` names subscribers and pools (``Pool(name, members)`` or a declared pool's
        name); without it the queue's standing subscriptions are the audience. A plain
        put is PUT then REVEALED at once; with ``confirm=True`` it stays PUT (hidden)
        until :meth:`confirm_put`, or :meth:`undo` withdraws it. ``ttl`` seconds after the
        put, members that have not got it yet go EXPIRED. ``priority`` is 0-9 (9 first).

        ``msg_id`` makes the put idempotent (see :meth:`put_many`'s ``msg_ids``).
        """
        return self.put_many(
            [payload],
            to=to,
            publisher=publisher,
            correlation_id=correlation_id,
            priority=priority,
            ordering_key=ordering_key,
            ttl=ttl,
            confirm=confirm,
            parents=parents,
            headers=headers,
            content_type=content_type,
            msg_ids=None if msg_id is None else [msg_id],
        )[0]

    def put_many(
        self,
        payloads: Iterable[object],
        *,
        to: AudienceSpec | None = None,
        publisher: str | None = None,
        correlation_id: str | None = None,
        priority: int = 4,
        ordering_key: str | None = None,
        ttl: float | timedelta | None = None,
        confirm: bool = False,
        parents: Iterable[str] = (),
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
        msg_ids: Sequence[str] | None = None,
    ) -> list[str]:
        """Put several messages with the same options in one transaction; return their ids.

        ``msg_ids`` (one per payload, chosen by the caller, as a transactional outbox
        does) makes the put idempotent: a message whose id the index already has is not
        put again, and is only sent to the broker if an earlier attempt stopped before
        the broker had it. A put with ``msg_ids`` that failed (say, the broker went away)
        is safe to repeat with the same ids and arguments: unlike a plain put, it leaves
        the index record in place for the repeat to finish, instead of withdrawing it.
        """
        if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 9:
            raise InvalidArgument(f"priority must be an int from 0 to 9, got {priority!r}")
        hdrs = dict(headers or {})
        for k, v in hdrs.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidArgument("headers must map str to str")
            check_text(f"header {k!r}", v)
            check_text("header name", k)
        if correlation_id is not None:
            check_text("correlation_id", correlation_id)
        if ordering_key is not None:
            check_text("ordering_key", ordering_key)
        ttl_s = _seconds(ttl, "ttl")
        publisher = check_name("publisher", publisher or self.hub.publisher)
        parent_ids = tuple(parents)
        items = list(payloads)
        ids = self._check_ids(msg_ids, len(items)) if msg_ids is not None else None
        audience = self._audience(to)
        now = self._now()
        expires_at = now + int(ttl_s * 1_000_000) if ttl_s is not None else None
        limit = min(self.max_bytes, self._adapter.capabilities.max_payload_bytes)
        envelopes: list[Envelope] = []
        changes: list[Change] = []
        groups = (*audience.subscribers, *(p.name for p in audience.pools))
        for i, payload in enumerate(items):
            body, ctype = encode(payload, content_type)
            if len(body) > limit:
                raise MessageTooLarge(len(body), limit, self.name)
            msg_id = ids[i] if ids is not None else new_id()
            envelopes.append(
                Envelope(
                    msg_id=msg_id,
                    body=body,
                    content_type=ctype,
                    headers=hdrs,
                    publisher=publisher,
                    correlation_id=correlation_id,
                    priority=priority,
                    ordering_key=ordering_key or publisher,
                    parents=parent_ids,
                    put_at=now,
                    groups=groups,
                )
            )
            changes.append(
                engine.new_message(
                    msg_id=msg_id,
                    queue=self.name,
                    publisher=publisher,
                    audience=audience,
                    now=now,
                    ordering_key=ordering_key,
                    correlation_id=correlation_id,
                    priority=priority,
                    parents=parent_ids,
                    expires_at=expires_at,
                    max_attempts=self.retry.max_attempts,
                    content_type=ctype,
                    size=len(body),
                    confirm=confirm,
                )
            )
        if not envelopes:
            return []
        if ids is not None:
            self._put_idempotent(audience, envelopes, changes)
        elif self._shared_txn:
            with self._store.atomic():
                refs = self._adapter.send(self.name, envelopes)
                for change, ref in zip(changes, refs, strict=True):
                    change.record.native_ref = ref
                self._store.commit_many(changes)
        else:
            self._put_via_broker(audience, envelopes, changes)
        self.hub.notify()
        return [e.msg_id for e in envelopes]

    def _check_ids(self, msg_ids: Sequence[str], count: int) -> list[str]:
        ids = [msg_ids] if isinstance(msg_ids, str) else list(msg_ids)
        if len(ids) != count:
            raise InvalidArgument(f"got {len(ids)} msg_ids for {count} payloads; pass one each")
        for i in ids:
            if (
                not isinstance(i, str)
                or not 0 < len(i) <= _MSG_ID_MAX
                or any(c.isspace() or c in "/\x00" for c in i)
            ):
                raise InvalidArgument(
                    f"msg_id {i!r} must be a string of 1 to {_MSG_ID_MAX} characters without "
                    f"whitespace, '/' or NUL; iqbridge.ids.new_id() makes one"
                )
        if len(set(ids)) != len(ids):
            raise InvalidArgument("msg_ids must be distinct within one put")
        return ids

    def _put_idempotent(
        self, audience: Audience, envelopes: list[Envelope], changes: list[Change]
    ) -> None:
        # The usual case, none of the ids known yet, costs what a plain put costs; a
        # creation that meets an existing record fails whole (StaleRecord, nothing
        # written), and then each message is settled on its own.
        try:
            if self._shared_txn:
                with self._store.atomic():
                    refs = self._adapter.send(self.name, envelopes)
                    for change, ref in zip(changes, refs, strict=True):
                        change.record.native_ref = ref
                    self._store.commit_many(changes)
            else:
                self._put_via_broker(audience, envelopes, changes, withdraw=False)
            return
        except StaleRecord:
            pass
        for env, change in zip(envelopes, changes, strict=True):
            change.record.native_ref = None
            self._put_once(env, change)

    def _put_once(self, env: Envelope, change: Change) -> None:
        """Create one message unless the index has it; send what the broker lacks."""
        store = self._store
        msg_id = change.msg_id
        for _ in range(_CAS_ATTEMPTS):
            try:
                with store.atomic() if self._shared_txn else contextlib.nullcontext():
                    try:
                        rec: MessageRecord | None = store.load(msg_id)
                    except MessageNotFound:
                        rec = None
                    if rec is None:
                        if self._shared_txn:
                            change.record.native_ref = self._adapter.send(self.name, [env])[0]
                        store.commit(change)  # StaleRecord: someone created it meanwhile
            except StaleRecord:
                continue
            if rec is None:
                if not self._shared_txn:
                    store.set_native_ref(msg_id, self._adapter.send(self.name, [env])[0])
                return
            if rec.queue != self.name:
                raise InvalidArgument(
                    f"msg_id {msg_id} already names a message of queue {rec.queue!r}, "
                    f"not {self.name!r}; give each message its own id"
                )
            if rec.native_ref is None and not self._shared_txn:
                # An earlier attempt stopped between the index and the broker. It may also
                # have stopped after the broker took the entry but before its reference was
                # recorded; then the broker gets a second entry, which the once-only rule
                # makes harmless (see _accept).
                sent = dataclasses.replace(env, put_at=rec.created_at)
                store.set_native_ref(msg_id, self._adapter.send(self.name, [sent])[0])
            return
        raise ConcurrentUpdate(msg_id, _CAS_ATTEMPTS)

    def _put_via_broker(
        self,
        audience: Audience,
        envelopes: list[Envelope],
        changes: list[Change],
        *,
        withdraw: bool = True,
    ) -> None:
        # Index first: a broker entry must never exist without its record (it would be
        # adopted as a stranger's message). If the broker then refuses, withdraw, unless
        # the put is idempotent (the caller repeats it, and the repeat sends).
        if self._native:
            self._declare_groups([*audience.subscribers, *(p.name for p in audience.pools)])
        colocated = self.hub.colocated
        if colocated is not None:
            # One server: records and entries are written in one atomic step.
            colocated.send_indexed(self.name, envelopes, changes, self._store)
            return
        self._store.commit_many(changes)
        try:
            refs = self._adapter.send(self.name, envelopes)
        except IQError as exc:
            if not withdraw:
                raise
            why = f"the broker refused the put ({type(exc).__name__})"
            for change in changes:
                self._apply(change.msg_id, lambda r: engine.withdraw(r, self._now(), why))
            raise
        for change, ref in zip(changes, refs, strict=True):
            self._store.set_native_ref(change.msg_id, ref)

    def confirm_put(self, msg_id: str) -> None:
        """Reveal a put made with ``confirm=True``: PUT -> REVEALED."""
        change = self._apply(msg_id, lambda r: engine.reveal(r, self._now()))
        if change is not None:
            self._wake(change.record)
        self.hub.notify()

    def reveal(self, msg_id: str, to: str | None = None) -> None:
        """Confirm a pending put, or with ``to`` re-reveal the message to one subscriber
        that found it UNUSABLE (AVAILABLE again, attempt + 1)."""
        if to is None:
            self.confirm_put(msg_id)
            return
        self._apply(msg_id, lambda r: engine.rereveal(r, to, self._now()))
        self.hub.notify()

    def withdraw(self, msg_id: str, reason: str = "withdrawn by publisher") -> None:
        """No subscriber may retrieve it any more; those already past GET finish normally."""
        self._apply(msg_id, lambda r: engine.withdraw(r, self._now(), reason))

    def undo(self, confirm_id: str) -> None:
        """Undo an unconfirmed put (its msg_id) or a held get (its delivery's confirm_id)."""
        if "/" in confirm_id:
            msg_id, subscriber, token = self._parse_confirm(confirm_id)
            self._release(msg_id, subscriber, token, "undo", 0.0)
            return

        def undo_put(rec: MessageRecord) -> Change:
            if rec.publisher_state is not PublisherState.PUT:
                raise IllegalTransition(
                    rec.msg_id,
                    rec.publisher,
                    rec.publisher_state,
                    PublisherState.UNAVAILABLE,
                    "undo",
                    "the put is not awaiting confirmation; use withdraw()",
                )
            return engine.withdraw(rec, self._now(), "put undone")

        self._apply(confirm_id, undo_put)

    # --- subscriber side -------------------------------------------------------------------

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
        lease_s = _seconds(lease, "lease")
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
            for _ in range(_CAS_ATTEMPTS):
                ids = self._store.claimable(self.name, subscriber, now, _CLAIM_BATCH, lock_id)
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
            due = self._store.redeliverable(self.name, subscriber, now, _CLAIM_BATCH)
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
        ids = self._store.claimable(self.name, subscriber, now, _CLAIM_BATCH)
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

    def _group_of(self, rec: MessageRecord, subscriber: str) -> str:
        member = rec.members[subscriber]
        return member.pool or member.subscriber

    def _process(
        self, msg_id: str, subscriber: str, token: str, hint: MessageRecord | None = None
    ) -> Change:
        change = self._apply(
            msg_id, lambda r: engine.process(r, subscriber, token, self._now()), hint
        )
        assert change is not None
        return change

    def _done(
        self,
        msg_id: str,
        subscriber: str,
        token: str | None,
        hint: MessageRecord | None = None,
        transaction: object = None,
        on_rollback: Callable[[], None] | None = None,
    ) -> Change:
        def op(r: MessageRecord) -> Change:
            return engine.done(r, subscriber, token, self._now(), auto_journal=self.auto_journal)

        if transaction is None:
            change = self._apply(msg_id, op, hint)
        else:
            # In the application's transaction: DONE commits (or not) with its rows, and
            # the broker hears of it only after the commit.
            with join(self._store, transaction) as binding:
                change = self._apply(msg_id, op, hint)
                if on_rollback is not None:
                    binding.on_rollback(on_rollback)
        assert change is not None
        rec = change.record
        if self._native and rec.native_ref:

            def ack() -> None:
                self._broker_call(
                    lambda: self._adapter.ack(
                        self.name, self._group_of(rec, subscriber), [rec.native_ref or ""]
                    )
                )

            if transaction is None:
                ack()
            else:
                binding.after_commit(ack)
        return change

    def transaction(self, connection: object) -> Transaction:
        """A transaction of your own database for :meth:`Delivery.done(transaction=...)
        <iqbridge.Delivery.done>`: DONE commits together with your rows (exactly-once).

        ``connection`` is a SQLAlchemy ``Engine`` or ``Connection`` on the database that
        holds this hub's SQL index. Use it as a context manager: it begins, commits on a
        clean exit (then acknowledges finished deliveries on the broker) and rolls back
        on an exception. Raises ConfigurationError if the index is not a SQL store and
        InvalidArgument if the connection does not reach the index's tables.
        """
        return Transaction(self, connection)

    def _unusable(
        self,
        msg_id: str,
        subscriber: str,
        token: str | None,
        reason: str,
        hint: MessageRecord | None = None,
    ) -> Change:
        change = self._apply(
            msg_id,
            lambda r: engine.unusable(
                r, subscriber, token, self._now(), reason, auto_journal=self.auto_journal
            ),
            hint,
        )
        assert change is not None
        rec = change.record
        if self._native and rec.native_ref:
            self._broker_call(
                lambda: self._adapter.dead_letter(
                    self.name, self._group_of(rec, subscriber), rec.native_ref or "", reason
                )
            )
        return change

    def _release(
        self,
        msg_id: str,
        subscriber: str,
        token: str | None,
        reason: str,
        delay: float,
        hint: MessageRecord | None = None,
    ) -> Change:
        delay_us = int(max(delay, 0.0) * 1_000_000)
        change = self._apply(
            msg_id,
            lambda r: engine.release(
                r, subscriber, token, self._now(), reason=reason, delay_us=delay_us
            ),
            hint,
        )
        assert change is not None
        self.hub.notify()
        return change

    def _renew(
        self,
        msg_id: str,
        subscriber: str,
        token: str,
        lease: float | None,
        hint: MessageRecord | None = None,
    ) -> Change:
        secs = _seconds(lease, "lease")
        secs = self.lease if secs is None else secs

        def op(r: MessageRecord) -> Change:
            now = self._now()
            return engine.renew(r, subscriber, token, now, now + int(secs * 1_000_000))

        change = self._apply(msg_id, op, hint)
        assert change is not None
        return change

    def _wake(self, rec: MessageRecord) -> None:
        """Requeue on the broker what it handed out while the index hid the message.

        A native-group broker keeps an entry the facade declined (put awaiting confirm,
        browse-locked) pending with the consumer that read it and never hands it to that
        consumer again; once members are AVAILABLE, their groups must see it again.
        """
        ref = rec.native_ref
        if not self._native or ref is None:
            return
        groups = {
            m.pool or m.subscriber
            for m in rec.members.values()
            if m.state is SubscriberState.AVAILABLE
        }
        for group in sorted(groups):
            self._broker_call(functools.partial(self._adapter.requeue, self.name, group, ref))

    def _broker_call(self, call: Callable[[], None]) -> None:
        # The index already holds the outcome; if the broker cannot be told now, its
        # redelivery is recognised later (once-only) and acknowledged then.
        try:
            call()
        except IQError as exc:
            log.warning("queue %s: broker acknowledgement deferred: %s", self.name, exc)

    @staticmethod
    def _parse_confirm(confirm_id: str) -> tuple[str, str, str]:
        parts = confirm_id.split("/")
        if len(parts) != 3 or not all(parts):
            raise InvalidArgument(
                f"{confirm_id!r} is not a confirm id; use delivery.confirm_id from get()"
            )
        return parts[0], parts[1], parts[2]

    def confirm_get(self, confirm_id: str) -> None:
        """Finish a held get (``delivery.confirm_id``): -> DONE, from any process."""
        msg_id, subscriber, token = self._parse_confirm(confirm_id)
        self._done(msg_id, subscriber, token)

    # --- looking -------------------------------------------------------------------------

    def state(self, msg_id: str) -> MessageState:
        """The publisher's and every subscriber's state and history, with timestamps."""
        rec = self._store.load(msg_id)
        if rec.queue != self.name:
            raise MessageNotFound(msg_id, self.name)
        journal = self._store.history(msg_id)
        pub_hist = tuple(
            (PublisherState(e.dst), from_micros(e.at))
            for e in journal
            if e.actor_kind is ActorKind.PUBLISHER
        )
        views: dict[str, SubscriberView] = {}
        for name, m in rec.members.items():
            hist = tuple(
                (SubscriberState(e.dst), from_micros(e.at))
                for e in journal
                if e.actor_kind is ActorKind.SUBSCRIBER and e.actor == name
            )
            views[name] = SubscriberView(
                subscriber=name,
                pool=m.pool,
                state=m.state,
                history=hist,
                attempt=m.attempt,
                reason=m.reason,
                lease_owner=m.lease_owner,
                lease_until=from_micros(m.lease_until) if m.lease_until else None,
            )
        return MessageState(
            msg_id=rec.msg_id,
            queue=rec.queue,
            publisher=rec.publisher,
            mode=rec.mode,
            correlation_id=rec.correlation_id,
            priority=rec.priority,
            parents=rec.parents,
            publisher_state=rec.publisher_state,
            publisher_history=pub_hist,
            subscribers=views,
            journal=tuple(journal),
        )

    def search(self, flt: Filter | None = None, **criteria: object) -> list[MessageSummary]:
        """Messages matching a :class:`~iqbridge.model.Filter` (or its fields as keywords),
        answered from the index without reading payloads."""
        if flt is None:
            try:
                flt = Filter(**criteria)  # type: ignore[arg-type]
            except TypeError as exc:
                raise InvalidArgument(f"bad search criteria: {exc}") from None
        elif criteria:
            raise InvalidArgument("pass a Filter or keyword criteria, not both")
        return self._store.search(self.name, flt)

    def peek(self, msg_id: str) -> Envelope:
        """The stored payload and envelope of a message, without changing any state."""
        rec = self._store.load(msg_id)
        if rec.queue != self.name:
            raise MessageNotFound(msg_id, self.name)
        env = self._adapter.read(self.name, rec.native_ref) if rec.native_ref else None
        if env is None:
            raise MessageNotFound(msg_id, self.name)
        return env

    def browse(
        self,
        flt: Filter | None = None,
        *,
        lock: bool = False,
        owner: str | None = None,
        lock_for: float | timedelta = 60.0,
        **criteria: object,
    ) -> Browse:
        """Find messages; with ``lock=True`` also lock them for the caller.

        Locked messages are hidden from every get except ``get(..., lock_id=...)`` until
        :meth:`unlock`, a get under the lock, or ``lock_for`` seconds pass. Messages
        already locked by someone else are left out of a locking browse.
        """
        found = self.search(flt, **criteria)
        if not lock:
            return Browse(found)
        lock_id = new_token()
        until_s = _seconds(lock_for, "lock_for")
        who = owner or self.hub.client_id
        locked: list[MessageSummary] = []
        for item in found:

            def op(r: MessageRecord) -> Change:
                now = self._now()
                until = now + int(until_s * 1_000_000) if until_s is not None else None
                return engine.lock(r, lock_id, who, now, until)

            try:
                self._apply(item.msg_id, op)
            except LockedError:
                continue
            locked.append(item)
        return Browse(locked, lock_id)

    def unlock(self, lock_id: str) -> int:
        """Release every message locked under ``lock_id``; return how many."""
        count = 0
        for item in self._store.search(self.name, Filter(lock_id=lock_id, limit=100_000)):
            try:
                change = self._apply(item.msg_id, lambda r: engine.unlock(r, lock_id, self._now()))
            except LockedError:
                continue
            if change is not None:
                self._wake(change.record)
            count += 1
        if count:
            self.hub.notify()
        return count

    # --- housekeeping --------------------------------------------------------------------

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

    def purge(self, older_than: float | timedelta) -> int:
        """Delete messages JOURNALLED longer than ``older_than`` (seconds or timedelta),
        payload included; the journal is kept. Returns how many were purged."""
        secs = _seconds(older_than, "older_than")
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
