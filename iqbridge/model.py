"""Records and views of the state model.

Internally every timestamp is an ``int`` of microseconds since the Unix epoch, UTC;
public views turn them into timezone-aware :class:`datetime.datetime` values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from iqbridge.errors import AudienceError, InvalidArgument
from iqbridge.states import (
    IN_DOUBT,
    ActorKind,
    Mode,
    PublisherState,
    SubscriberState,
)

__all__ = [
    "Audience",
    "Envelope",
    "Filter",
    "JournalEntry",
    "Member",
    "MessageRecord",
    "MessageState",
    "MessageSummary",
    "Pool",
    "QueueCounts",
    "Received",
    "Retained",
    "SubscriberView",
    "Subscriptions",
    "UNDONE",
    "from_micros",
    "tally",
    "to_micros",
]


def to_micros(value: datetime) -> int:
    """Microseconds since the epoch for an aware (or UTC-naive) datetime."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(value: int) -> datetime:
    """The aware UTC datetime of a microsecond timestamp."""
    return _EPOCH + timedelta(microseconds=value)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_NAME_MAX = 200


def check_name(kind: str, name: str) -> str:
    """Validate a queue, subscriber or pool name; return it."""
    if not isinstance(name, str) or not name or len(name) > _NAME_MAX:
        raise AudienceError(f"{kind} name must be a non-empty string of at most {_NAME_MAX} chars")
    if any(c.isspace() or c in "/\x00" for c in name):
        raise AudienceError(f"{kind} name {name!r} may not contain whitespace, '/' or NUL")
    if not _utf8(name):
        raise AudienceError(
            f"{kind} name {name!r} is not valid text (a lone surrogate, as from bytes decoded "
            f"with errors='surrogateescape'); decode it properly or pick another name"
        )
    return name


def _utf8(text: str) -> bool:
    """Whether ``text`` encodes to UTF-8 (it has no lone surrogates), as every store and
    broker needs."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(kind: str, value: str) -> str:
    """Validate a free-text field (a correlation id, an ordering key, a header): a str
    that encodes to UTF-8. Return it."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{kind} must be a str, got {type(value).__name__}")
    if not _utf8(value):
        raise InvalidArgument(
            f"{kind} {value!r} is not valid text (a lone surrogate, as from bytes decoded "
            f"with errors='surrogateescape'); decode it properly before passing it"
        )
    return value


@dataclass(frozen=True, slots=True)
class Pool:
    """A subscriber pool: the first member whose get succeeds owns the message."""

    name: str
    members: tuple[str, ...] = ()

    def __init__(self, name: str, members: Iterable[str] = ()) -> None:
        object.__setattr__(self, "name", check_name("pool", name))
        object.__setattr__(self, "members", tuple(check_name("subscriber", m) for m in members))


@dataclass(frozen=True, slots=True)
class Audience:
    """Named subscribers (each gets the message once) plus pools (one member each)."""

    subscribers: tuple[str, ...] = ()
    pools: tuple[Pool, ...] = ()

    @property
    def mode(self) -> Mode:
        """pubsub, pool or combined, derived from who is in the audience."""
        if not self.pools:
            return Mode.PUBSUB
        if not self.subscribers and len(self.pools) == 1:
            return Mode.POOL
        return Mode.COMBINED

    def members(self) -> list[tuple[str, str | None]]:
        """Every intended subscriber with the pool it belongs to (None for named ones)."""
        out: list[tuple[str, str | None]] = [(s, None) for s in self.subscribers]
        for pool in self.pools:
            out.extend((m, pool.name) for m in pool.members)
        return out

    def validate(self) -> Audience:
        """Raise AudienceError unless every subscriber appears once and pools are non-empty."""
        seen: set[str] = set()
        if not self.subscribers and not self.pools:
            raise AudienceError(
                "message has no audience: pass to=[subscribers or Pool(...)] or subscribe "
                "subscribers to the queue first (queue.subscribe(...))"
            )
        for pool in self.pools:
            if not pool.members:
                raise AudienceError(
                    f"pool {pool.name!r} has no members: declare them with "
                    f"queue.subscribe_pool({pool.name!r}, [...]) or Pool({pool.name!r}, [...])"
                )
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise AudienceError(f"pool named twice in one audience: {names}")
        for name, _pool in self.members():
            if name in seen:
                raise AudienceError(
                    f"subscriber {name!r} appears twice in one audience (a subscriber may be "
                    f"named once or be in one pool of a message, not both)"
                )
            seen.add(name)
        return self


