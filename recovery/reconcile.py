"""Reconciliation: compare a queue's index with what its broker holds, and repair safely.

:func:`reconcile` reads the queue's index records, then lists the broker's entries and
each consumer group's view of them (through the adapter's optional
:class:`~iqbridge.inventory.Inventory`), and reports every disagreement as a typed
:class:`Finding`:

* ``unknown entry``: a broker entry the index does not know. A stranger's entry (put by
  a client that knows nothing of iqbridge) is adopted with ``adopt=True``, through the
  same path and msg_id a get uses, so a later get does not adopt it again. An iqbridge
  entry whose record is gone (a purge cut short) is deleted by ``repair=True`` once every
  group acknowledged it; before that a get acknowledges it (once-only).
* ``missing payload``: a record still in use (publisher PUT or REVEALED, a member not
  finished) whose broker entry is gone. ``repair=True`` puts the payload back from the
  retained copy and records the new native reference; without a retained copy it cannot.
* ``unrecorded reference``: a record without a native reference whose entry the broker
  holds (a put cut short after the broker took it); ``repair=True`` records it.
* ``acked on broker``: a group acknowledged an entry whose member is AVAILABLE or in
  doubt on its first attempt (the broker would never hand it out again).
  ``repair=True`` makes the group deliver it again (where the broker cannot do that for
  one group, Kafka, the payload is put on the broker again and its new reference
  recorded); the index decides what happens then.
* ``pending on broker``: every member of a group is finished in the index but the entry
  is still handed out and unacknowledged on the broker. ``repair=True`` acknowledges it:
  the index says it is finished, so it is never processed twice.

Members given back (attempt 2 or later) are delivered through the index whatever the
broker's acknowledgement says, and an entry a group has not read yet is skipped by the
group's next read if its members are finished: neither is a finding. Index state is
never changed here except by adoption, which goes through the state engine like a get's.

Checks a broker cannot answer are reported as :class:`Note` rows (RabbitMQ cannot list
a queue without consuming it; the embedded SQLite queue keeps no acknowledgement of its
own: the index is the only one).

Three optional protocols of an inventory (:mod:`iqbridge.inventory`):

* :class:`~iqbridge.inventory.HidesInFlight` (``hides_in_flight = True``): a browse
  cannot see an entry under another connection's open get (IBM MQ's uncommitted MQGET).
  A member the index has in doubt (GET, FETCHED, IN_PROCESS) is then never reported as
  ``missing payload`` or ``acked on broker``: its entry may just be in flight;
* :class:`~iqbridge.inventory.TracksGroups` (``track_groups(queue, groups)``): told every
  consumer group of the queue (standing subscriptions and those in the records) before
  the listing, for a broker that keeps one queue per group and cannot list them by the
  iqbridge queue's name (IBM MQ);
* :class:`~iqbridge.inventory.PutsBack` (``put_back(queue, group, env)``): puts a copy of
  a message back for one group alone (same native reference), used instead of putting
  it again for every group when the broker cannot redeliver the entry and the payload
  comes from the retained copy.

An adapter that holds acknowledgements back (:class:`~iqbridge.adapter.HoldsAcks`, Redis
Streams) is flushed after repairs.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from iqbridge.adapter import HoldsAcks
from iqbridge.errors import IQError
from iqbridge.inventory import Entry, HidesInFlight, Inventory, PutsBack, TracksGroups, Unacked
from iqbridge.model import Envelope, Filter, Member, MessageRecord, Received
from iqbridge.queue import Queue
from iqbridge.redaction import get_logger
from iqbridge.states import IN_DOUBT, TERMINAL, PublisherState, SubscriberState

__all__ = ["Check", "Finding", "Kind", "Note", "Report", "reconcile"]

log = get_logger("iqbridge.recovery")

#: Records loaded from the index per call.
_CHUNK = 500

S = SubscriberState
_FINISHED = frozenset({*TERMINAL, S.JOURNALLED})
_OPEN = frozenset({S.AVAILABLE, *IN_DOUBT})


class Kind(enum.StrEnum):
    """What a finding is about."""

    UNKNOWN_ENTRY = "unknown entry"
    MISSING_PAYLOAD = "missing payload"
    UNRECORDED_REF = "unrecorded reference"
    ACKED_ON_BROKER = "acked on broker"
    PENDING_ON_BROKER = "pending on broker"


class Check(enum.StrEnum):
    """The three comparisons a reconciliation makes."""

    ENTRIES = "entries"
    PAYLOADS = "payloads"
    STATES = "states"


@dataclass(frozen=True, slots=True)
class Finding:
    """One disagreement between the index and the broker, and its fix."""

    kind: Kind
    #: The message (for an unknown entry: the id the facade knows it by, or would).
    msg_id: str | None
    #: The broker's reference to the entry, if there is one.
    native_ref: str | None
    #: What the index says, in a few words.
    index_says: str
    #: What the broker says, in a few words.
    broker_says: str
    #: The fix (what ``repair``/``adopt`` does, or why nothing can be done).
    fix: str
    #: Whether the fix was applied in this run.
    repaired: bool = False
    #: The consumer group concerned (state findings).
    group: str | None = None
    #: The subscribers concerned, comma-separated (state findings).
    subscriber: str | None = None


@dataclass(frozen=True, slots=True)
class Note:
    """A check that could not be made on this broker, and why."""

    check: Check
    text: str


@dataclass(frozen=True, slots=True)
class Report:
    """The outcome of :func:`reconcile` on one queue."""

    queue: str
    broker: str
    #: Index records compared.
    records: int
    #: Broker entries listed, or None when the broker cannot list them.
    entries: int | None
    findings: tuple[Finding, ...] = ()
    notes: tuple[Note, ...] = ()

    @property
    def outstanding(self) -> tuple[Finding, ...]:
        """Findings not repaired (in this run)."""
        return tuple(f for f in self.findings if not f.repaired)

    @property
    def consistent(self) -> bool:
        """No finding is left: the index and the broker agree (or were made to)."""
        return not self.outstanding

    def summary(self) -> str:
        """One line: what was compared, found and repaired."""
        listed = "entries not listed" if self.entries is None else f"{self.entries} entries"
        repaired = sum(f.repaired for f in self.findings)
        text = (
            f"queue {self.queue}: {self.records} records, {listed}: "
            f"{len(self.findings)} finding(s), {repaired} repaired, "
            f"{len(self.outstanding)} outstanding"
        )
        if self.notes:
            text += f"; not checked: {', '.join(sorted({n.check.value for n in self.notes}))}"
        return text

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict of the whole report."""
        return {
            "queue": self.queue,
            "broker": self.broker,
            "records": self.records,
            "entries": self.entries,
            "consistent": self.consistent,
            "findings": [asdict(f) for f in self.findings],
            "notes": [asdict(n) for n in self.notes],
            "summary": self.summary(),
        }


