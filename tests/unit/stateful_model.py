"""A reference model of the state model, for the stateful test of the facade.

It says, from the moves the test made and nothing read back from the index, what every
message's publisher and subscribers should be now and which journal entries each move
should have written (state-model.md). Each operation checks first and raises
:class:`Refused` with the iqbridge error the facade must raise, before it changes
anything; so a refused operation leaves the model as it was, as the facade must leave
the index. Times are integer microseconds from the hub's clock.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from iqbridge import (
    AudienceError,
    IllegalTransition,
    IQError,
    LeaseLost,
    PublisherState,
    SubscriberState,
)
from iqbridge.states import PUBLISHER_TABLE, SUBSCRIBER_TABLE

S = SubscriberState
P = PublisherState

IN_DOUBT = frozenset({S.GET, S.FETCHED, S.IN_PROCESS})

#: (msg_id, actor, src, dst, attempt): what a journal entry says, less its time and seq.
Entry = tuple[str, str, str | None, str, int]


class Refused(Exception):
    """The facade must refuse this move with ``error`` and change nothing."""

    def __init__(self, error: type[IQError]) -> None:
        super().__init__(error.__name__)
        self.error = error


def legal_subscriber_move(
    src: SubscriberState | None, dst: SubscriberState, outcome: SubscriberState | None
) -> bool:
    """Whether the transition table has a row moving ``src`` to ``dst``.

    ``outcome`` is the state before the member's last JOURNALLED (it gates moves out of
    JOURNALLED).
    """
    return any(
        t.src == src and t.dst == dst and (t.outcome is None or t.outcome == outcome)
        for t in SUBSCRIBER_TABLE
    )


def legal_publisher_move(src: PublisherState | None, dst: PublisherState) -> bool:
    """Whether the transition table has a row moving the publisher ``src`` to ``dst``."""
    return any(t.src == src and t.dst == dst for t in PUBLISHER_TABLE)


@dataclass
class ModelMember:
    """What one intended subscriber's state for one message should be."""

    name: str
    pool: str | None
    state: SubscriberState | None = None
    outcome: SubscriberState | None = None
    attempt: int = 1
    claim: int | None = None  # which get holds the lease token (None: nobody)
    lease_until: int | None = None
    not_before: int | None = None
    taken_by: str | None = None  # the pool member whose get expired this one


@dataclass
class ModelMessage:
    """What one message should be."""

    msg_id: str
    priority: int
    correlation_id: str
    expires_at: int | None
    max_attempts: int
    members: dict[str, ModelMember]
    pub: PublisherState | None = None
    withdrawn: bool = False
    lock_id: str | None = None
    lock_until: int | None = None

    def locked(self, now: int) -> bool:
        """Browse-locked right now."""
        return self.lock_id is not None and (self.lock_until is None or self.lock_until > now)

    def ttl_passed(self, now: int) -> bool:
        """Its time limit has passed."""
        return self.expires_at is not None and now >= self.expires_at


