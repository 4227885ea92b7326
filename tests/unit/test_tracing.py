"""OpenTelemetry spans of the facade (iqbridge.observability.tracing), recorded in memory
on embedded SQLite: names, kinds, messaging.* attributes, parents, an error span when a
handler raises in ``with delivery:``, a bridge hop, and nothing at all (with the facade
working) when tracing is not configured or OpenTelemetry is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import iqbridge
from iqbridge.observability import tracing
from iqbridge.redaction import remember
from tests.tracing_helpers import (  # noqa: F401 (fixtures)
    attrs,
    hub_fixture,
    named,
    parent_of,
    run_bridge,
    spans_fixture,
)

ROOT = Path(__file__).resolve().parents[2]


def test_put_get_done_spans(spans: InMemorySpanExporter, hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    msg_id = q.put({"n": 1}, to=["billing"], correlation_id="cart-7")
    d = q.get("billing")
    assert d is not None
    d.done()
    (put,) = named(spans, "put orders")
    assert put.kind is SpanKind.PRODUCER
    assert attrs(put) == {
        "messaging.system": "iqbridge.sqlite",
        "messaging.destination.name": "orders",
        "messaging.operation.type": "send",
        "messaging.operation.name": "put",
        "messaging.message.id": msg_id,
        "messaging.message.conversation_id": "cart-7",
    }
    (get,) = named(spans, "get orders")
    assert get.kind is SpanKind.CONSUMER
    assert attrs(get)["messaging.operation.type"] == "receive"
    assert attrs(get)["messaging.consumer.group.name"] == "billing"
    assert attrs(get)["messaging.message.id"] == msg_id
    assert attrs(get)["messaging.message.conversation_id"] == "cart-7"
    (done,) = named(spans, "done orders")
    assert done.kind is SpanKind.CLIENT
    assert attrs(done)["messaging.operation.type"] == "settle"
    assert attrs(done)["messaging.operation.name"] == "done"
    assert attrs(done)["messaging.message.id"] == msg_id
    assert attrs(done)["messaging.consumer.group.name"] == "billing"
    assert all(s.status.status_code is StatusCode.UNSET for s in spans.get_finished_spans())
    assert q.get("billing") is None
    assert len(named(spans, "get orders")) == 1  # an empty poll records nothing


def test_release_unusable_and_batches(spans: InMemorySpanExporter, hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    ids = q.put_many([b"a", b"b", b"c"], to=["s"])
    (put,) = named(spans, "put orders")
    assert attrs(put)["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in attrs(put)
    d = q.get("s")
    assert d is not None
    d.release()
    (rel,) = named(spans, "release orders")
    assert attrs(rel)["messaging.operation.name"] == "release"
    assert attrs(rel)["messaging.message.id"] == d.msg_id
    batch = q.get_many("s", 10)
    assert len(batch) == 3
    gets = named(spans, "get orders")
    assert attrs(gets[-1])["messaging.batch.message_count"] == 3
    batch.unusable(batch[0], "bad")
    batch.release(batch[1])
    settled = batch.done()
    assert settled.done == [batch[2].msg_id]
    (bdone,) = named(spans, "done orders")
    assert bdone.kind is SpanKind.CLIENT
    a = attrs(bdone)
    assert a["messaging.batch.message_count"] == 3
    assert a["messaging.consumer.group.name"] == "s"
    assert a["iqbridge.settle.unusable"] == 1 and a["iqbridge.settle.released"] == 1
    d2 = q.get("s")
    assert d2 is not None and d2.msg_id in ids
    d2.unusable("poison")
    (bad,) = named(spans, "unusable orders")
    assert attrs(bad)["messaging.operation.type"] == "settle"


def test_with_delivery_is_a_process_span_parenting_what_the_handler_does(
    spans: InMemorySpanExporter, hub: iqbridge.Hub
) -> None:
    q = hub.queue("orders")
    out = hub.queue("shipments")
    q.put(b"x", to=["billing"], correlation_id="c1")
    d = q.get("billing")
    assert d is not None
    with d:
        out.put(b"child", to=["ship"], parents=[d.msg_id])
    (proc,) = named(spans, "process orders")
    assert proc.kind is SpanKind.CONSUMER
    assert attrs(proc)["messaging.operation.type"] == "process"
    assert attrs(proc)["messaging.message.id"] == d.msg_id
    assert attrs(proc)["messaging.message.conversation_id"] == "c1"
    (child,) = named(spans, "put shipments")
    (done,) = named(spans, "done orders")
    assert parent_of(child) == proc.context.span_id
    assert parent_of(done) == proc.context.span_id
    assert proc.status.status_code is StatusCode.UNSET


def test_a_handler_exception_marks_the_process_span(
    spans: InMemorySpanExporter, hub: iqbridge.Hub
) -> None:
    q = hub.queue("orders")
    q.put(b"x", to=["billing"])
    d = q.get("billing")
    assert d is not None
    with pytest.raises(ValueError, match="boom"), d:
        raise ValueError("boom")
    (proc,) = named(spans, "process orders")
    assert proc.status.status_code is StatusCode.ERROR
    assert [e.name for e in proc.events] == ["exception"]
    assert (proc.events[0].attributes or {})["exception.type"] == "ValueError"
    (rel,) = named(spans, "release orders")  # the retry policy gave it back
    assert parent_of(rel) == proc.context.span_id
    assert rel.status.status_code is StatusCode.UNSET
    view = q.state(d.msg_id).subscribers["billing"]
    assert (view.state, view.attempt) == (iqbridge.SubscriberState.AVAILABLE, 2)


def test_telemetry_that_fails_changes_nothing_for_the_caller(
    spans: InMemorySpanExporter, hub: iqbridge.Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A span that cannot be written must not cost a get its deliveries, nor replace
    the handler's own exception, nor stop the settle."""
    q = hub.queue("orders")
    q.put(b"x", to=["billing"])
    d = q.get("billing")
    assert d is not None

    def broken_fail(*_a: object) -> None:
        raise RuntimeError("cannot record the exception")

    monkeypatch.setattr(tracing, "_fail", broken_fail)
    with pytest.raises(ValueError, match="boom"), d:  # still the handler's own exception
        raise ValueError("boom")
    view = q.state(d.msg_id).subscribers["billing"]
    assert (view.state, view.attempt) == (iqbridge.SubscriberState.AVAILABLE, 2)

    def broken_span(*_a: object, **_k: object) -> None:
        raise RuntimeError("exporter gone")

    tracer = tracing._tracer
    assert tracer is not None
    original = tracer.start_span
    tracer.start_span = broken_span  # type: ignore[method-assign]
    try:
        again = q.get("billing", timeout=10)  # no get span can start: the delivery comes
        assert again is not None and again.msg_id == d.msg_id
        with again:  # nor can the process span: the settle still happens
            pass
    finally:
        tracer.start_span = original  # type: ignore[method-assign]
    assert q.state(d.msg_id).subscribers["billing"].state is iqbridge.SubscriberState.JOURNALLED


