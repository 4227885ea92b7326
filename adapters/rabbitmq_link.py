"""One AMQP connection to RabbitMQ and the thread that runs its I/O (pika's
``SelectConnection``), for :mod:`iqbridge.adapters.rabbitmq`.

Why a thread of its own: pika's connections are not thread-safe, and heartbeats,
publisher confirms and pushed deliveries must be served while the application is busy
elsewhere (processing a message can take longer than a heartbeat). Every AMQP call is
made on the I/O thread; a caller hands it over with ``add_callback_threadsafe`` and
waits on a :class:`~concurrent.futures.Future` when it needs the answer.

A link has three channels:

* ``pub``: publishes, in confirm mode with ``mandatory``: one :meth:`Link.publish` sends
  a whole window of messages and waits for their confirms together (never one blocking
  confirm per message); a nack or a return (unroutable) fails that message's future; a
  connection lost in the middle of a window says, per message, whether the broker
  confirmed it, refused it, never got it, or may have it (:class:`PublishCut`);
* ``sub``: consumers (``basic_consume`` with prefetch) and their acknowledgements;
  deliveries go to the ``on_delivery`` callback the adapter gives;
* ``ctl``: declarations, which may fail with a channel error (406 for a queue declared
  before with other arguments, 404 for a missing one); RabbitMQ then closes the channel,
  and the link opens a new one without disturbing the other two.

A link lives as long as its connection. When the connection closes (a broker restart,
``rabbitmqctl close_all_connections``, a lost network), every waiting call fails with
:class:`LinkLost` and the adapter opens a new link (with backoff); deliveries not yet
acknowledged go back to their queues on the broker's side, which the index makes
harmless.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeAlias

import pika
import pika.exceptions
from pika.adapters.select_connection import SelectConnection
from pika.channel import Channel
from pika.spec import Basic, BasicProperties

from iqbridge.redaction import get_logger

__all__ = [
    "ChannelError",
    "Link",
    "LinkLost",
    "Outgoing",
    "PublishCut",
    "Sent",
    "Unconfirmed",
]

log = get_logger(__name__)

_generations = itertools.count(1)

#: A pushed delivery: (consumer tag, link generation, delivery tag, redelivered,
#: properties, body).
OnDelivery = Callable[[str, int, int, bool, BasicProperties, bytes], None]


class LinkLost(Exception):
    """The connection is gone (or never came up); what was in flight did not finish."""


class ChannelError(Exception):
    """The broker closed the control channel over a declaration (reply code and text)."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text


class Unconfirmed(Exception):
    """The broker did not take a published message: it nacked it, or returned it
    because no queue matched its routing."""

    def __init__(self, how: str, detail: str) -> None:
        super().__init__(f"{how}: {detail}")
        self.how = how
        self.detail = detail


class Sent(enum.Enum):
    """What became of a published message whose confirm never came."""

    #: Never handed to the connection: the broker cannot have it.
    UNSENT = "unsent"
    #: Written to the connection, no confirm before it was lost: the broker may have it.
    IN_DOUBT = "in doubt"


#: One message's outcome in a window: None (confirmed), why the broker refused it, or
#: what became of it when its confirm never came.
Outcome: TypeAlias = Unconfirmed | Sent | None


