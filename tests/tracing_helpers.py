"""Shared by the tracing tests: spans recorded in memory, and an embedded SQLite hub."""

from __future__ import annotations

from collections.abc import Iterator
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