@dataclass
class _Run:
    """One reconciliation in progress."""

    queue: Queue
    repair: bool
    adopt: bool
    inventory: Inventory | None
    #: The broker hides entries under an open get from a listing (``hides_in_flight``).
    hides: bool = False
    records: dict[str, MessageRecord] = field(default_factory=dict)
    entries: list[Entry] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.queue.name


def reconcile(
    queue: Queue, *, repair: bool = False, adopt: bool = False, limit: int = 100_000
) -> Report:
    """Compare ``queue``'s index with its broker; with ``repair``/``adopt``, fix what is safe.

    ``limit`` caps the index records compared (a note says when it was reached). Raises
    only :mod:`iqbridge.errors` exceptions (the broker or the index unreachable)."""
    adapter = queue.hub.adapter
    inventory = adapter if isinstance(adapter, Inventory) else None
    run = _Run(queue, repair, adopt, inventory)
    run.hides = _hides(inventory)
    _load_records(run, limit)
    if inventory is None:
        why = (
            f"{adapter.url} ({type(adapter).__name__}) cannot list a queue's entries "
            "without consuming them: unknown entries, missing payloads and contradicted "
            "states are not checked on this broker"
        )
        run.notes.extend(Note(c, why) for c in Check)
        return _report(run, None)
    if isinstance(inventory, TracksGroups):
        inventory.track_groups(queue.name, sorted(_all_groups(run)))
    run.entries = list(inventory.entries(queue.name))
    _check_entries(run)
    _check_payloads(run)
    _check_states(run)
    if repair and isinstance(adapter, HoldsAcks):
        adapter.flush()  # acknowledgements held back (Redis Streams) go out now
    return _report(run, len(run.entries))


