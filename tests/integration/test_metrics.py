"""Prometheus metrics from the index stores (iqbridge.observability.metrics), with real
traffic on an embedded SQLite hub and on a Redis Streams hub: exact gauges, transitions
counted between two scrapes, the REVEALED->DONE histogram (members revealed before the
collector started included, found through their history), redeliveries, the per-scrape
budget, and hubs that cannot be reached (counted, never an exception, no password in the
output)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import iqbridge
from iqbridge.errors import IndexUnavailable
from iqbridge.observability.metrics import IQCollector, build_registry, journal_end, render
from tests.redis_index_helpers import REDIS_URL, drop_streams, fresh_prefix

Snapshot = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(registry: CollectorRegistry) -> Snapshot:
    body, ctype = render(registry)
    assert ctype.startswith("text/plain")
    out: Snapshot = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def val(snap: Snapshot, name: str, **labels: str) -> float | None:
    return snap.get((name, tuple(sorted(labels.items()))))


def delta(a: Snapshot, b: Snapshot, name: str, **labels: str) -> float:
    return (val(b, name, **labels) or 0.0) - (val(a, name, **labels) or 0.0)


def _traffic(hub: iqbridge.Hub) -> None:
    """After the collector started: 3 puts to a and b; a finishes all 4 (one put before
    the collector started); b takes the oldest, releases it, takes it again, finishes."""
    q = hub.queue("orders")
    q.put_many([b"1", b"2", b"3"], to=["a", "b"])
    batch = q.get_many("a", 10, timeout=2.0)
    assert len(batch) == 4
    batch.done()
    first = q.get("b", timeout=2.0)
    assert first is not None
    first.release()
    again = q.get("b", timeout=5.0)
    assert again is not None and again.msg_id == first.msg_id and again.attempt == 2
    again.done()


def _check(hub: iqbridge.Hub, name: str) -> None:
    q = hub.queue("orders")
    q.put(b"0", to=["a", "b"])  # revealed before the collector starts
    registry = build_registry({name: hub})
    before = scrape(registry)
    h = {"hub": name, "queue": "orders"}
    assert val(before, "iqbridge_hub_up", hub=name) == 1
    assert val(before, "iqbridge_publisher_messages", state="REVEALED", **h) == 1
    assert val(before, "iqbridge_subscriber_messages", subscriber="a", state="AVAILABLE", **h) == 1
    assert (
        val(before, "iqbridge_transitions_total", actor_kind="publisher", state="PUT", **h) is None
    )

    _traffic(hub)
    after = scrape(registry)

    # Gauges: exact, from the index.
    assert val(after, "iqbridge_queue_messages", **h) == 4
    assert val(after, "iqbridge_publisher_messages", state="REVEALED", **h) == 3
    assert val(after, "iqbridge_publisher_messages", state="JOURNALLED", **h) == 1
    assert val(after, "iqbridge_publisher_messages", state="PUT", **h) == 0
    assert val(after, "iqbridge_subscriber_messages", subscriber="a", state="JOURNALLED", **h) == 4
    assert val(after, "iqbridge_subscriber_messages", subscriber="a", state="AVAILABLE", **h) == 0
    assert val(after, "iqbridge_subscriber_messages", subscriber="b", state="AVAILABLE", **h) == 3
    assert val(after, "iqbridge_subscriber_messages", subscriber="b", state="JOURNALLED", **h) == 1
    age = val(after, "iqbridge_oldest_undone_age_seconds", subscriber="b", **h)
    assert age is not None and 0 <= age < 120
    assert val(after, "iqbridge_oldest_undone_age_seconds", subscriber="a", **h) is None

    # Transitions between the two scrapes, by target state.
    def moved(kind: str, state: str) -> float:
        return delta(before, after, "iqbridge_transitions_total", actor_kind=kind, state=state, **h)

    assert moved("publisher", "PUT") == 3
    assert moved("publisher", "REVEALED") == 3
    assert moved("publisher", "JOURNALLED") == 1
    assert moved("subscriber", "AVAILABLE") == 6 + 1  # 3 puts x 2 members, 1 release
    assert moved("subscriber", "GET") == 4 + 2
    assert moved("subscriber", "FETCHED") == 4 + 2
    assert moved("subscriber", "DONE") == 4 + 1
    assert moved("subscriber", "JOURNALLED") == 4 + 1

    # REVEALED -> DONE: a's four (one revealed before the tail began: from its history),
    # b's one, timed from its AVAILABLE on attempt 2.
    count = "iqbridge_revealed_to_done_seconds_count"
    assert val(after, count, subscriber="a", **h) == 4
    assert val(after, count, subscriber="b", **h) == 1
    inf = val(after, "iqbridge_revealed_to_done_seconds_bucket", subscriber="a", le="+Inf", **h)
    assert inf == 4
    assert val(after, "iqbridge_redeliveries_total", subscriber="b", **h) == 1
    assert val(after, "iqbridge_redeliveries_total", subscriber="a", **h) is None

    # Nothing new: the counters stay (nothing counted twice).
    again = scrape(registry)
    for key, value in after.items():
        if key[0].endswith(("_total", "_count", "_bucket")):
            assert again[key] == value, key
    assert val(again, "iqbridge_index_errors_total", hub=name) == 0
    assert val(again, "iqbridge_broker_errors_total", hub=name) == 0


def test_sqlite_hub_gauges_transitions_latency_and_redeliveries(tmp_path: Path) -> None:
    with iqbridge.connect(f"sqlite:///{tmp_path}/m.db") as hub:
        _check(hub, "embedded")


@pytest.fixture
def redis_url() -> Iterator[str]:
    with fresh_prefix("metrics") as prefix:
        try:
            yield f"{REDIS_URL}?prefix={prefix}&stream_prefix={prefix}:"
        finally:
            drop_streams(f"{prefix}:")


@pytest.mark.redis
def test_redis_streams_hub_has_the_same_metrics(redis_url: str) -> None:
    with iqbridge.connect(redis_url) as hub:
        _check(hub, "streams")


def test_the_tail_starts_at_the_end_and_a_small_budget_catches_up_over_scrapes(
    tmp_path: Path,
) -> None:
    with iqbridge.connect(f"sqlite:///{tmp_path}/m.db") as hub:
        q = hub.queue("orders")
        q.put_many([b"x"] * 5, to=["a"])  # revealed before the collector starts
        assert journal_end(hub.store) == hub.journal(limit=10_000)[-1].seq
        registry = build_registry({"h": hub}, page_size=2, max_pages=1, max_lookups=1)
        h = {"hub": "h", "queue": "orders"}
        for d in q.get_many("a", 10):
            d.done()
        counts: list[float | None] = []
        for _ in range(30):  # 5 x (GET, FETCHED, DONE, JOURNALLED) + publisher JOURNALLED
            snap = scrape(registry)
            counts.append(val(snap, "iqbridge_revealed_to_done_seconds_count", subscriber="a", **h))
        # At most one history lookup per scrape: the five DONEs are timed one by one.
        assert counts[0] is None or counts[0] <= 1
        assert counts[-1] == 5
        done = val(snap, "iqbridge_transitions_total", actor_kind="subscriber", state="DONE", **h)
        assert done == 5
        assert (
            val(snap, "iqbridge_transitions_total", actor_kind="publisher", state="PUT", **h)
            is None
        )


def test_journal_end_on_an_empty_and_a_memory_store(tmp_path: Path) -> None:
    with iqbridge.connect(f"sqlite:///{tmp_path}/e.db") as hub:
        assert journal_end(hub.store) == 0
    with iqbridge.connect("memory://") as hub:
        assert journal_end(hub.store) == 0
        hub.queue("q").put_many([b"1", b"2"], to=["s"])
        assert journal_end(hub.store) == hub.journal()[-1].seq


def test_unreachable_hubs_are_counted_and_the_others_still_scraped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub given by URL is connected lazily, at scrape time: one that cannot be reached
    is hub_up 0 with a broker error per scrape; an index that fails is an index error."""
    caplog.set_level(logging.DEBUG, logger="iqbridge.metrics")
    with iqbridge.connect(f"sqlite:///{tmp_path}/m.db") as hub:
        hub.queue("orders").put(b"x", to=["a"])
        collector = IQCollector({"down": "redis://:pw@127.0.0.1:1/0", "ok": hub})
        registry = CollectorRegistry()
        registry.register(collector)
        try:
            first = scrape(registry)
            second = scrape(registry)
            assert val(first, "iqbridge_hub_up", hub="down") == 0
            assert val(first, "iqbridge_broker_errors_total", hub="down") == 1
            assert val(second, "iqbridge_broker_errors_total", hub="down") == 2
            assert val(second, "iqbridge_index_errors_total", hub="down") == 0
            assert val(second, "iqbridge_hub_up", hub="ok") == 1
            h = {"hub": "ok", "queue": "orders"}
            assert val(second, "iqbridge_publisher_messages", state="REVEALED", **h) == 1
            body, _ = render(registry)
            assert b"pw" not in body
            assert "pw" not in caplog.text and "***" in caplog.text

            def broken() -> list[str]:
                raise IndexUnavailable("index at sqlite:///x is gone")

            monkeypatch.setattr(hub.store, "queues", broken)
            third = scrape(registry)
            assert val(third, "iqbridge_hub_up", hub="ok") == 0
            assert val(third, "iqbridge_index_errors_total", hub="ok") == 1
            assert val(third, "iqbridge_publisher_messages", state="REVEALED", **h) is None
            monkeypatch.undo()
            fourth = scrape(registry)
            assert val(fourth, "iqbridge_hub_up", hub="ok") == 1
            assert val(fourth, "iqbridge_index_errors_total", hub="ok") == 1
        finally:
            collector.close()


