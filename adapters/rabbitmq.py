"""RabbitMQ: ``amqp://user:password@host:5672/vhost[?options]`` or ``amqps://`` (TLS).

Native mapping (see docs/adapters/rabbitmq.md):

* an iqbridge queue is a durable ``direct`` exchange named ``<prefix><queue>``; each
  subscriber and each pool has a durable queue ``<prefix><queue>.<group>`` bound to it
  with its group name as the routing key (pool members consume from the pool's queue
  and compete on it);
* a put is one publish per message: routing key = the first group of its audience, the
  other groups in the ``BCC`` header (RabbitMQ routes the copy to each and strips the
  header), so a message reaches exactly its audience's queues; ``mandatory`` is set and
  publisher confirms are on, a window of messages at a time; a nack or a return
  (unroutable) fails the put (:class:`~iqbridge.errors.BrokerRefused`); a connection
  lost in the middle of a window publishes again only what was not confirmed, and with
  ``ledger=true`` only what the ledger does not hold (:mod:`.rabbitmq_window`);
* persistent messages (``delivery_mode`` 2); consumers with manual acks and a prefetch;
  DONE is ``basic.ack`` (one ``multiple`` ack where a batch's delivery tags allow);
  a delivery given back is ``basic.nack`` with requeue;
* priorities: queues are declared with ``x-max-priority`` (classic queues); UNUSABLE
  publishes the message with the reason to the dead-letter exchange ``<prefix><queue>/dead``
  (a ``fanout`` with a queue of the same name) and acks it; queues name that exchange
  as their ``x-dead-letter-exchange``, so a message whose per-message TTL (the put's
  ``ttl``, as ``expiration``) runs out while it waits ends there too; ``queue_type=quorum``
  declares quorum queues (no priorities there in RabbitMQ 3.x);
* RabbitMQ forgets a message once it is acknowledged (``read_by_ref=False``,
  ``retains_after_ack=False``): the facade keeps a retained copy of each payload beside
  the index for journalled retention, peek, browse, re-reveal and redelivery.

Wire format: the payload bytes unchanged in the body; the envelope in the properties
(``message_id``, ``correlation_id``, ``priority``, ``timestamp``, ``content_type``,
``expiration``) and in headers: ``x-iq-at`` (put time, microseconds), ``x-iq-pub``,
``x-iq-key``, ``x-iq-parents``, ``x-iq-to``; the application's headers as they are (one
named like ours, ``x-iq-...``, ``CC`` or ``BCC``, travels as ``x-iq-h-<name>``). A message
without ``x-iq-at`` is a stranger's (a plain producer's) and is adopted: its msg_id
derives from the queue, the group and its ``message_id`` property, or, without one, a
digest of its body and properties (see :func:`decode`).

Options: ``prefix`` (prepended to exchange and queue names, default none), ``prefetch``
(deliveries a consumer may hold unacknowledged, default 256), ``queue_type`` (``classic``
or ``quorum``, default classic), ``max_priority`` (``x-max-priority`` of classic queues,
1-9, or 0 for none; default 9), ``retry_for`` (seconds to keep reconnecting with backoff
before an operation fails, default 30), ``connect_timeout`` and ``confirm_timeout``
(seconds, default 10 and 30); and pika's own URL options, passed through: ``heartbeat``,
``blocked_connection_timeout``, ``channel_max``, ``frame_max``, ``locale``,
``socket_timeout``, ``stack_timeout``, ``ssl_options``, ``tcp_options``. The default
index is the SQLite file ``iqbridge-index.db`` in the working directory (one host); pass
``index=`` for processes on several hosts.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import pika
import pika.exceptions
from pika.spec import BasicProperties
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from iqbridge.adapter import Capabilities
from iqbridge.errors import BrokerRefused, BrokerUnavailable
from iqbridge.model import Envelope, Received
from iqbridge.redaction import get_logger
from iqbridge.stores.sqlite import SqliteStore

# Relative: the adapters directory imports as iqbridge.adapters (see pyproject), and
# mypy checks it from the top level.
from .probes import ledger_steps, rabbitmq_find_sent  # noqa: TID251
from .rabbitmq_link import ChannelError, Link, LinkLost, Outgoing, Unconfirmed  # noqa: TID251
from .rabbitmq_url import parse_url  # noqa: TID251
from .rabbitmq_window import Probe, Window  # noqa: TID251
from .rabbitmq_wire import _PRIORITIES, Msg, Slot, as_int, decode, encode  # noqa: TID251

__all__ = ["RabbitMQAdapter", "decode", "encode"]

log = get_logger(__name__)

T = TypeVar("T")

#: RabbitMQ's default max_message_size (3.8 and later).
_MAX_PAYLOAD = 128 * 1024 * 1024
#: How long a receive waits for deliveries this process just gave back, at most.
_RETURNING = 0.5


class RabbitMQAdapter:
    """Adapter over RabbitMQ (AMQP 0-9-1) through pika."""

    def __init__(
        self,
        params: pika.URLParameters,
        *,
        url: str,
        prefix: str = "",
        prefetch: int = 256,
        queue_type: str = "classic",
        max_priority: int = 9,
        retry_for: float = 30.0,
        connect_timeout: float = 10.0,
        confirm_timeout: float = 30.0,
        single_active: bool = False,
        ledger: bool = False,
    ) -> None:
        from iqbridge.registry import redact

        self.url = redact(url)
        self._params = params
        self.prefix = prefix
        self.prefetch = prefetch
        self.queue_type = queue_type
        self.max_priority = max_priority if queue_type == "classic" else 0
        self.retry_for = retry_for
        self.connect_timeout = connect_timeout
        self.confirm_timeout = confirm_timeout
        self.single_active = single_active
        #: A stream queue beside each queue's groups records every publish (find_sent).
        self.ledger = ledger
        self.capabilities = Capabilities(
            native_groups=True,
            read_by_ref=False,
            retains_after_ack=False,
            native_priority=self.max_priority > 0,
            max_payload_bytes=_MAX_PAYLOAD,
            single_active_groups=single_active,
        )
        self._lock = threading.Condition(threading.RLock())
        self._connect_lock = threading.Lock()
        self._link: Link | None = None
        self._slots: dict[tuple[str, str], Slot] = {}
        self._by_consumer_tag: dict[str, Slot] = {}
        #: Unsettled deliveries of the current link by delivery tag (pushed or handed out).
        self._outstanding: dict[int, Msg] = {}
        #: Counts what this process sent (publishes, requeues) and, at the last barrier,
        #: how much of it the broker had surely pushed back to our consumers.
        self._sent = 0
        self._barrier_at = 0
        self._declared: set[tuple[str, str]] = set()
        self._closed = False

    @classmethod
    def from_url(cls, url: str) -> RabbitMQAdapter:
        """Connect to the broker an ``amqp://`` or ``amqps://`` URL names; check it answers."""
        params, options = parse_url(url)
        adapter = cls(params, url=url, **options)
        adapter._connected()  # fail fast at start: no long retry
        return adapter

    def default_index(self) -> SqliteStore:
        """The SQLite index file ``iqbridge-index.db`` in the working directory: right
        for processes on one host; pass ``index=`` (Redis, PostgreSQL, ...) for more."""
        return SqliteStore.from_url("sqlite:///iqbridge-index.db")

    # --- names ---------------------------------------------------------------------

    def exchange(self, queue: str) -> str:
        """The exchange of an iqbridge queue."""
        return f"{self.prefix}{queue}"

    def queue_name(self, queue: str, group: str) -> str:
        """The RabbitMQ queue of a consumer group (a subscriber or a pool)."""
        return f"{self.prefix}{queue}.{group}"

    def dead_name(self, queue: str) -> str:
        """The dead-letter exchange and queue of an iqbridge queue (``/`` keeps it apart
        from every group's queue: group names cannot hold one)."""
        return f"{self.prefix}{queue}/dead"

    # --- connection ----------------------------------------------------------------

    def _connected(self) -> Link:
        """The open connection, or a new one: BrokerUnavailable if none can be made."""
        try:
            return self._link_now()
        except LinkLost as exc:
            raise self._unavailable(exc) from exc

    def _link_now(self) -> Link:
        """The open connection, or a new one (LinkLost if it cannot be made)."""
        link = self._link
        if link is not None and link.alive:
            return link
        with self._connect_lock:
            link = self._link
            if link is not None and link.alive:
                return link
            if self._closed:
                raise BrokerUnavailable(f"the RabbitMQ adapter for {self.url} is closed")
            if link is not None:
                link.close()
            new = Link(
                self._params,
                prefetch=self.prefetch,
                on_delivery=self._on_delivery,
                on_cancel=self._on_cancel,
                connect_timeout=self.connect_timeout,
            )
            with self._lock:
                # What the old connection held went back to the broker's queues with it.
                self._link = new
                self._outstanding.clear()
                self._by_consumer_tag.clear()
                for slot in self._slots.values():
                    slot.ready = [deque() for _ in range(_PRIORITIES)]
                    slot.held.clear()
                    slot.consumer_tag = ""
            return new

    def _unavailable(self, exc: BaseException, tried: str = "") -> BrokerUnavailable:
        return BrokerUnavailable(
            f"cannot reach RabbitMQ at {self.url} ({exc}{tried}); check that the broker runs "
            f"there and that the URL's host, port, virtual host and credentials are right"
        )

    def _call(self, op: Callable[[Link], T]) -> T:
        """``op(link)``, on a new connection after the old one was lost, retried with
        exponential backoff for up to ``retry_for`` seconds (a broker restart is ridden
        out); then BrokerUnavailable. Only a lost connection is retried: the broker's
        refusals and a closed adapter are raised as they are."""
        try:
            return op(self._link_now())
        except LinkLost as exc:
            if self.retry_for <= 0 or self._closed:
                raise self._unavailable(exc) from exc
            log.warning("RabbitMQ at %s: %s; reconnecting", self.url, exc)
        retrying = Retrying(
            retry=retry_if_exception_type(LinkLost),
            stop=stop_after_delay(self.retry_for),
            wait=wait_exponential(multiplier=0.1, max=2.0) + wait_random(0, 0.1),
            before_sleep=before_sleep_log(log, logging.WARNING),
            reraise=True,
        )
        try:
            return retrying(lambda: op(self._link_now()))
        except LinkLost as exc:
            raise self._unavailable(exc, f"; retried for {self.retry_for:g} s") from exc

    def _on_delivery(
        self,
        consumer_tag: str,
        generation: int,
        tag: int,
        redelivered: bool,
        props: BasicProperties,
        body: bytes,
    ) -> None:
        """A delivery pushed to this process (I/O thread): into its slot's ready list."""
        with self._lock:
            link = self._link
            slot = self._by_consumer_tag.get(consumer_tag)
            if link is None or link.generation != generation or slot is None:
                return  # an old connection's: the broker requeued it when that one closed
            count = 2 if redelivered else 1
            raw = props.headers or {}
            if "x-delivery-count" in raw:  # quorum queues count for us
                count = as_int(raw["x-delivery-count"]) + 1
            msg = Msg(generation, tag, redelivered, props, body, count)
            prio = props.priority if props.priority is not None else 4
            slot.ready[min(max(prio, 0), 9)].append(msg)
            self._outstanding[tag] = msg
            self._lock.notify_all()

    def _on_cancel(self, consumer_tag: str) -> None:
        """The broker cancelled a consumer: its queue was deleted behind our back. The
        next receive declares the queue again and consumes anew."""
        with self._lock:
            slot = self._by_consumer_tag.pop(consumer_tag, None)
            if slot is not None:
                log.warning("RabbitMQ queue %r was deleted; declaring it again", slot.name)
                slot.consumer_tag = ""
                self._declared.discard((slot.queue, slot.group))

    # --- the Adapter protocol ------------------------------------------------------

    def declare(self, queue: str, groups: Sequence[str]) -> None:
        """Declare the queue's exchange, its dead-letter exchange and queue, and a durable
        queue per group bound by the group's name (idempotent)."""
        todo = [g for g in ("", *groups) if (queue, g) not in self._declared]
        if not todo:
            return
        steps: list[Callable[[Any, Callable[[Any], None]], None]] = []
        dead = self.dead_name(queue)
        if "" in todo:
            exchange = self.exchange(queue)
            steps += [
                lambda ch, cb: ch.exchange_declare(dead, "fanout", durable=True, callback=cb),
                lambda ch, cb: ch.queue_declare(dead, durable=True, callback=cb),
                lambda ch, cb: ch.queue_bind(dead, dead, callback=cb),
                lambda ch, cb: ch.exchange_declare(exchange, "direct", durable=True, callback=cb),
                *ledger_steps(self, queue, None),
            ]
        for group in (g for g in todo if g):
            steps += self._group_steps(queue, group)
        try:
            self._call(lambda link: self._run_steps(link, steps))
        except ChannelError as exc:
            if exc.code != 406:
                raise BrokerUnavailable(
                    f"RabbitMQ at {self.url} refused to declare queue {queue!r}: {exc}"
                ) from exc
            # A queue declared before with other arguments (no x-max-priority, another
            # type, ...): use it as it is, one step at a time.
            for group in (g for g in todo if g):
                self._declare_existing(queue, group)
        self._declared.update((queue, g) for g in todo)

    def _group_steps(
        self, queue: str, group: str
    ) -> list[Callable[[Any, Callable[[Any], None]], None]]:
        name = self.queue_name(queue, group)
        args: dict[str, Any] = {"x-dead-letter-exchange": self.dead_name(queue)}
        if self.queue_type == "quorum":
            args["x-queue-type"] = "quorum"
        elif self.max_priority:
            args["x-max-priority"] = self.max_priority
        if self.single_active:
            args["x-single-active-consumer"] = True
        exchange = self.exchange(queue)
        return [
            lambda ch, cb: ch.queue_declare(name, durable=True, arguments=args, callback=cb),
            lambda ch, cb: ch.queue_bind(name, exchange, routing_key=group, callback=cb),
            *ledger_steps(self, queue, group),
        ]

    def _declare_existing(self, queue: str, group: str) -> None:
        name = self.queue_name(queue, group)
        try:
            self._call(lambda link: self._run_steps(link, self._group_steps(queue, group)))
            return
        except ChannelError as exc:
            if exc.code != 406:
                raise BrokerUnavailable(
                    f"RabbitMQ at {self.url} refused to declare queue {name!r}: {exc}"
                ) from exc
            log.warning(
                "RabbitMQ queue %r exists with other arguments (%s); using it as it is: "
                "without x-max-priority the broker does not order it by priority, and "
                "without x-dead-letter-exchange messages expiring in it are dropped. Delete "
                "and re-declare it to change that.",
                name,
                exc.text,
            )
        exchange = self.exchange(queue)
        self._call(
            lambda link: self._run_steps(
                link,
                [
                    lambda ch, cb: ch.queue_declare(name, passive=True, callback=cb),
                    lambda ch, cb: ch.queue_bind(name, exchange, routing_key=group, callback=cb),
                ],
            )
        )

    def _run_steps(
        self, link: Link, steps: Sequence[Callable[[Any, Callable[[Any], None]], None]]
    ) -> None:
        """Run RPCs on the control channel, queued behind each other, and wait for the
        last (a failing one closes the channel and fails the wait)."""

        def start(fut: Future[Any]) -> None:
            ch = link.ctl
            left = [len(steps)]

            def one_done(_frame: Any) -> None:
                left[0] -= 1
                if left[0] == 0 and not fut.done():
                    fut.set_result(None)

            for step in steps:
                step(ch, one_done)

        link.call(start, timeout=self.confirm_timeout, ctl=True)

    def send(self, queue: str, envelopes: Sequence[Envelope]) -> list[str]:
        """Publish every envelope to the queue's exchange in one window and wait for
        their confirms; return their native references (their msg_ids). A connection
        lost on the way publishes again only what the broker did not confirm, and with
        the ledger only what it does not hold (see :mod:`.rabbitmq_window`)."""
        exchange = self.exchange(queue)
        items = []
        for env in envelopes:
            key, props = encode(env)
            items.append(Outgoing(exchange, key, env.body, props))
        self._publish(items, queue)
        return [env.msg_id for env in envelopes]

    def _publish(self, items: Sequence[Outgoing], queue: str | None = None) -> None:
        probe: Probe | None = None
        if queue is not None and self.ledger:

            def probe(sent: list[tuple[str, int]]) -> dict[str, str]:
                return rabbitmq_find_sent(self, queue, sent, strict=True)

        window = Window(items, probe=probe, url=self.url)
        try:
            self._call(lambda link: window.attempt(link, self.confirm_timeout))
        finally:
            with self._lock:
                self._sent += 1
        refused = window.refused()
        if refused:
            item, why = refused[0]
            how = why.how if isinstance(why, Unconfirmed) else "refused"
            raise BrokerRefused(
                f"RabbitMQ at {self.url} {how} {len(refused)} of {len(items)} message(s) "
                f"published to exchange {item.exchange!r} (first: routing key "
                f"{item.routing_key!r}, {why}); nothing of them is stored. Check that the "
                f"subscribers' queues exist and are bound (queue.subscribe(...) declares "
                f"them) and the broker's limits (max message size, queue length, memory "
                f"and disk alarms)"
            )

    def receive(
        self,
        queue: str,
        group: str,
        consumer: str,
        *,
        count: int,
        timeout: float,
        min_idle: float | None = None,
    ) -> list[Received]:
        """Deliveries pushed to this process for the group: idle ones another consumer
        of this process holds (with ``min_idle``) first, then by priority, oldest first.
        When there are none and this process sent something since the last look, one
        round trip makes sure the broker's pushes have arrived. Blocks up to ``timeout``."""
        slot = self._consuming(queue, group)
        out = self._take(slot, consumer, count, min_idle)
        if not out and self._barrier_at < self._sent:
            seen = self._sent
            self._call(lambda link: link.barrier(timeout=self.confirm_timeout))
            self._barrier_at = max(self._barrier_at, seen)
            out = self._take(slot, consumer, count, min_idle)
        wait = max(timeout, slot.returning_until - time.monotonic())
        if not out and wait > 0:
            deadline = time.monotonic() + wait
            with self._lock:
                while not slot.waiting() and (left := deadline - time.monotonic()) > 0:
                    self._lock.wait(left)
            out = self._take(slot, consumer, count, min_idle)
        return out

    def _consuming(self, queue: str, group: str) -> Slot:
        """The group's slot, with a consumer on its queue on the current connection."""
        key = (queue, group)
        slot = self._slots.get(key)
        if slot is None:
            self.declare(queue, [group])
            slot = self._slots.setdefault(key, Slot(queue, group, self.queue_name(queue, group)))
        link = self._link
        if slot.consumer_tag and link is not None and link.alive:
            return slot

        def start(link: Link) -> None:
            with self._lock:
                if slot.consumer_tag and slot.generation == link.generation:
                    return
                # Registered before the consumer starts: deliveries may come at once.
                tag = f"iq-{uuid.uuid4().hex}"
                self._by_consumer_tag[tag] = slot
            try:
                waiting = link.ready_count(slot.name, timeout=self.confirm_timeout)
            except ChannelError as exc:
                if exc.code != 404:
                    raise BrokerUnavailable(
                        f"RabbitMQ at {self.url} refused queue {slot.name!r}: {exc}"
                    ) from exc
                # Deleted behind our back: declare it again (bound, so new puts reach it).
                self._declared.discard((queue, group))
                self.declare(queue, [group])
                waiting = link.ready_count(slot.name, timeout=self.confirm_timeout)
            link.consume(slot.name, tag, timeout=self.confirm_timeout)
            with self._lock:
                slot.consumer_tag = tag
                slot.generation = link.generation
            self._pushed(link, slot, min(waiting, self.prefetch))

        self._call(start)
        return slot

    def _pushed(self, link: Link, slot: Slot, expect: int) -> None:
        """Wait (a second at most) until the messages a new consumer's queue held have
        been pushed here, or to other consumers of the group: a first get sees what was
        there before it started."""
        deadline = time.monotonic() + 1.0
        while expect and time.monotonic() < deadline:
            link.barrier(timeout=self.confirm_timeout)
            with self._lock:
                if slot.waiting() >= expect:
                    return
            if link.ready_count(slot.name, timeout=self.confirm_timeout) == 0:
                link.barrier(timeout=self.confirm_timeout)
                return
            time.sleep(0.002)

    def _take(
        self, slot: Slot, consumer: str, count: int, min_idle: float | None
    ) -> list[Received]:
        now = time.monotonic()
        out: list[Received] = []
        with self._lock:
            if (
                min_idle is not None
                and slot.held
                and now - slot.idle_checked >= min(min_idle / 2, 1.0)
            ):
                slot.idle_checked = now
                for msgs in list(slot.held.values()):
                    for msg in msgs:
                        if (
                            len(out) < count
                            and msg.consumer != consumer
                            and (now - msg.since >= min_idle)
                        ):
                            msg.count += 1
                            out.append(self._hand(slot, msg, consumer, now, hold=False))
            for ready in reversed(slot.ready):
                while ready and len(out) < count:
                    out.append(self._hand(slot, ready.popleft(), consumer, now, hold=True))
        return out

    def _hand(self, slot: Slot, msg: Msg, consumer: str, now: float, *, hold: bool) -> Received:
        if msg.env is None:
            msg.ref, msg.env, msg.adopted = decode(slot.queue, slot.group, msg.props, msg.body)
        msg.consumer = consumer
        msg.since = now
        if hold:
            slot.held.setdefault(msg.ref, []).append(msg)
        return Received(msg.ref, slot.group, msg.env, msg.adopted, delivery_count=msg.count)

    def _settle(self, queue: str, group: str, refs: Sequence[str]) -> tuple[list[Msg], Link | None]:
        """Take the deliveries of ``refs`` out of the group's held ones (this connection's
        only: an older one's went back to the queue when it closed)."""
        out: list[Msg] = []
        with self._lock:
            slot = self._slots.get((queue, group))
            link = self._link
            if slot is None or link is None:
                return [], None
            for ref in refs:
                for msg in slot.held.pop(ref, ()):
                    if msg.generation == link.generation:
                        self._outstanding.pop(msg.tag, None)
                        out.append(msg)
        return out, link

    def ack(self, queue: str, group: str, refs: Sequence[str]) -> None:
        """``basic.ack`` the group's deliveries of ``refs`` this process holds: one
        ``multiple`` ack for a run of delivery tags with nothing else outstanding before
        it, single ones for the rest; not waited for (a lost ack is a redelivery, which
        the index recognises). References this process does not hold are left alone."""
        with self._lock:
            msgs, link = self._settle(queue, group, refs)
            if not msgs or link is None:
                return
            # A lost connection requeued them on the broker: redelivered, and acked then.
            with contextlib.suppress(LinkLost):
                link.ack([m.tag for m in msgs], self._lowest_unsettled(len(msgs)))

    def _lowest_unsettled(self, acking: int) -> int | None:
        """The lowest delivery tag still unsettled (the ones being acknowledged are out
        of ``_outstanding`` already); not needed, and not looked for, to ack one."""
        return min(self._outstanding, default=None) if acking > 1 else None

    def requeue(self, queue: str, group: str, ref: str) -> None:
        """``basic.nack`` with requeue: the broker delivers it again (to any consumer of
        the group)."""
        msgs, link = self._settle(queue, group, [ref])
        if msgs and link is not None:
            self._returning(queue, group)
            with contextlib.suppress(LinkLost):  # else requeued with the connection
                link.nack([m.tag for m in msgs], requeue=True)

    def _returning(self, queue: str, group: str) -> None:
        with self._lock:
            self._sent += 1
            slot = self._slots.get((queue, group))
            if slot is not None:
                slot.returning_until = time.monotonic() + _RETURNING

    def dead_letter(self, queue: str, group: str, ref: str, reason: str) -> None:
        """Publish the delivery with the reason to the queue's dead-letter exchange (and
        wait for its confirm), then ack it. A delivery this process does not hold is not
        here to park: nothing is sent."""
        msgs, link = self._settle(queue, group, [ref])
        if not msgs:
            return
        msg = msgs[0]
        headers = dict(msg.props.headers or {})
        headers.update({"x-iq-reason": reason, "x-iq-group": group, "x-iq-queue": queue})
        props = BasicProperties(
            content_type=msg.props.content_type,
            delivery_mode=2,
            correlation_id=msg.props.correlation_id,
            message_id=msg.props.message_id,
            timestamp=msg.props.timestamp,
            headers=headers,
        )
        try:
            self._publish([Outgoing(self.dead_name(queue), "", msg.body, props)])
        except BaseException:
            with self._lock:  # still ours: settle it later
                slot = self._slots[(queue, group)]
                slot.held.setdefault(ref, []).extend(msgs)
                for m in msgs:
                    self._outstanding[m.tag] = m
            raise
        if link is not None:
            with self._lock, contextlib.suppress(LinkLost):
                link.ack([m.tag for m in msgs], self._lowest_unsettled(len(msgs)))

    def read(self, queue: str, ref: str) -> Envelope | None:
        """None: RabbitMQ cannot read a message by reference (the facade keeps copies)."""
        return None

    def read_many(self, queue: str, refs: Sequence[str]) -> list[Envelope | None]:
        """None for each: see :meth:`read`."""
        return [None] * len(refs)

    def delete(self, queue: str, refs: Sequence[str]) -> None:
        """Nothing to delete: RabbitMQ dropped each message when it was acknowledged."""

    def close(self) -> None:
        """Close the connection: deliveries not acknowledged go back to their queues."""
        self._closed = True
        link = self._link
        if link is not None:
            link.close()

    # --- tests, operations ---------------------------------------------------------

    def redeliver(self, queue: str, group: str, env: Envelope) -> None:
        """Make the group get a message again after it was acknowledged, as after an
        acknowledgement lost with a crashed consumer: the copy this process holds goes
        back (nack with requeue), else ``env`` is published onto the group's queue again.
        For tests and repair."""
        msgs, link = self._settle(queue, group, [env.msg_id])
        if msgs and link is not None:
            self._returning(queue, group)
            link.nack([m.tag for m in msgs], requeue=True)
            return
        _key, props = encode(env)
        self._publish([Outgoing("", self.queue_name(queue, group), env.body, props)])

    def held(self, queue: str, group: str) -> dict[str, str]:
        """Deliveries this process holds for a group: reference -> consumer."""
        with self._lock:
            slot = self._slots.get((queue, group))
            if slot is None:
                return {}
            return {ref: msgs[0].consumer for ref, msgs in slot.held.items() if msgs}

    def _blocking(self, *, strict: bool = False) -> pika.BlockingConnection:
        """A blocking connection of its own (BrokerUnavailable if none can be made; with
        ``strict``, pika's error as it is)."""
        try:
            return pika.BlockingConnection(self._params)
        except pika.exceptions.AMQPError as exc:
            if strict:
                raise
            raise self._unavailable(exc) from exc

    def find_sent(self, queue: str, sent: Sequence[tuple[str, int]]) -> dict[str, str]:
        """Messages of ``sent`` the queue's ledger holds (``Probing``; ``ledger=true``)."""
        return rabbitmq_find_sent(self, queue, sent) if self.ledger and sent else {}

    def dead_letters(self, queue: str, count: int = 100) -> list[tuple[dict[str, Any], bytes]]:
        """The oldest messages of the queue's dead-letter queue (headers and body), left
        where they are. For tests and operators."""
        conn = self._blocking()
        try:
            ch = conn.channel()
            out: list[tuple[dict[str, Any], bytes]] = []
            last = 0
            for _ in range(count):
                method, props, body = ch.basic_get(self.dead_name(queue), auto_ack=False)
                if method is None:
                    break
                last = method.delivery_tag
                out.append((dict(props.headers or {}), body))
            if last:
                ch.basic_nack(last, multiple=True, requeue=True)
            return out
        finally:
            conn.close()

    def drop(self, queue: str, groups: Sequence[str] = ()) -> None:
        """Delete the queue's exchange, its dead letters and the queues of ``groups``
        (every group this adapter declared for it when none are named)."""
        names = list(groups) or [g for q, g in self._declared if q == queue and g]
        with self._lock:  # our consumers on them are cancelled: not a surprise here
            for key in [k for k in self._slots if k[0] == queue]:
                slot = self._slots.pop(key)
                self._by_consumer_tag.pop(slot.consumer_tag, None)
        conn = self._blocking()
        try:
            ch = conn.channel()
            for group in names:
                ch.queue_delete(self.queue_name(queue, group))
            ch.queue_delete(self.dead_name(queue))
            ch.exchange_delete(self.dead_name(queue))
            ch.exchange_delete(self.exchange(queue))
        finally:
            conn.close()
        self._declared = {(q, g) for q, g in self._declared if q != queue}

    def declared(self) -> list[tuple[str, str]]:
        """(queue, group) pairs this adapter declared, ``""`` for a queue's exchange and
        dead letters (for clean-up)."""
        return sorted(self._declared)

    def declared_names(self) -> set[tuple[str, str]]:
        """("queue" or "exchange", name) of everything :meth:`declared` lists."""
        names: set[tuple[str, str]] = set()
        for queue, group in self.declared():
            if group:
                names.add(("queue", self.queue_name(queue, group)))
                continue
            dead, exchange = self.dead_name(queue), self.exchange(queue)
            names |= {("queue", dead), ("exchange", dead), ("exchange", exchange)}
            if self.ledger:
                names.add(("queue", f"{exchange}/ledger"))
        return names

    def __repr__(self) -> str:
        return f"<RabbitMQAdapter {self.url}>"
