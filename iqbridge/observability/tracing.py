"""OpenTelemetry spans around put, get, settle, ``with delivery:`` and bridge hops.

Tracing is off until the application switches it on::

    from opentelemetry.sdk.trace import TracerProvider
    from iqbridge.observability import tracing

    tracing.configure(TracerProvider(...))  # or configure(): the global provider
    ...
    tracing.disable()

**A global SDK provider does not switch it on by itself**: call :func:`configure` once at
start-up. That keeps the hooks at one module-level ``if`` when tracing is off (no
OpenTelemetry call, not even a no-op tracer's), and iqbridge works with
``opentelemetry-api`` not installed at all (it is imported by :func:`configure` only).
``configure()`` without a provider follows the global one through OpenTelemetry's
proxy, so it may be called before or after the application sets its provider.

What is recorded (span names ``"{operation} {queue}"``, e.g. ``put orders``):

===========================  =========  ==============  ===============================
call                         span kind  operation.type  operation.name
===========================  =========  ==============  ===============================
put, put_many, put_each      PRODUCER   send            put
get, get_many (non-empty)    CONSUMER   receive         get
``with delivery:`` / batch   CONSUMER   process         process
done, unusable, release      CLIENT     settle          done / unusable / release
``batch.done()``             CLIENT     settle          done
a bridge route's hop         CONSUMER   process         bridge
===========================  =========  ==============  ===============================

Attributes: ``messaging.system`` (``rabbitmq``, ``kafka``, ``redis``,
``iqbridge.sqlite``, ``iqbridge.memory``, else the URL scheme),
``messaging.destination.name`` (the queue), ``messaging.operation.type``,
``messaging.operation.name``, ``messaging.message.id`` (one message),
``messaging.batch.message_count`` (batches), ``messaging.consumer.group.name`` (the
subscriber), ``messaging.message.conversation_id`` (the correlation id, if any); a hop
adds ``iqbridge.bridge.route``, ``iqbridge.bridge.destination`` and
``iqbridge.parent_ids`` (the source msg_ids its children derive from). An exception is
recorded on the span, whose status is then ERROR; in ``with delivery:`` the handler's
exception marks the process span. A get that finds nothing records no span (a polling
consumer would otherwise record one per poll); one that fails does.

**Context propagation.** A put writes its span's context into each message's headers
with OpenTelemetry's global propagator (W3C ``traceparent``, ``tracestate``, ``baggage``
by default), in place of any it had: the put's span is a child of the caller's current
context, so the trace goes on from there. Every broker carries headers, so the context
crosses processes and bridges (a bridge that keeps its source's headers forwards the
source's context when it is not traced, its own hop's when it is). On the consuming
side, ``with delivery:`` opens its process span as a child of that creation context (one
trace from put to processing, wherever it ran); a batch's process span, a get's receive
span and a bridge hop link to the creation contexts of their messages (up to 128).
Messages put without tracing carry no such header and are traced from the consumer's
own context.
"""

from __future__ import annotations

import contextlib
import functools
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from iqbridge.errors import ConfigurationError
from iqbridge.redaction import get_logger, known_secrets, scrub

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider
    from opentelemetry.util.types import AttributeValue

__all__ = [
    "Open",
    "begin",
    "configure",
    "disable",
    "enabled",
    "finishing",
    "hop",
    "settle",
    "settle_batch",
    "system_of",
    "traced_get",
    "traced_put",
]

F = TypeVar("F", bound=Callable[..., Any])

#: The tracer when tracing is on; the hooks test this one name.
log = get_logger("iqbridge.tracing")
_tracer: Tracer | None = None
_trace: ModuleType | None = None  # opentelemetry.trace, once configured
_context: ModuleType | None = None  # opentelemetry.context
_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()

_SYSTEMS = {
    "amqp": "rabbitmq",
    "amqps": "rabbitmq",
    "kafka": "kafka",
    "redis": "redis",
    "rediss": "redis",
    "sqlite": "iqbridge.sqlite",
    "memory": "iqbridge.memory",
    "ibmmq": "ibm_mq",
}

SYSTEM = "messaging.system"
DESTINATION = "messaging.destination.name"
OP_TYPE = "messaging.operation.type"
OP_NAME = "messaging.operation.name"
MESSAGE_ID = "messaging.message.id"
BATCH_COUNT = "messaging.batch.message_count"
GROUP = "messaging.consumer.group.name"
CONVERSATION = "messaging.message.conversation_id"


