"""Prometheus metrics of one or more hubs, read from their index stores at scrape time.

One naming scheme on every broker, because every figure comes from the index (the state
model), not from a broker's own statistics; the process serving them need not be the one
doing the traffic::

    registry = build_registry({"orders": hub, "billing": "redis://redis:6379/0"})
    body, content_type = render(registry)        # what GET /metrics answers

Gauges come from ``queue.counts()`` of every queue of every hub, at each scrape. Counters
and the histogram come from a tail of each hub's journal that the collector reads on from
where it stopped at the previous scrape, so **counters count from the collector's
creation** (the server's start, as the Prometheus convention has it: ``rate()`` and
``increase()`` handle the reset after a restart), not from the journal's beginning. The
tail starts at the journal's end, found with a binary search on
``store.journal(after, limit=1)`` (a few dozen cheap reads, once). Work per scrape is
bounded: at most ``max_pages`` pages of ``page_size`` journal entries and
``max_lookups`` message histories; what is left is read at the next scrape.

A hub given as a URL is connected lazily, at the first scrape that reaches it (and again
at every scrape until one does): a hub that cannot be reached yields ``iqbridge_hub_up 0``
and one error count per scrape, and the other hubs are scraped as usual. A hub's journal
tail starts when it is first reached. No label and no log line carries a URL's password.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from iqbridge.errors import BrokerUnavailable, MessageNotFound
from iqbridge.hub import Hub, connect
from iqbridge.model import JournalEntry
from iqbridge.queue import Queue
from iqbridge.redaction import get_logger, redact, scrub, url_secrets
from iqbridge.states import ActorKind, PublisherState, SubscriberState
from iqbridge.stores.base import IndexStore, LateJournal

__all__ = ["BUCKETS", "IQCollector", "build_registry", "journal_end", "render"]

log = get_logger("iqbridge.metrics")

#: Bucket bounds (seconds) of ``iqbridge_revealed_to_done_seconds``.
BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    21600.0,
    86400.0,
)

S = SubscriberState
#: A member given back from these states is a redelivery.
_HELD = frozenset({S.GET.value, S.FETCHED.value, S.IN_PROCESS.value})
#: Gaps in the journal's sequence a tail remembers, at most (see _Tail.holes).
MAX_HOLES = 10_000
_CLOSED = frozenset({S.DONE.value, S.UNUSABLE.value, S.EXPIRED.value})


def build_registry(
    hubs: Mapping[str, Hub | str | Callable[[], Hub]],
    *,
    page_size: int = 1000,
    max_pages: int = 10,
    max_lookups: int = 200,
    max_tracked: int = 100_000,
) -> CollectorRegistry:
    """A registry holding one :class:`IQCollector` over ``hubs`` (name -> open hub, a
    URL to connect lazily, or a function giving the hub at each scrape); the options
    bound each scrape's work (see :class:`IQCollector`). Hubs given as URLs stay open
    for the registry's life; to close them, register an :class:`IQCollector` yourself
    and call its ``close()``."""
    registry = CollectorRegistry(auto_describe=False)
    collector = IQCollector(
        hubs,
        page_size=page_size,
        max_pages=max_pages,
        max_lookups=max_lookups,
        max_tracked=max_tracked,
    )
    registry.register(collector)
    return registry


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The registry's exposition (runs every collector now) and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


def journal_end(store: IndexStore) -> int:
    """The sequence number of the store's last journal entry (0 if it has none).

    Stores page the journal forward only (``journal(after, limit)``), with increasing
    but not dense numbers (SQLite and Redis number a commit's entries ``row * 65536 +
    position``), so the end is found by galloping then bisecting on ``journal(after,
    limit=1)``: each probe is one indexed read of a few rows, about 2 log2(end) probes
    in all."""
    first = store.journal(0, 1)
    if not first:
        return 0
    lo = first[0].seq or 0  # the last seq known to exist
    hi = max(2 * lo, lo + 1)
    while probe := store.journal(hi, 1):  # gallop: an upper bound with nothing after it
        lo = probe[0].seq or hi + 1
        hi = max(2 * lo, lo + 1)
    while hi - lo > 1:  # invariant: lo exists, nothing after hi
        mid = (lo + hi) // 2
        probe = store.journal(mid, 1)
        if probe:
            lo = probe[0].seq or mid + 1
        else:
            hi = mid
    if lo < hi and (probe := store.journal(lo, 1)):
        lo = probe[0].seq or hi
    return lo


class _Histogram:
    """Bucket counts (not cumulative), sum and count of one label set."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        i = 0
        while i < len(self.bounds) and value > self.bounds[i]:
            i += 1
        self.counts[i] += 1
        self.sum += value
        self.count += 1

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


