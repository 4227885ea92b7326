"""One route at work: a reader, N lanes, a heartbeat.

The reader claims batches from the source (``get_many`` as the route's subscriber) and
hands each delivery to the lane of its ordering key (a stable hash of the key, modulo
the number of workers), so one key is always handled by one lane, in claim order. A
lane translates its deliveries, puts their children on the destination in one
``put_each`` (msg_ids derived from the route and the parent: a repeat is refused by the
destination's index), then settles the sources in one commit: DONE after the put, never
before. A crash anywhere leaves the source held; the next holder of the route takes it
back at once (``reclaim``) and bridges it again, and the destination keeps one copy.

A delivery whose translation (or put) fails is retried after the route's retry delay,
holding back only its own key: the key is parked, its later deliveries queue behind it
in the lane, the lane's other keys go on. After ``retry.max_attempts`` it goes UNUSABLE
with the reason, and the key moves on.

The heartbeat renews the route's lease and every held delivery's lease, fires
aggregation timeouts, and stops the route if another process took its lease.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from iqbridge.batch import Batch
from iqbridge.bridge.config import BridgeSettings, Route
from iqbridge.bridge.correlate import Correlator
from iqbridge.bridge.lease import RouteLease
from iqbridge.bridge.translate import Translator, message_of
from iqbridge.delivery import Delivery
from iqbridge.errors import (
    ConcurrentUpdate,
    ConnectionError,
    InvalidArgument,
    IQError,
    MessageTooLarge,
    PayloadError,
)
from iqbridge.hub import Hub
from iqbridge.observability import tracing
from iqbridge.putting import Outgoing
from iqbridge.redaction import get_logger
from iqbridge.retry import RetryPolicy
from iqbridge.states import SubscriberState

S = SubscriberState

__all__ = ["RouteRunner", "RouteStats"]

log = get_logger("iqbridge.bridge")

#: Worth waiting out: the broker or index may be back in a moment.
TRANSIENT: tuple[type[BaseException], ...] = (ConnectionError, ConcurrentUpdate)
_REASON_MAX = 500


@dataclass(frozen=True, slots=True)
class RouteStats:
    """A snapshot of a route's counters."""

    name: str
    active: bool
    read: int
    bridged: int
    children: int
    unusable: int
    retried: int
    held: int
    groups: int
    recovered: int
    last_error: str | None


