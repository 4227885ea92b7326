"""A Kafka put produces first and then commits the index once (issue 28, point 4), on the
session's Tansu broker with an SQLite index.

* One index commit per put: the records with their native references (before: the
  records, then their references in a second commit, each with an fsync); a batch of
  gets is claimed in one commit of the batch engine's writes.
* A get that reads a record while its put is between the broker and the index (produced,
  its index record not committed yet) gives it back, and delivers it once the record is
  there: nothing lost, nothing delivered before its record exists.
* A record with an iqbridge envelope whose index record never came, older than the put
  window (a putter killed between the broker and the index long ago, or a purge), is
  acknowledged as purged, never delivered, and its group goes on past it.
* A put the broker refuses is recorded withdrawn: a get acknowledges the records the
  broker took, and none is delivered.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import iqbridge
from iqbridge.adapters.kafka import KafkaAdapter
from iqbridge.errors import BrokerRefused
from iqbridge.model import Envelope
from iqbridge.putting import SEND_FIRST_WINDOW
from iqbridge.states import PublisherState
from tests.kafka_helpers import fresh_prefix, kafka_url

pytestmark = pytest.mark.kafka

WRITES = (
    "commit",
    "commit_many",
    "commit_each",
    "commit_writes",
    "set_native_ref",
    "set_native_refs",
    "claim_received",
    "settle_held",
)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[iqbridge.Hub]:
    with iqbridge.connect(
        kafka_url(fresh_prefix("put")), index=f"sqlite:///{tmp_path / 'i.db'}"
    ) as h:
        yield h


def _count_writes(hub: iqbridge.Hub, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The store's write calls from now on, by name."""
    calls: list[str] = []
    for name in WRITES:
        real = getattr(hub.store, name)

        def wrapped(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls.append(_name)
            return _real(*args, **kw)

        monkeypatch.setattr(hub.store, name, wrapped)
    return calls


def test_a_put_commits_the_index_once_with_the_native_refs(
    hub: iqbridge.Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = hub.queue("orders")
    q.subscribe("a")
    q.put(b"warm-up")  # the topic and the producer exist
    calls = _count_writes(hub, monkeypatch)
    ids = q.put_many([b"%d" % i for i in range(50)])
    assert calls == ["commit_writes"]
    refs = [hub.store.load(i).native_ref for i in ids]
    assert all(refs), refs
    assert len(set(refs)) == 50
    calls.clear()
    one = q.put(b"one")
    assert calls == ["commit_writes"]
    assert hub.store.load(one).native_ref
    # The gets claim each batch in one call where the index keeps the messages, the dones
    # settle there, and no native references are written: the records have theirs.
    calls.clear()
    got = q.get_many("a", 100, timeout=10)
    bodies = {d.body for d in got}
    while len(bodies) < 52:
        more = q.get_many("a", 100, timeout=10)
        assert len(more), f"only {len(bodies)} of 52 arrived"
        got.done()
        got = more
        bodies |= {d.body for d in more}
    got.done()
    assert bodies == {b"warm-up", b"one", *(b"%d" % i for i in range(50))}
    assert set(calls) == {"claim_received", "settle_held"}, calls


def test_a_get_during_the_put_gives_the_record_back_until_its_index_record_is_there(
    hub: iqbridge.Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = hub.queue("orders")
    q.subscribe("a")
    q.put(b"warm-up", ordering_key="k")
    first = q.get("a", timeout=10)
    assert first is not None and first.body == b"warm-up"
    first.done()
    # The put stops between the broker and the index until the test lets it go on.
    produced, go_on = threading.Event(), threading.Event()
    real = hub.store.commit_writes

    def held(writes: Any) -> list[bool]:
        if writes.created:
            produced.set()
            assert go_on.wait(30)
        return real(writes)

    monkeypatch.setattr(hub.store, "commit_writes", held)
    out: list[list[str]] = []
    putter = threading.Thread(
        target=lambda: out.append(q.put_many([b"m0", b"m1", b"m2"], ordering_key="k"))
    )
    putter.start()
    try:
        assert produced.wait(30)
        # The records are on the broker, the index has none of them: not delivered.
        for _ in range(5):
            assert q.get("a", timeout=0.3) is None
        assert len(q.get_many("a", 10, timeout=0.3)) == 0
    finally:
        go_on.set()
        putter.join(30)
    ids = out[0]
    seen: list[bytes] = []
    while len(seen) < 3:
        d = q.get("a", timeout=10)
        assert d is not None, f"only {seen} arrived after the put committed"
        assert d.msg_id == ids[len(seen)]
        seen.append(d.body)
        d.done()
    assert seen == [b"m0", b"m1", b"m2"]  # in key order
    assert q.get("a", timeout=0.5) is None


def test_an_old_record_without_its_index_record_is_acknowledged_not_delivered(
    hub: iqbridge.Hub, caplog: pytest.LogCaptureFixture
) -> None:
    q = hub.queue("orders")
    q.subscribe("a")
    adapter = hub.adapter
    assert isinstance(adapter, KafkaAdapter)
    now = hub.now_us()
    old = now - int(2 * SEND_FIRST_WINDOW * 1_000_000) - 1_000_000
    # Produced by a putter killed before its index commit, long ago (or purged since).
    orphan = Envelope(msg_id="orphan-1", body=b"orphan", put_at=old, groups=("a",))
    adapter.send("orders", [orphan])
    after = q.put(b"after")
    with caplog.at_level(logging.WARNING, logger="iqbridge"):
        d = q.get("a", timeout=10)
    assert d is not None and d.msg_id == after
    d.done()
    assert "orphan-1 has no index record" in caplog.text
    assert q.get("a", timeout=0.5) is None


def test_a_refused_put_is_recorded_withdrawn_and_never_delivered(
    hub: iqbridge.Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = hub.queue("orders")
    q.subscribe("a")
    q.put(b"warm-up")
    warm = q.get("a", timeout=10)
    assert warm is not None
    warm.done()
    adapter = hub.adapter
    assert isinstance(adapter, KafkaAdapter)
    real = adapter.send
    taken: list[str] = []

    def half(queue: str, envelopes: list[Envelope]) -> list[str]:
        taken.extend(e.msg_id for e in envelopes[:2])
        real(queue, envelopes[:2])  # the broker took two, then refused
        raise BrokerRefused("refused (test)")

    monkeypatch.setattr(adapter, "send", half)
    with pytest.raises(BrokerRefused):
        q.put_many([b"r0", b"r1", b"r2"])
    monkeypatch.setattr(adapter, "send", real)
    assert len(taken) == 2
    for msg_id in taken:
        rec = hub.store.load(msg_id)
        assert rec.withdrawn
        assert rec.publisher_state in (PublisherState.UNAVAILABLE, PublisherState.JOURNALLED)
    after = q.put(b"after")
    d = q.get("a", timeout=10)
    assert d is not None and d.msg_id == after  # the two taken records were acknowledged
    d.done()
    assert q.get("a", timeout=0.5) is None


def test_two_entries_of_one_message_in_one_batch_make_one_delivery(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    q.subscribe("a")
    adapter = hub.adapter
    assert isinstance(adapter, KafkaAdapter)
    q.put(b"dup", msg_id="dup-1")
    # A second entry of the same message (an idempotent put repeated after the broker took
    # the first, before its reference was recorded).
    adapter.send("orders", [Envelope(msg_id="dup-1", body=b"dup", put_at=hub.now_us())])
    q.put(b"next")
    time.sleep(1.0)  # the group's consumer reads all three: one batch holds both entries
    got = q.get_many("a", 10, timeout=10)
    seen = [d.msg_id for d in got]
    got.done()
    while True:
        more = q.get_many("a", 10, timeout=1)
        if not len(more):
            break
        seen += [d.msg_id for d in more]
        more.done()
    assert seen.count("dup-1") == 1, seen
    assert len(seen) == 2, seen
    journal = q.state("dup-1").journal
    assert [e.dst for e in journal if e.actor == "a"].count("DONE") == 1, journal
    assert [e.dst for e in journal if e.actor == "a"].count("GET") == 1, journal
