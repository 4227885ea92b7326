"""The ways a put reaches the broker and the index, one per kind of hub, chosen once when a
queue opens (:func:`put_path`):

* :class:`InOneTransaction`: the broker's queue and the index share one database
  transaction (the embedded SQLite queue): entries and records commit together;
* :class:`OnBrokerServer`: the index lives on the broker's server (Redis Streams with the
  Redis index): records and entries in one atomic step;
* :class:`IndexFirst`: the index apart from the broker: the records first (a broker entry
  must never exist without its record), then the broker, then the references;
* :class:`SendFirst`: the index apart, the broker first and the records with their
  references in one commit (``Capabilities.index_after_send``: Kafka).

Each writes a put of new messages (:meth:`PutPath.put_new`) and an idempotent put
(:meth:`PutPath.put_idempotent`, ``msg_ids``: a repeat creates only what the index lacks
and sends only what the broker lacks) once, for a whole batch; what no batch can settle
(a race with another putter of the same ids) goes one message at a time
(:meth:`PutPath.put_once`)."""

from __future__ import annotations

import contextlib
import dataclasses

from iqbridge import engine
from iqbridge.engine import Change
from iqbridge.errors import (
    BrokerUnavailable,
    ConcurrentUpdate,
    InvalidArgument,
    IQError,
    MessageNotFound,
)
from iqbridge.model import Audience, Envelope, MessageRecord
from iqbridge.queue_core import CAS_ATTEMPTS, Part, QueueCore
from iqbridge.redaction import get_logger
from iqbridge.stores.base import StaleRecord
from iqbridge.writes import Writes

__all__ = [
    "SEND_FIRST_WINDOW",
    "InOneTransaction",
    "IndexFirst",
    "OnBrokerServer",
    "PutPath",
    "SendFirst",
    "put_path",
]

#: Seconds after its start within which a put that sends first (an adapter with
#: ``Capabilities.index_after_send``) commits its records available; a get gives an
#: entry without its record back until then, and acknowledges it as purged only after
#: twice as long (room for clocks apart and a commit waiting for the index).
SEND_FIRST_WINDOW = 60.0

log = get_logger("iqbridge")


def put_path(core: QueueCore) -> PutPath:
    """The way puts of this queue's hub go, chosen once for its broker and index."""
    if core.shared_txn:
        return InOneTransaction(core)
    if core.hub.colocated is not None:
        return OnBrokerServer(core)
    if core.adapter.capabilities.index_after_send:
        return SendFirst(core)
    return IndexFirst(core)


class PutPath(Part):
    """How puts reach the broker and the index on one kind of hub."""

    def put_new(self, audience: Audience, envelopes: list[Envelope], writes: Writes) -> None:
        """Put new messages (fresh ids): records and broker entries."""
        raise NotImplementedError

    def put_idempotent(self, audience: Audience, envelopes: list[Envelope], writes: Writes) -> None:
        """Put messages with the caller's ids: what the index has already is not
        created again, and the broker gets only what it lacks."""
        raise NotImplementedError

    def _declare_audience(self, audience: Audience) -> None:
        if self._native:
            self._declare_groups([*audience.subscribers, *(p.name for p in audience.pools)])

    def _one_by_one(self, envelopes: list[Envelope], changes: list[Change]) -> None:
        """Settle each message of an idempotent put on its own (a race with another
        putter of the same ids)."""
        for change in changes:
            change.record.native_ref = None
        for env, change in zip(envelopes, changes, strict=True):
            self.put_once(env, change)

    def put_once(self, env: Envelope, change: Change) -> None:
        """Create one message unless the index has it; send what the broker lacks."""
        for _ in range(CAS_ATTEMPTS):
            try:
                rec = self._create_once(env, change)
            except StaleRecord:
                continue  # someone created it meanwhile: decide on a fresh read
            if rec is not None:
                self._check_queue(rec)
                self._complete(env, rec)
            return
        raise ConcurrentUpdate(change.msg_id, CAS_ATTEMPTS)

    def _create_once(self, env: Envelope, change: Change) -> MessageRecord | None:
        """Create the message if the index lacks it (None), else its record; StaleRecord
        if another putter created it meanwhile."""
        raise NotImplementedError

    def _complete(self, env: Envelope, rec: MessageRecord) -> None:
        """A message the index had already: send it if the broker may lack it."""
        if rec.native_ref is None and self._probing is not None:
            # The broker may hold the entry already: the earlier attempt may have stopped
            # after the broker took it, before its reference was recorded.
            self._find_sent({rec.msg_id: rec})
        if rec.native_ref is None:
            # An earlier attempt stopped between the index and the broker (or, on a
            # broker that cannot be asked, after it: then the broker gets a second entry,
            # which the once-only rule makes harmless, see Receiving._accept_many).
            sent = dataclasses.replace(env, put_at=rec.created_at)
            self._store.set_native_ref(rec.msg_id, self._adapter.send(self.name, [sent])[0])

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

    def _check_queue(self, rec: MessageRecord) -> None:
        if rec.queue != self.name:
            raise InvalidArgument(
                f"msg_id {rec.msg_id} already names a message of queue {rec.queue!r}, "
                f"not {self.name!r}; give each message its own id"
            )

    def _load(self, msg_id: str) -> MessageRecord | None:
        try:
            return self._store.load(msg_id)
        except MessageNotFound:
            return None