class _Lane:
    """One worker thread of a route: the keys that hash to it, in order."""

    def __init__(self, runner: RouteRunner, n: int) -> None:
        self.runner = runner
        self.n = n
        self.inbox: deque[Delivery] = deque()
        self.cond = threading.Condition()
        self.parked: dict[str, deque[Delivery]] = {}
        self.retry_at: dict[str, float] = {}
        self.tries: dict[str, int] = {}
        self.thread = threading.Thread(
            target=self._run, name=f"iq-bridge-{runner.route.name}-{n}", daemon=True
        )

    def push(self, items: Sequence[Delivery]) -> None:
        with self.cond:
            self.inbox.extend(items)
            self.cond.notify()

    def _next(self) -> list[Delivery] | None:
        r = self.runner
        with self.cond:
            while True:
                if r.aborted.is_set():
                    return None
                now = time.monotonic()
                due = [k for k, t in self.retry_at.items() if t <= now]
                if self.inbox or due:
                    break
                if r.closing.is_set():
                    return None
                wait = min((t - now for t in self.retry_at.values()), default=0.2)
                self.cond.wait(max(0.001, min(wait, 0.2)))
            ready: list[Delivery] = []
            for key in due:
                del self.retry_at[key]
                ready.extend(self.parked.pop(key))
            ready.extend(self.inbox)
            self.inbox.clear()
            return ready

    def _run(self) -> None:
        r = self.runner
        try:
            while True:
                ready = self._next()
                if ready is None:
                    break
                self._process(ready)
        except Exception as exc:  # a bug: the route stops, its deliveries lapse back
            log.exception("route %s lane %d failed", r.route.name, self.n)
            r.fail(f"lane {self.n}: {type(exc).__name__}: {exc}")
            return
        if not r.aborted.is_set():
            self._give_back_parked()

    def _give_back_parked(self) -> None:
        r = self.runner
        left = [d for dq in self.parked.values() for d in dq]
        self.parked.clear()
        self.retry_at.clear()
        if not left:
            return
        batch = Batch(r.src, left)
        for d in left:
            batch.release(d, reason="bridge stopping")
        try:
            batch.done()
        except IQError as exc:
            log.warning(
                "route %s: %d parked messages not given back (%s)", r.route.name, len(left), exc
            )
        r.forget(left)

    def _process(self, ready: list[Delivery]) -> None:
        r = self.runner
        with tracing.hop(r.src, r.route.name, r.dst.name, r.sub, ready):
            ok: list[Delivery] = []
            kids: list[list[Outgoing]] = []
            unusable: list[tuple[Delivery, str]] = []
            t0 = time.monotonic()
            self._start([d for d in ready if d.ordering_key not in self.parked])
            t1 = time.monotonic()
            for d in ready:
                key = d.ordering_key
                if key in self.parked:
                    self.parked[key].append(d)
                    continue
                try:
                    children = r.translator.children(message_of(d))
                except Exception as exc:
                    self._failed(d, exc, unusable)
                    continue
                ok.append(d)
                kids.append(children)
            t2 = time.monotonic()
            if ok:
                ok, kids = self._put(ok, kids, unusable)
            t3 = time.monotonic()
            self._settle(ok, kids, unusable)
            log.debug(
                "route %s lane %d: %d messages: start %.3f s, translate %.3f s, put %.3f s, "
                "settle %.3f s",
                r.route.name,
                self.n,
                len(ready),
                t1 - t0,
                t2 - t1,
                t3 - t2,
                time.monotonic() - t3,
            )

    def _start(self, deliveries: list[Delivery]) -> None:
        """FETCHED -> IN_PROCESS in one commit, on a route with a transform: the user's
        code could crash the process, so a crash from here on counts against the
        message (one that kills the bridge ends UNUSABLE, not in a crash loop). Without
        a transform nothing of a message can crash the bridge: its deliveries stay
        FETCHED until DONE, and a crash never makes them UNUSABLE."""
        if self.runner.translator.transform is None:
            return
        fresh = [d for d in deliveries if d.state is SubscriberState.FETCHED]
        pause = 0.2
        while fresh and not self.runner.aborted.is_set():
            try:
                Batch(self.runner.src, fresh).in_process()
                return
            except TRANSIENT as exc:
                self.runner.count(error=f"source: {type(exc).__name__}: {exc}")
                time.sleep(pause)
                pause = min(pause * 2, 5.0)

    def _failed(self, d: Delivery, exc: Exception, unusable: list[tuple[Delivery, str]]) -> None:
        r = self.runner
        tries = self.tries.get(d.msg_id, d.attempt)
        why = f"{type(exc).__name__}: {exc}"[:_REASON_MAX]
        if r.policy.gives_up(exc, tries, r.policy.max_attempts):
            self.tries.pop(d.msg_id, None)
            unusable.append((d, f"bridge route {r.route.name}: {why} (try {tries})"))
            log.warning(
                "route %s: message %s UNUSABLE after %d tries: %s",
                r.route.name,
                d.msg_id,
                tries,
                why,
            )
            return
        self.tries[d.msg_id] = tries + 1
        r.count(retried=1, error=why)
        key = d.ordering_key
        self.parked[key] = deque([d])
        self.retry_at[key] = time.monotonic() + r.policy.delay(tries)

    def _put(
        self,
        ok: list[Delivery],
        kids: list[list[Outgoing]],
        unusable: list[tuple[Delivery, str]],
    ) -> tuple[list[Delivery], list[list[Outgoing]]]:
        """Put every child; on an error about a message, find it by putting one
        parent's children at a time. Returns the deliveries whose children are out."""
        r = self.runner
        try:
            r.send(
                [c for cs in kids for c in cs],
                [d.msg_id for d, cs in zip(ok, kids, strict=True) for _ in cs],
            )
            return ok, kids
        except _Stopped:
            return [], []
        except Exception as exc:
            if len(ok) == 1:
                self._failed(ok[0], exc, unusable)
                return [], []
        sent: list[Delivery] = []
        sent_kids: list[list[Outgoing]] = []
        for d, cs in zip(ok, kids, strict=True):
            if d.ordering_key in self.parked:
                self.parked[d.ordering_key].append(d)
                continue
            try:
                r.send(cs, [d.msg_id] * len(cs))
            except _Stopped:
                return sent, sent_kids
            except Exception as exc:
                self._failed(d, exc, unusable)
                continue
            sent.append(d)
            sent_kids.append(cs)
        return sent, sent_kids

    def _settle(
        self, ok: list[Delivery], kids: list[list[Outgoing]], unusable: list[tuple[Delivery, str]]
    ) -> None:
        r = self.runner
        if not ok and not unusable:
            return
        every = ok + [d for d, _ in unusable]
        batch = Batch(r.src, every)
        for d, why in unusable:
            batch.unusable(d, why)
        for d in ok:
            self.tries.pop(d.msg_id, None)
        while True:
            try:
                settled = batch.done()
                break
            except TRANSIENT as exc:
                if r.aborted.is_set():
                    return
                r.count(error=f"settling: {exc}")
                time.sleep(0.5)
        for msg_id, why in settled.lost.items():
            log.warning(
                "route %s: %s was taken over before it settled: %s", r.route.name, msg_id, why
            )
        r.forget(every)
        r.count(
            bridged=len(settled.done),
            children=sum(len(cs) for cs in kids),
            unusable=len(settled.unusable),
        )