def _hides(inventory: object) -> bool:
    """Whether the broker's listing hides entries under another connection's open get."""
    return isinstance(inventory, HidesInFlight) and bool(inventory.hides_in_flight)


def _puts_back(inventory: object) -> PutsBack | None:
    """The inventory, if it can put a message back for one group alone."""
    return inventory if isinstance(inventory, PutsBack) else None


def _report(run: _Run, entries: int | None) -> Report:
    for f in run.findings:
        if f.repaired:
            log.info("queue %s: %s %s repaired: %s", run.name, f.kind, f.msg_id, f.fix)
    return Report(
        run.name,
        run.queue.hub.adapter.url,
        len(run.records),
        entries,
        tuple(run.findings),
        tuple(run.notes),
    )


def _load_many(run: _Run, ids: Sequence[str]) -> dict[str, MessageRecord]:
    store = run.queue.hub.store
    out: dict[str, MessageRecord] = {}
    for i in range(0, len(ids), _CHUNK):
        found = store.load_many(ids[i : i + _CHUNK])
        out.update((k, r) for k, r in found.items() if r.queue == run.name)
    return out


def _load_records(run: _Run, limit: int) -> None:
    """Every index record of the queue (read before the broker is listed, so a record
    whose entry exists is never taken for one whose entry is gone)."""
    hits = run.queue.hub.store.search(run.name, Filter(limit=limit))
    if len(hits) >= limit:
        run.notes.append(
            Note(Check.PAYLOADS, f"only the first {limit} index records were compared")
        )
    run.records = _load_many(run, [h.msg_id for h in hits])


# --- unknown entries --------------------------------------------------------------------


def _check_entries(run: _Run) -> None:
    known = run.records
    # Records written since the index was read are not unknown: ask again for those.
    fresh = [e.msg_id for e in run.entries if e.msg_id not in known]
    later = _load_many(run, list(dict.fromkeys(fresh))) if fresh else {}
    unknown = [e for e in run.entries if e.msg_id not in known and e.msg_id not in later]
    if not unknown:
        return
    views = _group_views(run)
    holders = {
        e.native_ref: [g for g, v in views.items() if v is not None and not v.acked(e.native_ref)]
        for e in unknown
    }
    # A broker that tracks acknowledgements: an entry every group acknowledged was never
    # seen by a get (which would have adopted it or acknowledged it itself).
    tracked = run.queue.hub.adapter.capabilities.native_groups and any(
        v is not None for v in views.values()
    )
    strangers = [e for e in unknown if e.stranger and (holders[e.native_ref] or not tracked)]
    consumed = sum(1 for e in unknown if e.stranger) - len(strangers)
    if consumed:
        run.notes.append(
            Note(
                Check.ENTRIES,
                f"{consumed} entries without an iqbridge envelope were acknowledged by every "
                "group before iqbridge saw them (consumed outside iqbridge): left alone, "
                "adopting them would deliver them again",
            )
        )
    orphans = [e for e in unknown if not e.stranger]
    if strangers:
        _strangers(run, strangers)
    if orphans:
        _orphans(run, orphans, holders, tracked)


def _group_views(run: _Run) -> dict[str, Unacked | None]:
    """Every consumer group of the queue (standing, remembered, in records) and the
    broker's view of it."""
    inventory = run.inventory
    assert inventory is not None
    return {g: inventory.unacked(run.name, g) for g in sorted(_all_groups(run))}


