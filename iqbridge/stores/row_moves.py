"""Claims and settles decided on a message's compact member rows, for the stores that make
them where they keep the messages (the SQLite store, :mod:`iqbridge.stores.sqlite_claim`
and :mod:`iqbridge.stores.sqlite_settle`; the SQL store, :mod:`iqbridge.stores.sql_claim`).

A store reads each message's compact columns and its member rows (``[subscriber, pool,
state, outcome, attempt, lease_token, lease_owner, lease_until, not_before, reason,
updated_at]`` each, the layout of :func:`~iqbridge.stores.codec.members_to_json` and of
the SQL store's member table), and asks :class:`RowClaims` or :class:`RowSettles`
whether the message is on the batch's common path. If it is, the subscriber's row is
moved in place as the plan from the transition table says
(:func:`iqbridge.engine_batch.claim_plan`, :func:`~iqbridge.engine_batch.settle_plan`),
and the message's journal is gathered per group of messages that made the same steps at
the same instant (one template per group, as
:meth:`~iqbridge.stores.base.IndexStore.commit_writes` writes a batch's); the store then
writes the rows its own way. A message off the common path is left as it is (None), for
the per-message engine, which knows the other rules (pools, time limits, browse locks,
retry delays, other holders) and raises the right errors.

The rules live here once; the Redis index applies the same ones in Lua
(``stores/lua/claim_member.lua``, ``stores/lua/settle.lua``) and the memory store with
the batch engine on records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from iqbridge.engine_batch import ClaimPlan, SettlePlan
from iqbridge.states import ActorKind, SubscriberState
from iqbridge.stores.codec import (
    ROW_ATTEMPT,
    ROW_NAME,
    ROW_NOT_BEFORE,
    ROW_OUTCOME,
    ROW_OWNER,
    ROW_POOL,
    ROW_STATE,
    ROW_TOKEN,
    ROW_UNTIL,
    ROW_UPDATED,
    leases_due,
)
from iqbridge.writes import Step, Steps

__all__ = ["Claimed", "RowClaims", "RowSettles", "Settled", "as_steps", "claim_entries_in_order"]

_DONE = SubscriberState.DONE.value
_JOURNALLED = SubscriberState.JOURNALLED.value

#: A batch's journal: (instant, steps as ``[actor, kind, src, dst, detail]``, the
#: ``[msg_id, attempt]`` of every message that made them).
Journal = Iterator[tuple[int, list[list[Any]], list[list[Any]]]]


class Claimed(NamedTuple):
    """One message claimed where it is kept: its msg_id, broker reference, the member's
    attempt, the message's max attempts and the claim's lease token."""

    msg_id: str
    native_ref: str
    attempt: int
    max_attempts: int
    token: str


class Settled(NamedTuple):
    """One member settled in place: its row (moved), the message's publisher state
    after, the instant the move is stamped with, and the message's next due time."""

    member: list[Any]
    publisher_state: str
    stamp: int
    due: int | None


class RowClaims:
    """The claims of one batch by ``plan`` at ``at`` (µs), decided message by message."""

    __slots__ = ("at", "dst", "groups", "plan", "revealed", "src")

    def __init__(self, plan: ClaimPlan, at: int) -> None:
        self.plan = plan
        self.at = at
        self.src, self.dst, self.revealed = plan.src.value, plan.dst.value, plan.revealed.value
        #: instant -> [msg_id, attempt] of every claim made then
        self.groups: dict[int, list[list[Any]]] = {}

    def claim(
        self,
        msg_id: str,
        members: list[list[Any]],
        publisher_state: str | None,
        updated_at: int,
        off_path: bool,
        ref: str | None,
        max_attempts: int,
        token: str,
    ) -> tuple[Claimed, list[Any], int, int | None] | None:
        """Claim one message under ``token``: its claim, the subscriber's member row
        (moved in ``members``), the instant stamped and the message's next due time; or
        None, with nothing moved, when it is off the common path (no member of the
        subscriber's own, a pool's, another state, the message not revealed,
        ``off_path`` (a time limit or a browse lock on it), no broker reference, a retry
        delay still running)."""
        plan = self.plan
        at = self.at
        mine = next((m for m in members if m[ROW_NAME] == plan.subscriber), None)
        if (
            mine is None
            or off_path
            or ref is None
            or mine[ROW_POOL] is not None
            or mine[ROW_STATE] != self.src
            or publisher_state != self.revealed
            or (mine[ROW_NOT_BEFORE] is not None and at < mine[ROW_NOT_BEFORE])
        ):
            return None
        stamp = at if at >= updated_at else updated_at
        mine[ROW_STATE] = self.dst
        mine[ROW_TOKEN] = token
        mine[ROW_OWNER] = plan.owner
        mine[ROW_UNTIL] = plan.lease_until
        mine[ROW_NOT_BEFORE] = None
        mine[ROW_UPDATED] = stamp
        self.groups.setdefault(stamp, []).append([msg_id, mine[ROW_ATTEMPT]])
        claimed = Claimed(msg_id, ref, mine[ROW_ATTEMPT], max_attempts, token)
        return claimed, mine, stamp, leases_due(members)

    def journal(self) -> Journal:
        """The batch's journal, one group per instant."""
        steps = self.plan.steps
        return ((stamp, steps, items) for stamp, items in self.groups.items())