class _Stopped(Exception):
    """The route stopped while a put was being retried."""


class RouteRunner:
    """One route of a :class:`~iqbridge.bridge.Bridge` (see the module documentation)."""

    def __init__(
        self,
        route: Route,
        settings: BridgeSettings,
        source: Hub,
        destination: Hub,
        state: Hub,
    ) -> None:
        self.route = route
        self.settings = settings
        rs = route.retry
        self.policy = RetryPolicy(
            max_attempts=rs.max_attempts,
            initial_delay=rs.initial_delay,
            multiplier=rs.multiplier,
            max_delay=rs.max_delay,
            permanent=(PayloadError, MessageTooLarge, InvalidArgument),
        )
        self.src = source.queue(route.source.queue, lease=route.lease, retry=self.policy)
        self.dst = destination.queue(route.destination.queue)
        self.sub = route.source.subscriber
        self.audience = route.destination.to
        self.translator = Translator(route)
        self.correlator = (
            Correlator(
                route.correlate,
                route.name,
                state,
                settings.name,
                self._put_aggregate,
                self.translator.publisher,
            )
            if route.correlate is not None
            else None
        )
        self.lease = RouteLease(state, settings.name, route.name, route.lease)
        self.lanes = [_Lane(self, n) for n in range(route.workers)]
        self.max_held = max(2 * route.batch, route.batch + route.workers)
        self.stopping = threading.Event()  # stop reading
        self.closing = threading.Event()  # no more input: lanes drain and end
        self.aborted = threading.Event()  # the route is lost: drop everything
        self._lock = threading.Lock()
        self._held: dict[str, Delivery] = {}
        self._c = {
            "read": 0,
            "bridged": 0,
            "children": 0,
            "unusable": 0,
            "retried": 0,
            "recovered": 0,
        }
        self.last_error: str | None = None
        self.failed: str | None = None
        self._reader = threading.Thread(
            target=self._read, name=f"iq-bridge-{route.name}", daemon=True
        )
        self._beat = threading.Thread(
            target=self._heartbeat, name=f"iq-bridge-{route.name}-beat", daemon=True
        )
        self._subscribed = False

    # --- counters ---------------------------------------------------------------------

    def count(self, *, error: str | None = None, **by: int) -> None:
        """Add to the route's counters (thread-safe)."""
        with self._lock:
            for k, v in by.items():
                self._c[k] += v
            if error is not None:
                self.last_error = error

    def forget(self, deliveries: Sequence[Delivery]) -> None:
        """Deliveries settled or given back: no longer renewed."""
        with self._lock:
            for d in deliveries:
                self._held.pop(d.msg_id, None)

    def fail(self, why: str) -> None:
        """Stop the route after a fault of its own (not the broker's)."""
        self.failed = why
        self.count(error=why)
        self.aborted.set()
        self.stopping.set()

    def stats(self) -> RouteStats:
        """A snapshot of the counters."""
        with self._lock:
            c = dict(self._c)
            held = len(self._held)
            err = self.last_error
        return RouteStats(
            self.route.name,
            self.lease.held is not None,
            c["read"],
            c["bridged"],
            c["children"],
            c["unusable"],
            c["retried"],
            held,
            self.correlator.groups if self.correlator else 0,
            c["recovered"],
            err,
        )

    # --- putting ----------------------------------------------------------------------

    def send(self, children: list[Outgoing], parents: list[str]) -> None:
        """Put children (or stage them for aggregation), waiting out broker outages."""
        if not children:
            return
        pause = 0.2
        while True:
            try:
                if self.correlator is not None:
                    self.correlator.stage(children, parents)
                else:
                    self.dst.put_each(children, to=self.audience)
                return
            except TRANSIENT as exc:
                if self.aborted.is_set() or (self.closing.is_set() and pause >= 5.0):
                    raise _Stopped() from exc
                self.count(error=f"destination: {type(exc).__name__}: {exc}")
                time.sleep(pause)
                pause = min(pause * 2, 5.0)

    def _put_aggregate(self, aggregates: list[Outgoing]) -> None:
        pause = 0.2
        while True:
            try:
                self.dst.put_each(aggregates, to=self.audience)
                self.count(children=len(aggregates))
                return
            except TRANSIENT as exc:
                if self.aborted.is_set():
                    raise
                self.count(error=f"destination: {type(exc).__name__}: {exc}")
                time.sleep(pause)
                pause = min(pause * 2, 5.0)

    # --- the reader -------------------------------------------------------------------

    def start(self) -> None:
        """Start the route's threads."""
        for lane in self.lanes:
            lane.thread.start()
        self._beat.start()
        self._reader.start()

    def stop(self) -> None:
        """Stop reading; the lanes finish what they hold (see :meth:`join`)."""
        self.stopping.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the route has stopped; True if it did within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in (self._reader, *(lane.thread for lane in self.lanes), self._beat):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            t.join(left)
            if t.is_alive():
                return False
        return True

    def _recover(self) -> None:
        """Run once the lease is ours: take back what a previous holder left in doubt,
        read pending aggregations back, before anything new is read."""
        if self.route.source.subscribe and not self._subscribed:
            self.src.subscribe(self.sub)
            self._subscribed = True
        back = self.src.reclaim(self.sub, reason=f"bridge route {self.route.name} taken over")
        if back:
            log.info(
                "route %s: %d messages left in doubt are bridged again", self.route.name, len(back)
            )
        self.count(recovered=len(back))
        if self.correlator is not None:
            pending = self.correlator.load()
            if pending:
                log.info("route %s: %d inputs pending aggregation", self.route.name, pending)

    def _read(self) -> None:
        try:
            self._read_loop()
        except Exception as exc:
            log.exception("route %s reader failed", self.route.name)
            self.fail(f"reader: {type(exc).__name__}: {exc}")
        finally:
            self.closing.set()
            for lane in self.lanes:
                with lane.cond:
                    lane.cond.notify()

    def _read_loop(self) -> None:
        route = self.route
        ready = False
        pause = 0.2
        while not self.stopping.is_set():
            try:
                if not ready:
                    if not self.lease.acquire():
                        self.stopping.wait(self.settings.heartbeat)
                        continue
                    self._recover()
                    ready = True
                if self.lease.held is None:  # lost on the heartbeat
                    return
                with self._lock:
                    full = len(self._held) >= self.max_held
                if full:
                    self.stopping.wait(0.01)
                    continue
                batch = self.src.get_many(self.sub, route.batch, timeout=0.5, lease=route.lease)
                pause = 0.2
            except TRANSIENT as exc:
                self.count(error=f"source: {type(exc).__name__}: {exc}")
                self.stopping.wait(pause)
                pause = min(pause * 2, 5.0)
                continue
            if not batch:
                continue
            with self._lock:
                for d in batch:
                    self._held[d.msg_id] = d
                self._c["read"] += len(batch)
            parts: list[list[Delivery]] = [[] for _ in self.lanes]
            n = len(self.lanes)
            for d in batch:
                parts[zlib.crc32(d.ordering_key.encode()) % n].append(d)
            for lane, part in zip(self.lanes, parts, strict=True):
                if part:
                    lane.push(part)

    # --- the heartbeat ----------------------------------------------------------------

    def _heartbeat(self) -> None:
        every = min(self.settings.heartbeat, self.route.lease / 3)
        while True:
            done = self.closing.is_set() and all(not lane.thread.is_alive() for lane in self.lanes)
            if done or self.aborted.is_set():
                break
            time.sleep(every)
            try:
                self._beat_once()
            except IQError as exc:
                self.count(error=f"heartbeat: {type(exc).__name__}: {exc}")
            except Exception as exc:
                log.exception("route %s heartbeat failed", self.route.name)
                self.count(error=f"heartbeat: {type(exc).__name__}: {exc}")
        if not self.aborted.is_set():
            self.lease.release()

    def _beat_once(self) -> None:
        if self.lease.held is not None and not self.lease.renew():
            self.aborted.set()
            self.stopping.set()
            return
        with self._lock:
            held = list(self._held.values())
        if held:
            # Only what has used up half its lease: most deliveries are settled long
            # before, and a renew of one racing its settle costs the settle a retry.
            settled = Batch(self.src, held).renew(self.route.lease, within=self.route.lease / 2)
            with self._lock:  # settled meanwhile is not lost
                lost = [
                    m
                    for m in settled.lost
                    if m in self._held and self._held[m].state in (S.FETCHED, S.IN_PROCESS)
                ]
            if lost:
                log.warning("route %s: %d deliveries' leases lost", self.route.name, len(lost))
        if self.correlator is not None and self.lease.held is not None:
            self.correlator.expire()