def _all_groups(run: _Run) -> set[str]:
    """Every consumer group of the queue: standing, remembered, in records."""
    subs = run.queue.subscriptions()
    groups = {*subs.subscribers, *(p.name for p in (*subs.pools, *subs.adhoc_pools))}
    for rec in run.records.values():
        groups.update(_groups(rec))
    return groups


def _strangers(run: _Run, strangers: Sequence[Entry]) -> None:
    """Entries put by clients that know nothing of iqbridge: adopted as a get would."""
    adapter = run.queue.hub.adapter
    unread = [e.native_ref for e in strangers if e.envelope is None]
    envs = dict(zip(unread, adapter.read_many(run.name, unread), strict=True)) if run.adopt else {}
    for entry in strangers:
        done = False
        fix = "adopt it (adopt=True, iq reconcile --adopt)"
        env = (entry.envelope or envs.get(entry.native_ref)) if run.adopt else None
        if env is not None:
            # The get path's own adoption: same msg_id, same audience, same engine step.
            try:
                rec = run.queue.adopt(Received(entry.native_ref, "", env, adopted=True))
            except IQError as exc:  # no standing audience to adopt it for, say
                fix = f"cannot adopt: {exc}"
            else:
                run.records[rec.msg_id] = rec
                done, fix = True, "adopted, as a get would"
        elif run.adopt:
            fix = "none: the entry went while it was being adopted"
        run.findings.append(
            Finding(
                Kind.UNKNOWN_ENTRY,
                entry.msg_id,
                entry.native_ref,
                "no record",
                "entry without an iqbridge envelope",
                fix,
                done,
            )
        )


def _orphans(
    run: _Run, orphans: Sequence[Entry], holders: dict[str, list[str]], tracked: bool
) -> None:
    """iqbridge entries whose record is gone (a purge cut short after the index)."""
    keeps = run.queue.hub.adapter.capabilities.retains_after_ack
    deletable: list[Entry] = []
    for entry in orphans:
        holding = holders[entry.native_ref]
        if holding:
            broker = f"unacknowledged by {', '.join(holding)}"
            fix = "none yet: a get acknowledges it (once-only); then repair deletes it"
        elif not keeps:
            continue  # acknowledged by every group; the broker drops it in its own time
        else:
            broker = "acknowledged by every group" if tracked else "stored"
            fix = "delete the entry (what the purge did not finish)"
            deletable.append(entry)
        run.findings.append(
            Finding(
                Kind.UNKNOWN_ENTRY,
                entry.msg_id,
                entry.native_ref,
                "no record (purged?)",
                broker,
                fix,
                run.repair and not holding,
            )
        )
    if run.repair and deletable:
        run.queue.hub.adapter.delete(run.name, [e.native_ref for e in deletable])


# --- missing payloads -------------------------------------------------------------------


def _in_use(rec: MessageRecord) -> bool:
    """The record still needs its payload: not withdrawn or journalled, and some member
    is not finished."""
    return rec.publisher_state in (PublisherState.PUT, PublisherState.REVEALED) and any(
        m.state not in _FINISHED for m in rec.members.values()
    )


def _check_payloads(run: _Run) -> None:
    refs = {e.native_ref for e in run.entries}
    by_id = {e.msg_id: e.native_ref for e in run.entries if not e.stranger}
    horizon = run.queue.hub.now_us() - int(run.queue.lease * 1_000_000)
    missing: list[MessageRecord] = []
    for rec in run.records.values():
        if not _in_use(rec):
            continue
        if run.hides and any(m.state in IN_DOUBT for m in rec.members.values()):
            continue  # its entry may be under an open get, which a listing cannot see
        if rec.native_ref is None:
            ref = by_id.get(rec.msg_id)
            if ref is not None:
                _unrecorded(run, rec, ref)
            elif rec.created_at < horizon:  # younger: a put in flight records it soon
                missing.append(rec)
        elif rec.native_ref not in refs:
            missing.append(rec)
    if missing:
        _missing(run, missing)