class InOneTransaction(PutPath):
    """The broker's queue and the index share one database transaction (the embedded
    queue): entries and records commit together, or neither."""

    def put_new(self, audience: Audience, envelopes: list[Envelope], writes: Writes) -> None:
        with self._store.atomic():
            refs = self._adapter.send(self.name, envelopes)
            for rec, ref in zip(writes.created, refs, strict=True):
                rec.native_ref = ref
            if not all(self._store.commit_writes(writes)):
                raise StaleRecord(writes.created[0].msg_id)  # a new id taken: nothing stays

    def put_idempotent(self, audience: Audience, envelopes: list[Envelope], writes: Writes) -> None:
        # The usual case, none of the ids known yet, is a plain put; one that meets an
        # existing record fails whole (nothing stays), and then each message is settled
        # on its own.
        try:
            self.put_new(audience, envelopes, writes)
            return
        except StaleRecord:
            pass
        self._one_by_one(envelopes, writes.as_changes())

    def _complete(self, env: Envelope, rec: MessageRecord) -> None:
        """Nothing: a record the index has came with its entry, in one transaction."""

    def _create_once(self, env: Envelope, change: Change) -> MessageRecord | None:
        with self._store.atomic():
            rec = self._load(change.msg_id)
            if rec is None:
                change.record.native_ref = self._adapter.send(self.name, [env])[0]
                self._store.commit(change)  # StaleRecord: someone created it meanwhile
            return rec


class OnBrokerServer(PutPath):
    """The index on the broker's server (Redis Streams with the Redis index): records
    and entries in one atomic step, the journal as templates."""

    def put_new(self, audience: Audience, envelopes: list[Envelope], writes: Writes) -> None:
        colocated = self.hub.colocated
        assert colocated is not None
        self._declare_audience(audience)
        colocated.send_indexed(self.name, envelopes, writes, self._store)

    def put_idempotent(self, audience: Audience, envelopes: list[Envelope], writes: Writes) -> None:
        # All or nothing, as a batch: a creation that meets an existing record writes
        # nothing (StaleRecord), and then each message is settled on its own.
        colocated = self.hub.colocated
        assert colocated is not None
        self._declare_audience(audience)
        try:
            colocated.send_indexed(self.name, envelopes, writes, self._store)
            return
        except StaleRecord:
            pass
        self._one_by_one(envelopes, writes.as_changes())

    def _create_once(self, env: Envelope, change: Change) -> MessageRecord | None:
        colocated = self.hub.colocated
        assert colocated is not None
        rec = self._load(change.msg_id)
        if rec is None:
            # The record and the entry in one atomic step, as a first put makes them: a
            # kill can never leave one without the other.
            colocated.send_indexed(self.name, [env], [change], self._store)
        return rec


