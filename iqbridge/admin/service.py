"""What the admin API and the dashboard do, over the configured hubs: read counts,
searches, timelines and lineage; act (reveal, withdraw, re-reveal, redrive, purge,
recovery) through the state engine, journalled with the acting token's name."""

from __future__ import annotations

import dataclasses
import importlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import typer

from iqbridge.admin.auth import Principal
from iqbridge.admin.config import BridgeSpec
from iqbridge.admin.hubs import Hubs, HubUnavailable
from iqbridge.admin.schemas import (
    ActionResult,
    BridgeHealth,
    HubOut,
    JournalOut,
    LineageOut,
    MessageOut,
    NodeOut,
    PayloadOut,
    PurgeRequest,
    PurgeResult,
    QueueCountsOut,
    RecoveryRequest,
    RecoveryResultOut,
    RecoveryRowOut,
    RedriveRequest,
    RedriveResult,
    StepOut,
    SubscriberOut,
    SummaryOut,
)
from iqbridge.bridge import Lineage, check_health
from iqbridge.cli.parsing import parse_state as cli_parse_state
from iqbridge.errors import InvalidArgument, IQError
from iqbridge.hub import Hub
from iqbridge.model import (
    Filter,
    MessageRecord,
    MessageState,
    MessageSummary,
    SubscriberView,
    from_micros,
)
from iqbridge.queue import Queue
from iqbridge.redaction import get_logger
from iqbridge.states import PublisherState, SubscriberState

if TYPE_CHECKING:  # recovery/ is installed as iqbridge.recovery; mypy reads it as its own root
    from recovery.crossqueue import CrossQueueRecovery  # noqa: TID251

__all__ = ["SCAN_BOUND", "AdminService", "SearchPage", "SearchParams", "parse_state"]

log = get_logger("iqbridge.admin")

#: Payload bytes shown in a timeline.
PAYLOAD_PREVIEW = 4096
#: Search page while listing every candidate of a redrive or purge dry run.
_PAGE = 2000
_MAX_SCAN = 1_000_000
#: Nodes of a lineage, each way, and children listed per queue.
_MAX_NODES = 200
_CHILD_SCAN = 1000
#: Children may be put on hosts whose clocks run behind the parent's.
_CLOCK_SLACK = timedelta(minutes=5)
#: Matches a paged search reads at most: it counts a filtered search up to this many, and
#: pages no further (the index search has no cursor: each page reads the ones before it).
SCAN_BOUND = 10_000


def parse_state(
    name: str | None, subscriber: str | None
) -> PublisherState | SubscriberState | None:
    """A state by name, read as ``iq search --state`` reads it: a name both machines
    have (JOURNALLED) is the subscriber's when a subscriber is given, else the
    publisher's (``pub:``/``sub:`` force one)."""
    if not name:
        return None
    try:
        return cli_parse_state(name, subscriber=bool(subscriber))
    except typer.BadParameter as exc:
        raise InvalidArgument(exc.message) from None


@dataclass(frozen=True, slots=True)
class SearchParams:
    """The search filters of the API and the dashboard's search form."""

    msg_id: str | None = None
    correlation_id: str | None = None
    priority: int | None = None
    publisher: str | None = None
    state: str | None = None
    subscriber: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = 100
    parent: str | None = None

    def to_filter(self) -> Filter:
        """The index filter (InvalidArgument for an unknown state name)."""
        return Filter(
            msg_id=self.msg_id or None,
            correlation_id=self.correlation_id or None,
            priority=self.priority,
            publisher=self.publisher or None,
            state=parse_state(self.state, self.subscriber),
            subscriber=self.subscriber or None,
            since=self.since,
            until=self.until,
            parent=self.parent or None,
            limit=self.limit,
        )


@dataclass(frozen=True, slots=True)
class SearchPage:
    """One page of a search: its rows, where it starts, and how many match in all.

    ``total`` is exact when ``exact``; otherwise more than ``total`` (that is,
    ``bound``) messages match. Pages reach no further than ``bound`` matches.
    """

    rows: list[SummaryOut]
    offset: int
    total: int
    exact: bool
    bound: int


def _steps(history: Sequence[tuple[object, datetime]]) -> list[StepOut]:
    return [StepOut(state=str(s), at=t) for s, t in history]


def _summary(s: MessageSummary) -> SummaryOut:
    return SummaryOut(
        msg_id=s.msg_id,
        queue=s.queue,
        publisher=s.publisher,
        correlation_id=s.correlation_id,
        priority=s.priority,
        mode=str(s.mode),
        publisher_state=None if s.publisher_state is None else str(s.publisher_state),
        created_at=s.created_at,
        subscribers={k: None if v is None else str(v) for k, v in s.subscribers.items()},
        parents=list(s.parents),
        outcomes={k: str(v) for k, v in s.outcomes.items()},
    )