def _unrecorded(run: _Run, rec: MessageRecord, ref: str) -> None:
    if run.repair:
        run.queue.hub.store.set_native_ref(rec.msg_id, ref)
        rec.native_ref = ref
    run.findings.append(
        Finding(
            Kind.UNRECORDED_REF,
            rec.msg_id,
            ref,
            "no native reference",
            "entry holds the message",
            "record the native reference",
            run.repair,
        )
    )


def _missing(run: _Run, recs: Sequence[MessageRecord]) -> None:
    """Records whose entry is gone: put back from the retained copy where there is one."""
    queue, store, adapter = run.queue, run.queue.hub.store, run.queue.hub.adapter
    # Asked again, one by one: a purge or a put may have moved on since the listing.
    still = _load_many(run, [r.msg_id for r in recs])
    recs = [r for r in recs if (s := still.get(r.msg_id)) and s.native_ref == r.native_ref]
    refd = [r for r in recs if r.native_ref]
    if refd:
        there = adapter.read_many(queue.name, [r.native_ref or "" for r in refd])
        back = {r.msg_id for r, env in zip(refd, there, strict=True) if env is not None}
        recs = [r for r in recs if r.msg_id not in back]
    kept = store.retained([r.msg_id for r in recs]) if recs else {}
    put_back = _puts_back(run.inventory)
    for rec in recs:
        copy = kept.get(rec.msg_id)
        done = False
        ref = rec.native_ref
        if copy is None:
            fix = "no retained copy: cannot repair"
        elif run.repair and ref is not None and put_back is not None:
            # One copy per group still to finish it, same reference: no duplicates.
            groups = sorted({g for g, names in _groups(rec).items() if not _finished(rec, names)})
            for group in groups:
                put_back.put_back(run.name, group, rec.envelope(copy))
            done, fix = True, f"put back from the retained copy for {', '.join(groups)}"
        elif run.repair:
            ref = _reput(run, rec, rec.envelope(copy))
            done, fix = True, f"put back from the retained copy as {ref}"
        else:
            fix = "put it back from the retained copy"
        run.findings.append(
            Finding(
                Kind.MISSING_PAYLOAD,
                rec.msg_id,
                ref,
                f"publisher {_state(rec.publisher_state)}; {_members(rec.members.values())}",
                "entry gone" if rec.native_ref else "no entry of the message",
                fix,
                done,
            )
        )


def _reput(run: _Run, rec: MessageRecord, env: Envelope) -> str:
    """Store the payload again and record where (one transaction on the embedded queue)."""
    store, adapter = run.queue.hub.store, run.queue.hub.adapter
    groups = sorted({m.pool or m.subscriber for m in rec.members.values()})
    adapter.declare(run.name, groups)
    with store.atomic():
        ref = adapter.send(run.name, [env])[0]
        store.set_native_ref(rec.msg_id, ref)
    rec.native_ref = ref
    return ref


# --- contradicted states ----------------------------------------------------------------


def _groups(rec: MessageRecord) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for m in rec.members.values():
        out.setdefault(m.pool or m.subscriber, []).append(m.subscriber)
    return out


def _stuck(rec: MessageRecord, names: Iterable[str], hides: bool = False) -> list[str]:
    """Members AVAILABLE or in doubt on their first attempt (a given-back one, attempt 2
    or later, is delivered through the index whatever the broker acknowledged). Where the
    broker hides entries under an open get (``hides``), a member in doubt is not: the
    listing cannot tell its get in flight from an acknowledgement."""
    open_ = {S.AVAILABLE} if hides else _OPEN
    return [n for n in names if rec.members[n].state in open_ and rec.members[n].attempt == 1]


def _finished(rec: MessageRecord, names: Iterable[str]) -> bool:
    return all(rec.members[n].state in _FINISHED for n in names)