@dataclass
class _Tail:
    """What one hub's journal tail has counted, and where it stands."""

    cursor: int | None = None  # None: not started (the hub was not reached yet)
    transitions: dict[tuple[str, str, str], int] = field(default_factory=dict)
    redeliveries: dict[tuple[str, str], int] = field(default_factory=dict)
    latency: dict[tuple[str, str], _Histogram] = field(default_factory=dict)
    #: (msg_id, subscriber, attempt) -> when that member entered AVAILABLE (µs), bounded.
    available: OrderedDict[tuple[str, str, int], int] = field(default_factory=OrderedDict)
    #: Sequence numbers the cursor passed that had no entry yet (a store whose entries
    #: can commit out of order, LateJournal) -> when the gap was seen (monotonic s).
    holes: OrderedDict[int, float] = field(default_factory=OrderedDict)


@dataclass
class _HubState:
    name: str
    hub: Hub | None
    url: str | None  # set when the collector connects (and closes) it itself
    #: Gives the hub at each scrape (the caller owns it: an app's own lazily opened hubs).
    factory: Callable[[], Hub] | None = None
    tail: _Tail = field(default_factory=_Tail)
    queues: dict[str, Queue] = field(default_factory=dict)
    index_errors: int = 0
    broker_errors: int = 0
    up: bool = True


@dataclass
class _Families:
    """The metric families of one scrape."""

    publisher: GaugeMetricFamily
    subscriber: GaugeMetricFamily
    oldest: GaugeMetricFamily
    messages: GaugeMetricFamily
    transitions: CounterMetricFamily
    revealed_to_done: HistogramMetricFamily
    redeliveries: CounterMetricFamily
    index_errors: CounterMetricFamily
    broker_errors: CounterMetricFamily
    up: GaugeMetricFamily
    seconds: GaugeMetricFamily

    @classmethod
    def new(cls) -> _Families:
        return cls(
            GaugeMetricFamily(
                "iqbridge_publisher_messages",
                "Messages per publisher state (index, at scrape time).",
                labels=["hub", "queue", "state"],
            ),
            GaugeMetricFamily(
                "iqbridge_subscriber_messages",
                "Messages per subscriber and subscriber state (index, at scrape time).",
                labels=["hub", "queue", "subscriber", "state"],
            ),
            GaugeMetricFamily(
                "iqbridge_oldest_undone_age_seconds",
                "Age of the subscriber's oldest message still to process (since its put).",
                labels=["hub", "queue", "subscriber"],
            ),
            GaugeMetricFamily(
                "iqbridge_queue_messages",
                "Messages the index holds for the queue (purged ones are gone).",
                labels=["hub", "queue"],
            ),
            CounterMetricFamily(
                "iqbridge_transitions",
                "State transitions journalled since the collector started, by target state.",
                labels=["hub", "queue", "actor_kind", "state"],
            ),
            HistogramMetricFamily(
                "iqbridge_revealed_to_done_seconds",
                "Time from a member entering AVAILABLE to its DONE, on the same attempt.",
                labels=["hub", "queue", "subscriber"],
            ),
            CounterMetricFamily(
                "iqbridge_redeliveries",
                "Members given back (lease lapsed, released, reclaimed, undone).",
                labels=["hub", "queue", "subscriber"],
            ),
            CounterMetricFamily(
                "iqbridge_index_errors",
                "Scrapes that failed reading the hub's index store.",
                labels=["hub"],
            ),
            CounterMetricFamily(
                "iqbridge_broker_errors",
                "Scrapes that failed reaching the hub's broker.",
                labels=["hub"],
            ),
            GaugeMetricFamily(
                "iqbridge_hub_up", "1 if the hub was scraped in full, else 0.", labels=["hub"]
            ),
            GaugeMetricFamily(
                "iqbridge_scrape_duration_seconds",
                "Time the last scrape of the hub took.",
                labels=["hub"],
            ),
        )

    def all(self) -> list[Metric]:
        return [
            self.publisher,
            self.subscriber,
            self.oldest,
            self.messages,
            self.transitions,
            self.revealed_to_done,
            self.redeliveries,
            self.index_errors,
            self.broker_errors,
            self.up,
            self.seconds,
        ]


