"""Drop-in over existing Redis Streams traffic (issue 3, point 6), both directions, on the
real Redis server.

* A producer that knows nothing of iqbridge ``XADD``s plain entries onto the queue's
  stream. iqbridge adopts each on first sight: its msg_id is derived from the stream key
  and entry id (the same in every process), and it is tracked from then on for every
  member of the queue's standing audience (two named subscribers and a pool of two),
  each of whom gets it once and never again.
* A consumer that knows nothing of iqbridge reads, in a consumer group of its own,
  what iqbridge put on the same stream: the payload bytes unchanged in the field
  ``payload``, the envelope beside it in ``iq-*`` fields.

Nothing is mocked: the legacy side is plain redis-py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

import iqbridge
from iqbridge import PublisherState, SubscriberState
from iqbridge.adapters.redis_streams import RedisStreamsAdapter
from iqbridge.ids import adopted_id
from iqbridge.states import ActorKind
from tests.redis_index_helpers import REDIS_URL, drop_streams, fresh_prefix

pytestmark = pytest.mark.redis

P = PublisherState
S = SubscriberState
QUEUE = "orders"
SUBSCRIBERS = ("billing", "audit", "ship-1", "ship-2")
POOL = ("ship-1", "ship-2")


@dataclass
class Setup:
    """One test's iqbridge URL, the queue's stream key and a plain redis-py client."""

    url: str
    key: str
    raw: redis.Redis


@pytest.fixture
def setup() -> Iterator[Setup]:
    with fresh_prefix("legacy") as prefix:
        stream_prefix = f"{prefix}:"
        raw = redis.Redis.from_url(REDIS_URL)
        try:
            yield Setup(
                url=f"{REDIS_URL}?prefix={prefix}&stream_prefix={stream_prefix}",
                key=f"{stream_prefix}{QUEUE}",
                raw=raw,
            )
        finally:
            raw.close()
            drop_streams(stream_prefix)


def _declare(hub: iqbridge.Hub) -> iqbridge.Queue:
    q = hub.queue(QUEUE)
    q.subscribe("billing", "audit")
    q.subscribe_pool("ship", list(POOL))
    return q


def _get_in_another_process(url: str, subscriber: str) -> list[dict[str, str]]:
    """Every message ``subscriber`` gets in a fresh Python process (done at once)."""
    code = textwrap.dedent(
        f"""
        import json, iqbridge
        with iqbridge.connect({url!r}, publisher="other-process") as hub:
            q = hub.queue({QUEUE!r})
            while (d := q.get({subscriber!r}, timeout=0.5)) is not None:
                print(json.dumps({{"msg_id": d.msg_id, "body": d.body.hex(),
                                  "ct": d.content_type, "publisher": d.publisher}}))
                d.done()
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in run.stdout.splitlines()]


