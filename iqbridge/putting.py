"""The publisher side: put, confirm, reveal and withdraw."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from iqbridge import engine, engine_batch
from iqbridge.durations import to_seconds
from iqbridge.engine import Change
from iqbridge.errors import (
    BrokerUnavailable,
    ConcurrentUpdate,
    InvalidArgument,
    IQError,
    MessageNotFound,
    MessageTooLarge,
    PayloadNotRetained,
)
from iqbridge.ids import new_id
from iqbridge.model import Audience, Envelope, MessageRecord, Retained, check_name, check_text
from iqbridge.observability import tracing
from iqbridge.payload import encode
from iqbridge.queue_core import CAS_ATTEMPTS, Part, QueueCore
from iqbridge.redaction import get_logger
from iqbridge.stores.base import StaleRecord
from iqbridge.subscribing import AudienceSpec, Subscribing
from iqbridge.writes import Writes

_MSG_ID_MAX = 128


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message of :meth:`Putting.put_each`, with its own options (as for ``put``)."""

    payload: object
    msg_id: str | None = None
    correlation_id: str | None = None
    priority: int = 4
    ordering_key: str | None = None
    ttl: float | timedelta | None = None
    parents: Sequence[str] = ()
    headers: Mapping[str, str] | None = None
    content_type: str | None = None
    publisher: str | None = None


@dataclass(frozen=True, slots=True)
class _Spec:
    """A message's options, checked."""

    publisher: str
    correlation_id: str | None
    priority: int
    ordering_key: str | None
    ttl: float | None
    parents: tuple[str, ...]
    headers: dict[str, str]
    content_type: str | None

    @classmethod
    def checked(
        cls,
        publisher: str,
        correlation_id: str | None,
        priority: int,
        ordering_key: str | None,
        ttl: float | None,
        parents: tuple[str, ...],
        headers: Mapping[str, str] | None,
        content_type: str | None,
    ) -> _Spec:
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
        for p in parents:
            if not isinstance(p, str):
                raise InvalidArgument("parents must be msg_id strings")
        return cls(
            check_name("publisher", publisher),
            correlation_id,
            priority,
            ordering_key or None,  # an empty key is none: the publisher's order
            ttl,
            parents,
            hdrs,
            content_type,
        )


__all__ = ["SEND_FIRST_WINDOW", "Outgoing", "Putting"]

#: Seconds after its start within which a put that sends first (an adapter with
#: ``Capabilities.index_after_send``) commits its records available; a get gives an
#: entry without its record back until then, and acknowledges it as purged only after
#: twice as long (room for clocks apart and a commit waiting for the index).
SEND_FIRST_WINDOW = 60.0

log = get_logger("iqbridge")