def _check_states(run: _Run) -> None:
    inventory = run.inventory
    assert inventory is not None
    refs = {e.native_ref for e in run.entries}
    recs = [r for r in run.records.values() if r.native_ref in refs and r.members]
    if not run.queue.hub.adapter.capabilities.native_groups:
        run.notes.append(
            Note(
                Check.STATES,
                f"{run.queue.hub.adapter.url} keeps no acknowledgement of its own "
                "(index-driven delivery): the index is the only record of states",
            )
        )
        return
    views: dict[str, Unacked | None] = {}
    for rec in recs:
        for group in _groups(rec):
            if group not in views:
                views[group] = inventory.unacked(run.name, group)
    suspects = [r.msg_id for r in recs if _contradicted(r, views, run.hides)]
    if not suspects:
        return
    # Decided again on fresh reads: a consumer may have moved on since the first one.
    fresh = _load_many(run, suspects)
    views = {g: inventory.unacked(run.name, g) for g in views}
    for msg_id in suspects:
        again = fresh.get(msg_id)
        if again is not None and again.native_ref in refs:
            _state_findings(run, again, views)


def _contradicted(rec: MessageRecord, views: dict[str, Unacked | None], hides: bool) -> bool:
    ref = rec.native_ref or ""
    for group, names in _groups(rec).items():
        view = views.get(group)
        if view is None:
            continue
        if (view.acked(ref) and _stuck(rec, names, hides)) or (
            ref in view.pending and _finished(rec, names)
        ):
            return True
    return False


def _state_findings(run: _Run, rec: MessageRecord, views: dict[str, Unacked | None]) -> None:
    adapter, inventory = run.queue.hub.adapter, run.inventory
    assert inventory is not None and rec.native_ref is not None
    ref = rec.native_ref
    for group, names in sorted(_groups(rec).items()):
        view = views.get(group)
        if view is None:
            continue
        stuck = _stuck(rec, names, run.hides)
        if view.acked(ref) and stuck:
            done, fix = False, "deliver it to the group again"
            if run.repair:
                done, fix = _give_back(run, rec, group, ref)
            members = {n: rec.members[n] for n in stuck}
            run.findings.append(
                Finding(
                    Kind.ACKED_ON_BROKER,
                    rec.msg_id,
                    ref,
                    _members(members.values()),
                    f"acknowledged by group {group}",
                    fix,
                    done,
                    group,
                    ", ".join(stuck),
                )
            )
        elif ref in view.pending and _finished(rec, names):
            if run.repair:
                adapter.ack(run.name, group, [ref])
            run.findings.append(
                Finding(
                    Kind.PENDING_ON_BROKER,
                    rec.msg_id,
                    ref,
                    _members(rec.members[n] for n in names),
                    f"pending, unacknowledged by group {group}",
                    "acknowledge it on the broker (finished in the index: never processed twice)",
                    run.repair,
                    group,
                    ", ".join(names),
                )
            )


def _give_back(run: _Run, rec: MessageRecord, group: str, ref: str) -> tuple[bool, str]:
    """Make the group deliver the entry again; where the broker cannot do that for one
    group (Kafka), put the payload on the broker again (from the entry or the retained
    copy) and record the new reference: the groups finished with it skip it (once-only).
    Returns (applied, what was done)."""
    inventory = run.inventory
    assert inventory is not None
    try:
        if inventory.redeliver(run.name, group, ref):
            return True, "delivered to the group again"
        if rec.native_ref != ref:  # put again already, for another group of the message
            return True, f"put on the broker again as {rec.native_ref}"
        env = run.queue.hub.adapter.read(run.name, ref)
        if env is None:
            copy = run.queue.hub.store.retained([rec.msg_id]).get(rec.msg_id)
            env = rec.envelope(copy) if copy is not None else None
        if env is None:
            return False, "needs an operator: no redelivery on this broker, no retained copy"
        if isinstance(inventory, PutsBack):
            inventory.put_back(run.name, group, env)
            return True, "put back for the group from the retained copy"
        return True, f"put on the broker again as {_reput(run, rec, env)}"
    except IQError as exc:
        return False, f"needs an operator: the broker refused a redelivery: {exc}"


def _state(state: enum.Enum | None) -> str:
    return state.value if state is not None else "unrevealed"


def _members(members: Iterable[Member]) -> str:
    return ", ".join(f"{m.subscriber} {_state(m.state)}" for m in members)