def test_entries_of_a_legacy_producer_are_adopted_and_tracked(setup: Setup) -> None:
    raw, key = setup.raw, setup.key
    # The legacy producer was there first: the stream exists before iqbridge opens it.
    ref_payload = raw.xadd(key, {"payload": b"\x00\x01 raw bytes \xff"}).decode()
    with iqbridge.connect(setup.url, publisher="shop") as hub:
        q = _declare(hub)
        ref_fields = raw.xadd(key, {"order": "7", "total": "9.5"}).decode()
        ref_single = raw.xadd(key, {"text": "only field"}).decode()
        refs = [ref_payload, ref_fields, ref_single]
        expected = [adopted_id("redis-streams", key, ref) for ref in refs]
        assert len(set(expected)) == 3

        # First sight: billing's get adopts each entry, under the derived id.
        first = q.get("billing")
        assert first is not None
        assert first.msg_id == expected[0]
        assert first.body == b"\x00\x01 raw bytes \xff"
        assert first.payload == b"\x00\x01 raw bytes \xff"
        assert first.content_type == "application/octet-stream"
        assert first.publisher == "(legacy)"
        # Tracked from first sight for the whole standing audience, not only billing.
        seen = q.state(first.msg_id)
        assert seen.publisher == "(legacy)"
        assert seen.publisher_state is P.REVEALED
        assert {n: v.state for n, v in seen.subscribers.items()} == {
            "billing": S.FETCHED,
            "audit": S.AVAILABLE,
            "ship-1": S.AVAILABLE,
            "ship-2": S.AVAILABLE,
        }
        assert seen.subscribers["ship-1"].pool == "ship"
        assert hub.store.load(first.msg_id).native_ref == ref_payload
        first.done()

        billing = [first]
        while (d := q.get("billing")) is not None:
            billing.append(d)
            d.done()
        assert [d.msg_id for d in billing] == expected
        fields = billing[1]
        assert fields.content_type == "application/json"
        assert fields.payload == {"order": "7", "total": "9.5"}  # every field, as JSON
        assert billing[2].body == b"only field"  # a single field is the payload

        # Another process derives the same ids: audit gets each once, tracked, not re-adopted.
        audit = _get_in_another_process(setup.url, "audit")
        assert [a["msg_id"] for a in audit] == expected
        assert [bytes.fromhex(a["body"]) for a in audit] == [d.body for d in billing]
        assert {a["publisher"] for a in audit} == {"(legacy)"}

        # The pool: one member each, through a second hub of this process and this one.
        with iqbridge.connect(setup.url, publisher="shop") as hub2:
            q2 = hub2.queue(QUEUE)
            won: dict[str, str] = {}
            for member, queue in (("ship-1", q2), ("ship-2", q), ("ship-1", q2)):
                d = queue.get(member)
                assert d is not None, member
                won[d.msg_id] = member
                d.done()
            assert set(won) == set(expected)
            assert q2.get("ship-1") is None
            assert q.get("ship-2") is None

        for msg_id in expected:
            st = q.state(msg_id)
            assert st.publisher_state is P.JOURNALLED
            assert [s for s, _ in st.publisher_history] == [P.PUT, P.REVEALED, P.JOURNALLED]
            for name in ("billing", "audit", won[msg_id]):
                view = st.subscribers[name]
                assert [s for s, _ in view.history] == [
                    S.AVAILABLE,
                    S.GET,
                    S.FETCHED,
                    S.DONE,
                    S.JOURNALLED,
                ], (msg_id, name)
            loser = next(m for m in POOL if m != won[msg_id])
            assert [s for s, _ in st.subscribers[loser].history] == [
                S.AVAILABLE,
                S.EXPIRED,
                S.JOURNALLED,
            ]
            stamps = [t for _, t in st.subscribers["billing"].history]
            assert stamps == sorted(stamps)

        # A second delivery never happens: make every group hand every entry out again
        # (as after a lost XACK), and open a fresh hub as a restarted consumer would.
        adapter = hub.adapter
        assert isinstance(adapter, RedisStreamsAdapter)
        for group in ("billing", "audit", "ship"):
            for ref in refs:
                adapter.redeliver(QUEUE, group, ref)
        with iqbridge.connect(setup.url) as hub3:
            q3 = hub3.queue(QUEUE)
            for name in SUBSCRIBERS:
                assert q3.get(name) is None, name
        for name in SUBSCRIBERS:
            assert q.get(name) is None, name
        for group in ("billing", "audit", "ship"):
            assert adapter.pending(QUEUE, group) == {}, group

        done = Counter(
            (e.msg_id, e.actor)
            for e in hub.journal(limit=10_000)
            if e.actor_kind is ActorKind.SUBSCRIBER and e.dst == S.DONE.value
        )
        assert done == Counter({(m, n): 1 for m in expected for n in ("billing", "audit", won[m])})
        # One record per entry: the legacy stream was not copied or rewritten.
        assert raw.xlen(key) == 3
        assert len(q.search(publisher="(legacy)")) == 3


def test_a_legacy_producer_entry_is_adopted_once_by_concurrent_first_sights(
    setup: Setup,
) -> None:
    """Two hubs seeing the same new entry at once (two members of one queue's audience)
    create one record between them, under one id."""
    raw, key = setup.raw, setup.key
    with (
        iqbridge.connect(setup.url) as hub1,
        iqbridge.connect(setup.url) as hub2,
    ):
        q1 = _declare(hub1)
        q2 = hub2.queue(QUEUE)
        ref = raw.xadd(key, {"payload": "hello"}).decode()
        a = q1.get("billing")
        b = q2.get("audit")
        assert a is not None and b is not None
        assert a.msg_id == b.msg_id == adopted_id("redis-streams", key, ref)
        created = [
            e
            for e in hub1.store.history(a.msg_id)
            if e.actor_kind is ActorKind.PUBLISHER and e.dst == P.PUT.value
        ]
        assert len(created) == 1
        a.done()
        b.done()
        st = q1.state(a.msg_id)
        assert st.subscribers["billing"].state is S.JOURNALLED
        assert st.subscribers["audit"].state is S.JOURNALLED
        assert st.publisher_state is P.REVEALED  # the pool has not had it yet