class RowSettles:
    """The settles of one batch by ``plan`` at ``at`` (µs), decided message by message."""

    __slots__ = ("at", "groups", "moves", "plan", "pubs")

    def __init__(self, plan: SettlePlan, at: int) -> None:
        self.plan = plan
        self.at = at
        self.moves = {
            src.value: (dst.value, last.value if last is not None else None, steps)
            for src, (dst, last, steps) in plan.moves.items()
        }
        self.pubs = {src.value: (dst.value, step) for src, (dst, step) in plan.publisher.items()}
        # (instant, state left, publisher moved from, publisher) -> the group's journal
        self.groups: dict[tuple[Any, ...], tuple[list[list[Any]], list[list[Any]]]] = {}

    def settle(
        self,
        msg_id: str,
        members: list[list[Any]],
        publisher_state: str,
        publisher: str,
        updated_at: int,
        token: str,
    ) -> Settled | None:
        """Settle one message held under ``token``: the moved member row (in
        ``members``), the publisher state after (journalled once every member is), the
        instant and the next due time; or None, with nothing moved, when the
        subscriber's member is in a state the plan does not move or held under another
        token. (A time limit, a browse lock or another queue: the caller checks.)"""
        mine = next((m for m in members if m[ROW_NAME] == self.plan.subscriber), None)
        move = self.moves.get(mine[ROW_STATE]) if mine is not None else None
        if mine is None or move is None or mine[ROW_TOKEN] != token:
            return None
        dst, last, steps = move
        at = self.at
        stamp = at if at >= updated_at else updated_at
        src = mine[ROW_STATE]
        mine[ROW_STATE] = dst
        if dst == _DONE:
            mine[ROW_UNTIL] = None
            if last is not None:
                mine[ROW_STATE] = last
                mine[ROW_OUTCOME] = dst
        mine[ROW_UPDATED] = stamp
        pub = self.pubs.get(publisher_state) if last == _JOURNALLED else None
        if pub is not None and any(m[ROW_STATE] != _JOURNALLED for m in members):
            pub = None
        key = (stamp, src, publisher_state if pub else None, publisher if pub else None)
        group = self.groups.get(key)
        if group is None:
            journal = list(steps)
            if pub is not None:
                journal.append([publisher, *pub[1]])
            group = self.groups[key] = (journal, [])
        group[1].append([msg_id, mine[ROW_ATTEMPT]])
        ps = pub[0] if pub is not None else publisher_state
        return Settled(mine, ps, stamp, leases_due(members))

    def journal(self) -> Journal:
        """The batch's journal, one group per instant, state left and publisher move."""
        return ((key[0], journal, items) for key, (journal, items) in self.groups.items())


def claim_entries_in_order(
    entries: Sequence[tuple[str, str, str]],
    tokens: Sequence[str],
    claim: Callable[[str, str, str], Claimed | None],
) -> list[Claimed | None]:
    """Walk a consumer group's broker entries (msg_id, broker reference, ordering key) in
    the order the broker delivered them, calling ``claim(msg_id, ref, token)`` for each
    that may be claimed here, the n-th claim under ``tokens[n]``: not a second entry of
    one message, nor an entry after one of its ordering key that was not claimed (the
    per-message path decides those in order). Per entry, its claim or None."""
    out: list[Claimed | None] = []
    seen: set[str] = set()
    held: set[str] = set()
    n = 0
    for msg_id, ref, key in entries:
        got = None
        if msg_id not in seen and not (key and key in held):
            got = claim(msg_id, ref, tokens[n])
        seen.add(msg_id)
        if got is None:
            if key:
                held.add(key)
        else:
            n += 1
        out.append(got)
    return out


def as_steps(journal: Journal) -> list[Steps]:
    """A batch's journal as :class:`~iqbridge.writes.Steps` templates (what
    :class:`~iqbridge.writes.Writes` carries), one per group."""
    kinds = {k.value: k for k in ActorKind}
    return [
        Steps(
            at,
            tuple(Step(a, kinds[kind], src, dst, detail) for a, kind, src, dst, detail in steps),
            [(msg_id, attempt) for msg_id, attempt in items],
        )
        for at, steps, items in journal
    ]