class _OutOfBudget(Exception):
    """This scrape's history lookups are spent: the tail goes on at the next scrape."""


class IQCollector(Collector):
    """A Prometheus collector over named hubs (see the module documentation).

    ``hubs`` maps a hub's label to an open :class:`~iqbridge.hub.Hub` (left open: the
    caller owns it) or to a URL, connected at the first scrape and closed by
    :meth:`close`. ``page_size`` and ``max_pages`` bound the journal entries one scrape
    reads per hub; ``max_lookups`` the message histories it reads (for members revealed
    before the tail started); ``max_tracked`` the AVAILABLE times it remembers.
    ``clock`` gives seconds since the epoch (for ages).
    """

    def __init__(
        self,
        hubs: Mapping[str, Hub | str | Callable[[], Hub]],
        *,
        page_size: int = 1000,
        max_pages: int = 10,
        max_lookups: int = 200,
        max_tracked: int = 100_000,
        buckets: Sequence[float] = BUCKETS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.page_size = page_size
        self.max_pages = max_pages
        self.max_lookups = max(1, max_lookups)  # at least one: the tail always moves on
        self.max_tracked = max_tracked
        self.buckets = tuple(buckets)
        self._clock = clock
        self._lock = threading.Lock()
        self._hubs: list[_HubState] = []
        for name, hub in hubs.items():
            if isinstance(hub, str):
                self._hubs.append(_HubState(name, None, hub))
            elif not isinstance(hub, Hub):
                self._hubs.append(_HubState(name, None, None, factory=hub))
            else:
                st = _HubState(name, hub, None)
                self._hubs.append(st)
                try:  # counters count from now
                    st.tail.cursor = journal_end(hub.store)
                except Exception as exc:  # reached at the first scrape that can
                    self._failed(st, exc)

    def collect(self) -> Iterator[Metric]:
        """Scrape every hub now (see the module documentation)."""
        with self._lock:
            fam = _Families.new()
            for st in self._hubs:
                t0 = time.monotonic()
                self._scrape(st, fam)
                fam.seconds.add_metric([st.name], time.monotonic() - t0)
                self._counters(st, fam)
            families = fam.all()
        yield from families

    def close(self) -> None:
        """Close the hubs this collector connected itself (those given as URLs)."""
        with self._lock:
            for st in self._hubs:
                if st.url is not None and st.hub is not None:
                    hub, st.hub = st.hub, None
                    try:
                        hub.close()
                    except Exception as exc:
                        log.debug(
                            "metrics: closing hub %s: %s",
                            st.name,
                            scrub(str(exc), url_secrets(st.url)),
                        )

    # --- one hub --------------------------------------------------------------------

    def _scrape(self, st: _HubState, fam: _Families) -> None:
        try:
            hub = self._connect(st)
            if st.tail.cursor is None:
                st.tail.cursor = journal_end(hub.store)
            gauges = self._gauges(st, hub)
            self._advance(st, hub)
        except Exception as exc:
            self._failed(st, exc)
            fam.up.add_metric([st.name], 0)
            return
        if not st.up:
            log.info("metrics: hub %s is back", st.name)
        st.up = True
        fam.up.add_metric([st.name], 1)
        for family, labels, value in gauges:
            getattr(fam, family).add_metric(labels, value)

    def _connect(self, st: _HubState) -> Hub:
        if st.factory is not None:
            return st.factory()
        if st.hub is None:
            assert st.url is not None
            st.hub = connect(st.url)
        return st.hub

    def _failed(self, st: _HubState, exc: Exception) -> None:
        broker = isinstance(exc, BrokerUnavailable)
        if broker:
            st.broker_errors += 1
        else:
            st.index_errors += 1
        where = f" ({redact(st.url)})" if st.url is not None else ""
        text = scrub(f"{type(exc).__name__}: {exc}", url_secrets(st.url))
        level = logging.WARNING if st.up else logging.DEBUG  # once per outage
        log.log(level, "metrics: hub %s%s not scraped: %s", st.name, where, text)
        st.up = False

    def _gauges(self, st: _HubState, hub: Hub) -> list[tuple[str, list[str], float]]:
        """The hub's gauge samples: (family, labels, value); nothing is added to the
        scrape unless every queue was read."""
        out: list[tuple[str, list[str], float]] = []
        now = self._clock()
        for name in hub.queues():
            q = st.queues.get(name)
            if q is None:
                q = st.queues[name] = hub.queue(name, create=False)
            c = q.counts()
            out.append(("messages", [st.name, name], float(c.messages)))
            for p in PublisherState:
                out.append(("publisher", [st.name, name, p.value], float(c.publisher.get(p, 0))))
            for sub, per in c.subscribers.items():
                for s in SubscriberState:
                    out.append(("subscriber", [st.name, name, sub, s.value], float(per.get(s, 0))))
            for sub, since in c.oldest_undone.items():
                out.append(("oldest", [st.name, name, sub], max(0.0, now - since.timestamp())))
        return out

    def _counters(self, st: _HubState, fam: _Families) -> None:
        tail = st.tail
        h = st.name
        for (queue, kind, state), n in sorted(tail.transitions.items()):
            fam.transitions.add_metric([h, queue, kind, state], n)
        for (queue, sub), n in sorted(tail.redeliveries.items()):
            fam.redeliveries.add_metric([h, queue, sub], n)
        for (queue, sub), hist in sorted(tail.latency.items()):
            fam.revealed_to_done.add_metric([h, queue, sub], hist.buckets(), hist.sum)
        fam.index_errors.add_metric([h], st.index_errors)
        fam.broker_errors.add_metric([h], st.broker_errors)

    # --- the journal tail -------------------------------------------------------------

    def _advance(self, st: _HubState, hub: Hub) -> None:
        """Read on from the tail's cursor, at most ``max_pages`` pages; the cursor moves
        past each entry once it is counted, so a failure or a spent budget loses and
        repeats nothing."""
        tail = st.tail
        lookups = [self.max_lookups]
        late = hub.store if isinstance(hub.store, LateJournal) else None
        if late is not None and tail.holes and not self._heal(tail, hub, late, lookups):
            return
        for _ in range(self.max_pages):
            assert tail.cursor is not None
            page = hub.store.journal(tail.cursor, self.page_size)
            for entry in page:
                try:
                    self._take(tail, hub, entry, lookups)
                except _OutOfBudget:
                    return
                if entry.seq is not None:
                    if late is not None:
                        self._gap(tail, tail.cursor, entry.seq)
                    tail.cursor = entry.seq
            if len(page) < self.page_size:
                return

    def _gap(self, tail: _Tail, cursor: int, seq: int) -> None:
        """Remember the numbers between the cursor and the next entry: an entry may
        still commit there (at most :data:`MAX_HOLES` remembered, the oldest dropped)."""
        now = time.monotonic()
        for missing in range(max(cursor + 1, seq - MAX_HOLES), seq):
            tail.holes[missing] = now
        while len(tail.holes) > MAX_HOLES:
            tail.holes.popitem(last=False)

    def _heal(self, tail: _Tail, hub: Hub, late: LateJournal, lookups: list[int]) -> bool:
        """Count entries that committed in gaps the cursor passed (one page read from the
        oldest gap); forget gaps older than the store's settle time. False when the
        lookup budget ran out (the rest waits for the next scrape)."""
        now = time.monotonic()
        for seq, seen in list(tail.holes.items()):
            if now - seen > late.journal_settle_seconds:
                del tail.holes[seq]
        if not tail.holes:
            return True
        last = max(tail.holes)
        for entry in hub.store.journal(min(tail.holes) - 1, self.page_size):
            if entry.seq is None or entry.seq > last:
                break
            if entry.seq in tail.holes:
                try:
                    self._take(tail, hub, entry, lookups)
                except _OutOfBudget:
                    return False
                del tail.holes[entry.seq]
        return True

    def _take(self, tail: _Tail, hub: Hub, e: JournalEntry, lookups: list[int]) -> None:
        """Count one journal entry."""
        subscriber = e.actor_kind is ActorKind.SUBSCRIBER
        if subscriber and e.dst == S.DONE.value:
            # Decided first: a lookup beyond the budget leaves the entry for next time.
            since = self._available_at(tail, hub, e, lookups)
            if since is not None:
                hist = tail.latency.get((e.queue, e.actor))
                if hist is None:
                    hist = tail.latency[(e.queue, e.actor)] = _Histogram(self.buckets)
                hist.observe(max(0, e.at - since) / 1_000_000)
        key3 = (e.queue, e.actor_kind.value, e.dst)
        tail.transitions[key3] = tail.transitions.get(key3, 0) + 1
        if not subscriber:
            return
        if e.dst == S.AVAILABLE.value:
            self._track(tail, (e.msg_id, e.actor, e.attempt), e.at)
            if e.src in _HELD:
                key2 = (e.queue, e.actor)
                tail.redeliveries[key2] = tail.redeliveries.get(key2, 0) + 1
        elif e.dst in _CLOSED:
            tail.available.pop((e.msg_id, e.actor, e.attempt), None)

    def _track(self, tail: _Tail, key: tuple[str, str, int], at: int) -> None:
        tail.available[key] = at
        tail.available.move_to_end(key)
        while len(tail.available) > self.max_tracked:
            tail.available.popitem(last=False)

    def _available_at(
        self, tail: _Tail, hub: Hub, e: JournalEntry, lookups: list[int]
    ) -> int | None:
        """When the member of a DONE entry entered AVAILABLE on that attempt: from the
        tail, else from the message's history (one lookup serves all its members)."""
        key = (e.msg_id, e.actor, e.attempt)
        since = tail.available.get(key)
        if since is not None:
            return since
        if lookups[0] <= 0:
            raise _OutOfBudget()
        lookups[0] -= 1
        try:
            history = hub.store.history(e.msg_id)
        except MessageNotFound:
            return None
        # The members still open just before this entry: their DONE may come later in
        # the tail, so their AVAILABLE times are kept too.
        open_: dict[tuple[str, int], int] = {}
        for h in history:
            if h.seq is not None and e.seq is not None and h.seq >= e.seq:
                break
            if h.actor_kind is not ActorKind.SUBSCRIBER:
                continue
            if h.dst == S.AVAILABLE.value:
                open_[(h.actor, h.attempt)] = h.at
            elif h.dst in _CLOSED:
                open_.pop((h.actor, h.attempt), None)
        found = open_.pop((e.actor, e.attempt), None)
        for (actor, attempt), at in open_.items():
            self._track(tail, (e.msg_id, actor, attempt), at)
        return found
