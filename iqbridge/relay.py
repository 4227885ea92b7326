"""The outbox relay: publishes :mod:`iqbridge.outbox` rows to any broker, exactly once.

Each round reads up to ``batch`` pending rows in put order, puts them through the facade
(``hub.queue(name).put_many(..., msg_ids=...)``) with the msg_ids the outbox assigned,
and marks them relayed with one UPDATE. Every message ends REVEALED in the index.

Crash safety: the relay can be killed at any point. A row is marked relayed only after
its put returned, so a restart finds every unmarked row again and puts it again; the put
is idempotent by msg_id (the index never gets a second record, and a payload the broker
never got is sent then). What remains: if the relay dies after the broker took an entry
but before the index recorded where (one round trip), the repeat sends a second broker
entry of the same message. The facade's once-only rule makes it harmless: each
subscriber's claim is a compare-and-set in the index, so the second entry is never
handed to a subscriber that got (or is getting) the first; it is acknowledged when read.

Concurrency: on PostgreSQL and MySQL/MariaDB a round locks the rows it relays
(``SELECT ... FOR UPDATE``), so a second relay on the same outbox waits and takes over
where the first stopped, in order. On SQLite a round holds no lock while it publishes
(producers must never wait for a broker): run one relay per SQLite outbox.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from iqbridge.durations import seconds, to_seconds
from iqbridge.errors import ConcurrentUpdate, ConnectionError, InvalidArgument, MessageError
from iqbridge.outbox import MalformedOutboxRow, Outbox, OutboxRow, _translate
from iqbridge.redaction import get_logger
from iqbridge.signals import StopSignals

if TYPE_CHECKING:
    from iqbridge.hub import Hub
    from iqbridge.queue import Queue

__all__ = ["Relay", "RelayStats", "RoundResult", "stop_on_signals"]

log = get_logger("iqbridge.relay")

#: Errors that say something about one row: the row is parked, the others go on.
_ROW_ERRORS = (MessageError, InvalidArgument)
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: Errors worth waiting out: the round is abandoned and tried again later.
TRANSIENT = (ConnectionError, ConcurrentUpdate)


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one round did."""

    relayed: int
    parked: list[MalformedOutboxRow]
    read: int
    #: The round read a whole batch: more rows are probably waiting.
    full: bool


@dataclass(slots=True)
class RelayStats:
    """Running totals of a relay."""

    relayed: int = 0
    parked: int = 0
    rounds: int = 0
    failures: int = 0
    #: Why the last round failed; None once a round succeeds again.
    last_error: str | None = None
    started_at: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        """Seconds since the relay was made."""
        return time.monotonic() - self.started_at