class PublishCut(LinkLost):
    """The connection was lost before every confirm of a window came: ``outcomes`` says,
    per message in order, what became of it (a confirmed one must not be sent again)."""

    def __init__(self, why: str, outcomes: list[Outcome]) -> None:
        super().__init__(why)
        self.outcomes = outcomes


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish."""

    exchange: str
    routing_key: str
    body: bytes
    properties: BasicProperties


_PENDING: Any = object()


class _Confirms:
    """The messages of one :meth:`Link.publish` and their confirms: one slot per
    message, set on the I/O thread, and one event for the caller once every slot is
    set or the window is given up (no future, lock or callback per message)."""

    __slots__ = ("_low", "_returned", "_slots", "first", "items", "left", "over", "written")

    def __init__(self, items: Sequence[Outgoing]) -> None:
        self.items = items
        #: The delivery tag of the first message (set when it is written).
        self.first = 0
        #: How many were handed to the connection (the rest cannot be on the broker).
        self.written = 0
        #: Slots still awaiting a confirm.
        self.left = len(items)
        #: Every slot below this one is settled.
        self._low = 0
        self._slots: list[Outcome] = [_PENDING] * len(items)
        #: Positions the broker returned (unroutable), with why, until their confirm.
        self._returned: dict[int, str] = {}
        self.over = threading.Event()

    def settle(self, i: int, outcome: Outcome) -> None:
        """The confirm (ack: None, or a nack) of position ``i`` (I/O thread)."""
        if self._slots[i] is not _PENDING:
            return
        why = self._returned.pop(i, None)
        self._slots[i] = (
            Unconfirmed("returned", why) if why is not None and outcome is None else outcome
        )
        self.left -= 1
        if not self.left:
            self.over.set()

    def settle_upto(self, end: int, outcome: Outcome) -> None:
        """A confirm of every position below ``end`` (``multiple``; I/O thread)."""
        slots = self._slots
        if not self._returned and all(s is _PENDING for s in slots[self._low : end]):
            slots[self._low : end] = [outcome] * (end - self._low)
            self.left -= end - self._low
            if not self.left:
                self.over.set()
        else:
            for i in range(self._low, end):
                self.settle(i, outcome)
        self._low = max(self._low, end)

    def mark_returned(self, msg_id: str, why: str) -> bool:
        """Note that the broker returned the first unconfirmed message ``msg_id``."""
        for i in range(self._low, self.written):
            if (
                self._slots[i] is _PENDING
                and i not in self._returned
                and (self.items[i].properties.message_id or "") == msg_id
            ):
                self._returned[i] = why
                return True
        return False

    def outcomes(self, *, in_doubt: bool) -> list[Outcome]:
        """Each message's outcome (the caller, once the window is over): a slot still
        awaiting its confirm is in doubt when it was written (or the window was given up
        while the I/O thread may still write), else unsent."""
        return [
            (Sent.IN_DOUBT if i < self.written or in_doubt else Sent.UNSENT)
            if slot is _PENDING
            else slot
            for i, slot in enumerate(self._slots)
        ]


class Link:
    """One connection, its I/O thread and its three channels."""

    def __init__(
        self,
        params: pika.URLParameters,
        *,
        prefetch: int,
        on_delivery: OnDelivery,
        on_cancel: Callable[[str], None],
        connect_timeout: float,
        name: str = "iqbridge",
    ) -> None:
        self.generation = next(_generations)
        self.prefetch = prefetch
        self._on_delivery = on_delivery
        self._on_cancel = on_cancel
        self._opened: Future[None] = Future()
        self._closed = threading.Event()
        #: Given up on (a window went unconfirmed): closing, never used again.
        self._abandoned = False
        self.close_reason = ""
        self._pub: Channel | None = None
        self._sub: Channel | None = None
        self._ctl: Channel | None = None
        self._ctl_waiting: set[Future[Any]] = set()
        #: Control calls made while the control channel reopens, run once it is open.
        self._ctl_deferred: list[Callable[[], None]] = []
        #: Every future a caller may wait on, failed with LinkLost if the link goes.
        self._waiting: set[Future[Any]] = set()
        #: Publisher confirms: the next delivery tag and the windows still awaiting
        #: confirms, in tag order (a window's tags are consecutive: it is written in one
        #: go on the I/O thread).
        self._next_tag = 1
        self._windows: collections.deque[_Confirms] = collections.deque()
        #: Consumer tags this link started -> queue name.
        self.consumers: dict[str, str] = {}
        self._conn = SelectConnection(
            params,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_close,
        )
        self._thread = threading.Thread(target=self._run, name=f"{name}-amqp-io", daemon=True)
        self._thread.start()
        try:
            self._opened.result(timeout=connect_timeout)
        except FutureTimeout:
            self.close()
            raise LinkLost(f"no connection within {connect_timeout:g} s") from None
        except LinkLost:
            self.close()
            raise

    # --- the I/O thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._conn.ioloop.start()
        except Exception as exc:  # pragma: no cover - pika's loop should not raise
            log.exception("AMQP I/O loop stopped: %s", exc)
            self._lost(f"I/O loop stopped: {exc}")
        finally:
            self._closed.set()

    def _on_open(self, conn: Any) -> None:
        remaining = {"pub", "sub", "ctl"}

        def opened(which: str) -> Callable[[Channel], None]:
            def done(ch: Channel) -> None:
                setattr(self, f"_{which}", ch)
                ch.add_on_close_callback(self._on_channel_close)
                if which == "pub":
                    ch.confirm_delivery(self._on_confirm, callback=lambda _f: ready("pub"))
                    ch.add_on_return_callback(self._on_return)
                elif which == "sub":
                    ch.add_on_cancel_callback(self._cancelled)
                    ch.basic_qos(prefetch_count=self.prefetch, callback=lambda _f: ready("sub"))
                else:
                    ready("ctl")

            return done

        def ready(which: str) -> None:
            remaining.discard(which)
            if not remaining and not self._opened.done():
                self._opened.set_result(None)

        for which in ("pub", "sub", "ctl"):
            conn.channel(on_open_callback=opened(which))

    def _on_open_error(self, _conn: Any, exc: BaseException | str) -> None:
        self.close_reason = _describe(exc)
        if not self._opened.done():
            self._opened.set_exception(LinkLost(self.close_reason))
        self._conn.ioloop.stop()

    def _on_close(self, _conn: Any, reason: BaseException) -> None:
        self._lost(_describe(reason))
        self._conn.ioloop.stop()

    def _lost(self, why: str) -> None:
        self.close_reason = self.close_reason or why
        error = LinkLost(self.close_reason)
        if not self._opened.done():
            self._opened.set_exception(error)
        for fut in list(self._waiting):
            if not fut.done():
                fut.set_exception(error)
        self._waiting.clear()
        windows, self._windows = self._windows, collections.deque()
        for window in windows:
            window.over.set()
        self._closed.set()

    def _on_channel_close(self, ch: Channel, reason: BaseException) -> None:
        if self._conn.is_closing or self._conn.is_closed:
            return
        if ch is self._ctl:
            code = getattr(reason, "reply_code", 0)
            text = getattr(reason, "reply_text", str(reason))
            for fut in list(self._ctl_waiting):
                if not fut.done():
                    fut.set_exception(ChannelError(code, text))
            self._ctl_waiting.clear()
            self._ctl = None

            def reopened(new: Channel) -> None:
                self._ctl = new
                new.add_on_close_callback(self._on_channel_close)
                deferred, self._ctl_deferred = self._ctl_deferred, []
                for begin in deferred:
                    begin()

            self._conn.channel(on_open_callback=reopened)
            return
        # The publishing or consuming channel closed under us (say a consumer's queue was
        # deleted with a delivery unacknowledged): start afresh on a new connection.
        why = f"channel closed by the broker: {_describe(reason)}"
        log.warning("AMQP %s; reconnecting", why)
        self.close_reason = why
        self._conn.close()

    def _cancelled(self, frame: Any) -> None:
        """The broker cancelled a consumer (its queue was deleted)."""
        tag = frame.method.consumer_tag
        self.consumers.pop(tag, None)
        self._on_cancel(tag)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tag: int = method.delivery_tag
        outcome: Outcome = (
            Unconfirmed("nacked", "the broker refused to take it")
            if isinstance(method, Basic.Nack)
            else None
        )
        windows = self._windows
        if not method.multiple:
            for window in windows:
                if window.first <= tag < window.first + len(window.items):
                    window.settle(tag - window.first, outcome)
                    if window.left == 0:
                        windows.remove(window)
                    break
            return
        # Every tag up to ``tag``: the windows before it whole, then its part of the
        # window it falls in.
        while windows and windows[0].first <= tag:
            window = windows[0]
            end = min(tag - window.first + 1, len(window.items))
            window.settle_upto(end, outcome)
            if window.left:
                break
            windows.popleft()

    def _on_return(
        self, _ch: Channel, method: Basic.Return, props: BasicProperties, _body: bytes
    ) -> None:
        # A return carries no delivery tag: the first unconfirmed message of that id.
        # (Rare: an unroutable message; its confirm follows.)
        mid = props.message_id or ""
        why = (
            f"{method.reply_code} {method.reply_text} (exchange {method.exchange!r}, "
            f"routing key {method.routing_key!r})"
        )
        for window in self._windows:
            if window.mark_returned(mid, why):
                return

    # --- calls from other threads ------------------------------------------------------

    @property
    def alive(self) -> bool:
        """The connection is open (and not given up on)."""
        return not self._closed.is_set() and not self._abandoned

    def _abandon(self, why: str) -> None:
        """Give the connection up and close it: the broker drops its channels, so nothing
        unconfirmed of it is routed later behind a new connection's back."""
        self.close_reason = self.close_reason or why
        self._abandoned = True
        with contextlib.suppress(LinkLost):
            self._submit(lambda: self._conn.close() if self._conn.is_open else None)

    def _submit(self, fn: Callable[[], None]) -> None:
        if self._closed.is_set():
            raise LinkLost(self.close_reason or "connection closed")
        try:
            self._conn.ioloop.add_callback_threadsafe(fn)
        except Exception as exc:  # the loop is gone
            raise LinkLost(f"connection closed ({exc})") from exc

    def call(self, start: Callable[[Future[Any]], None], *, timeout: float, ctl: bool) -> Any:
        """Run ``start(future)`` on the I/O thread; wait until it completes the future."""
        fut: Future[Any] = Future()

        def begin() -> None:
            try:
                start(fut)
            except Exception as exc:
                if not fut.done():
                    fut.set_exception(exc)

        def run() -> None:
            self._waiting.add(fut)
            fut.add_done_callback(self._forget)
            if ctl:
                self._ctl_waiting.add(fut)
                if self._ctl is None:  # reopening after a refused declaration: queue up
                    self._ctl_deferred.append(begin)
                    return
            begin()

        self._submit(run)
        try:
            return fut.result(timeout=timeout)
        except FutureTimeout:
            raise LinkLost(f"no answer from the broker within {timeout:g} s") from None

    def _forget(self, fut: Future[Any]) -> None:
        self._waiting.discard(fut)
        self._ctl_waiting.discard(fut)

    def fire(self, fn: Callable[[Link], None]) -> None:
        """Run ``fn(link)`` on the I/O thread without waiting (acknowledgements)."""

        def run() -> None:
            try:
                fn(self)
            except Exception as exc:  # a closed channel: the broker requeues, harmless
                log.debug("AMQP call not made: %s", exc)

        self._submit(run)

    def publish(self, items: Sequence[Outgoing], *, timeout: float) -> list[Outcome]:
        """Publish every item (persistent, mandatory) and wait for all their confirms:
        one window. Returns, per item, None (confirmed) or why the broker did not take it.

        Raises :class:`PublishCut` (a LinkLost) if the connection went before every
        confirm came, or none came within ``timeout`` (the connection is then given up):
        it says per item whether it was confirmed, refused, never sent, or is in doubt."""
        window = _Confirms(items)

        def run() -> None:
            ch = self._pub
            if ch is None or not ch.is_open:
                raise LinkLost("publishing channel closed")
            window.first = self._next_tag
            self._windows.append(window)
            for item in items:
                ch.basic_publish(
                    item.exchange, item.routing_key, item.body, item.properties, mandatory=True
                )
                self._next_tag += 1
                window.written += 1

        def guarded() -> None:
            try:
                run()
            except Exception as exc:
                log.debug("AMQP publish cut short: %s", exc)
                with contextlib.suppress(ValueError):
                    self._windows.remove(window)
                window.over.set()

        if not items:
            return []
        try:
            self._submit(guarded)
        except LinkLost as exc:
            raise PublishCut(str(exc), [Sent.UNSENT] * len(items)) from None
        deadline = time.monotonic() + timeout
        timed_out = False
        # Woken every quarter second: a connection lost before the window was even
        # handed to the I/O thread never ends the window.
        while not window.over.wait(max(0.0, min(0.25, deadline - time.monotonic()))):
            if self._closed.is_set():
                break
            if time.monotonic() >= deadline:
                timed_out = True
                self._abandon(f"no publisher confirm within {timeout:g} s")
                break
        out = window.outcomes(in_doubt=timed_out)
        if any(isinstance(o, Sent) for o in out):
            raise PublishCut(self.close_reason or "connection lost", out)
        return out

    # --- operations (run on the I/O thread through call/fire) --------------------------

    @property
    def ctl(self) -> Channel:
        """The control channel (I/O thread only)."""
        if self._ctl is None or not self._ctl.is_open:
            raise ChannelError(0, "control channel is reopening")
        return self._ctl

    @property
    def sub(self) -> Channel:
        """The consuming channel (I/O thread only)."""
        if self._sub is None or not self._sub.is_open:
            raise LinkLost("consuming channel closed")
        return self._sub

    def consume(self, queue: str, tag: str, *, timeout: float) -> None:
        """Start a consumer on ``queue`` (manual acks) with consumer tag ``tag``; its
        deliveries go to ``on_delivery`` from the moment the broker accepts it."""

        def start(fut: Future[Any]) -> None:
            def on_message(
                _ch: Channel, method: Basic.Deliver, props: BasicProperties, body: bytes
            ) -> None:
                self._on_delivery(
                    method.consumer_tag,
                    self.generation,
                    method.delivery_tag,
                    bool(method.redelivered),
                    props,
                    body,
                )

            self.sub.basic_consume(
                queue,
                on_message,
                auto_ack=False,
                consumer_tag=tag,
                callback=lambda _f: fut.set_result(None),
            )
            self.consumers[tag] = queue

        self.call(start, timeout=timeout, ctl=False)

    def barrier(self, *, timeout: float) -> None:
        """A round trip on the consuming channel: deliveries the broker pushed to this
        channel before it answered have been handed to ``on_delivery`` when it returns."""
        self.call(
            lambda fut: self.sub.basic_qos(
                prefetch_count=self.prefetch, callback=lambda _f: fut.set_result(None)
            ),
            timeout=timeout,
            ctl=False,
        )

    def ready_count(self, queue: str, *, timeout: float) -> int:
        """How many messages of ``queue`` wait for a consumer (a passive declare)."""
        return int(
            self.call(
                lambda fut: self.ctl.queue_declare(
                    queue,
                    passive=True,
                    callback=lambda frame: fut.set_result(frame.method.message_count),
                ),
                timeout=timeout,
                ctl=True,
            )
        )

    def ack(self, tags: Sequence[int], below: int | None) -> None:
        """Acknowledge delivery ``tags`` of the consuming channel, without waiting: one
        ``multiple`` acknowledgement for those under ``below`` (the lowest tag of this
        channel still unsettled apart from ``tags``, None if there is none), so it
        acknowledges nothing else, and single ones for the rest."""
        if len(tags) == 1:
            (tag,) = tags
            self.fire(lambda link: link.sub.basic_ack(tag))
            return
        under = [t for t in tags if below is None or t < below]
        upto = max(under, default=0)
        singles = sorted(t for t in tags if t > upto)
        multiple = len(under) > 1

        def send(link: Link) -> None:
            ch = link.sub
            if upto:
                ch.basic_ack(upto, multiple=multiple)
            for t in singles:
                ch.basic_ack(t)

        self.fire(send)

    def nack(self, tags: Sequence[int], *, requeue: bool) -> None:
        """Give deliveries back to their queue (``requeue``) or drop them, not waiting."""

        def send(link: Link) -> None:
            for t in tags:
                link.sub.basic_nack(t, requeue=requeue)

        if tags:
            self.fire(send)

    def close(self) -> None:
        """Close the connection (the broker requeues what was not acknowledged) and stop
        the I/O thread."""
        if self._closed.is_set():
            self._thread.join(timeout=5)
            return

        def shut() -> None:
            if self._conn.is_open:
                self._conn.close()
            elif not self._conn.is_closing:
                self._conn.ioloop.stop()

        try:
            self._conn.ioloop.add_callback_threadsafe(shut)
        except Exception:
            return
        self._closed.wait(timeout=5)
        self._thread.join(timeout=5)


def _describe(reason: BaseException | str) -> str:
    """A connection or channel error as a short text (never with credentials: pika's
    errors carry reply codes and texts, not the URL)."""
    if isinstance(reason, str):
        return reason
    if isinstance(reason, pika.exceptions.ProbableAuthenticationError):
        return "the broker refused the login (user name or password)"
    if isinstance(reason, pika.exceptions.ProbableAccessDeniedError):
        return "access denied (does the virtual host exist, may this user use it?)"
    code = getattr(reason, "reply_code", None)
    text = getattr(reason, "reply_text", None)
    if code is not None:
        return f"{code} {text}"
    return f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