def _outcome(v: SubscriberView) -> str | None:
    """What a JOURNALLED member did: the last state of its history before JOURNALLED."""
    if v.state is not SubscriberState.JOURNALLED or len(v.history) < 2:
        return None
    return str(v.history[-2][0])


def _unfiltered(flt: Filter) -> bool:
    return dataclasses.replace(flt, limit=0) == Filter(limit=0)


def _member_states(st: MessageState) -> dict[str, str | None]:
    return {n: None if v.state is None else str(v.state) for n, v in st.subscribers.items()}


def _is_unusable(rec: MessageRecord, subscriber: str) -> bool:
    m = rec.members.get(subscriber)
    if m is None:
        return False
    return m.state is SubscriberState.UNUSABLE or (
        m.state is SubscriberState.JOURNALLED and m.outcome is SubscriberState.UNUSABLE
    )


class AdminService:
    """Reads and actions over the configured hubs (shared by the API and dashboard)."""

    #: How far a paged search reads (see :data:`SCAN_BOUND`).
    scan_bound = SCAN_BOUND

    def __init__(self, hubs: Hubs, bridges: Sequence[BridgeSpec] = ()) -> None:
        self.hubs = hubs
        self.bridges = list(bridges)

    # --- reading ---------------------------------------------------------------------

    def overview(self) -> list[HubOut]:
        """Every hub with its redacted URL and queues; an unreachable one says so."""
        out: list[HubOut] = []
        for name in self.hubs.names():
            url = self.hubs.redacted_url(name)
            try:
                with self.hubs.using(name):
                    queues = self.hubs.queue_names(name)
            except HubUnavailable as exc:
                out.append(HubOut(name=name, url=url, available=False, queues=[], error=str(exc)))
                continue
            out.append(HubOut(name=name, url=url, available=True, queues=queues))
        return out

    def counts(self, hub: str) -> list[QueueCountsOut]:
        """Each queue of a hub: counts per state and oldest-undone ages."""
        out: list[QueueCountsOut] = []
        with self.hubs.using(hub) as h:
            now = from_micros(h.now_us())
            for name in sorted(h.store.queues()):
                c = h.queue(name, create=False).counts()
                out.append(
                    QueueCountsOut(
                        queue=c.queue,
                        messages=c.messages,
                        publisher=_in_order(c.publisher, list(PublisherState)),
                        subscribers={
                            s: _in_order(per, list(SubscriberState))
                            for s, per in sorted(c.subscribers.items())
                        },
                        oldest_undone=dict(c.oldest_undone),
                        oldest_undone_age={
                            s: max(0.0, round((now - t).total_seconds(), 3))
                            for s, t in c.oldest_undone.items()
                        },
                    )
                )
        return out

    def search(self, hub: str, queue: str, params: SearchParams) -> list[SummaryOut]:
        """Messages of a queue matching the filters, from the index."""
        flt = params.to_filter()
        with self.hubs.using(hub):
            q = self.hubs.queue(hub, queue)
            return [_summary(s) for s in q.search(flt)]

    def search_page(
        self, hub: str, queue: str, params: SearchParams, offset: int, queue_total: int
    ) -> SearchPage:
        """The ``params.limit`` matches from ``offset`` on, in put order, and how many
        match in all: ``queue_total`` (the index's count of the queue's messages) when
        nothing is filtered, else counted by the search itself up to
        :attr:`scan_bound`. Pages reach no further than that bound."""
        bound = self.scan_bound
        if not 0 <= offset < bound:
            raise InvalidArgument(
                f"offset must be between 0 and {bound - 1:,}; to reach later messages, "
                "narrow the search (since, until, publisher...)"
            )
        flt = params.to_filter()
        page = params.limit
        with self.hubs.using(hub):
            q = self.hubs.queue(hub, queue)
            if _unfiltered(flt):
                found = q.search(dataclasses.replace(flt, limit=offset + page))
                rows = found[offset:]
                total = max(queue_total, offset + len(rows)) if rows else queue_total
                return SearchPage([_summary(s) for s in rows], offset, total, True, bound)
            # One read both counts (to the bound, and one more to know there are more)
            # and holds the page, which may run past the bound.
            found = q.search(dataclasses.replace(flt, limit=max(bound, offset + page) + 1))
        rows = found[offset : offset + page]
        exact = len(found) <= bound
        total = min(len(found), bound)
        return SearchPage([_summary(s) for s in rows], offset, total, exact, bound)

    def message(self, hub: str, queue: str, msg_id: str) -> MessageOut:
        """A message's timeline: publisher and subscribers with states and times."""
        with self.hubs.using(hub):
            q = self.hubs.queue(hub, queue)
            st = q.state(msg_id)
            payload = self._payload(q, msg_id)
        subs = [
            SubscriberOut(
                subscriber=v.subscriber,
                pool=v.pool,
                state=None if v.state is None else str(v.state),
                attempt=v.attempt,
                reason=v.reason,
                lease_owner=v.lease_owner,
                lease_until=v.lease_until,
                history=_steps(v.history),
                outcome=_outcome(v),
            )
            for v in st.subscribers.values()
        ]
        journal = [
            JournalOut(
                actor=e.actor,
                actor_kind=str(e.actor_kind),
                src=e.src,
                dst=e.dst,
                at=e.timestamp,
                attempt=e.attempt,
                detail=e.detail,
            )
            for e in st.journal
        ]
        return MessageOut(
            hub=hub,
            msg_id=st.msg_id,
            queue=st.queue,
            publisher=st.publisher,
            mode=str(st.mode),
            correlation_id=st.correlation_id,
            priority=st.priority,
            parents=list(st.parents),
            publisher_state=None if st.publisher_state is None else str(st.publisher_state),
            publisher_history=_steps(st.publisher_history),
            subscribers=subs,
            journal=journal,
            payload=payload,
        )

    @staticmethod
    def _payload(q: Queue, msg_id: str) -> PayloadOut:
        try:
            env = q.peek(msg_id)
        except IQError as exc:
            return PayloadOut(note=f"payload not shown: {type(exc).__name__}")
        body = env.body
        try:
            text = body[:PAYLOAD_PREVIEW].decode("utf-8")
        except UnicodeDecodeError:
            text = repr(body[:PAYLOAD_PREVIEW])
        return PayloadOut(
            content_type=env.content_type,
            size=len(body),
            text=text,
            truncated=len(body) > PAYLOAD_PREVIEW,
        )

    # --- lineage ---------------------------------------------------------------------

    def _open_hubs(self) -> list[tuple[str, Hub]]:
        out: list[tuple[str, Hub]] = []
        for name in self.hubs.names():
            try:
                out.append((name, self.hubs.hub(name)))
            except HubUnavailable:
                continue
        return out

    def lineage(self, hub: str, queue: str, msg_id: str) -> LineageOut:
        """A message's ancestors and descendants on every configured hub."""
        with self.hubs.using(hub):
            self.hubs.queue(hub, queue).state(msg_id)  # 404 unless it is there
        places = self._open_hubs()
        # Hub names stand in for URLs: Lineage shows them (redacted) as "where".
        finder = Lineage(places)

        def node(mid: str) -> tuple[NodeOut, MessageRecord | None]:
            got = finder.located(mid)
            if got is None:
                gone = NodeOut(
                    msg_id=mid,
                    hub="",
                    queue="",
                    publisher_state="-",
                    subscribers={},
                    parents=[],
                    found=False,
                )
                return gone, None
            n, rec = got
            out = NodeOut(
                msg_id=mid,
                hub=n.where,
                queue=n.queue,
                publisher_state=n.publisher_state,
                subscribers=n.subscribers,
                parents=list(n.parents),
            )
            return out, rec

        me, rec = node(msg_id)
        ancestors: list[NodeOut] = []
        seen = {msg_id}
        todo = list(me.parents)
        while todo and len(ancestors) < _MAX_NODES:
            mid = todo.pop(0)
            if mid in seen:
                continue
            seen.add(mid)
            n, _ = node(mid)
            ancestors.append(n)
            todo.extend(n.parents)
        descendants: list[NodeOut] = []
        frontier = [(msg_id, rec)]
        while frontier and len(descendants) < _MAX_NODES:
            mid, r = frontier.pop(0)
            if r is None:
                continue
            for cid in self._children(places, mid, r.created_at):
                if cid in seen or len(descendants) >= _MAX_NODES:
                    continue
                seen.add(cid)
                n, crec = node(cid)
                descendants.append(n)
                frontier.append((cid, crec))
        return LineageOut(msg_id=msg_id, node=me, ancestors=ancestors, descendants=descendants)

    @staticmethod
    def _children(places: Sequence[tuple[str, Hub]], msg_id: str, created_at: int) -> list[str]:
        """Messages naming ``msg_id`` as a parent (the index's search by parent), put on
        any queue of any hub since it was (less a clock slack), at most
        :data:`_CHILD_SCAN` per queue."""
        since = from_micros(created_at) - _CLOCK_SLACK
        out: list[str] = []
        for _name, h in places:
            try:
                names = sorted(h.store.queues())
                for qn in names:
                    flt = Filter(parent=msg_id, since=since, limit=_CHILD_SCAN)
                    out.extend(s.msg_id for s in h.queue(qn, create=False).search(flt))
            except IQError:
                continue
        return out

    # --- acting ----------------------------------------------------------------------

    @staticmethod
    def _detail(by: Principal, reason: str, default: str) -> str:
        return f"by admin {by.name}: {reason.strip() or default}"

    def _result(
        self, q: Queue, action: str, msg_id: str, by: Principal, detail: str
    ) -> ActionResult:
        st = q.state(msg_id)
        log.info("admin action %s on %s/%s by %s", action, q.name, msg_id, by.name)
        return ActionResult(
            action=action,
            msg_id=msg_id,
            by=by.name,
            detail=detail,
            publisher_state=None if st.publisher_state is None else str(st.publisher_state),
            subscribers=_member_states(st),
        )

    def reveal(self, hub: str, queue: str, msg_id: str, by: Principal, reason: str) -> ActionResult:
        """Confirm a pending put (PUT -> REVEALED)."""
        detail = self._detail(by, reason, "revealed")
        with self.hubs.using(hub):
            q = self.hubs.queue(hub, queue)
            q.reveal(msg_id, detail=detail)
            return self._result(q, "reveal", msg_id, by, detail)

    def withdraw(
        self, hub: str, queue: str, msg_id: str, by: Principal, reason: str
    ) -> ActionResult:
        """Withdraw a message: no subscriber may retrieve it any more."""
        detail = self._detail(by, reason, "withdrawn")
        with self.hubs.using(hub):
            q = self.hubs.queue(hub, queue)
            q.withdraw(msg_id, reason=detail)
            return self._result(q, "withdraw", msg_id, by, detail)

    def rereveal(
        self, hub: str, queue: str, msg_id: str, subscriber: str, by: Principal, reason: str
    ) -> ActionResult:
        """Re-reveal a message to one subscriber that found it UNUSABLE."""
        detail = self._detail(by, reason, f"re-revealed to {subscriber}")
        with self.hubs.using(hub):
            q = self.hubs.queue(hub, queue)
            q.reveal(msg_id, to=subscriber, detail=detail)
            return self._result(q, "rereveal", msg_id, by, detail)

    def redrive(self, hub: str, queue: str, req: RedriveRequest, by: Principal) -> RedriveResult:
        """List (dry run) or re-reveal a subscriber's UNUSABLE messages, to it alone."""
        detail = self._detail(by, req.reason, f"redriven to {req.subscriber}")
        with self.hubs.using(hub) as h:
            q = self.hubs.queue(hub, queue)
            ids: dict[str, None] = {}
            for state in (SubscriberState.UNUSABLE, SubscriberState.JOURNALLED):
                flt = Filter(subscriber=req.subscriber, state=state, limit=_PAGE)
                ids.update((s.msg_id, None) for s in _search_all(q, flt))
            found = _load_many(h, list(ids))
            mine = [m for m in ids if m in found and found[m].queue == q.name]
            candidates = [m for m in mine if _is_unusable(found[m], req.subscriber)][: req.limit]
            moved: list[str] = []
            failed: dict[str, str] = {}
            if not req.dry_run:
                for mid in candidates:
                    try:
                        q.reveal(mid, to=req.subscriber, detail=detail)
                    except IQError as exc:
                        failed[mid] = type(exc).__name__
                    else:
                        moved.append(mid)
                log.info(
                    "admin redrive on %s/%s for %s by %s: %d moved, %d failed",
                    hub,
                    queue,
                    req.subscriber,
                    by.name,
                    len(moved),
                    len(failed),
                )
        return RedriveResult(
            subscriber=req.subscriber,
            dry_run=req.dry_run,
            candidates=candidates,
            moved=moved,
            failed=failed,
        )

    def purge(self, hub: str, queue: str, req: PurgeRequest, by: Principal) -> PurgeResult:
        """Count (dry run) or purge the messages JOURNALLED longer than ``older_than``."""
        if req.dry_run:
            cutoff = self.purge_cutoff(hub, req.older_than)
            count = len(self.purge_candidates(hub, queue, cutoff))
            return PurgeResult(dry_run=True, older_than=req.older_than, count=count)
        with self.hubs.using(hub):
            q = self.hubs.queue(hub, queue)
            count = q.purge(req.older_than)
            log.info("admin purge on %s/%s by %s: %d purged", hub, queue, by.name, count)
            return PurgeResult(dry_run=False, older_than=req.older_than, count=count)

    def purge_cutoff(self, hub: str, older_than: float) -> int:
        """Now less ``older_than`` seconds, on the hub's clock (microseconds)."""
        with self.hubs.using(hub) as h:
            return h.now_us() - int(older_than * 1_000_000)

    def purge_listed(self, hub: str, queue: str, cutoff: int, by: Principal) -> int:
        """Purge exactly what :meth:`purge_candidates` lists for ``cutoff`` (a dry run's,
        confirmed): ``Queue.purge_listed`` keeps any that changed since."""
        ids = self.purge_candidates(hub, queue, cutoff)
        with self.hubs.using(hub):
            count = self.hubs.queue(hub, queue).purge_listed(ids, cutoff)
        log.info("admin purge on %s/%s by %s: %d purged", hub, queue, by.name, count)
        return count

    def purge_candidates(self, hub: str, queue: str, cutoff: int) -> list[str]:
        """The msg_ids a purge up to ``cutoff`` (microseconds) would delete: the queue's
        messages whose publisher is JOURNALLED and unchanged since before then, oldest
        put first. Nothing changes."""
        with self.hubs.using(hub) as h:
            q = self.hubs.queue(hub, queue)
            flt = Filter(state=PublisherState.JOURNALLED, until=from_micros(cutoff), limit=_PAGE)
            ids = [s.msg_id for s in _search_all(q, flt)]
            recs = _load_many(h, ids)
        return [
            mid
            for mid in ids
            if (r := recs.get(mid)) is not None
            and r.queue == q.name
            and r.publisher_state is PublisherState.JOURNALLED
            and r.updated_at < cutoff
        ]

    def recovery(self, req: RecoveryRequest, by: Principal) -> RecoveryResultOut:
        """Plan (dry run) or apply cross-queue recovery between two hubs' queues."""
        if req.source is None and req.target is None:
            raise InvalidArgument("name the source (parents), the target (children) or both")
        src = tgt = None
        if req.source is not None:
            with self.hubs.using(req.source.hub):
                src = self.hubs.queue(req.source.hub, req.source.queue)
        if req.target is not None:
            with self.hubs.using(req.target.hub):
                tgt = self.hubs.queue(req.target.hub, req.target.queue)
        cls: type[CrossQueueRecovery] = importlib.import_module(
            "iqbridge.recovery.crossqueue"
        ).CrossQueueRecovery
        run = f"admin-{by.name}-{secrets.token_hex(4)}"
        job = cls(src, tgt, via=req.via, run=run)
        plan = job.plan()
        rows = [
            RecoveryRowOut(
                step=r.step,
                action=str(r.action),
                side=r.side,
                queue=r.queue,
                msg_id=r.msg_id,
                subscriber=r.subscriber,
                state=r.state,
                reason=r.reason,
            )
            for r in plan.rows
        ]
        out = RecoveryResultOut(
            dry_run=req.dry_run,
            run=run,
            summary=plan.summary(),
            rows=rows,
            unresolved={u.msg_id: u.reason for u in plan.unresolved},
        )
        if req.dry_run:
            return out
        result = job.apply(plan)
        log.info("admin recovery %s by %s: %s", run, by.name, plan.summary())
        return out.model_copy(update={"applied": result.applied, "already": result.already})

    def bridge_health(self) -> list[BridgeHealth]:
        """Each configured bridge's health record."""
        out: list[BridgeHealth] = []
        for b in self.bridges:
            alive, reason = check_health(b.health_file, max_age=b.max_age)
            out.append(BridgeHealth(name=b.name, alive=alive, reason=reason))
        return out


def _in_order(counts: Mapping[Any, int], order: Sequence[Any]) -> dict[str, int]:
    """Counts keyed by state name, in the state machine's order."""
    return {str(st): counts[st] for st in order if st in counts}


def _search_all(q: Queue, flt: Filter) -> list[MessageSummary]:
    """Every match of ``flt``, asked again with a doubled limit while a page is full."""
    limit = flt.limit
    while True:
        page = q.search(dataclasses.replace(flt, limit=limit))
        if len(page) < limit or limit >= _MAX_SCAN:
            return page
        limit *= 2


def _load_many(h: Hub, ids: Sequence[str]) -> dict[str, MessageRecord]:
    out: dict[str, MessageRecord] = {}
    for i in range(0, len(ids), 1000):
        out.update(h.store.load_many(ids[i : i + 1000]))
    return out