def test_an_error_span_never_carries_a_secret(
    spans: InMemorySpanExporter, hub: iqbridge.Hub
) -> None:
    remember("kafka://h:9092?sasl.password=Tr4ce-S3cret")  # as connect() does
    q = hub.queue("orders")
    q.put(b"x", to=["billing"])
    d = q.get("billing")
    assert d is not None
    why = "cannot reach kafka://h:9092?ssl.key.password=Url-S3cret (driver: Tr4ce-S3cret)"
    with pytest.raises(ValueError), d:
        raise ValueError(why)
    (proc,) = named(spans, "process orders")
    event = dict(proc.events[0].attributes or {})
    shown = "cannot reach kafka://h:9092?ssl.key.password=*** (driver: ***)"
    assert event["exception.message"] == shown
    assert shown in str(event["exception.stacktrace"])
    assert proc.status.description == f"ValueError: {shown}"
    for text in (str(event), str(proc.status.description)):
        assert "S3cret" not in text


def test_a_failed_settle_is_an_error_span(spans: InMemorySpanExporter, hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    q.put(b"x", to=["billing"])
    d = q.get("billing")
    assert d is not None
    d.done()
    with pytest.raises(iqbridge.IQError):
        q.confirm_get(d.confirm_id)  # done twice: an illegal transition
    failed = [s for s in named(spans, "done orders") if s.status.status_code is StatusCode.ERROR]
    assert len(failed) == 1 and failed[0].events[0].name == "exception"


def test_batch_context_manager_is_one_process_span(
    spans: InMemorySpanExporter, hub: iqbridge.Hub
) -> None:
    q = hub.queue("orders")
    q.put_many([b"1", b"2"], to=["s"])
    with q.get_many("s", 10) as batch:
        assert len(batch) == 2
    (proc,) = named(spans, "process orders")
    assert attrs(proc)["messaging.batch.message_count"] == 2
    (done,) = named(spans, "done orders")
    assert parent_of(done) == proc.context.span_id


def test_a_bridge_hop_is_one_span_with_its_parents(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    ids = run_bridge(tmp_path, lambda q: q.put_many([b"1", b"2", b"3"]))
    hops = named(spans, "bridge orders")
    assert hops, [s.name for s in spans.get_finished_spans()]
    assert sorted(p for h in hops for p in attrs(h)["iqbridge.parent_ids"]) == sorted(ids)
    hop = hops[0]
    a = attrs(hop)
    assert hop.kind is SpanKind.CONSUMER
    assert a["messaging.operation.name"] == "bridge"
    assert a["messaging.operation.type"] == "process"
    assert a["messaging.system"] == "iqbridge.sqlite"
    assert a["messaging.consumer.group.name"] == "bridge"
    assert a["iqbridge.bridge.route"] == "r" and a["iqbridge.bridge.destination"] == "copies"
    hop_ids = {h.context.span_id for h in hops}
    puts = named(spans, "put copies")
    assert puts and all(parent_of(p) in hop_ids for p in puts)
    settles = named(spans, "done orders")
    assert settles and all(parent_of(s) in hop_ids for s in settles)


def test_nothing_is_recorded_unless_configured(hub: iqbridge.Hub) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(provider)
    tracing.disable()
    assert not tracing.enabled()
    q = hub.queue("orders")
    q.put(b"x", to=["s"])
    d = q.get("s")
    assert d is not None
    with d:
        pass
    with q.get_many("s", 10):
        pass
    assert exporter.get_finished_spans() == ()
    assert q.state(d.msg_id).subscribers["s"].state is iqbridge.SubscriberState.JOURNALLED


def test_without_opentelemetry_installed_the_facade_works(tmp_path: Path) -> None:
    code = f"""
import sys
sys.modules["opentelemetry"] = None  # as if not installed
import iqbridge
from iqbridge.errors import ConfigurationError
from iqbridge.observability import tracing
with iqbridge.connect("sqlite:///{tmp_path}/n.db") as hub:
    q = hub.queue("orders")
    q.put(b"x", to=["s"])
    with q.get("s"):
        pass
    try:
        tracing.configure()
    except ConfigurationError as exc:
        print("refused:", exc)
    assert not tracing.enabled()
    assert "opentelemetry.trace" not in sys.modules
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert "refused: tracing needs opentelemetry-api" in run.stdout
    assert run.stdout.strip().endswith("ok")


def test_messaging_system_by_scheme() -> None:
    assert tracing.system_of("amqps://u:p@mq:5671/v") == "rabbitmq"
    assert tracing.system_of("amqp://mq") == "rabbitmq"
    assert tracing.system_of("kafka://k:9092") == "kafka"
    assert tracing.system_of("redis://r:6379/0?prefix=x") == "redis"
    assert tracing.system_of("rediss://r:6380/0") == "redis"
    assert tracing.system_of("sqlite:///app.db") == "iqbridge.sqlite"
    assert tracing.system_of("memory://") == "iqbridge.memory"
    assert tracing.system_of("ibmmq://qm1") == "ibm_mq"
    assert tracing.system_of("custom://x") == "custom"