def configure(tracer_provider: TracerProvider | None = None) -> None:
    """Switch tracing on, with spans from ``tracer_provider`` (None: the global provider,
    followed through OpenTelemetry's proxy if the application sets it later).

    Raises :class:`~iqbridge.errors.ConfigurationError` if ``opentelemetry-api`` is not
    installed."""
    global _tracer, _trace, _context  # noqa: PLW0603 (the one switch the hooks read)
    try:
        from opentelemetry import context, trace
    except ImportError as exc:
        raise ConfigurationError(
            "tracing needs opentelemetry-api: pip install 'iqbridge[admin]' "
            "(or opentelemetry-api and an SDK)"
        ) from exc
    try:
        version: str | None = metadata.version("iqbridge")
    except metadata.PackageNotFoundError:
        version = None
    _trace, _context = trace, context
    _tracer = trace.get_tracer("iqbridge", version, tracer_provider=tracer_provider)


def disable() -> None:
    """Switch tracing off: the hooks record nothing from now on."""
    global _tracer  # noqa: PLW0603
    _tracer = None


def enabled() -> bool:
    """Whether :func:`configure` switched tracing on."""
    return _tracer is not None


def system_of(url: str) -> str:
    """``messaging.system`` for a broker URL (by scheme)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    return _SYSTEMS.get(scheme, scheme or "iqbridge")


def _attrs(queue: object, operation: str, op_type: str) -> dict[str, AttributeValue]:
    """The attributes every span has, for a queue handle (anything with ``name`` and
    ``hub.adapter.url``)."""
    hub = getattr(queue, "hub", None)
    url = getattr(getattr(hub, "adapter", None), "url", "")
    return {
        SYSTEM: system_of(url if isinstance(url, str) else ""),
        DESTINATION: _name(queue),
        OP_TYPE: op_type,
        OP_NAME: operation,
    }


def _name(queue: object) -> str:
    return str(getattr(queue, "name", ""))


def _kind(name: str) -> Any:
    assert _trace is not None
    return getattr(_trace.SpanKind, name)


def _fail(span: Span, exc: BaseException) -> None:
    """Mark the span failed by ``exc``; its message and traceback scrubbed of secrets."""
    assert _trace is not None
    secrets = known_secrets()
    message = scrub(str(exc), secrets)
    stack = scrub("".join(traceback.format_exception(exc)), secrets)
    span.record_exception(
        exc, attributes={"exception.message": message, "exception.stacktrace": stack}
    )
    span.set_status(_trace.Status(_trace.StatusCode.ERROR, f"{type(exc).__name__}: {message}"))


#: The header a creation context travels in (W3C Trace Context).
TRACEPARENT = "traceparent"
#: Links a span keeps to its messages' creation contexts, at most.
MAX_LINKS = 128


def _inject(pairs: Sequence[tuple[object, Any]]) -> None:
    """Write the current context (the put's span) into each message's headers, in place
    of a context they carried (a bridge's copy of its source's headers, say)."""
    from opentelemetry import propagate

    seen: set[int] = set()
    for _, spec in pairs:
        headers = getattr(spec, "headers", None)
        if id(headers) in seen or not isinstance(headers, dict):
            continue
        seen.add(id(headers))
        for field in propagate.get_global_textmap().fields:
            headers.pop(field, None)
        propagate.inject(headers)


def _creation(headers: object) -> Context | None:
    """The creation context a message's headers carry, or None."""
    if not hasattr(headers, "get") or not headers.get(TRACEPARENT):
        return None
    from opentelemetry import propagate

    assert _trace is not None
    ctx = propagate.extract(cast(Any, headers))
    return ctx if _trace.get_current_span(ctx).get_span_context().is_valid else None


def _links(messages: Sequence[Any]) -> list[Any]:
    """Links to the creation contexts of ``messages`` (anything with ``headers``)."""
    assert _trace is not None
    out: list[Any] = []
    for m in messages:
        ctx = _creation(getattr(m, "headers", None))
        if ctx is not None:
            out.append(_trace.Link(_trace.get_current_span(ctx).get_span_context()))
            if len(out) >= MAX_LINKS:
                break
    return out


# --- put and get: decorators, since what they record is known once they return -----------


def traced_put(fn: F) -> F:
    """Wrap the queue's one internal put path ``(queue, pairs, ...) -> msg_ids``: a
    PRODUCER span per put (``pairs`` is a list of (payload, spec with correlation_id))."""

    @functools.wraps(fn)
    def put(queue: Any, pairs: Sequence[tuple[object, Any]], *args: Any, **kwargs: Any) -> Any:
        tracer = _tracer
        if tracer is None:
            return fn(queue, pairs, *args, **kwargs)
        attrs = _attrs(queue, "put", "send")
        if len(pairs) != 1:
            attrs[BATCH_COUNT] = len(pairs)
        corr = {getattr(spec, "correlation_id", None) for _, spec in pairs}
        if len(corr) == 1 and (one := corr.pop()) is not None:
            attrs[CONVERSATION] = one
        with _guarded(tracer, f"put {queue.name}", "PRODUCER", attrs) as span:
            if span is not None:
                _quietly(_inject, pairs)
            ids = fn(queue, pairs, *args, **kwargs)
            if len(ids) == 1 and span is not None:
                _quietly(span.set_attribute, MESSAGE_ID, ids[0])
            return ids

    return cast(F, put)


def traced_get(fn: F) -> F:
    """Wrap the queue's internal get ``(queue, subscriber, want, ...) -> deliveries``: a
    CONSUMER span for a get that returned something or failed, none for an empty poll."""

    @functools.wraps(fn)
    def get(queue: Any, subscriber: str, want: int, *args: Any, **kwargs: Any) -> Any:
        tracer = _tracer
        if tracer is None:
            return fn(queue, subscriber, want, *args, **kwargs)
        start = time.time_ns()
        try:
            got: list[Any] = fn(queue, subscriber, want, *args, **kwargs)
        except BaseException as exc:
            _quietly(_record_get, tracer, queue, subscriber, want, [], exc, start)
            raise
        if got:  # an empty poll records nothing
            _quietly(_record_get, tracer, queue, subscriber, want, got, None, start)
        return got

    return cast(F, get)


def _record_get(
    tracer: Tracer,
    queue: Any,
    subscriber: str,
    want: int,
    got: Sequence[Any],
    failed: BaseException | None,
    start: int,
) -> None:
    attrs = _attrs(queue, "get", "receive")
    attrs[GROUP] = subscriber
    if want > 1:
        attrs[BATCH_COUNT] = len(got)
    if len(got) == 1:
        attrs[MESSAGE_ID] = got[0].msg_id
        if got[0].correlation_id is not None:
            attrs[CONVERSATION] = got[0].correlation_id
    span = tracer.start_span(
        f"get {queue.name}",
        kind=_kind("CONSUMER"),
        attributes=attrs,
        start_time=start,
        links=_links(got),
    )
    if failed is not None:
        _fail(span, failed)
    span.end()


@contextlib.contextmanager
def _guarded(
    tracer: Tracer, name: str, kind: str, attrs: dict[str, Any], links: list[Any] | None = None
) -> Iterator[Span | None]:
    """``tracer.start_as_current_span`` whose own failures are logged and ignored: the
    code inside runs, and its outcome (return or exception) is the caller's, whatever
    the telemetry does. Yields the span, or None when it could not start."""
    cm: contextlib.AbstractContextManager[Span] | None = None
    span: Span | None = None
    try:
        cm = tracer.start_as_current_span(name, kind=_kind(kind), attributes=attrs, links=links)
        span = cm.__enter__()
    except Exception as exc:
        log.warning("tracing failed, ignored: %s", type(exc).__name__)
        cm = None
    if cm is None:
        yield None
        return
    try:
        yield span
    except BaseException as exc:
        with contextlib.suppress(Exception):  # records it on the span, then re-raises
            cm.__exit__(type(exc), exc, exc.__traceback__)
        raise
    with contextlib.suppress(Exception):
        cm.__exit__(None, None, None)


def _quietly(record: Callable[..., object], *args: Any) -> Any:
    """Run telemetry: a failure of its own is logged, never raised into the facade (a
    get's deliveries must reach the caller, a handler's exception must stay its own)."""
    try:
        return record(*args)
    except Exception as exc:
        log.warning("tracing failed, ignored: %s", type(exc).__name__)
        return None


# --- settling ---------------------------------------------------------------------------


def settle(
    operation: str,
    queue: object,
    msg_id: str,
    subscriber: str,
    record: object = None,
) -> contextlib.AbstractContextManager[object]:
    """A CLIENT span around one delivery's ``operation`` (done, unusable, release);
    ``record`` (the message's record, if at hand) gives the correlation id."""
    tracer = _tracer
    if tracer is None:
        return _OFF
    attrs = _attrs(queue, operation, "settle")
    attrs[MESSAGE_ID] = msg_id
    attrs[GROUP] = subscriber
    corr = getattr(record, "correlation_id", None)
    if isinstance(corr, str):
        attrs[CONVERSATION] = corr
    return _guarded(tracer, f"{operation} {_name(queue)}", "CLIENT", attrs)


def settle_batch(
    queue: object, moves: Sequence[tuple[Any, Any]]
) -> contextlib.AbstractContextManager[object]:
    """A CLIENT span around settling a batch (``moves``: (delivery, move) pairs); the
    unusable and released among them are counted in ``iqbridge.settle.unusable`` and
    ``iqbridge.settle.released``."""
    tracer = _tracer
    if tracer is None or not moves:
        return _OFF
    attrs = _attrs(queue, "done", "settle")
    attrs[BATCH_COUNT] = len(moves)
    attrs[GROUP] = moves[0][0].subscriber
    kinds = [getattr(m, "kind", "") for _, m in moves]
    attrs["iqbridge.settle.unusable"] = kinds.count("unusable")
    attrs["iqbridge.settle.released"] = kinds.count("release")
    return _guarded(tracer, f"done {_name(queue)}", "CLIENT", attrs)


# --- processing: a span opened by __enter__ and closed by __exit__ ------------------------


class Open:
    """A process span opened by :func:`begin`, current until :func:`finishing` ends it."""

    __slots__ = ("span", "token")

    def __init__(self, span: Span, token: object) -> None:
        self.span = span
        self.token = token


def begin(
    queue: object,
    subscriber: str,
    *,
    msg_id: str | None = None,
    count: int | None = None,
    correlation_id: str | None = None,
    messages: Sequence[Any] = (),
) -> Open | None:
    """Open a CONSUMER ``process`` span for ``with delivery:`` (``msg_id``) or ``with
    batch:`` (``count``) and make it current; None when tracing is off. ``messages``
    (the deliveries) give the creation contexts: the one message's is the span's parent,
    a batch's are its links."""
    tracer = _tracer
    if tracer is None:
        return None
    opened: Open | None = _quietly(
        _open_process, tracer, queue, subscriber, msg_id, count, correlation_id, messages
    )
    return opened


def _open_process(
    tracer: Tracer,
    queue: object,
    subscriber: str,
    msg_id: str | None,
    count: int | None,
    correlation_id: str | None,
    messages: Sequence[Any],
) -> Open:
    assert _trace is not None and _context is not None
    attrs = _attrs(queue, "process", "process")
    attrs[GROUP] = subscriber
    if msg_id is not None:
        attrs[MESSAGE_ID] = msg_id
    if count is not None:
        attrs[BATCH_COUNT] = count
    if correlation_id is not None:
        attrs[CONVERSATION] = correlation_id
    parent = _creation(getattr(messages[0], "headers", None)) if len(messages) == 1 else None
    span = tracer.start_span(
        f"process {_name(queue)}",
        context=parent,
        kind=_kind("CONSUMER"),
        attributes=attrs,
        links=_links(messages) if len(messages) > 1 else None,
    )
    ctx: Context = _trace.set_span_in_context(span)
    return Open(span, _context.attach(ctx))


class _Finishing:
    __slots__ = ("exc", "open")

    def __init__(self, open_: Open, exc: BaseException | None) -> None:
        self.open = open_
        self.exc = exc

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert _context is not None
        span = self.open.span
        try:
            _quietly(self._end, span, exc)
        finally:
            with contextlib.suppress(Exception):
                _context.detach(cast(Any, self.open.token))

    def _end(self, span: Span, exc: BaseException | None) -> None:
        for failure in (self.exc, exc):
            if failure is not None:
                _fail(span, failure)
        span.end()


def finishing(
    open_: Open | None, exc: BaseException | None
) -> contextlib.AbstractContextManager[object]:
    """Around ``__exit__``'s settling: on leaving, end the span :func:`begin` opened,
    recording ``exc`` (the handler's exception) and any exception of the settling."""
    if open_ is None:
        return _OFF
    return _Finishing(open_, exc)


# --- a bridge route's hop -----------------------------------------------------------------


def hop(
    source: object,
    route: str,
    destination: str,
    subscriber: str,
    deliveries: Sequence[Any],
) -> contextlib.AbstractContextManager[object]:
    """A CONSUMER ``bridge`` span around one hop of a bridge route: ``deliveries`` of the
    ``source`` queue translated and put on ``destination``; their msg_ids are the
    ``iqbridge.parent_ids`` attribute (the puts and settles of the hop are its children)."""
    tracer = _tracer
    if tracer is None:
        return _OFF
    attrs = _attrs(source, "bridge", "process")
    attrs[GROUP] = subscriber
    attrs[BATCH_COUNT] = len(deliveries)
    attrs["iqbridge.bridge.route"] = route
    attrs["iqbridge.bridge.destination"] = destination
    attrs["iqbridge.parent_ids"] = [d.msg_id for d in deliveries]
    links = _quietly(_links, deliveries) or None
    return _guarded(tracer, f"bridge {_name(source)}", "CONSUMER", attrs, links)