@pytest.mark.postgres
def test_a_transition_committed_behind_the_cursor_is_counted_on_postgres(
    tmp_path: Path,
) -> None:
    """On the SQL store a journal entry's number is taken when its transaction writes:
    a DONE written in a long application transaction commits after later entries the
    tail has already passed. The tail remembers the gap and counts it once it commits."""
    import sqlalchemy as sa

    from tests.sql_helpers import PG_URL, fresh_schema, sa_url

    with (
        fresh_schema(PG_URL, "PostgreSQL at 127.0.0.1:5432") as index,
        iqbridge.connect(f"sqlite:///{tmp_path}/q.db", index=index) as hub,
    ):
        app = sa.create_engine(sa_url(PG_URL))
        q = hub.queue("orders")
        registry = build_registry({"h": hub})
        h = {"hub": "h", "queue": "orders"}

        def done_count() -> float | None:
            return val(
                scrape(registry),
                "iqbridge_transitions_total",
                actor_kind="subscriber",
                state="DONE",
                **h,
            )

        q.put(b"first", to=["a"])
        d = q.get("a")
        assert d is not None
        with q.transaction(app) as tx:
            d.done(transaction=tx)  # DONE's journal rows get their numbers now
            q.put(b"second", to=["b"])  # committed at once, with later numbers
            assert done_count() is None  # the tail passes DONE's numbers: not committed
        assert done_count() == 1  # committed behind the cursor: counted now
        assert done_count() == 1  # and only once
        app.dispose()