@dataclass(frozen=True, slots=True)
class Subscriptions:
    """A queue's subscribers and pools, kept in the index.

    ``subscribers`` and ``pools`` are the standing audience, used when a put names no
    ``to``; ``adhoc_pools`` are pools named inline by earlier puts (``Pool(name,
    members)``), remembered so their members know which consumer groups to read.
    """

    subscribers: tuple[str, ...] = ()
    pools: tuple[Pool, ...] = ()
    adhoc_pools: tuple[Pool, ...] = ()

    def audience(self) -> Audience:
        """The audience a put without ``to`` is revealed to."""
        return Audience(self.subscribers, self.pools)

    def adding(
        self, queue: str, subscribers: Iterable[str] = (), pools: Iterable[Pool] = ()
    ) -> Subscriptions:
        """These subscribers and pools added to the standing audience of ``queue`` (a
        pool of a standing pool's name redefines it).

        Raises :class:`~iqbridge.errors.AudienceError` naming the queue, the pool and the
        member for a standing audience every put without ``to`` would refuse: a pool
        without members or listing a member twice, a subscriber both named and in a pool
        or in two pools, a name both a subscriber and a pool."""
        names = list(self.subscribers)
        for s in subscribers:
            check_name("subscriber", s)
            if self.pool(s) is not None:
                raise AudienceError(f"{s!r} already names a pool on queue {queue!r}")
            for p in self.pools:
                if s in p.members:
                    raise AudienceError(
                        f"cannot subscribe {s!r} to queue {queue!r}: it is a member of the "
                        f"standing pool {p.name!r}, and a subscriber is in an audience once "
                        f"(named, or in one pool); redefine the pool without it first"
                    )
            if s not in names:
                names.append(s)
        standing = list(self.pools)
        adhoc = list(self.adhoc_pools)
        for new in pools:
            if not new.members:
                raise AudienceError(f"pool {new.name!r} on queue {queue!r} needs members")
            standing = [p for p in standing if p.name != new.name] + [new]
            adhoc = [p for p in adhoc if p.name != new.name]
        owner: dict[str, str] = {}  # member -> its pool
        for p in standing:
            where = f"pool {p.name!r} on queue {queue!r}"
            if p.name in names:
                raise AudienceError(f"{p.name!r} already names a subscriber on queue {queue!r}")
            for m in p.members:
                if owner.get(m) == p.name:
                    raise AudienceError(f"{where}: member {m!r} is listed twice; list it once")
                if m in owner:
                    raise AudienceError(
                        f"{where}: member {m!r} is already in the standing pool "
                        f"{owner[m]!r}; a subscriber may be in one pool of an audience"
                    )
                if m in names:
                    raise AudienceError(
                        f"{where}: member {m!r} is also a standing subscriber of the queue; "
                        f"a subscriber is in an audience once, named or in one pool "
                        f"(unsubscribe {m!r} first, or leave it out of the pool)"
                    )
                owner[m] = p.name
        return Subscriptions(tuple(names), tuple(standing), tuple(adhoc))

    def pool(self, name: str) -> Pool | None:
        """A declared or remembered pool by name."""
        for p in (*self.pools, *self.adhoc_pools):
            if p.name == name:
                return p
        return None

    def groups_for(self, subscriber: str) -> list[str]:
        """Consumer groups a subscriber reads on a broker with native groups.

        A subscriber always reads its own group (named subscribers of any put), then
        the group of every pool it is a member of.
        """
        groups = [subscriber]
        groups.extend(p.name for p in (*self.pools, *self.adhoc_pools) if subscriber in p.members)
        return groups


@dataclass
class Member:
    """One intended subscriber's state for one message."""

    subscriber: str
    pool: str | None
    state: SubscriberState | None = None
    outcome: SubscriberState | None = None
    attempt: int = 1
    lease_token: str | None = None
    lease_owner: str | None = None
    lease_until: int | None = None
    not_before: int | None = None
    reason: str | None = None
    updated_at: int = 0

    def copy(self) -> Member:
        """A shallow copy (every field is immutable)."""
        new = Member.__new__(Member)
        new.__dict__.update(self.__dict__)
        return new


