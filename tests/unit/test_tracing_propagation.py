"""Trace context carried in the messages (iqbridge.observability.tracing): a put writes
its span's W3C ``traceparent`` into the headers; ``with delivery:`` continues that trace;
a batch, a get and a bridge hop link to their messages' creation contexts; the bridge's
children carry the hop's context. On embedded SQLite, spans kept in memory."""

from __future__ import annotations

from pathlib import Path

from opentelemetry import context, trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import iqbridge
from iqbridge.observability import tracing
from tests.tracing_helpers import (  # noqa: F401 (fixtures)
    hub_fixture,
    named,
    parent_of,
    run_bridge,
    spans_fixture,
)


def traceparent(trace_id: int, span_id: int) -> str:
    """A W3C traceparent's version, trace id and parent id (the flags vary by SDK)."""
    return f"00-{trace_id:032x}-{span_id:016x}"


def ids_of(header: str) -> str:
    """A traceparent header without its flags."""
    return header.rsplit("-", 1)[0]


def test_a_put_writes_its_context_and_processing_continues_the_trace(
    spans: InMemorySpanExporter, hub: iqbridge.Hub
) -> None:
    q = hub.queue("orders")
    q.put(b"x", to=["billing"], headers={"tenant": "acme"})
    (put,) = named(spans, "put orders")
    d = q.get("billing")
    assert d is not None
    assert d.headers["tenant"] == "acme"
    assert ids_of(d.headers[tracing.TRACEPARENT]) == traceparent(
        put.context.trace_id, put.context.span_id
    )
    with d:
        pass
    (proc,) = named(spans, "process orders")
    assert proc.context.trace_id == put.context.trace_id
    assert parent_of(proc) == put.context.span_id
    (get,) = named(spans, "get orders")
    assert [link.context.span_id for link in get.links] == [put.context.span_id]


def test_the_trace_goes_on_from_the_callers_span_not_a_stale_header(
    spans: InMemorySpanExporter, hub: iqbridge.Hub
) -> None:
    q = hub.queue("orders")
    stale = traceparent(0xABC, 0xDEF) + "-01"
    # The caller's context, as an incoming request's (a remote parent).
    caller = trace.SpanContext(
        0x1234, 0x5678, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)
    )
    token = context.attach(trace.set_span_in_context(trace.NonRecordingSpan(caller)))
    try:
        q.put(b"x", to=["billing"], headers={tracing.TRACEPARENT: stale})
    finally:
        context.detach(token)
    (put,) = named(spans, "put orders")
    assert parent_of(put) == 0x5678 and put.context.trace_id == 0x1234
    d = q.get("billing")
    assert d is not None
    assert ids_of(d.headers[tracing.TRACEPARENT]) == traceparent(
        put.context.trace_id, put.context.span_id
    )


def test_a_batch_links_every_message_it_processes(
    spans: InMemorySpanExporter, hub: iqbridge.Hub
) -> None:
    q = hub.queue("orders")
    q.put(b"1", to=["s"])
    q.put(b"2", to=["s"])
    puts = {s.context.span_id for s in named(spans, "put orders")}
    assert len(puts) == 2
    with q.get_many("s", 10) as batch:
        assert len(batch) == 2
    (proc,) = named(spans, "process orders")
    assert {link.context.span_id for link in proc.links} == puts
    assert proc.parent is None  # a batch has no single creation context


def test_without_tracing_no_header_is_added(hub: iqbridge.Hub) -> None:
    assert not tracing.enabled()
    q = hub.queue("orders")
    q.put(b"x", to=["s"], headers={"tenant": "acme"})
    d = q.get("s")
    assert d is not None
    assert dict(d.headers) == {"tenant": "acme"}


def test_a_bridge_child_carries_the_hops_context(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    run_bridge(tmp_path, lambda q: [q.put(b"1")])
    (source_put,) = named(spans, "put orders")
    with iqbridge.connect(f"sqlite:///{tmp_path}/out.db") as dst:
        child = dst.queue("copies").get("sink", timeout=5)
        assert child is not None
    (hop,) = named(spans, "bridge orders")
    assert [link.context.span_id for link in hop.links] == [source_put.context.span_id]
    (child_put,) = named(spans, "put copies")
    assert parent_of(child_put) == hop.context.span_id
    assert ids_of(child.headers[tracing.TRACEPARENT]) == traceparent(
        child_put.context.trace_id, child_put.context.span_id
    )
