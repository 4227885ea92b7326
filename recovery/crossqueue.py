"""Cross-queue recovery (seed 000, steps 1-5): restore a failed flow from message states.

An inbound queue A (``source``) feeds a processing module that puts child messages, each
naming its parents, on an outbound queue B (``target``), the two on any stores. After a
failure, the module's work is in one of a few places: a parent fetched and nothing put, a
child put but not yet confirmed (publisher state PUT), a parent marked DONE and its child
still unconfirmed. The procedure decides from the states alone:

1. in B, find the children not REVEALED (still PUT: the put was never confirmed);
2. follow each child's parents into A (a child without parents goes to step 4);
3. if any parent is DONE for the module, mark every parent DONE and reveal the child
   (the work was done: do not do it again); if none is, make the parents available again
   and withdraw the child (the work is done again from the start);
4. a child without parents is revealed;
5. in A, every message fetched but not DONE (GET, FETCHED, IN_PROCESS) is made available
   again.

:meth:`CrossQueueRecovery.plan` computes every move first, changing nothing; :meth:`apply`
makes them through the state engine, journalled as ``by recovery <run>: <reason>``. The
plan is a fixpoint of its own rule (a parent another child's verdict marks DONE counts as
DONE), and a child's parents move before the child, so a run killed at any point and run
again plans exactly the moves the first run had not made yet: nothing is applied twice.

Either queue may be left out: without ``source`` only steps 1 and 4 run (a publisher with
no inbound queue, the seed's point-of-sale module); without ``target`` only step 5 (the
last module of a flow, the seed's credit-approval module).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from iqbridge.errors import InvalidArgument, MessageNotFound
from iqbridge.housekeeping import RecoveryAction
from iqbridge.model import Filter, Member, MessageRecord, MessageSummary
from iqbridge.queue import Queue
from iqbridge.redaction import get_logger
from iqbridge.registry import redact
from iqbridge.states import IN_DOUBT, PublisherState, SubscriberState

__all__ = [
    "CrossQueueRecovery",
    "Plan",
    "PlanRow",
    "RecoveryResult",
    "Unresolved",
    "recover",
]

log = get_logger("iqbridge.recovery")

S = SubscriberState
P = PublisherState

#: The first search limit while listing a queue's candidates.
_PAGE = 2000


@dataclass(frozen=True, slots=True)
class PlanRow:
    """One move of the plan, in the order :meth:`CrossQueueRecovery.apply` makes them.

    ``side`` is ``"source"`` (queue A, the parents) or ``"target"`` (queue B, the
    children); ``subscriber`` is None for a publisher move (reveal, withdraw); ``state``
    is the state the move starts from.
    """

    step: int
    action: RecoveryAction
    side: str
    queue: str
    msg_id: str
    subscriber: str | None
    state: str
    reason: str


@dataclass(frozen=True, slots=True)
class Unresolved:
    """A child the procedure cannot decide: it is left as it is, with the reason."""

    msg_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    """Every move of one recovery, computed before anything changes."""

    source: str | None
    target: str | None
    rows: tuple[PlanRow, ...]
    unresolved: tuple[Unresolved, ...] = ()

    def count(self, action: RecoveryAction) -> int:
        """How many rows make ``action``."""
        return sum(1 for r in self.rows if r.action == action)

    def summary(self) -> str:
        """One line: the moves per action and what is left undecided."""
        parts = [f"{self.count(a)} {a}" for a in ("reveal", "withdraw", "done", "release")]
        text = ", ".join(parts)
        if self.unresolved:
            text += f"; {len(self.unresolved)} child(ren) left undecided"
        return text


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    """What :meth:`CrossQueueRecovery.apply` did: ``applied`` rows moved now, ``already``
    rows found done by an earlier (interrupted) run or meanwhile."""

    run: str
    plan: Plan
    applied: int
    already: int
    started: datetime
    finished: datetime


@dataclass(slots=True)
class _Child:
    rec: MessageSummary
    parents: list[MessageRecord] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


class CrossQueueRecovery:
    """Seed 000's recovery between ``source`` (A, the parents) and ``target`` (B, the
    children), on any two stores.

    ``via`` names the module that consumes A and puts on B: its subscriber (or pool)
    name in A. By default each child's publisher name is tried, then the parent's only
    subscriber or pool; a parent with several and none matching leaves its child
    undecided (name the module with ``via``).
    """

    def __init__(
        self,
        source: Queue | None,
        target: Queue | None,
        *,
        via: str | None = None,
        run: str | None = None,
    ) -> None:
        if source is None and target is None:
            raise InvalidArgument(
                "name the inbound queue (source), the outbound queue (target) or both"
            )
        self.source = source
        self.target = target
        self.via = via
        self.run = run or f"run-{secrets.token_hex(4)}"

    # --- planning -----------------------------------------------------------------

    def plan(self) -> Plan:
        """Compute every move (steps 1-5) from the current states; nothing changes."""
        rows: list[PlanRow] = []
        unresolved: list[Unresolved] = []
        # (msg_id, subscriber) of A's members the plan marks DONE or releases.
        decided: dict[tuple[str, str], str] = {}
        if self.target is not None:
            children = self._children()
            verdicts, unresolved = self._verdicts(children)
            for child in children:
                cid = child.rec.msg_id
                if cid not in verdicts:
                    continue
                reveal, reason, members = verdicts[cid]
                for parent, m in members:
                    key = (parent.msg_id, m.subscriber)
                    if key in decided:
                        continue
                    action: RecoveryAction = "done" if reveal else "release"
                    decided[key] = action
                    rows.append(
                        self._row(
                            3,
                            action,
                            "source",
                            parent.msg_id,
                            m,
                            "its child is revealed" if reveal else "its child is withdrawn",
                        )
                    )
                rows.append(
                    PlanRow(
                        4 if not child.rec.parents else 3,
                        "reveal" if reveal else "withdraw",
                        "target",
                        self.target.name,
                        cid,
                        None,
                        P.PUT.value,
                        reason,
                    )
                )
        if self.source is not None:
            for rec in self._in_doubt(self.source):
                for m in rec.members.values():
                    if m.state in IN_DOUBT and (rec.msg_id, m.subscriber) not in decided:
                        decided[(rec.msg_id, m.subscriber)] = "release"
                        rows.append(
                            self._row(5, "release", "source", rec.msg_id, m, "fetched, not DONE")
                        )
        return Plan(
            self._label(self.source), self._label(self.target), tuple(rows), tuple(unresolved)
        )

    def _row(
        self, step: int, action: RecoveryAction, side: str, msg_id: str, m: Member, why: str
    ) -> PlanRow:
        assert self.source is not None
        return PlanRow(
            step,
            action,
            side,
            self.source.name,
            msg_id,
            m.subscriber,
            m.state.value if m.state else "-",
            why,
        )

    @staticmethod
    def _label(q: Queue | None) -> str | None:
        return None if q is None else f"{redact(q.hub.adapter.url)}:{q.name}"

    def _children(self) -> list[_Child]:
        """Step 1: the target's messages still PUT, with their parents read from A."""
        assert self.target is not None
        found = [_Child(s) for s in _search_all(self.target, Filter(state=P.PUT))]
        wanted = sorted({p for c in found for p in c.rec.parents})
        known: dict[str, MessageRecord] = {}
        if self.source is not None and wanted:
            store = self.source.hub.store
            for i in range(0, len(wanted), 500):
                for msg_id, rec in store.load_many(wanted[i : i + 500]).items():
                    if rec.queue == self.source.name:
                        known[msg_id] = rec
        for c in found:
            for p in c.rec.parents:
                if p in known:
                    c.parents.append(known[p])
                else:
                    c.missing.append(p)
        return found

    def _module_members(self, child: _Child, parent: MessageRecord) -> list[Member] | str:
        """The members of ``parent`` that stand for the module that made ``child``, or
        why they cannot be told."""
        names = [self.via] if self.via else [child.rec.publisher]
        for name in names:
            hit = [m for m in parent.members.values() if name in (m.subscriber, m.pool)]
            if hit:
                return hit
        if self.via:
            return f"parent {parent.msg_id} has no subscriber or pool named {self.via!r}"
        units = {m.pool or m.subscriber for m in parent.members.values()}
        if len(units) == 1:
            return list(parent.members.values())
        return (
            f"parent {parent.msg_id} has subscribers {', '.join(sorted(units))} and none is "
            f"the child's publisher {child.rec.publisher!r}: name the module with --via"
        )

    def _verdicts(
        self, children: Sequence[_Child]
    ) -> tuple[dict[str, tuple[bool, str, list[tuple[MessageRecord, Member]]]], list[Unresolved]]:
        """Steps 2-4 for every child, to a fixpoint: a parent marked DONE for one child
        counts as DONE for the others (so re-planning after a partial run agrees)."""
        unresolved: dict[str, str] = {}
        module: dict[str, list[tuple[MessageRecord, Member]]] = {}
        for c in children:
            if not c.rec.parents:
                continue
            if self.source is None:
                unresolved[c.rec.msg_id] = (
                    "its parents are in a queue not named: give the inbound queue with --from"
                )
                continue
            pairs: list[tuple[MessageRecord, Member]] = []
            for parent in c.parents:
                members = self._module_members(c, parent)
                if isinstance(members, str):
                    unresolved[c.rec.msg_id] = members
                    break
                pairs.extend((parent, m) for m in members)
            else:
                module[c.rec.msg_id] = pairs
        done_parents = {p.msg_id for pairs in module.values() for p, m in pairs if _did(m, S.DONE)}
        reveal: set[str] = set()
        while True:
            grew = False
            for cid, pairs in module.items():
                if cid not in reveal and any(p.msg_id in done_parents for p, _ in pairs):
                    reveal.add(cid)
                    fresh = {p.msg_id for p, _ in pairs} - done_parents
                    if fresh:
                        done_parents |= fresh
                        grew = True
            if not grew:
                break
        out: dict[str, tuple[bool, str, list[tuple[MessageRecord, Member]]]] = {}
        for c in children:
            cid = c.rec.msg_id
            if not c.rec.parents:
                out[cid] = (True, "a child without parents", [])
                continue
            if cid not in module:
                continue
            pairs = module[cid]
            in_doubt = [(p, m) for p, m in pairs if m.state in IN_DOUBT]
            if cid in reveal:
                out[cid] = (True, "a parent reached DONE", in_doubt)
            elif c.missing:
                unresolved[cid] = (
                    f"no parent found DONE and {len(c.missing)} not in the inbound queue "
                    f"({', '.join(c.missing[:3])}): cannot tell whether it was processed"
                )
            else:
                out[cid] = (False, "no parent reached DONE", in_doubt)
        return out, [Unresolved(k, v) for k, v in unresolved.items()]

    @staticmethod
    def _in_doubt(q: Queue) -> list[MessageRecord]:
        """Step 5's candidates: A's messages with a member in GET, FETCHED or IN_PROCESS."""
        ids: dict[str, None] = {}
        for state in (S.GET, S.FETCHED, S.IN_PROCESS):
            for s in _search_all(q, Filter(state=state)):
                ids[s.msg_id] = None
        recs = q.hub.store.load_many(list(ids))
        return [recs[m] for m in ids if m in recs and recs[m].queue == q.name]

    # --- applying -----------------------------------------------------------------

    def apply(
        self,
        plan: Plan | None = None,
        *,
        on_row: Callable[[PlanRow, bool], None] | None = None,
    ) -> RecoveryResult:
        """Make the plan's moves in order (a fresh plan when none is given). Each row
        that finds its move already made (an earlier run, a module meanwhile) is counted
        in ``already`` and changes nothing. ``on_row(row, applied)`` follows each row."""
        started = datetime.now().astimezone()
        plan = plan if plan is not None else self.plan()
        applied = already = 0
        for row in plan.rows:
            queue = self.target if row.side == "target" else self.source
            assert queue is not None
            detail = f"by recovery {self.run}: step {row.step}, {row.reason}"
            try:
                moved = queue.apply_recovery(
                    row.msg_id, row.action, subscriber=row.subscriber, detail=detail
                )
            except MessageNotFound:
                moved = False  # purged meanwhile: nothing left to move
            applied += moved
            already += not moved
            if on_row is not None:
                on_row(row, moved)
        log.info(
            "recovery %s: %d move(s) applied, %d already made (%s)",
            self.run,
            applied,
            already,
            plan.summary(),
        )
        return RecoveryResult(
            self.run, plan, applied, already, started, datetime.now().astimezone()
        )


def recover(
    source: Queue | None,
    target: Queue | None,
    *,
    via: str | None = None,
    dry_run: bool = False,
) -> Plan | RecoveryResult:
    """Plan seed 000's recovery between ``source`` and ``target`` and, unless
    ``dry_run``, apply it. Returns the plan (dry run) or what was applied."""
    job = CrossQueueRecovery(source, target, via=via)
    plan = job.plan()
    return plan if dry_run else job.apply(plan)


def _did(m: Member, outcome: SubscriberState) -> bool:
    """The member reached ``outcome`` (now, or before it was journalled)."""
    return m.state is outcome or (m.state is S.JOURNALLED and m.outcome is outcome)


def _search_all(q: Queue, flt: Filter) -> Iterator[MessageSummary]:
    """Every match of ``flt``, in put order: asked again with a doubled limit while a
    page comes back full (a recovery reads a queue's few unsettled messages, not all)."""
    seen: set[str] = set()
    limit = _PAGE
    while True:
        page = q.search(Filter(state=flt.state, subscriber=flt.subscriber, limit=limit))
        for s in page:
            if s.msg_id not in seen:
                seen.add(s.msg_id)
                yield s
        if len(page) < limit:
            return
        limit *= 2