@dataclass
class Model:
    """Every message the test put, in put order, and the journal entries owed."""

    publisher: str
    messages: dict[str, ModelMessage] = field(default_factory=dict)
    emitted: list[Entry] = field(default_factory=list)
    _claims: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # --- moves -------------------------------------------------------------------------

    def _pub(self, msg: ModelMessage, dst: PublisherState) -> None:
        assert legal_publisher_move(msg.pub, dst), (msg.pub, dst)
        self.emitted.append(
            (msg.msg_id, self.publisher, msg.pub.value if msg.pub else None, dst.value, 1)
        )
        msg.pub = dst

    def _sub(
        self, msg: ModelMessage, m: ModelMember, dst: SubscriberState, *, next_attempt: bool = False
    ) -> None:
        src = m.state
        assert legal_subscriber_move(src, dst, m.outcome), (src, dst, m.outcome)
        if next_attempt:
            m.attempt += 1
        if dst is S.JOURNALLED:
            m.outcome = src
        elif dst is S.AVAILABLE:
            m.outcome = None
            m.claim = None
        if dst not in IN_DOUBT:
            m.lease_until = None
        m.state = dst
        self.emitted.append((msg.msg_id, m.name, src.value if src else None, dst.value, m.attempt))

    def _settle(self, msg: ModelMessage) -> None:
        every = all(m.state is S.JOURNALLED for m in msg.members.values())
        if every and msg.pub in (P.REVEALED, P.UNAVAILABLE):
            self._pub(msg, P.JOURNALLED)
        elif not every and msg.pub is P.JOURNALLED:
            self._pub(msg, P.REVEALED)

    def _expire(self, msg: ModelMessage, m: ModelMember) -> None:
        self._sub(msg, m, S.EXPIRED)
        self._sub(msg, m, S.JOURNALLED)

    def _release(self, msg: ModelMessage, m: ModelMember, now: int, delay_us: int) -> None:
        self._sub(msg, m, S.AVAILABLE, next_attempt=True)
        m.not_before = now + delay_us if delay_us > 0 else None
        if msg.withdrawn or msg.ttl_passed(now):
            self._expire(msg, m)
            return
        if m.pool is None:
            return
        for other in msg.members.values():
            if (
                other.pool == m.pool
                and other is not m
                and S.EXPIRED in (other.state, other.outcome)
                and other.taken_by == m.name
            ):
                self._sub(msg, other, S.AVAILABLE, next_attempt=True)
                other.taken_by = None

    # --- publisher side ----------------------------------------------------------------

    def put(
        self,
        msg_id: str,
        audience: list[tuple[str, str | None]],
        *,
        now: int,
        confirm: bool,
        ttl_us: int | None,
        priority: int,
        correlation_id: str,
        max_attempts: int,
    ) -> None:
        """A new message: PUT, and REVEALED to every member unless it awaits confirm."""
        msg = ModelMessage(
            msg_id,
            priority,
            correlation_id,
            now + ttl_us if ttl_us is not None else None,
            max_attempts,
            {name: ModelMember(name, pool) for name, pool in audience},
        )
        self.messages[msg_id] = msg
        self._pub(msg, P.PUT)
        if not confirm:
            self._reveal_all(msg)

    def _reveal_all(self, msg: ModelMessage) -> None:
        self._pub(msg, P.REVEALED)
        for m in msg.members.values():
            self._sub(msg, m, S.AVAILABLE)

    def confirm_put(self, msg_id: str) -> None:
        """PUT -> REVEALED, every member AVAILABLE."""
        msg = self.messages[msg_id]
        if msg.pub is not P.PUT:
            raise Refused(IllegalTransition)
        self._reveal_all(msg)

    def withdraw(self, msg_id: str, *, undo: bool = False) -> None:
        """Withdraw (``undo``: only a put awaiting confirm may be undone)."""
        msg = self.messages[msg_id]
        allowed = (P.PUT,) if undo else (P.PUT, P.REVEALED)
        if msg.pub not in allowed:
            raise Refused(IllegalTransition)
        self._pub(msg, P.UNAVAILABLE)
        msg.withdrawn = True
        for m in msg.members.values():
            if m.state in (None, S.AVAILABLE):
                self._expire(msg, m)
        self._settle(msg)

    def rereveal(self, msg_id: str, subscriber: str) -> None:
        """UNUSABLE (or journalled after UNUSABLE) -> AVAILABLE for one subscriber."""
        msg = self.messages[msg_id]
        m = msg.members.get(subscriber)
        if m is None:
            raise Refused(AudienceError)
        if msg.withdrawn or not (
            m.state is S.UNUSABLE or (m.state is S.JOURNALLED and m.outcome is S.UNUSABLE)
        ):
            raise Refused(IllegalTransition)
        self._sub(msg, m, S.AVAILABLE, next_attempt=True)
        m.not_before = None
        self._settle(msg)

    # --- subscriber side ---------------------------------------------------------------

    def claimable(self, subscriber: str, now: int, lock_id: str | None = None) -> list[str]:
        """Ids a get by ``subscriber`` may return now, in delivery order."""
        hits: list[tuple[int, int, str]] = []
        for seq, msg in enumerate(self.messages.values()):
            m = msg.members.get(subscriber)
            if m is None or m.state is not S.AVAILABLE or msg.ttl_passed(now):
                continue
            if m.not_before is not None and m.not_before > now:
                continue
            locked = msg.locked(now)
            if lock_id is None and locked:
                continue
            if lock_id is not None and (not locked or msg.lock_id != lock_id):
                continue
            hits.append((-msg.priority, seq, msg.msg_id))
        return [h[2] for h in sorted(hits)]

    def claim(
        self,
        msg_id: str,
        subscriber: str,
        now: int,
        lease_until: int | None,
        lock_id: str | None,
    ) -> int:
        """AVAILABLE -> GET -> FETCHED; a pool's other members expire. Returns the claim."""
        msg = self.messages[msg_id]
        m = msg.members[subscriber]
        assert msg_id in self.claimable(subscriber, now, lock_id)
        self._sub(msg, m, S.GET)
        m.claim = next(self._claims)
        m.lease_until = lease_until
        m.not_before = None
        if lock_id is not None:
            msg.lock_id = msg.lock_until = None
        if m.pool is not None:
            for other in msg.members.values():
                if other.pool == m.pool and other is not m and other.state is S.AVAILABLE:
                    self._expire(msg, other)
                    other.taken_by = subscriber
        self._sub(msg, m, S.FETCHED)
        return m.claim

    def _held(self, msg_id: str, subscriber: str, claim: int) -> tuple[ModelMessage, ModelMember]:
        msg = self.messages[msg_id]
        m = msg.members.get(subscriber)
        if m is None:
            raise Refused(AudienceError)
        if m.claim != claim:
            raise Refused(LeaseLost)
        return msg, m

    def holds(self, msg_id: str, subscriber: str, claim: int) -> bool:
        """The get ``claim`` still holds the message (its moves are not fenced off)."""
        m = self.messages[msg_id].members[subscriber]
        return m.claim == claim and m.state in IN_DOUBT

    def process(self, msg_id: str, subscriber: str, claim: int) -> None:
        """FETCHED -> IN_PROCESS."""
        msg, m = self._held(msg_id, subscriber, claim)
        if m.state is not S.FETCHED:
            raise Refused(IllegalTransition)
        self._sub(msg, m, S.IN_PROCESS)

    def finish(self, msg_id: str, subscriber: str, claim: int, outcome: SubscriberState) -> None:
        """-> DONE or UNUSABLE, then JOURNALLED."""
        msg, m = self._held(msg_id, subscriber, claim)
        sources = (S.FETCHED, S.IN_PROCESS) if outcome is S.DONE else tuple(IN_DOUBT)
        if m.state not in sources:
            raise Refused(IllegalTransition)
        self._sub(msg, m, outcome)
        self._sub(msg, m, S.JOURNALLED)
        self._settle(msg)

    def release(self, msg_id: str, subscriber: str, claim: int, now: int, delay_us: int) -> None:
        """Give a held message back: AVAILABLE, attempt + 1 (a pool reopens)."""
        msg, m = self._held(msg_id, subscriber, claim)
        if m.state not in IN_DOUBT:
            raise Refused(IllegalTransition)
        self._release(msg, m, now, delay_us)
        self._settle(msg)

    def renew(self, msg_id: str, subscriber: str, claim: int, lease_until: int) -> None:
        """Extend a held lease (no journal entry)."""
        _msg, m = self._held(msg_id, subscriber, claim)
        if m.state not in IN_DOUBT:
            raise Refused(LeaseLost)
        m.lease_until = lease_until

    # --- browse locks --------------------------------------------------------------------

    def lock(self, msg_ids: list[str], lock_id: str, now: int, until: int) -> list[str]:
        """Lock those not locked by anyone now; return them."""
        done: list[str] = []
        for msg_id in msg_ids:
            msg = self.messages[msg_id]
            if msg.locked(now):
                continue
            msg.lock_id, msg.lock_until = lock_id, until
            done.append(msg_id)
        return done

    def unlock(self, lock_id: str) -> int:
        """Release every message still carrying ``lock_id``; return how many."""
        count = 0
        for msg in self.messages.values():
            if msg.lock_id == lock_id:
                msg.lock_id = msg.lock_until = None
                count += 1
        return count

    # --- time ------------------------------------------------------------------------------

    def recover(self, now: int) -> int:
        """Apply lapsed leases, passed time limits and lapsed locks; return how many changed."""
        changed = 0
        for msg in self.messages.values():
            if self._due(msg, now):
                self._expire_due(msg, now)
                changed += 1
        return changed

    @staticmethod
    def _due(msg: ModelMessage, now: int) -> bool:
        if msg.lock_id is not None and msg.lock_until is not None and msg.lock_until <= now:
            return True
        ttl = msg.ttl_passed(now)
        if ttl and msg.pub is P.PUT:
            return True
        for m in msg.members.values():
            if m.state in IN_DOUBT and m.lease_until is not None and m.lease_until <= now:
                return True
            if ttl and m.state in (None, S.AVAILABLE):
                return True
        return False

    def _expire_due(self, msg: ModelMessage, now: int) -> None:
        if msg.lock_id is not None and msg.lock_until is not None and msg.lock_until <= now:
            msg.lock_id = msg.lock_until = None
        ttl = msg.ttl_passed(now)
        if ttl and msg.pub is P.PUT:
            self._pub(msg, P.UNAVAILABLE)
            msg.withdrawn = True
        for m in msg.members.values():
            lease_out = m.lease_until is not None and m.lease_until <= now
            if m.state in IN_DOUBT and lease_out:
                if m.attempt >= msg.max_attempts:
                    self._sub(msg, m, S.UNUSABLE)
                    self._sub(msg, m, S.JOURNALLED)
                else:
                    self._release(msg, m, now, 0)
            elif m.state in (None, S.AVAILABLE) and (ttl or msg.withdrawn):
                self._expire(msg, m)
        self._settle(msg)