@dataclass
class MessageRecord:
    """Everything the index knows of one message, apart from its payload and history."""

    msg_id: str
    queue: str
    publisher: str
    ordering_key: str
    priority: int
    mode: Mode
    created_at: int
    correlation_id: str | None = None
    parents: tuple[str, ...] = ()
    native_ref: str | None = None
    content_type: str = "application/octet-stream"
    size: int = 0
    expires_at: int | None = None
    max_attempts: int = 5
    publisher_state: PublisherState | None = None
    withdrawn: bool = False
    updated_at: int = 0
    lock_id: str | None = None
    lock_owner: str | None = None
    lock_until: int | None = None
    version: int = 0
    seq: int | None = None
    members: dict[str, Member] = field(default_factory=dict)

    def copy(self) -> MessageRecord:
        """A deep-enough copy: the engine mutates the copy, never the original."""
        new = MessageRecord.__new__(MessageRecord)
        new.__dict__.update(self.__dict__)
        new.members = {k: m.copy() for k, m in self.members.items()}
        return new

    def envelope(self, retained: Retained) -> Envelope:
        """The envelope this message was put with, rebuilt from the record and its
        retained copy (body and headers)."""
        return Envelope(
            msg_id=self.msg_id,
            body=retained.body,
            content_type=self.content_type,
            headers=dict(retained.headers),
            publisher=self.publisher,
            correlation_id=self.correlation_id,
            priority=self.priority,
            ordering_key=self.ordering_key,
            parents=self.parents,
            put_at=self.created_at,
            groups=tuple(dict.fromkeys(m.pool or m.subscriber for m in self.members.values())),
            expires_at=self.expires_at,
        )

    def due_at(self) -> int | None:
        """When time next makes something due on this message (a lease lapses, the time
        limit passes for members not yet past GET, a browse lock lapses), or None."""
        due: int | None = None
        if self.lock_id is not None and self.lock_until is not None:
            due = self.lock_until
        waiting = self.publisher_state is PublisherState.PUT
        for m in self.members.values():
            if m.state in IN_DOUBT and m.lease_until is not None:
                if due is None or m.lease_until < due:
                    due = m.lease_until
            elif m.state is None or m.state is SubscriberState.AVAILABLE:
                waiting = True
        if waiting and self.expires_at is not None and (due is None or self.expires_at < due):
            due = self.expires_at
        return due


class JournalEntry(NamedTuple):
    """One transition: appended for every state change, read by history and analytics.

    ``actor`` is whose state machine moved (the publisher or one subscriber); ``detail``
    says why or by whom (a consumer, a lease expiry, a reason). ``seq`` is the journal's
    sequence number, assigned by the store.
    """

    msg_id: str
    queue: str
    actor: str
    actor_kind: ActorKind
    src: str | None
    dst: str
    at: int
    attempt: int = 1
    detail: str | None = None
    seq: int | None = None

    @property
    def timestamp(self) -> datetime:
        """When the transition happened (UTC)."""
        return from_micros(self.at)


@dataclass(slots=True)
class Envelope:
    """What travels on the broker: the payload bytes plus the iqbridge envelope fields."""

    msg_id: str
    body: bytes
    content_type: str = "application/octet-stream"
    headers: dict[str, str] = field(default_factory=dict)
    publisher: str = ""
    correlation_id: str | None = None
    priority: int = 4
    ordering_key: str = ""
    parents: tuple[str, ...] = ()
    put_at: int = 0
    #: The consumer groups the message is addressed to (its named subscribers and pools);
    #: a native-group broker may let every other group pass over it. Empty: all groups.
    groups: tuple[str, ...] = ()
    #: When the put's time limit (``ttl``) ends, in microseconds since the epoch, or None.
    #: A broker with per-message expiry may drop the message from then on.
    expires_at: int | None = None

    def payload(self) -> object:
        """The decoded payload (bytes, str or a JSON value, by content type)."""
        from iqbridge.payload import decode

        return decode(self.body, self.content_type)


@dataclass(frozen=True, slots=True)
class Retained:
    """The facade's retained copy of a payload, kept in the index store beside the record
    when the broker cannot read it again by reference (it forgets a message once it is
    acknowledged, or keeps it only for a while). With the record it gives back the whole
    :class:`Envelope` (see :meth:`MessageRecord.envelope`)."""

    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Received:
    """One delivery from a broker's consumer group, before the index has claimed it."""

    native_ref: str
    group: str
    envelope: Envelope
    adopted: bool = False
    delivery_count: int = 1
    #: The index record as read with the entry (a co-located index), or None. A hint
    #: only: it may be stale by the time it is used; compare-and-set decides.
    record: MessageRecord | None = None
    #: A claim the receive made on the way (a co-located index): the member's attempt,
    #: the message's max attempts, and what makes the index record as read before the
    #: claim (None if it has none), called only if a move needs the record.
    claimed: tuple[int, int, Callable[[], MessageRecord | None]] | None = None


