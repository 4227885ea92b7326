"""Shared by the tracing tests: spans recorded in memory, and an embedded SQLite hub."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import iqbridge
from iqbridge.observability import tracing


@pytest.fixture(name="spans")
def spans_fixture() -> Iterator[InMemorySpanExporter]:
    """Tracing on, every finished span kept in memory; off again afterwards."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


@pytest.fixture(name="hub")
def hub_fixture(tmp_path: Path) -> Iterator[iqbridge.Hub]:
    """A hub on an embedded SQLite queue."""
    with iqbridge.connect(f"sqlite:///{tmp_path}/t.db") as h:
        yield h


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    """The finished spans called ``name``."""
    return [s for s in exporter.get_finished_spans() if s.name == name]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    """A span's attributes as a dict."""
    return dict(span.attributes or {})


def parent_of(span: ReadableSpan) -> int | None:
    """The span id of a span's parent, or None."""
    return span.parent.span_id if span.parent is not None else None


def run_bridge(tmp_path: Path, put: Callable[[iqbridge.Queue], list[str]]) -> list[str]:
    """Run a bridge route ``orders`` (``in.db``) -> ``copies`` (``out.db``) on embedded
    SQLite until what ``put`` put on the source is bridged; return ``put``'s msg_ids."""
    from iqbridge.bridge import Bridge, parse_config

    cfg = {
        "bridge": {"name": "t", "state": f"sqlite:///{tmp_path}/state.db", "heartbeat": 0.1},
        "routes": [
            {
                "name": "r",
                "source": {"url": f"sqlite:///{tmp_path}/in.db", "queue": "orders"},
                "destination": {"url": f"sqlite:///{tmp_path}/out.db", "queue": "copies"},
                "workers": 1,
                "batch": 50,
                "lease": 10,
            }
        ],
    }
    with (
        iqbridge.connect(f"sqlite:///{tmp_path}/in.db") as src,
        iqbridge.connect(f"sqlite:///{tmp_path}/out.db") as dst,
    ):
        src.queue("orders").subscribe("bridge")
        dst.queue("copies").subscribe("sink")
        ids = put(src.queue("orders"))
        with Bridge(parse_config(cfg)) as bridge:
            deadline = time.monotonic() + 20
            while bridge.stats()[0].bridged < len(ids):
                assert time.monotonic() < deadline, "not bridged"
                time.sleep(0.05)
    return ids
