"""The state engine: every change to a message, computed on a copy of its record.

Each operation takes a :class:`~iqbridge.model.MessageRecord` as read from the index,
works on a copy, looks every move up in :mod:`iqbridge.states` and returns a
:class:`Change`: the new record, the journal entries of every move, and the version the
index must still hold for the change to apply (compare-and-set). An illegal move raises
before anything is returned, so a refused operation changes nothing. Index stores only
persist changes; they never decide what is legal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from iqbridge.errors import AudienceError, IllegalTransition, LeaseLost, LockedError
from iqbridge.model import Audience, JournalEntry, Member, MessageRecord, Retained
from iqbridge.states import (
    IN_DOUBT,
    TERMINAL,
    ActorKind,
    PubEvent,
    PublisherState,
    SubEvent,
    SubscriberState,
    publisher_move,
    subscriber_move,
)

__all__ = [
    "POOL_TAKEN",
    "Change",
    "chain",
    "claim",
    "done",
    "expire_due",
    "fetch_failed",
    "lock",
    "new_message",
    "process",
    "release",
    "renew",
    "rereveal",
    "resolve",
    "reveal",
    "unlock",
    "unusable",
    "withdraw",
]

#: Reason recorded on pool members expired because another member won the message.
POOL_TAKEN = "pool taken by "

S = SubscriberState
P = PublisherState


@dataclass(slots=True)
class Change:
    """The result of one engine operation, to be committed atomically by a store."""

    record: MessageRecord
    journal: list[JournalEntry]
    expected_version: int
    dirty: set[str] = field(default_factory=set)
    created: bool = False
    #: The record the change was computed from (at ``expected_version``), or None for a
    #: new message: a store can tell from it what to take out of its indexes.
    before: MessageRecord | None = None
    #: For a new message: the payload copy the store keeps beside the record, written in
    #: the same commit (a queue that retains payloads on a broker that forgets them).
    retain: Retained | None = None

    @property
    def msg_id(self) -> str:
        """The message this change is about."""
        return self.record.msg_id


class _Step:
    """Accumulates the moves of one atomic change on a private copy of a record."""

    __slots__ = ("before", "dirty", "expected", "journal", "now", "rec")

    def __init__(self, record: MessageRecord, now: int, *, copy: bool = True) -> None:
        self.expected = record.version
        self.before = record if copy else None
        self.rec = record.copy() if copy else record
        # Never stamp a move earlier than the record's last change: histories stay
        # time-ordered even when writers' clocks disagree slightly.
        self.now = max(now, record.updated_at)
        self.journal: list[JournalEntry] = []
        self.dirty: set[str] = set()

    def pub(self, event: PubEvent, detail: str | None = None) -> None:
        rec = self.rec
        dst = publisher_move(rec.msg_id, rec.publisher, rec.publisher_state, event)
        self.journal.append(
            JournalEntry(
                rec.msg_id,
                rec.queue,
                rec.publisher,
                ActorKind.PUBLISHER,
                rec.publisher_state.value if rec.publisher_state else None,
                dst.value,
                self.now,
                1,
                detail,
            )
        )
        rec.publisher_state = dst
        if event is PubEvent.WITHDRAW:
            rec.withdrawn = True

    def sub(
        self,
        member: Member,
        event: SubEvent,
        detail: str | None = None,
        *,
        next_attempt: bool = False,
    ) -> None:
        rec = self.rec
        src = member.state
        dst = subscriber_move(rec.msg_id, member.subscriber, src, event, member.outcome)
        if next_attempt:
            member.attempt += 1
        if dst is S.JOURNALLED:
            member.outcome = src
        elif dst is S.AVAILABLE:
            member.outcome = None
        if dst is S.AVAILABLE:
            # A new claim gets a new token; the old holder is fenced off from now on.
            member.lease_token = member.lease_owner = None
        if dst not in IN_DOUBT:
            member.lease_until = None
        if dst is S.UNUSABLE or (dst is S.EXPIRED and detail):
            member.reason = detail
        member.state = dst
        member.updated_at = self.now
        self.dirty.add(member.subscriber)
        self.journal.append(
            JournalEntry(
                rec.msg_id,
                rec.queue,
                member.subscriber,
                ActorKind.SUBSCRIBER,
                src.value if src else None,
                dst.value,
                self.now,
                member.attempt,
                detail,
            )
        )

    def settle_publisher(self) -> None:
        """Keep the invariant: publisher JOURNALLED exactly when every member is."""
        rec = self.rec
        every = all(m.state is S.JOURNALLED for m in rec.members.values())
        if every and rec.publisher_state in (P.REVEALED, P.UNAVAILABLE):
            self.pub(PubEvent.JOURNAL)
        elif not every and rec.publisher_state is P.JOURNALLED:
            self.pub(PubEvent.REREVEAL)

    def finish(self) -> Change:
        self.settle_publisher()
        rec = self.rec
        rec.updated_at = self.now
        rec.version = self.expected + 1
        return Change(rec, self.journal, self.expected, self.dirty, before=self.before)


def chain(first: Change, then: Callable[[MessageRecord], Change]) -> Change:
    """One change made of ``first`` followed by ``then`` applied to its result."""
    second = then(first.record)
    return Change(
        second.record,
        first.journal + second.journal,
        first.expected_version,
        first.dirty | second.dirty,
        first.created,
        first.before,
        first.retain,
    )


def _member(rec: MessageRecord, subscriber: str) -> Member:
    member = rec.members.get(subscriber)
    if member is None:
        raise AudienceError(
            f"subscriber {subscriber!r} is not in the audience of message {rec.msg_id} "
            f"(audience: {', '.join(sorted(rec.members))})"
        )
    return member


def _held(rec: MessageRecord, subscriber: str, token: str | None) -> Member:
    """The member, checked to be held under ``token`` (fencing against stale holders)."""
    member = _member(rec, subscriber)
    if token is not None and member.lease_token != token:
        state = member.state.value if member.state else "unrevealed"
        raise LeaseLost(
            rec.msg_id,
            subscriber,
            f"its lease expired; it is now {state} on attempt {member.attempt}",
        )
    return member


def _journal_after(step: _Step, member: Member, auto_journal: bool) -> None:
    if auto_journal and member.state in TERMINAL:
        step.sub(member, SubEvent.JOURNAL)


# --- publisher side -----------------------------------------------------------------


def new_message(
    *,
    msg_id: str,
    queue: str,
    publisher: str,
    audience: Audience,
    now: int,
    ordering_key: str | None = None,
    correlation_id: str | None = None,
    priority: int = 4,
    parents: Iterable[str] = (),
    expires_at: int | None = None,
    max_attempts: int = 5,
    content_type: str = "application/octet-stream",
    size: int = 0,
    native_ref: str | None = None,
    confirm: bool = False,
) -> Change:
    """A new message: PUT, then REVEALED to every member unless the put awaits confirm."""
    audience.validate()
    rec = MessageRecord(
        msg_id=msg_id,
        queue=queue,
        publisher=publisher,
        ordering_key=ordering_key if ordering_key is not None else publisher,
        priority=priority,
        mode=audience.mode,
        created_at=now,
        correlation_id=correlation_id,
        parents=tuple(parents),
        native_ref=native_ref,
        content_type=content_type,
        size=size,
        expires_at=expires_at,
        max_attempts=max_attempts,
        updated_at=now,
        version=0,
    )
    for name, pool in audience.members():
        rec.members[name] = Member(name, pool, updated_at=now)
    step = _Step(rec, now, copy=False)
    step.pub(PubEvent.PUT, "confirm pending" if confirm else None)
    if not confirm:
        _reveal_all(step)
    change = step.finish()
    change.created = True
    change.dirty = set(rec.members)
    return change


def _reveal_all(step: _Step, detail: str | None = None) -> None:
    step.pub(PubEvent.REVEAL, detail)
    for member in step.rec.members.values():
        step.sub(member, SubEvent.REVEAL, detail)


def reveal(rec: MessageRecord, now: int, detail: str | None = None) -> Change:
    """Confirm a put: PUT -> REVEALED, every member AVAILABLE."""
    step = _Step(rec, now)
    _reveal_all(step, detail)
    return step.finish()


def withdraw(rec: MessageRecord, now: int, reason: str = "withdrawn") -> Change:
    """Withdraw (or undo an unconfirmed put): no subscriber may retrieve it any more.

    Members not yet past GET expire and are journalled; members past GET finish normally.
    """
    step = _Step(rec, now)
    step.pub(PubEvent.WITHDRAW, reason)
    for member in step.rec.members.values():
        if member.state in (None, S.AVAILABLE):
            step.sub(member, SubEvent.EXPIRE, reason)
            step.sub(member, SubEvent.JOURNAL)
    return step.finish()


def rereveal(
    rec: MessageRecord, subscriber: str, now: int, detail: str = "re-revealed by publisher"
) -> Change:
    """Make a message available again to one subscriber that found it UNUSABLE."""
    if rec.withdrawn:
        raise IllegalTransition(
            rec.msg_id,
            subscriber,
            _member(rec, subscriber).state,
            S.AVAILABLE,
            SubEvent.REREVEAL,
            "the message was withdrawn",
        )
    step = _Step(rec, now)
    member = _member(step.rec, subscriber)
    step.sub(member, SubEvent.REREVEAL, detail, next_attempt=True)
    member.not_before = None
    return step.finish()


# --- subscriber side ----------------------------------------------------------------


def claim(
    rec: MessageRecord,
    subscriber: str,
    now: int,
    *,
    token: str,
    owner: str,
    lease_until: int | None,
    lock_id: str | None = None,
    fetched: bool = True,
) -> Change:
    """GET (and, when the payload comes with it, FETCHED) for one subscriber.

    In a pool, the other members of the pool go EXPIRED then JOURNALLED in the same step:
    the claim is the compare-and-set that makes two owners impossible.
    """
    member = _member(rec, subscriber)
    if rec.lock_id is not None and (rec.lock_until is None or rec.lock_until > now):
        if lock_id != rec.lock_id:
            raise LockedError(
                f"message {rec.msg_id} is browse-locked by {rec.lock_owner!r}; "
                f"get it with that lock_id, or wait for unlock or lock expiry"
            )
    elif lock_id is not None:
        raise LockedError(f"message {rec.msg_id} is not locked under lock {lock_id}")
    if rec.publisher_state is not P.REVEALED:
        state = rec.publisher_state.value if rec.publisher_state else "(none)"
        raise IllegalTransition(
            rec.msg_id,
            subscriber,
            member.state,
            S.GET,
            SubEvent.GET,
            f"publisher state is {state}",
        )
    if rec.expires_at is not None and now >= rec.expires_at and member.state is S.AVAILABLE:
        raise IllegalTransition(
            rec.msg_id, subscriber, member.state, S.GET, SubEvent.GET, "its time limit passed"
        )
    if member.state is S.AVAILABLE and member.not_before is not None and now < member.not_before:
        # Given back with a delay (release(delay=...), retry backoff): not before then, on
        # every path, also when a broker hands the entry to the group again early.
        raise IllegalTransition(
            rec.msg_id, subscriber, member.state, S.GET, SubEvent.GET, "its retry delay runs"
        )
    step = _Step(rec, now)
    member = step.rec.members[subscriber]
    step.sub(member, SubEvent.GET, f"by {owner}")
    member.lease_token = token
    member.lease_owner = owner
    member.lease_until = lease_until
    member.not_before = None
    if lock_id is not None:
        step.rec.lock_id = step.rec.lock_owner = None
        step.rec.lock_until = None
    if member.pool is not None:
        for other in step.rec.members.values():
            if other.pool == member.pool and other is not member and other.state is S.AVAILABLE:
                step.sub(other, SubEvent.EXPIRE, POOL_TAKEN + subscriber)
                step.sub(other, SubEvent.JOURNAL)
    if fetched:
        step.sub(member, SubEvent.FETCH)
    return step.finish()


def process(rec: MessageRecord, subscriber: str, token: str | None, now: int) -> Change:
    """FETCHED -> IN_PROCESS."""
    step = _Step(rec, now)
    step.sub(_held(step.rec, subscriber, token), SubEvent.PROCESS)
    return step.finish()


def done(
    rec: MessageRecord,
    subscriber: str,
    token: str | None,
    now: int,
    *,
    auto_journal: bool = True,
    detail: str | None = None,
) -> Change:
    """FETCHED/IN_PROCESS -> DONE (then JOURNALLED): once-only, never delivered again."""
    step = _Step(rec, now)
    member = _held(step.rec, subscriber, token)
    step.sub(member, SubEvent.DONE, detail)
    _journal_after(step, member, auto_journal)
    return step.finish()


def unusable(
    rec: MessageRecord,
    subscriber: str,
    token: str | None,
    now: int,
    reason: str,
    *,
    auto_journal: bool = True,
) -> Change:
    """GET/FETCHED/IN_PROCESS -> UNUSABLE (then JOURNALLED), with the reason kept."""
    step = _Step(rec, now)
    member = _held(step.rec, subscriber, token)
    step.sub(member, SubEvent.UNUSABLE, reason)
    _journal_after(step, member, auto_journal)
    return step.finish()


def fetch_failed(rec: MessageRecord, subscriber: str, token: str, now: int, reason: str) -> Change:
    """The payload could not be read after GET: the message is unusable for this member."""
    return unusable(rec, subscriber, token, now, reason)


def release(
    rec: MessageRecord,
    subscriber: str,
    token: str | None,
    now: int,
    *,
    reason: str = "released",
    delay_us: int = 0,
) -> Change:
    """Give a held message back: AVAILABLE again with attempt + 1 (undo, retry, release).

    In a pool this reopens the pool: the members its claim expired come back too.
    """
    step = _Step(rec, now)
    _release(step, _held(step.rec, subscriber, token), reason, delay_us)
    return step.finish()


def _release(step: _Step, member: Member, reason: str, delay_us: int) -> None:
    rec = step.rec
    step.sub(member, SubEvent.RELEASE, reason, next_attempt=True)
    member.reason = reason
    member.not_before = step.now + delay_us if delay_us > 0 else None
    if rec.withdrawn or (rec.expires_at is not None and step.now >= rec.expires_at):
        why = "withdrawn" if rec.withdrawn else "time limit passed"
        step.sub(member, SubEvent.EXPIRE, why)
        step.sub(member, SubEvent.JOURNAL)
        return
    if member.pool is not None:
        marker = POOL_TAKEN + member.subscriber
        for other in rec.members.values():
            if (
                other.pool == member.pool
                and other is not member
                and (other.state is S.EXPIRED or other.outcome is S.EXPIRED)
                and other.reason == marker
            ):
                step.sub(other, SubEvent.REOPEN, f"pool reopened: {reason}", next_attempt=True)
                other.reason = None


def resolve(
    rec: MessageRecord,
    subscriber: str,
    now: int,
    *,
    done: bool,
    detail: str,
    auto_journal: bool = True,
) -> Change | None:
    """Settle a member in doubt for a holder known to be gone (cross-queue recovery):
    DONE (a child of the message was revealed: it was processed), or back to AVAILABLE
    with attempt + 1 (clean again). A member in GET is marked DONE through FETCHED: its
    child proves the payload was read. None when the member is no longer in doubt (an
    earlier, interrupted run resolved it), so running a plan again applies nothing twice.
    """
    if _member(rec, subscriber).state not in IN_DOUBT:
        return None
    step = _Step(rec, now)
    member = step.rec.members[subscriber]
    if not done:
        _release(step, member, detail, 0)
        return step.finish()
    if member.state is S.GET:
        step.sub(member, SubEvent.FETCH, detail)
    step.sub(member, SubEvent.DONE, detail)
    _journal_after(step, member, auto_journal)
    return step.finish()


def renew(
    rec: MessageRecord, subscriber: str, token: str, now: int, lease_until: int | None
) -> Change:
    """Extend a held lease. Not a state change: no journal entry."""
    step = _Step(rec, now)
    member = _held(step.rec, subscriber, token)
    if member.state not in IN_DOUBT:
        raise LeaseLost(rec.msg_id, subscriber, f"it is {member.state} and holds no lease")
    member.lease_until = lease_until
    step.dirty.add(subscriber)
    return step.finish()


def expire_due(rec: MessageRecord, now: int) -> Change | None:
    """Apply whatever time has made due: expired leases, passed time limits, lapsed locks.

    A lease that ran out returns the member to AVAILABLE with attempt + 1, or makes it
    UNUSABLE once ``max_attempts`` is used up. Returns None when nothing is due.
    """
    step = _Step(rec, now)
    r = step.rec
    if r.lock_id is not None and r.lock_until is not None and r.lock_until <= now:
        r.lock_id = r.lock_owner = None
        r.lock_until = None
    ttl_passed = r.expires_at is not None and now >= r.expires_at
    if ttl_passed and r.publisher_state is P.PUT:
        step.pub(PubEvent.WITHDRAW, "time limit passed before the put was confirmed")
    for member in r.members.values():
        lease_out = member.lease_until is not None and member.lease_until <= now
        if member.state in IN_DOUBT and lease_out:
            if member.attempt >= r.max_attempts:
                step.sub(
                    member,
                    SubEvent.UNUSABLE,
                    f"lease expired on attempt {member.attempt} of {r.max_attempts}",
                )
                step.sub(member, SubEvent.JOURNAL)
            else:
                _release(step, member, f"lease of {member.lease_owner} expired", 0)
        elif member.state in (None, S.AVAILABLE) and (ttl_passed or r.withdrawn):
            step.sub(member, SubEvent.EXPIRE, "time limit passed" if ttl_passed else "withdrawn")
            step.sub(member, SubEvent.JOURNAL)
    if not step.journal and r.lock_id == rec.lock_id:
        return None
    return step.finish()


def reclaim(
    rec: MessageRecord, subscriber: str, owner: str | None, now: int, reason: str
) -> Change | None:
    """Give back at once what ``owner`` holds of ``subscriber``'s (a member of a pool
    is a subscriber here), as if its leases had run out: the holder
    is known to be gone (a restarted process on the same host, a bridge route taken
    over); ``owner=None`` gives back every holder's. Each goes back to AVAILABLE with
    attempt + 1 (so every one of them is handed out again through the index, in put
    order), except that an IN_PROCESS member whose ``max_attempts`` is used up goes
    UNUSABLE (it may be what made its holder crash); a FETCHED one, never started, is
    never made UNUSABLE by a crash. Returns None when nothing is given back.
    """
    step = _Step(rec, now)
    r = step.rec
    for member in r.members.values():
        if (
            member.subscriber == subscriber
            and member.state in IN_DOUBT
            and owner in (None, member.lease_owner)
        ):
            if member.state is S.IN_PROCESS and member.attempt >= r.max_attempts:
                step.sub(
                    member,
                    SubEvent.UNUSABLE,
                    f"{reason} on attempt {member.attempt} of {r.max_attempts}",
                )
                step.sub(member, SubEvent.JOURNAL)
            else:
                _release(step, member, reason, 0)
    if not step.journal:
        return None
    return step.finish()


# --- browse locks (not state changes: the record changes, no journal entry) ---------


def lock(rec: MessageRecord, lock_id: str, owner: str, now: int, until: int | None) -> Change:
    """Lock a message for a browser: hidden from every get but get(lock_id=...)."""
    if rec.lock_id is not None and (rec.lock_until is None or rec.lock_until > now):
        raise LockedError(f"message {rec.msg_id} is already browse-locked by {rec.lock_owner!r}")
    step = _Step(rec, now)
    step.rec.lock_id, step.rec.lock_owner, step.rec.lock_until = lock_id, owner, until
    return step.finish()


def unlock(rec: MessageRecord, lock_id: str, now: int) -> Change:
    """Release a browse lock held under ``lock_id``."""
    if rec.lock_id != lock_id:
        raise LockedError(f"message {rec.msg_id} is not locked under lock {lock_id}")
    step = _Step(rec, now)
    step.rec.lock_id = step.rec.lock_owner = None
    step.rec.lock_until = None
    return step.finish()