@dataclass(frozen=True, slots=True)
class Filter:
    """Search criteria, all answered from the index without reading payloads."""

    msg_id: str | None = None
    correlation_id: str | None = None
    priority: int | tuple[int, int] | None = None
    publisher: str | None = None
    state: PublisherState | SubscriberState | None = None
    subscriber: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    lock_id: str | None = None
    #: Messages that name this msg_id among their parents (its children).
    parent: str | None = None
    limit: int = 100

    def __post_init__(self) -> None:
        # A plain string would match neither enum and silently filter on nothing
        # ("JOURNALLED" names a publisher and a subscriber state alike).
        if self.state is not None and not isinstance(self.state, PublisherState | SubscriberState):
            raise InvalidArgument(
                f"state must be a PublisherState or SubscriberState member, not "
                f"{self.state!r}; e.g. SubscriberState.DONE or PublisherState.JOURNALLED"
            )


@dataclass(frozen=True, slots=True)
class SubscriberView:
    """One subscriber's view of a message: current state and full history."""

    subscriber: str
    pool: str | None
    state: SubscriberState | None
    history: tuple[tuple[SubscriberState, datetime], ...]
    attempt: int
    reason: str | None
    lease_owner: str | None
    lease_until: datetime | None


@dataclass(frozen=True, slots=True)
class MessageState:
    """The answer of ``queue.state(msg_id)``: both views with timestamps."""

    msg_id: str
    queue: str
    publisher: str
    mode: Mode
    correlation_id: str | None
    priority: int
    parents: tuple[str, ...]
    publisher_state: PublisherState | None
    publisher_history: tuple[tuple[PublisherState, datetime], ...]
    subscribers: Mapping[str, SubscriberView]
    journal: tuple[JournalEntry, ...]


@dataclass(frozen=True, slots=True)
class MessageSummary:
    """One search hit: index fields and current states, never the payload."""

    msg_id: str
    queue: str
    publisher: str
    correlation_id: str | None
    priority: int
    mode: Mode
    publisher_state: PublisherState | None
    created_at: datetime
    subscribers: Mapping[str, SubscriberState | None]
    parents: Sequence[str] = ()
    #: For each subscriber that is JOURNALLED, the state it was journalled after: DONE
    #: (it did the work), UNUSABLE (it failed for good) or EXPIRED (its pool went to
    #: another member, or its time limit passed).
    outcomes: Mapping[str, SubscriberState] = field(default_factory=dict)


#: Subscriber states of a member that still has the message to process.
UNDONE = frozenset(
    {
        SubscriberState.AVAILABLE,
        SubscriberState.GET,
        SubscriberState.FETCHED,
        SubscriberState.IN_PROCESS,
    }
)


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """How many messages of a queue are in each state, answered from the index.

    ``publisher`` counts messages per publisher state; ``subscribers`` counts, for each
    subscriber (a pool's members by their own names), its members per state (states
    with none are left out; a member not revealed yet has no state and is not counted);
    ``oldest_undone`` is, per subscriber, the put time of its oldest message still to
    process (AVAILABLE, GET, FETCHED or IN_PROCESS); subscribers with none are absent.
    """

    queue: str
    messages: int
    publisher: Mapping[PublisherState, int]
    subscribers: Mapping[str, Mapping[SubscriberState, int]]
    oldest_undone: Mapping[str, datetime]


def tally(queue: str, summaries: Iterable[MessageSummary]) -> QueueCounts:
    """:class:`QueueCounts` from search results (a store without a counting query)."""
    messages = 0
    pub: dict[PublisherState, int] = {}
    subs: dict[str, dict[SubscriberState, int]] = {}
    oldest: dict[str, datetime] = {}
    for s in summaries:
        messages += 1
        if s.publisher_state is not None:
            pub[s.publisher_state] = pub.get(s.publisher_state, 0) + 1
        for name, state in s.subscribers.items():
            if state is None:
                continue
            per = subs.setdefault(name, {})
            per[state] = per.get(state, 0) + 1
            if state in UNDONE and (name not in oldest or s.created_at < oldest[name]):
                oldest[name] = s.created_at
    return QueueCounts(queue, messages, pub, subs, oldest)
