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

import contextlib
import enum
import functools
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
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
        #: Publisher confirms: the next delivery tag and the futures by tag.
        self._next_tag = 1
        self._confirms: dict[int, Future[None]] = {}
        #: Messages the broker returned (unroutable), by delivery tag, until their confirm.
        self._returned: dict[int, str] = {}
        #: Unconfirmed tags by message id, to match a return (which carries no tag).
        self._tags_by_id: dict[str, list[int]] = {}
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
        for fut in list(self._waiting) + list(self._confirms.values()):
            if not fut.done():
                fut.set_exception(error)
        self._waiting.clear()
        self._confirms.clear()
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
        tags = [t for t in self._confirms if t <= tag] if method.multiple else [tag]
        nack = isinstance(method, Basic.Nack)
        for t in tags:
            fut = self._confirms.pop(t, None)
            returned = self._returned.pop(t, None)
            if fut is None or fut.done():
                continue
            if nack:
                fut.set_exception(Unconfirmed("nacked", "the broker refused to take it"))
            elif returned is not None:
                fut.set_exception(Unconfirmed("returned", returned))
            else:
                fut.set_result(None)

    def _on_return(
        self, _ch: Channel, method: Basic.Return, props: BasicProperties, _body: bytes
    ) -> None:
        tags = self._tags_by_id.get(props.message_id or "", [])
        for t in tags:
            if t in self._confirms and t not in self._returned:
                self._returned[t] = (
                    f"{method.reply_code} {method.reply_text} (exchange {method.exchange!r}, "
                    f"routing key {method.routing_key!r})"
                )
                break

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
        futures: list[Future[None]] = [Future() for _ in items]
        #: Handed to pika (set on the I/O thread, read once the window is over).
        written = [False] * len(items)

        def run() -> None:
            ch = self._pub
            if ch is None or not ch.is_open:
                raise LinkLost("publishing channel closed")
            for i, (item, fut) in enumerate(zip(items, futures, strict=True)):
                tag = self._next_tag
                self._next_tag += 1
                self._confirms[tag] = fut
                mid = item.properties.message_id or ""
                tags = self._tags_by_id.setdefault(mid, [])
                tags.append(tag)
                fut.add_done_callback(functools.partial(self._untag, mid, tag))
                ch.basic_publish(
                    item.exchange, item.routing_key, item.body, item.properties, mandatory=True
                )
                written[i] = True

        def guarded() -> None:
            try:
                run()
            except Exception as exc:
                for fut in futures:
                    if not fut.done():
                        fut.set_exception(LinkLost(f"publish failed: {exc}"))

        try:
            self._submit(guarded)
        except LinkLost as exc:
            raise PublishCut(str(exc), [Sent.UNSENT] * len(items)) from None
        deadline = time.monotonic() + timeout
        pending: set[Future[None]] = set(futures)
        timed_out = False
        while pending:
            # Woken every quarter second: a connection lost before the window was even
            # handed to the I/O thread never completes its futures.
            _, pending = wait_futures(
                pending, timeout=max(0.0, min(0.25, deadline - time.monotonic()))
            )
            if not pending or self._closed.is_set():
                break
            if time.monotonic() >= deadline:
                timed_out = True
                self._abandon(f"no publisher confirm within {timeout:g} s")
                break
        out: list[Outcome] = []
        for fut, sent in zip(futures, written, strict=True):
            why = fut.exception() if fut.done() else None
            if fut.done() and why is None:
                out.append(None)
            elif isinstance(why, Unconfirmed):
                out.append(why)
            else:
                # Given up on while the I/O thread may still be writing: in doubt, all.
                out.append(Sent.IN_DOUBT if sent or timed_out else Sent.UNSENT)
        if any(isinstance(o, Sent) for o in out):
            raise PublishCut(self.close_reason or "connection lost", out)
        return out

    def _untag(self, mid: str, tag: int, _fut: object = None) -> None:
        tags = self._tags_by_id.get(mid)
        if tags is not None:
            if tag in tags:
                tags.remove(tag)
            if not tags:
                del self._tags_by_id[mid]

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