def test_a_legacy_consumer_reads_iqbridge_puts_unchanged(setup: Setup) -> None:
    raw, key = setup.raw, setup.key
    with iqbridge.connect(setup.url, publisher="shop") as hub:
        q = _declare(hub)
        # A consumer that knows nothing of iqbridge, in a group of its own, same stream.
        raw.xgroup_create(key, "legacy-reader", id="0")
        payloads: list[object] = [
            b"\x00\xff binary \r\n",
            "text: caf\u00e9",
            {"order": 1, "n": [2]},
        ]
        wire = [b"\x00\xff binary \r\n", "text: caf\u00e9".encode(), b'{"order":1,"n":[2]}']
        ids = [
            q.put(p, correlation_id="cart-7", priority=7, headers={"trace": "t-9"})
            for p in payloads
        ]

        reply = raw.xreadgroup("legacy-reader", "c1", {key: ">"}, count=10)
        [(stream, entries)] = reply
        assert stream == key.encode()
        assert [fields[b"payload"] for _ref, fields in entries] == wire
        for (ref, fields), msg_id, ctype in zip(
            entries,
            ids,
            ["application/octet-stream", "text/plain; charset=utf-8", "application/json"],
            strict=True,
        ):
            assert isinstance(fields[b"payload"], bytes)
            assert fields[b"iq-id"] == msg_id.encode()
            assert fields[b"iq-ct"] == ctype.encode()
            assert fields[b"iq-pub"] == b"shop"
            assert fields[b"iq-corr"] == b"cart-7"
            assert fields[b"iq-prio"] == b"7"
            assert fields[b"iq-h-trace"] == b"t-9"
            assert set(fields[b"iq-to"].split()) == {b"billing", b"audit", b"ship"}
            # Everything but the payload is envelope, under iq-* names only.
            assert all(f == b"payload" or f.startswith(b"iq-") for f in fields)
            assert hub.store.load(msg_id).native_ref == ref.decode()
        assert json.loads(entries[2][1][b"payload"]) == payloads[2]
        raw.xack(key, "legacy-reader", *[ref for ref, _ in entries])

        # The legacy reader takes nothing from iqbridge's subscribers.
        for name in ("billing", "audit"):
            got = []
            while (d := q.get(name)) is not None:
                got.append(d.payload)
                d.done()
            assert got == payloads, name
        assert raw.xpending(key, "legacy-reader")["pending"] == 0
        assert raw.xreadgroup("legacy-reader", "c1", {key: ">"}, count=10) == []
        for msg_id in ids:
            assert q.state(msg_id).subscribers["billing"].state is S.JOURNALLED


def test_the_adopted_id_does_not_depend_on_how_a_client_spells_its_url(setup: Setup) -> None:
    """The facade's own fallback would derive an adopted id from the adapter's URL; the
    adapter derives it from the stream key and entry id alone, so hubs that name the same
    server differently (host alias, other options) still share one record."""
    raw, key = setup.raw, setup.key
    other_url = setup.url.replace("127.0.0.1", "localhost") + "&retry_for=5&socket_timeout=3"
    assert other_url != setup.url
    with (
        iqbridge.connect(setup.url) as hub1,
        iqbridge.connect(other_url) as hub2,
    ):
        assert hub1.adapter.url != hub2.adapter.url
        q1 = _declare(hub1)
        q2 = hub2.queue(QUEUE)
        ref = raw.xadd(key, {"payload": b"x"}).decode()
        a = q1.get("billing")
        b = q2.get("audit")
        assert a is not None and b is not None
        assert a.msg_id == b.msg_id == adopted_id("redis-streams", key, ref)
        a.done()
        b.done()
        assert len(q1.search(publisher="(legacy)")) == 1
        st = q2.state(a.msg_id)
        assert st.subscribers["billing"].state is S.JOURNALLED
        assert st.subscribers["audit"].state is S.JOURNALLED


def test_an_entry_with_fields_that_are_not_text_is_still_read(setup: Setup) -> None:
    """A foreign producer wrote ``iq-*`` fields that are not UTF-8 (the receive script
    passes them through into its JSON reply): the entry is still read, undecodable bytes
    become U+FFFD and the payload stays as it was."""
    with iqbridge.connect(setup.url) as hub:
        adapter = hub.adapter
        assert isinstance(adapter, RedisStreamsAdapter)
        adapter.declare(QUEUE, ["g"])
        ref = setup.raw.xadd(
            setup.key, {"payload": b"\x00\xffbody", "iq-id": "x-1", "iq-h-bin": b"\xff\xfe"}
        ).decode()
        got = adapter.receive(QUEUE, "g", "c", count=1, timeout=0)
        assert [r.native_ref for r in got] == [ref]
        env = got[0].envelope
        assert env.msg_id == "x-1"
        assert env.body == b"\x00\xffbody"
        assert env.headers == {"bin": "\ufffd\ufffd"}
        assert not got[0].adopted