class Putting(Part):
    """The publisher side: put and put_many (idempotent with msg_ids), confirm_put,
    reveal and withdraw.

    One part of :class:`~iqbridge.queue.Queue`; a put's audience comes from the
    subscribing part."""

    def __init__(self, core: QueueCore, subscribing: Subscribing) -> None:
        super().__init__(core)
        self._subscribing = subscribing
        # The path a put of new messages takes, chosen once for the hub's broker and
        # index (not asked on every put).
        self._put_new: Callable[[Audience, list[Envelope], Writes], None]
        if self._shared_txn:
            self._put_new = self._put_in_one_transaction
        elif self.hub.colocated is not None:
            self._put_new = self._put_colocated
        elif self._adapter.capabilities.index_after_send:
            self._put_new = self._put_then_index
        else:
            self._put_new = self._put_index_first
        #: An idempotent put's usual case (none of its ids known yet) on an index apart
        #: from the broker: the records in one batch commit, then the broker, then their
        #: references. (In one transaction with the broker, or on its server, the usual
        #: case is one atomic step already.)
        self._put_new_apart: Callable[[Audience, list[Envelope], Writes], bool] | None = (
            None if self._shared_txn or self.hub.colocated is not None else self._put_fresh
        )

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
        spec = _Spec.checked(
            publisher or self.hub.publisher,
            correlation_id,
            priority,
            ordering_key,
            to_seconds(ttl, "ttl"),
            tuple(parents),
            headers,
            content_type,
        )
        items = list(payloads)
        return self._put_specs(
            [(payload, spec) for payload in items],
            msg_ids=msg_ids,
            to=to,
            confirm=confirm,
        )

    def put_each(
        self,
        messages: Iterable[Outgoing],
        *,
        to: AudienceSpec | None = None,
        confirm: bool = False,
    ) -> list[str]:
        """Put several messages, each with its own options (:class:`Outgoing`), in one
        transaction, as :meth:`put_many` does; return their ids in order.

        A message with a ``msg_id`` is put idempotently (see :meth:`put_many`); either
        every message has one or none has. This is the put of a bridge or relay whose
        messages carry their own keys, parents and headers, at the cost of one batch."""
        outs = list(messages)
        if not outs:
            return []
        for o in outs:
            if not isinstance(o, Outgoing):
                raise InvalidArgument(f"put_each takes Outgoing messages, got {type(o).__name__}")
        with_ids = [o.msg_id is not None for o in outs]
        if any(with_ids) and not all(with_ids):
            raise InvalidArgument("give every message of a put_each a msg_id, or none")
        pairs = [
            (
                o.payload,
                _Spec.checked(
                    o.publisher or self.hub.publisher,
                    o.correlation_id,
                    o.priority,
                    o.ordering_key,
                    to_seconds(o.ttl, "ttl"),
                    tuple(o.parents),
                    o.headers,
                    o.content_type,
                ),
            )
            for o in outs
        ]
        ids = [o.msg_id or "" for o in outs] if all(with_ids) else None
        return self._put_specs(pairs, msg_ids=ids, to=to, confirm=confirm)

    @tracing.traced_put
    def _put_specs(
        self,
        pairs: list[tuple[object, _Spec]],
        *,
        msg_ids: Sequence[str] | None,
        to: AudienceSpec | None,
        confirm: bool,
    ) -> list[str]:
        ids = self._check_ids(msg_ids, len(pairs)) if msg_ids is not None else None
        audience = self._subscribing.audience(to)
        now = self._now()
        limit = min(self.max_bytes, self._adapter.capabilities.max_payload_bytes)
        envelopes: list[Envelope] = []
        items: list[engine_batch.NewItem] = []
        retain: list[Retained | None] = []
        groups = (*audience.subscribers, *(p.name for p in audience.pools))
        for i, (payload, spec) in enumerate(pairs):
            body, ctype = encode(payload, spec.content_type)
            if len(body) > limit:
                raise MessageTooLarge(len(body), limit, self.name)
            msg_id = ids[i] if ids is not None else new_id()
            expires_at = now + int(spec.ttl * 1_000_000) if spec.ttl is not None else None
            envelopes.append(
                Envelope(
                    msg_id=msg_id,
                    body=body,
                    content_type=ctype,
                    headers=spec.headers,
                    publisher=spec.publisher,
                    correlation_id=spec.correlation_id,
                    priority=spec.priority,
                    ordering_key=spec.ordering_key or spec.publisher,
                    parents=spec.parents,
                    put_at=now,
                    groups=groups,
                    expires_at=expires_at,
                )
            )
            items.append(
                (
                    msg_id,
                    spec.publisher,
                    spec.ordering_key,
                    spec.correlation_id,
                    spec.priority,
                    tuple(spec.parents),
                    expires_at,
                    ctype,
                    len(body),
                )
            )
            if self.retain:
                # The broker forgets: a copy beside the index, in the same commit.
                retain.append(Retained(body, spec.headers))
        if not envelopes:
            return []
        records, journal = engine_batch.create(
            self.name,
            audience,
            now,
            items,
            confirm=confirm,
            max_attempts=self.retry.max_attempts,
        )
        writes = Writes(self.name, created=records, retain=retain, journal=journal)
        if ids is not None:
            if not (
                self._put_new_apart is not None and self._put_new_apart(audience, envelopes, writes)
            ):
                self._put_idempotent(audience, envelopes, writes.as_changes())
        else:
            self._put_new(audience, envelopes, writes)
        self.hub.notify()
        return [e.msg_id for e in envelopes]

    def _put_in_one_transaction(
        self, audience: Audience, envelopes: list[Envelope], writes: Writes
    ) -> None:
        """The broker's queue and the index share one database transaction (the
        embedded queue): entries and records commit together."""
        with self._store.atomic():
            refs = self._adapter.send(self.name, envelopes)
            for rec, ref in zip(writes.created, refs, strict=True):
                rec.native_ref = ref
            if not all(self._store.commit_writes(writes)):
                raise StaleRecord(writes.created[0].msg_id)  # a new id taken: nothing stays

    def _put_colocated(self, audience: Audience, envelopes: list[Envelope], writes: Writes) -> None:
        """The index on the broker's server: records and entries in one atomic step, the
        journal as templates."""
        assert self.hub.colocated is not None
        if self._native:
            self._declare_groups([*audience.subscribers, *(p.name for p in audience.pools)])
        self.hub.colocated.send_indexed(self.name, envelopes, writes, self._store)

    def _put_index_first(
        self, audience: Audience, envelopes: list[Envelope], writes: Writes
    ) -> None:
        """The records first, then the broker (see :meth:`_put_via_broker`)."""
        self._put_via_broker(audience, envelopes, writes.as_changes())

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

    def _put_fresh(self, audience: Audience, envelopes: list[Envelope], writes: Writes) -> bool:
        """An idempotent put whose ids the index does not know yet (the usual case), on an
        index apart from the broker, as a batch: the records in one commit (index first: a
        broker entry must never exist without its record), the broker, then the native
        references. False, having sent nothing, when an id is known (a repeat) or was
        taken meanwhile: the caller settles the put as a repeat. If the broker refuses,
        the records stay without references and the put raises: it is in doubt, and the
        caller repeats it (the repeat sends what the broker lacks)."""
        store = self._store
        if store.load_many([e.msg_id for e in envelopes]):
            return False
        if self._native:
            self._declare_groups([*audience.subscribers, *(p.name for p in audience.pools)])
        try:
            if not all(store.commit_writes(writes)):
                return False  # raced: what was created here is sent by the repeat
        except StaleRecord:
            return False  # raced, and nothing was written
        refs = self._adapter.send(self.name, envelopes)
        store.set_native_refs([(e.msg_id, ref) for e, ref in zip(envelopes, refs, strict=True)])
        return True

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
        for change in changes:
            change.record.native_ref = None
        if not self._shared_txn and self.hub.colocated is None:
            with contextlib.suppress(StaleRecord):  # raced: settle each on its own
                self._repeat(audience, envelopes, changes)
                return
        for env, change in zip(envelopes, changes, strict=True):
            self._put_once(env, change)

    def _repeat(self, audience: Audience, envelopes: list[Envelope], changes: list[Change]) -> None:
        """A repeated put, as a batch: records the index lacks are created, and what
        the broker lacks (new records, and old ones an earlier attempt left without a
        native reference) is sent in one call, in the put's order, so a key's messages
        reach the broker in order. StaleRecord if someone creates one meanwhile."""
        known = self._store.load_many([c.msg_id for c in changes])
        for rec in known.values():
            if rec.queue != self.name:
                raise InvalidArgument(
                    f"msg_id {rec.msg_id} already names a message of queue {rec.queue!r}, "
                    f"not {self.name!r}; give each message its own id"
                )
        if self._probing is not None:
            self._find_sent(known)
        fresh = [c for c in changes if c.msg_id not in known]
        if fresh:
            if self._native:
                self._declare_groups([*audience.subscribers, *(p.name for p in audience.pools)])
            self._store.commit_many(fresh)
        send = [
            env
            if env.msg_id not in known
            else dataclasses.replace(env, put_at=known[env.msg_id].created_at)
            for env in envelopes
            if env.msg_id not in known or known[env.msg_id].native_ref is None
        ]
        if send:
            log.debug(
                "queue %s: a repeated put sends %d of %d (%d new)",
                self.name,
                len(send),
                len(envelopes),
                len(fresh),
            )
            refs = self._adapter.send(self.name, send)
            self._store.set_native_refs([(e.msg_id, r) for e, r in zip(send, refs, strict=True)])

    def _find_sent(self, known: dict[str, MessageRecord]) -> None:
        """Records an earlier attempt left without a native reference: ask the broker
        which it holds and record their references (in the index and in ``known``), so
        only the rest is sent again."""
        assert self._probing is not None
        lost = [(r.msg_id, r.created_at) for r in known.values() if r.native_ref is None]
        if not lost:
            return
        found = self._probing.find_sent(self.name, lost)
        if found:
            log.info(
                "queue %s: %d of %d messages in doubt had reached the broker",
                self.name,
                len(found),
                len(lost),
            )
            self._store.set_native_refs(sorted(found.items()))
            for msg_id, ref in found.items():
                known[msg_id].native_ref = ref

    def _put_once(self, env: Envelope, change: Change) -> None:
        """Create one message unless the index has it; send what the broker lacks."""
        store = self._store
        msg_id = change.msg_id
        colocated = self.hub.colocated
        for _ in range(CAS_ATTEMPTS):
            try:
                with store.atomic() if self._shared_txn else contextlib.nullcontext():
                    try:
                        rec: MessageRecord | None = store.load(msg_id)
                    except MessageNotFound:
                        rec = None
                    if rec is None:
                        if colocated is not None:
                            # The record and the entry in one atomic step, as a first put
                            # makes them: a kill can never leave one without the other.
                            colocated.send_indexed(self.name, [env], [change], store)
                            return
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
            if rec.native_ref is None and not self._shared_txn and self._probing is not None:
                # The broker may hold the entry already: the earlier attempt may have
                # stopped after the broker took it, before its reference was recorded.
                self._find_sent({msg_id: rec})
            if rec.native_ref is None and not self._shared_txn:
                # An earlier attempt stopped between the index and the broker (or, on a
                # broker that cannot be asked, after it: then the broker gets a second
                # entry, which the once-only rule makes harmless, see _accept).
                sent = dataclasses.replace(env, put_at=rec.created_at)
                store.set_native_ref(msg_id, self._adapter.send(self.name, [sent])[0])
            return
        raise ConcurrentUpdate(msg_id, CAS_ATTEMPTS)

    def _put_then_index(
        self, audience: Audience, envelopes: list[Envelope], writes: Writes
    ) -> None:
        """The broker first, then the records with their native references in one index
        commit (:attr:`~iqbridge.adapter.Capabilities.index_after_send`).

        A get that reads an entry before its record is committed gives it back (the put
        is in flight) for :data:`SEND_FIRST_WINDOW` after the put began, and acknowledges
        it as purged only after twice that. So the records are committed available only
        within the window; a put whose broker took longer, or refused, is withdrawn in the
        index (its records committed, then withdrawn: a get acknowledges the entries the
        broker took) and raises. A put cut short between the broker and the index (the
        process killed) leaves entries without records: no get hands them out, and the
        put never returned their ids."""
        if self._native:
            self._declare_groups([*audience.subscribers, *(p.name for p in audience.pools)])
        began = envelopes[0].put_at
        try:
            refs = self._adapter.send(self.name, envelopes)
        except IQError as exc:
            self._withdraw_put(writes, f"the broker refused the put ({type(exc).__name__})")
            raise
        took = self._now() - began
        if took > SEND_FIRST_WINDOW * 1_000_000:
            self._withdraw_put(writes, f"the broker took {took / 1e6:.0f} s to confirm the put")
            raise BrokerUnavailable(
                f"queue {self.name}: the broker at {self._adapter.url} took {took / 1e6:.1f} s "
                f"to confirm a put of {len(envelopes)} message(s), more than "
                f"{SEND_FIRST_WINDOW:g} s: the put is withdrawn; put them again"
            )
        for rec, ref in zip(writes.created, refs, strict=True):
            rec.native_ref = ref
        if not all(self._store.commit_writes(writes)):
            raise StaleRecord(writes.created[0].msg_id)  # a new id taken: nothing stays

    def _withdraw_put(self, writes: Writes, why: str) -> None:
        """Record a put the broker did not take whole, withdrawn (best effort: a get
        acknowledges an entry without its record once it is old enough)."""
        try:
            self._store.commit_writes(writes)
        except (IQError, StaleRecord):
            log.exception("queue %s: a failed put could not be recorded as withdrawn", self.name)
            return
        now = self._now()
        undo = [engine.withdraw(rec, now, why) for rec in writes.created]
        for change, ok in zip(undo, self._store.commit_each(undo), strict=True):
            if not ok:  # someone moved it meanwhile: decide on a fresh read
                self._apply(change.msg_id, lambda r: engine.withdraw(r, self._now(), why))

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
            now = self._now()
            undo = [engine.withdraw(c.record, now, why) for c in changes]
            for change, ok in zip(undo, self._store.commit_each(undo), strict=True):
                if not ok:  # someone moved it meanwhile: decide on a fresh read
                    self._apply(change.msg_id, lambda r: engine.withdraw(r, self._now(), why))
            raise
        self._store.set_native_refs(
            [(change.msg_id, ref) for change, ref in zip(changes, refs, strict=True)]
        )

    def confirm_put(self, msg_id: str, *, detail: str | None = None) -> None:
        """Reveal a put made with ``confirm=True``: PUT -> REVEALED (``detail``, who and
        why, is journalled with it)."""
        change = self._apply(msg_id, lambda r: engine.reveal(r, self._now(), detail))
        if change is not None:
            self._wake(change.record)
        self.hub.notify()

    def reveal(self, msg_id: str, to: str | None = None, *, detail: str | None = None) -> None:
        """Confirm a pending put, or with ``to`` re-reveal the message to one subscriber
        that found it UNUSABLE (AVAILABLE again, attempt + 1). ``detail`` is journalled
        with the move (who asked, and why); a re-reveal's default is "re-revealed by
        publisher"."""
        if to is None:
            self.confirm_put(msg_id, detail=detail)
            return
        if self._adapter.capabilities.forgets:
            # The member's entry is gone from the broker: the retained copy serves the
            # redelivery, so without one there is nothing to reveal.
            rec = self._store.load(msg_id)
            if rec.queue == self.name and not self._envelopes([rec]):
                raise PayloadNotRetained(msg_id, self.name, self._adapter.url, "re-reveal")
        why = detail or "re-revealed by publisher"
        self._apply(msg_id, lambda r: engine.rereveal(r, to, self._now(), why))
        self.hub.notify()

    def withdraw(self, msg_id: str, reason: str = "withdrawn by publisher") -> None:
        """No subscriber may retrieve it any more; those already past GET finish normally."""
        self._apply(msg_id, lambda r: engine.withdraw(r, self._now(), reason))
