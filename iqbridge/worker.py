"""An ordered parallel worker: many threads consume one queue, every key stays in order.

Seed 004 (concurrent publishing with ordering): N threads share one input queue. One
fetch mutex serialises the gets; the thread holding it claims a batch,
``queue.get_many(subscriber, batch, lease=...)`` (one index commit for the whole
batch), and looks at each message's ordering key (by default its publisher), in the
order the batch was claimed:

* if no other thread is processing that key, the key is marked busy for that message:
  the first such message is processed by the fetching thread once it releases the
  mutex; the others wait in a ready queue, which idle threads serve before they fetch;
* if the key is busy, the message is appended to that key's FIFO of waiting messages.
  No thread ever waits for a key while it holds the mutex, so a slow key never stalls
  the others.

A thread that finishes a message of key K takes the next waiting message of K (still
holding K), or marks K free and goes back to fetching. Messages of one key are therefore
handled one at a time, in the order the worker fetched them, while different keys run in
parallel::

    with Worker(queue, "billing", handle, threads=8):
        ...                                  # runs until the block ends (drains,
                                             # unless an exception ends the block)

    stats = Worker(queue, "billing", handle).run(until_idle=5.0)

Processing one message: ``delivery.in_process()``, ``handler(delivery)``,
``delivery.done()``. A handler may finish the delivery itself (for instance
``delivery.unusable(reason)`` for a poison message); the worker then leaves it as it is.

Retry in place. When the handler raises, the worker keeps holding the key, sleeps
``queue.retry.delay(n)`` and calls the handler again, until
``queue.retry.gives_up(exc, n, delivery.max_attempts)``; then the message goes
UNUSABLE with a reason naming the exception and the number of tries, and the key moves
on to its next message. ``n`` starts at the delivery's attempt (above 1 after a
redelivery) and ``delivery.attempt`` is set to it before each call, so the handler sees
which try it is on; the index's attempt counter only moves on a redelivery. The worker
never ``release()``\\ s a failing message for a retry: that would make it AVAILABLE
again while the later messages of its key, already fetched or next in the queue, are
processed first, an ordering inversion.

Leases. Every held message (waiting in a key's FIFO or in process) keeps its lease: a
heartbeat thread renews each one (``delivery.renew()``) every lease/3 seconds, so a slow
key's backlog is not reclaimed by another consumer. A ``LeaseLost`` on any move is
logged, counted (``stats.lost``) and the delivery dropped: someone else owns the message
now. The worker never crashes on it. Connection errors of the store or broker are retried
(a get after ``poll`` seconds, a move a few times with backoff, keeping the key) before
the delivery is given up the same way.

Held cap. At most ``max_held`` messages are held at once; when the cap is reached,
fetching pauses until a held message finishes. The trade-off: a high cap lets fast keys
keep flowing past a slow key's growing backlog, but costs memory and one lease renewal
per held message per heartbeat; a low cap bounds both, but once the slow key's backlog
fills the cap every thread waits for that one key.

What is guaranteed. Within one Worker (one process), messages of the same ordering key
and the same priority are handled in put order, one at a time. Gets claim by priority
first, then put order, so (as in JMS) a higher-priority message may overtake a
lower-priority one of the same key. Across several workers or processes consuming the
same subscriber, order holds only as far as gets happen to claim in order; a lost lease
(redelivery) can also reorder.

Stopping. ``stop(drain=True)`` stops fetching and finishes every held message (in-place
retries included; pass a timeout to bound the wait).
``stop(drain=False)`` stops fetching, lets messages in process finish and gives held but
unstarted messages back at once, many in one index commit (released with reason
``worker stopping``: AVAILABLE again with attempt + 1, for the next consumer now rather
than after their lease). A key's waiting messages are given back right after its message
in process finishes, so whoever gets them next still sees that key in order; a message
waiting for an in-place retry is given back at once. ``request_stop()`` begins either
stop and returns. ``run()`` stops by itself when idle for ``until_idle`` seconds, after
``max_messages`` messages, on ``stop()`` from another thread, or on Ctrl-C (which stops
without draining); a ``with`` block ended by an exception stops without draining too.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from iqbridge.batch import Batch
from iqbridge.delivery import Delivery
from iqbridge.durations import seconds, to_seconds
from iqbridge.errors import ConcurrentUpdate, InvalidArgument, IQError, LeaseLost
from iqbridge.errors import ConnectionError as IQConnectionError
from iqbridge.redaction import get_logger
from iqbridge.states import SubscriberState

if TYPE_CHECKING:
    from iqbridge.queue import Queue

__all__ = ["Worker", "WorkerStats"]

log = get_logger("iqbridge.worker")

_REASON_MAX = 1000
#: Errors worth trying again: the store or broker may be back in a moment.
_TRANSIENT = (IQConnectionError, ConcurrentUpdate)
_MOVE_TRIES = 5
#: Held messages given back in one index commit when a worker stops without draining.
_GIVE_BACK_CHUNK = 500
_STOPPING = "worker stopping"
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """A snapshot of what a :class:`Worker` has done.

    ``processed`` counts messages the worker finished with an outcome: ``done`` plus
    ``unusable`` plus those the handler moved itself. ``retried`` counts in-place retries
    (handler calls after a failure). ``in_flight`` messages are in the handler now;
    ``held`` are fetched and not finished (waiting for their key or in process). ``lost``
    deliveries were dropped because their lease was taken over (``LeaseLost``).
    ``released`` were given back unfinished by a stop without draining.
    ``started_at`` is when :meth:`Worker.start` ran (UTC); ``elapsed`` is seconds since
    then, up to the end of :meth:`Worker.stop`.
    """

    processed: int = 0
    done: int = 0
    unusable: int = 0
    retried: int = 0
    in_flight: int = 0
    held: int = 0
    started_at: datetime | None = None
    elapsed: float = 0.0
    lost: int = 0
    released: int = 0


def _retrying(call: Callable[[], _T], what: str) -> _T:
    """``call()``, tried again with backoff while the store or broker is briefly away."""
    for i in range(_MOVE_TRIES - 1):
        try:
            return call()
        except _TRANSIENT as exc:
            log.warning("%s failed (%s); retrying", what, type(exc).__name__)
            time.sleep(0.1 * 2**i)
    return call()


class _Held:
    """One held delivery. ``lock`` serialises its moves (worker thread and heartbeat);
    ``finished`` is set once the worker made its final move or dropped it."""

    __slots__ = ("delivery", "finished", "key", "lock")

    def __init__(self, delivery: Delivery) -> None:
        self.delivery = delivery
        self.key = delivery.ordering_key
        self.lock = threading.Lock()
        self.finished = False


class Worker:
    """Consume ``subscriber``'s messages of ``queue`` with ``threads`` threads, calling
    ``handler`` for each, one message at a time per ordering key, in order.

    ``lease`` is the lease each get takes and each heartbeat renews (default: the
    queue's); ``poll`` is how long one get waits for a message, which also bounds how
    quickly fetching notices a stop; ``max_held`` caps the messages held at once;
    ``batch`` is the most messages one fetch claims (fewer when the cap is near).
    See the module documentation for the ordering, retry, lease and stop semantics.
    A Worker runs once: after :meth:`stop` make a new one.
    """

    def __init__(
        self,
        queue: Queue,
        subscriber: str,
        handler: Callable[[Delivery], object],
        *,
        threads: int = 4,
        lease: float | None = None,
        poll: float = 0.2,
        max_held: int = 10_000,
        name: str | None = None,
        batch: int = 16,
    ) -> None:
        if threads < 1:
            raise InvalidArgument(f"threads must be at least 1, got {threads}")
        lease = to_seconds(lease, "lease", positive=True)
        poll = seconds(poll, "poll", positive=True)
        if max_held < 1:
            raise InvalidArgument(f"max_held must be at least 1, got {max_held}")
        if batch < 1:
            raise InvalidArgument(f"batch must be at least 1, got {batch}")
        self.queue = queue
        self.subscriber = subscriber
        self.handler = handler
        self.threads = threads
        self.lease = lease
        self.poll = poll
        self.max_held = max_held
        self.batch = batch
        self.name = name or f"worker-{queue.name}-{subscriber}"

        self._fetch_mutex = threading.Lock()
        self._lock = threading.Lock()
        #: Signalled when a held message finishes or something is fetched.
        self._changed = threading.Condition(self._lock)
        #: A key is busy while it is in here; the deque holds its waiting messages.
        self._keys: dict[str, deque[_Held]] = {}
        #: Messages of a batch whose key was free, taken for them: each waits for a thread.
        self._ready: deque[_Held] = deque()
        self._held: set[_Held] = set()
        self._stopping = threading.Event()
        self._abandon = threading.Event()
        self._all_exited = threading.Event()
        self._workers: list[threading.Thread] = []
        self._heartbeat: threading.Thread | None = None
        self._alive = 0
        self._error: BaseException | None = None
        self._budget: int | None = None
        self._fetched = 0
        self._processed = 0
        self._done = 0
        self._unusable = 0
        self._retried = 0
        self._lost = 0
        self._released = 0
        self._in_flight = 0
        self._started_at: datetime | None = None
        self._started_mono = 0.0
        self._stopped_mono: float | None = None
        self._last_activity = 0.0

    def __repr__(self) -> str:
        return f"<Worker {self.name!r} {self.threads} threads on {self.queue!r}>"

    # --- public API --------------------------------------------------------------------

    @property
    def stats(self) -> WorkerStats:
        """What the worker has done so far (a consistent snapshot)."""
        with self._lock:
            end = self._stopped_mono if self._stopped_mono is not None else time.monotonic()
            return WorkerStats(
                processed=self._processed,
                done=self._done,
                unusable=self._unusable,
                retried=self._retried,
                in_flight=self._in_flight,
                held=len(self._held),
                started_at=self._started_at,
                elapsed=end - self._started_mono if self._started_at is not None else 0.0,
                lost=self._lost,
                released=self._released,
            )

    def start(self) -> None:
        """Start the worker threads and the lease heartbeat; return at once."""
        with self._lock:
            if self._started_at is not None or self._stopping.is_set():
                raise RuntimeError(f"{self!r} was already started; a Worker runs once")
            self._started_at = datetime.now(UTC)
            self._started_mono = self._last_activity = time.monotonic()
            self._alive = self.threads
        self._workers = [
            threading.Thread(target=self._work, name=f"{self.name}-{i}", daemon=True)
            for i in range(self.threads)
        ]
        self._heartbeat = threading.Thread(
            target=self._beat, name=f"{self.name}-heartbeat", daemon=True
        )
        for t in self._workers:
            t.start()
        self._heartbeat.start()

    def request_stop(self, *, drain: bool = True) -> None:
        """Begin stopping as :meth:`stop` does, and return at once: a :meth:`run` in
        another thread returns when the worker has stopped. ``drain=False`` wins over
        an earlier ``drain=True``."""
        self._stopping.set()
        if not drain:
            self._abandon.set()
        with self._changed:
            self._changed.notify_all()
        self.queue.hub.notify()

    def stop(self, *, drain: bool = True, timeout: float | None = None) -> None:
        """Stop fetching and wait up to ``timeout`` seconds (default: no limit) for the
        threads to end.

        ``drain=True`` finishes every held message first; ``drain=False`` finishes only
        the messages in process and gives the others back at once (a key's waiting
        messages right after its message in process ends, so they go back in order).
        If the timeout passes, the threads go on in the background (they are daemon
        threads) and a warning is logged. Re-raises an unexpected error that ended a
        worker thread.
        """
        timeout = to_seconds(timeout, "timeout")
        self.request_stop(drain=drain)
        deadline = None if timeout is None else time.monotonic() + timeout
        me = threading.current_thread()
        for t in [*self._workers, *([self._heartbeat] if self._heartbeat else [])]:
            if t is me:
                continue
            t.join(None if deadline is None else max(deadline - time.monotonic(), 0.0))
        still = [t.name for t in self._workers if t.is_alive() and t is not me]
        if still:
            log.warning("%s: stop timed out; still running: %s", self.name, ", ".join(still))
        with self._lock:
            if self._stopped_mono is None and not still:
                self._stopped_mono = time.monotonic()
            error, self._error = self._error, None
        if error is not None:
            raise error

    def run(
        self, *, until_idle: float | None = None, max_messages: int | None = None
    ) -> WorkerStats:
        """Start (unless started) and block until the worker should stop, then stop it.

        It stops when nothing was fetched or held for ``until_idle`` seconds, after
        ``max_messages`` messages were fetched (and finished), when :meth:`stop` is called
        from another thread, or on KeyboardInterrupt (without draining). Returns the
        final stats.
        """
        if max_messages is not None:
            if max_messages < 1:
                raise InvalidArgument(f"max_messages must be at least 1, got {max_messages}")
            with self._lock:
                self._budget = self._fetched + max_messages
        until_idle = to_seconds(until_idle, "until_idle")
        if self._started_at is None:
            self.start()
        try:
            with self._changed:
                while not (self._stopping.is_set() or self._all_exited.is_set()):
                    wait = self.poll
                    if until_idle is not None and not self._held:
                        idle = time.monotonic() - self._last_activity
                        if idle >= until_idle:
                            break
                        wait = min(wait, until_idle - idle)
                    self._changed.wait(wait)
        except KeyboardInterrupt:
            log.info("%s: interrupted; stopping without draining", self.name)
            self.stop(drain=False)
            return self.stats
        self.stop(drain=True)
        return self.stats

    def __enter__(self) -> Worker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # An exception (Ctrl-C included) ending the block must not wait for the backlog.
        self.stop(drain=exc_type is None)

    # --- worker threads ----------------------------------------------------------------

    def _work(self) -> None:
        try:
            while True:
                held = self._fetch()
                if held is None:
                    return
                self._serve(held)
        except BaseException as exc:
            log.critical("%s: worker thread failed; stopping", self.name, exc_info=True)
            with self._lock:
                if self._error is None:
                    self._error = exc
            self._stopping.set()
            self._abandon.set()
        finally:
            with self._changed:
                self._alive -= 1
                if self._alive == 0:
                    self._all_exited.set()
                self._changed.notify_all()

    def _fetch(self) -> _Held | None:
        """Fetch until a message of a free key turns up (this thread then owns the key);
        None when the worker stops fetching and nothing fetched waits to be started."""
        while True:
            ready = self._take_ready()
            if ready is not None:
                return ready
            if self._stopping.is_set():
                return None
            if not self._fetch_mutex.acquire(timeout=self.poll):
                continue
            try:
                held, more = self._fetch_batch()
            finally:
                self._fetch_mutex.release()
            if held is not None:
                return held
            if not more:  # the message budget is spent: start what is fetched, then end
                return self._take_ready()

    def _take_ready(self) -> _Held | None:
        """A message fetched with a batch whose key was free: it waits for a thread.
        Stopping without draining, such messages (and their keys' queues) are given back."""
        with self._changed:
            if not self._ready:
                return None
            if not self._abandon.is_set():
                return self._ready.popleft()
            rest: list[_Held] = []
            while self._ready:
                held = self._ready.popleft()
                rest += [held, *self._keys.pop(held.key, ())]
        self._give_back(rest)
        return None

    def _fetch_batch(self) -> tuple[_Held | None, bool]:
        """Claim a batch (holding the fetch mutex) and hand its messages to their keys:
        the first of a free key is returned (this thread owns the key), further ones of
        free keys wait in the ready queue for other threads, those of busy keys join
        their key's queue. The flag is False once the message budget is spent."""
        while not self._stopping.is_set():
            with self._changed:
                if self._ready:
                    return None, True  # serve what is fetched first
                if self._budget is not None and self._fetched >= self._budget:
                    return None, False
                room = self.max_held - len(self._held)
                if room <= 0:
                    self._changed.wait(self.poll)
                    continue
                want = min(self.batch, room)
                if self._budget is not None:
                    want = min(want, self._budget - self._fetched)
            try:
                batch = self.queue.get_many(
                    self.subscriber, want, lease=self.lease, timeout=self.poll
                )
            except _TRANSIENT as exc:
                log.warning("%s: get failed (%s); retrying", self.name, exc)
                self._stopping.wait(self.poll)
                continue
            if not batch:
                continue
            mine: _Held | None = None
            back: list[_Held] = []
            with self._changed:
                for delivery in batch:
                    held = _Held(delivery)
                    self._fetched += 1
                    self._held.add(held)
                    if self._abandon.is_set():
                        # Fetched just as a stop without draining began: give it back.
                        back.append(held)
                        continue
                    waiting = self._keys.get(held.key)
                    if waiting is not None:
                        waiting.append(held)
                        continue
                    self._keys[held.key] = deque()
                    if mine is None:
                        mine = held
                    else:
                        self._ready.append(held)
                self._last_activity = time.monotonic()
                self._changed.notify_all()
            self._give_back(back)
            if mine is not None:
                return mine, True
        return None, True

    def _serve(self, held: _Held) -> None:
        """Process ``held`` and then every message that queues up behind it for its key."""
        key = held.key
        current: _Held | None = held
        owned = True  # this thread still holds the key
        try:
            while current is not None:
                self._handle(current)
                leftovers: list[_Held] = []
                with self._changed:
                    self._forget(current)
                    waiting = self._keys[key]
                    if waiting and not self._abandon.is_set():
                        current = waiting.popleft()
                    else:
                        leftovers = list(waiting)
                        del self._keys[key]
                        owned = False
                        current = None
                self._give_back(leftovers)
        except BaseException:
            # Leave nothing stranded behind a key nobody will serve: give it back in order.
            # Abandon in the same critical section that frees the key, so a thread whose
            # get() returns meanwhile gives its message back instead of starting it ahead
            # of the ones handed back here.
            with self._changed:
                self._stopping.set()
                self._abandon.set()
                rest = [current] if current is not None else []
                if owned:
                    rest.extend(self._keys.pop(key, ()))
            self._give_back(rest)
            raise

    def _handle(self, held: _Held) -> None:
        d = held.delivery
        if not self._move(held, d.in_process, final=False):
            return
        with self._lock:
            self._in_flight += 1
        try:
            policy = self.queue.retry
            tries = d.attempt
            while True:
                d.attempt = tries
                try:
                    self.handler(d)
                except Exception as exc:
                    if d.state is not SubscriberState.IN_PROCESS:
                        log.warning(
                            "%s: handler moved message %s to %s, then raised %s; not retried",
                            self.name,
                            d.msg_id,
                            d.state.value,
                            type(exc).__name__,
                        )
                        self._finished_by_handler(held)
                        return
                    if policy.gives_up(exc, tries, d.max_attempts):
                        self._give_up(held, exc, tries)
                        return
                    with self._lock:
                        self._retried += 1
                    log.info(
                        "%s: message %s failed on try %d (%s); retrying in place",
                        self.name,
                        d.msg_id,
                        tries,
                        type(exc).__name__,
                    )
                    if self._abandon.wait(policy.delay(tries)):
                        if self._move(held, lambda: d.release(reason=_STOPPING), final=True):
                            with self._lock:
                                self._released += 1
                        return
                    tries += 1
                    continue
                if d.state is SubscriberState.IN_PROCESS:
                    if self._move(held, d.done, final=True):
                        self._count(done=1)
                else:
                    self._finished_by_handler(held)
                return
        finally:
            with self._lock:
                self._in_flight -= 1

    def _finished_by_handler(self, held: _Held) -> None:
        with held.lock:
            held.finished = True
        self._count()

    def _give_up(self, held: _Held, exc: Exception, tries: int) -> None:
        d = held.delivery
        suffix = f" (gave up after {tries} {'try' if tries == 1 else 'tries'})"
        reason = f"{type(exc).__name__}: {exc}"[: _REASON_MAX - len(suffix)] + suffix
        log.warning(
            "%s: message %s is UNUSABLE: %s failed %d time(s)",
            self.name,
            d.msg_id,
            type(exc).__name__,
            tries,
        )
        if self._move(held, lambda: d.unusable(reason), final=True):
            self._count(unusable=1)

    def _count(self, *, done: int = 0, unusable: int = 0) -> None:
        with self._lock:
            self._processed += 1
            self._done += done
            self._unusable += unusable

    def _move(self, held: _Held, move: Callable[[], None], *, final: bool) -> bool:
        """Make a move on a held delivery; False (and the delivery dropped) if the lease
        was lost or the move failed."""
        with held.lock:
            if held.finished:
                return False
            try:
                for i in range(_MOVE_TRIES):
                    try:
                        move()
                        break
                    except _TRANSIENT as exc:
                        # Keep the key while the store is briefly away: dropping the
                        # message would let the key's later messages overtake it.
                        if i == _MOVE_TRIES - 1:
                            raise
                        log.warning(
                            "%s: move on message %s failed (%s); retrying",
                            self.name,
                            held.delivery.msg_id,
                            type(exc).__name__,
                        )
                        time.sleep(0.1 * 2**i)
            except LeaseLost as exc:
                held.finished = True
                self._note_lost(held, str(exc))
                return False
            except IQError as exc:
                held.finished = True
                log.error(
                    "%s: move on message %s failed (%s: %s); dropped, its lease will lapse",
                    self.name,
                    held.delivery.msg_id,
                    type(exc).__name__,
                    exc,
                )
                with self._lock:
                    self._lost += 1
                return False
            if final:
                held.finished = True
            return True

    def _note_lost(self, held: _Held, why: str) -> None:
        log.warning("%s: message %s dropped: %s", self.name, held.delivery.msg_id, why)
        with self._lock:
            self._lost += 1

    def _give_back(self, items: list[_Held]) -> None:
        """Give held messages that never started back at once: AVAILABLE again (attempt
        + 1, reason ``worker stopping``), a whole chunk in one index commit. Whatever
        cannot be given back is left to its lease, which brings it back the same way."""
        if not items:
            return
        todo: list[_Held] = []
        for held in items:
            with held.lock:
                if not held.finished:
                    held.finished = True  # the heartbeat leaves it alone from now on
                    todo.append(held)
        for start in range(0, len(todo), _GIVE_BACK_CHUNK):
            self._release_all(todo[start : start + _GIVE_BACK_CHUNK])
        with self._changed:
            for held in items:
                self._forget(held)

    def _release_all(self, chunk: list[_Held]) -> None:
        batch = Batch(self.queue, [held.delivery for held in chunk])
        for d in batch:
            batch.release(d, reason=_STOPPING)
        try:
            settled = _retrying(batch.done, f"{self.name}: giving back")
        except IQError as exc:
            log.error(
                "%s: could not give back %d message(s) (%s: %s); they return when their "
                "lease runs out",
                self.name,
                len(chunk),
                type(exc).__name__,
                exc,
            )
            return
        for msg_id, reason in settled.lost.items():
            log.warning("%s: message %s dropped: %s", self.name, msg_id, reason)
        with self._lock:
            self._released += len(settled.released)
            self._lost += len(settled.lost)

    def _forget(self, held: _Held) -> None:
        """Drop a finished message from the held set (caller holds ``self._lock``)."""
        self._held.discard(held)
        self._last_activity = time.monotonic()
        self._changed.notify_all()

    # --- heartbeat ---------------------------------------------------------------------

    def _beat(self) -> None:
        lease = self.lease if self.lease is not None else self.queue.lease
        while not self._all_exited.wait(lease / 3):
            try:
                self._renew_all()
            except Exception:
                log.exception("%s: lease heartbeat failed; trying again next beat", self.name)

    def _renew_all(self) -> None:
        with self._lock:
            snapshot = list(self._held)
        for held in snapshot:
            with held.lock:
                if held.finished:
                    continue
                try:
                    held.delivery.renew(self.lease)
                except LeaseLost as exc:
                    held.finished = True
                    self._note_lost(held, str(exc))
                except IQError as exc:
                    log.warning(
                        "%s: could not renew the lease of message %s (%s); will retry",
                        self.name,
                        held.delivery.msg_id,
                        type(exc).__name__,
                    )
                    continue
                else:
                    continue
            # Lost while waiting for its key: take it out of the key's FIFO.
            with self._changed:
                waiting = self._keys.get(held.key)
                if waiting is not None and held in waiting:
                    waiting.remove(held)
                    self._forget(held)