class IndexFirst(PutPath):
    """The index apart from the broker: the records first (a broker entry must never
    exist without its record: it would be adopted as a stranger's message), then the
    broker, then the references. If the broker refuses a plain put, its records are
    withdrawn; an idempotent one keeps them for the caller's repeat, which sends what the
    broker lacks (asking a broker that can say, :class:`~iqbridge.adapter.Probing`,
    which it took already)."""

    def put_new(self, audience: Audience, envelopes: list[Envelope], writes: Writes) -> None:
        # Index first: a broker entry must never exist without its record. The records in
        # one batch commit (the journal as templates); if the broker then refuses, they
        # are withdrawn (an idempotent put keeps its records instead: the caller repeats
        # it, and the repeat sends; see _fresh).
        self._declare_audience(audience)
        created = self._store.commit_writes(writes)
        if not all(created):  # a new id taken (ids are new: not expected)
            taken = [r for r, ok in zip(writes.created, created, strict=True) if not ok]
            mine = [r for r, ok in zip(writes.created, created, strict=True) if ok]
            self._withdraw(mine, f"msg_id {taken[0].msg_id} of the put was taken")
            raise StaleRecord(taken[0].msg_id)
        try:
            refs = self._adapter.send(self.name, envelopes)
        except IQError as exc:
            self._withdraw(writes.created, f"the broker refused the put ({type(exc).__name__})")
            raise
        self._store.set_native_refs(
            [(rec.msg_id, ref) for rec, ref in zip(writes.created, refs, strict=True)]
        )

    def put_idempotent(self, audience: Audience, envelopes: list[Envelope], writes: Writes) -> None:
        known = self._store.load_many([e.msg_id for e in envelopes])
        if not known and self._fresh(audience, envelopes, writes):
            return
        # A repeat (ids known) or a race (an id taken between the read and the commit):
        # settled as a repeat, on what was read unless a race made it stale.
        changes = writes.as_changes()
        with contextlib.suppress(StaleRecord):  # raced again: settle each on its own
            self._repeat(audience, envelopes, changes, known or None)
            return
        self._one_by_one(envelopes, changes)

    def _fresh(self, audience: Audience, envelopes: list[Envelope], writes: Writes) -> bool:
        """An idempotent put whose ids the index did not know (the usual case), as a
        batch: the records in one commit, the broker, then the native references. False,
        having sent nothing, when an id was taken meanwhile: the caller settles the put as
        a repeat. If the broker refuses, the records stay without references and the put
        raises: it is in doubt, and the caller repeats it (the repeat sends what the
        broker lacks)."""
        store = self._store
        self._declare_audience(audience)
        try:
            if not all(store.commit_writes(writes)):
                return False  # raced: what was created here is sent by the repeat
        except StaleRecord:
            return False  # raced, and nothing was written
        refs = self._adapter.send(self.name, envelopes)
        store.set_native_refs([(e.msg_id, ref) for e, ref in zip(envelopes, refs, strict=True)])
        return True

    def _withdraw(self, records: list[MessageRecord], why: str) -> None:
        """Withdraw the records of a put the broker did not take (each as committed,
        version 1; one moved meanwhile is decided on a fresh read)."""
        now = self._now()
        undo = [engine.withdraw(rec, now, why) for rec in records]
        for change, ok in zip(undo, self._store.commit_each(undo), strict=True):
            if not ok:  # someone moved it meanwhile: decide on a fresh read
                self._apply(change.msg_id, lambda r: engine.withdraw(r, self._now(), why))

    def _repeat(
        self,
        audience: Audience,
        envelopes: list[Envelope],
        changes: list[Change],
        known: dict[str, MessageRecord] | None,
    ) -> None:
        """A repeated put, as a batch: records the index lacks are created, and what
        the broker lacks (new records, and old ones an earlier attempt left without a
        native reference) is sent in one call, in the put's order, so a key's messages
        reach the broker in order. ``known``: the records just read, None to read them.
        StaleRecord if someone creates one meanwhile."""
        if known is None:
            known = self._store.load_many([c.msg_id for c in changes])
        for rec in known.values():
            self._check_queue(rec)
        if self._probing is not None:
            self._find_sent(known)
        fresh = [c for c in changes if c.msg_id not in known]
        if fresh:
            self._declare_audience(audience)
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

    def _create_once(self, env: Envelope, change: Change) -> MessageRecord | None:
        rec = self._load(change.msg_id)
        if rec is None:
            self._store.commit(change)  # StaleRecord: someone created it meanwhile
            self._store.set_native_ref(change.msg_id, self._adapter.send(self.name, [env])[0])
        return rec


class SendFirst(IndexFirst):
    """The index apart, a plain put sending first: the broker, then the records with
    their native references in one index commit
    (:attr:`~iqbridge.adapter.Capabilities.index_after_send`: Kafka). An idempotent put
    goes index first (see :class:`IndexFirst`): a repeat after a crash then finds what
    the broker took instead of sending a second copy.

    A get that reads an entry before its record is committed gives it back (the put is
    in flight) for :data:`SEND_FIRST_WINDOW` after the put began, and acknowledges it as
    purged only after twice that. So the records are committed available only within the
    window; a put whose broker took longer, or refused, is withdrawn in the index (its
    records committed, then withdrawn: a get acknowledges the entries the broker took)
    and raises. A put cut short between the broker and the index (the process killed)
    leaves entries without records: no get hands them out, and the put never returned
    their ids."""

    def put_new(self, audience: Audience, envelopes: list[Envelope], writes: Writes) -> None:
        self._declare_audience(audience)
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
        self._withdraw(writes.created, why)