class Relay:
    """Publishes an :class:`~iqbridge.outbox.Outbox` to the broker of ``hub``.

    ``batch`` rows per round; ``poll`` seconds between rounds when nothing is pending.
    ``open_queue(name)`` returns the :class:`~iqbridge.Queue` to put into (default
    ``hub.queue(name)``; pass one to set a queue's retry policy or lease).
    """

    def __init__(
        self,
        outbox: Outbox,
        hub: Hub,
        *,
        batch: int = 100,
        poll: float = 0.5,
        max_backoff: float = 30.0,
        open_queue: Callable[[str], Queue] | None = None,
    ) -> None:
        if batch < 1:
            raise InvalidArgument(f"batch must be at least 1, got {batch}")
        poll = seconds(poll, "poll")
        max_backoff = seconds(max_backoff, "max_backoff")
        self.outbox = outbox
        self.hub = hub
        self.batch = batch
        self.poll = poll
        self.max_backoff = max_backoff
        self.stats = RelayStats()
        self._open_queue = open_queue or hub.queue
        self._queues: dict[str, Queue] = {}
        self._stop = threading.Event()

    def __repr__(self) -> str:
        return f"<Relay {self.outbox.name} on {self.outbox.url} -> {self.hub.adapter.url}>"

    # --- one round -----------------------------------------------------------------------

    def run_once(self) -> RoundResult:
        """Relay up to ``batch`` pending rows; return what was done.

        A row that cannot be relayed is parked with the reason. A broker or index
        failure ends the round early: what was published before it is marked, the
        rest stays pending, and the error is raised.
        """
        outbox = self.outbox
        outbox.create_table()
        relayed: list[int] = []
        parked: list[MalformedOutboxRow] = []
        failure: list[Exception] = []
        stmt = outbox.pending_stmt(self.batch)
        try:
            with self._connect() as conn:
                if conn.dialect.name == "sqlite":
                    # No lock while publishing: a producer must never wait for a broker.
                    with conn.begin():
                        rows = conn.execute(stmt).all()
                    self._publish_rows(rows, relayed, parked, failure)
                    with conn.begin():
                        outbox.mark(conn, relayed, parked)
                else:
                    # Row locks, not a table lock: producers insert on, a second relay waits.
                    with conn.begin():
                        rows = conn.execute(stmt.with_for_update()).all()
                        self._publish_rows(rows, relayed, parked, failure)
                        outbox.mark(conn, relayed, parked)
        except sa.exc.SQLAlchemyError as exc:
            raise _translate(exc, outbox.url) from exc
        for bad in parked:
            log.error("%s", bad)
        self.stats.rounds += 1
        self.stats.relayed += len(relayed)
        self.stats.parked += len(parked)
        if failure:
            raise failure[0]
        return RoundResult(len(relayed), parked, len(rows), len(rows) == self.batch)

    def _publish_rows(
        self,
        rows: Sequence[sa.engine.Row[Any]],
        relayed: list[int],
        parked: list[MalformedOutboxRow],
        failure: list[Exception],
    ) -> None:
        items: list[OutboxRow] = []
        for row in rows:
            try:
                items.append(self.outbox.decode(row))
            except MalformedOutboxRow as bad:
                parked.append(bad)
        try:
            for group in _groups(items):
                self._publish(group, relayed, parked)
        except Exception as exc:
            failure.append(exc)  # mark what is done, then raise

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sa.engine.Connection]:
        with self.outbox.engine.connect() as conn:
            if conn.dialect.name in ("mysql", "mariadb"):
                # REPEATABLE READ would gap-lock the end of the pending rows: producers'
                # inserts would wait for the round.
                yield conn.execution_options(isolation_level="READ COMMITTED")
            else:
                yield conn

    def _queue(self, name: str) -> Queue:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = self._open_queue(name)
        return q

    def _put(self, rows: list[OutboxRow]) -> None:
        first = rows[0]
        ttl = None
        if first.expires_at is not None:
            ttl = max(0.0, (first.expires_at - self.hub.now_us()) / 1_000_000)
        self._queue(first.queue).put_many(
            [r.body for r in rows],
            msg_ids=[r.msg_id for r in rows],
            to=first.to,
            publisher=first.publisher,
            correlation_id=first.correlation_id,
            priority=first.priority,
            ordering_key=first.ordering_key,
            ttl=ttl,
            parents=first.parents,
            headers=first.headers,
            content_type=first.content_type,
        )

    def _publish(
        self, group: list[OutboxRow], relayed: list[int], parked: list[MalformedOutboxRow]
    ) -> None:
        try:
            self._put(group)
        except _ROW_ERRORS as exc:
            if len(group) > 1:  # find the row(s) at fault; the others go through
                for row in group:
                    self._publish([row], relayed, parked)
                return
            row = group[0]
            # Reopen the queue next time: its cached subscriptions may be what was wrong.
            self._queues.pop(row.queue, None)
            why = f"{type(exc).__name__}: {exc}"
            parked.append(MalformedOutboxRow(row.seq, row.msg_id, self.outbox.name, why))
            return
        relayed.extend(r.seq for r in group)

    # --- running -------------------------------------------------------------------------

    def run(self, *, once: bool = False, until_idle: float | None = None) -> RelayStats:
        """Relay rounds until :meth:`stop` (or a signal, see :func:`stop_on_signals`).

        ``once=True`` relays what is pending and returns (a failure is raised).
        ``until_idle`` returns after that many seconds without a pending row. Broker,
        index and outbox connection failures are raised if the first round fails (a
        wrong URL, a server that is not there), and after that logged and retried with
        backoff (1 s doubling up to ``max_backoff``); other errors end the run.
        """
        until_idle = to_seconds(until_idle, "until_idle")
        self._stop.clear()
        idle_since = time.monotonic()
        backoff = first_backoff = min(1.0, self.max_backoff)
        started = False
        while not self._stop.is_set():
            try:
                result = self.run_once()
            except TRANSIENT as exc:
                self.stats.failures += 1
                self.stats.last_error = str(exc)
                if once or not started:
                    raise
                log.warning("relay round failed, retrying in %.0f s: %s", backoff, exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            backoff = first_backoff
            started = True
            self.stats.last_error = None
            if result.read:
                idle_since = time.monotonic()
            if result.full:
                continue
            if once:
                break
            if until_idle is not None and time.monotonic() - idle_since >= until_idle:
                break
            self._stop.wait(self.poll)
        return self.stats

    def stop(self) -> None:
        """Finish the current round, then return from :meth:`run`."""
        self._stop.set()


@contextlib.contextmanager
def stop_on_signals(relay: Relay, *signums: int) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT (or ``signums``) stop ``relay`` after its round.

    The handler only records the signal; the relay is stopped from a watcher thread
    (:mod:`iqbridge.signals`). Only in the main thread (Python delivers signals there);
    elsewhere it does nothing.
    """
    with StopSignals(then=lambda _: relay.stop(), signums=signums or _STOP_SIGNALS):
        yield


def _groups(items: list[OutboxRow]) -> Iterator[list[OutboxRow]]:
    """Runs of consecutive rows that share every put option (one put_many each)."""
    run: list[OutboxRow] = []
    key: tuple[Any, ...] | None = None
    for item in items:
        k = item.options()
        if run and k != key:
            yield run
            run = []
        run.append(item)
        key = k
    if run:
        yield run
