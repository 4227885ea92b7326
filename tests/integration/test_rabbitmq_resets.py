"""RabbitMQ when the connection is reset in the middle of a publish window (issue 27,
point 15), through :class:`~iqbridge.testing.proxy.FaultProxy` in front of the real
broker; what reached it is counted with pika, straight from the group's queue.

Each test puts 10 windows of 100 messages (4 ordering keys, msg_ids: what a bridge
puts); in 5 of them the connection is cut after 10% to 70% of the window's bytes reached
the broker.

* With ``ledger=true``, the publisher confirms of what got through lost with the
  connection (in doubt, all of it): the retry publishes only what the ledger stream does
  not hold; every msg_id is in the queue once, each key in put order.
* Without a ledger, the confirms of what got through reach the client before the reset:
  those messages are never published again; the rest is in doubt (the broker cannot say
  what it took of it) and is published again, and logged. Every msg_id is there, copies
  only of messages in doubt, and each key's first copies in put order.

Before the fix the whole window was published again after each cut, confirmed messages
included, ledger or not.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pika
import pytest
from rabbitmq_helpers import AMQP_URL, fresh_prefix, remember, url_with

import iqbridge
from iqbridge.putting import Outgoing
from iqbridge.testing.proxy import FaultProxy
from iqbridge.testing.servers import address

pytestmark = pytest.mark.rabbitmq

KEYS = ("k0", "k1", "k2", "k3")
WINDOWS = 10
PER_WINDOW = 100


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    host, port = address("rabbitmq", AMQP_URL)
    with FaultProxy(host, port) as p:
        yield p


def _put_windows(hub: iqbridge.Hub, proxy: FaultProxy, *, replies: bool = False) -> None:
    q = hub.queue("orders")
    q.subscribe("a")
    seq = dict.fromkeys(KEYS, 0)
    size = 0
    for window in range(WINDOWS):
        batch = []
        for i in range(PER_WINDOW):
            k = KEYS[i % len(KEYS)]
            batch.append(
                Outgoing(
                    {"k": k, "n": seq[k], "pad": "x" * 200}, msg_id=f"w{window}-{i}", ordering_key=k
                )
            )
            seq[k] += 1
        if window % 2:
            # Cut after 10% to 70% of a window's bytes (as the first one measured).
            proxy.cut_after(size * (1 + (window * 3) % 7) // 10, replies=replies, hold=1.0)
        before = proxy.client_bytes
        q.put_each(batch)
        if window == 0:
            size = proxy.client_bytes - before
        assert not proxy.armed
    assert proxy.cuts == 5


def _queued(queue: str) -> list[tuple[str, dict[str, object]]]:
    """(message_id, body) of every message in the queue, in queue order (left there)."""
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        ch = conn.channel()
        out: list[tuple[str, dict[str, object]]] = []
        last = 0
        while True:
            method, props, body = ch.basic_get(queue, auto_ack=False)
            if method is None:
                break
            last = method.delivery_tag
            out.append((props.message_id, orjson.loads(body)))
        if last:
            ch.basic_nack(last, multiple=True, requeue=True)
        return out
    finally:
        conn.close()


def _first_copies_in_order(queued: list[tuple[str, dict[str, object]]]) -> None:
    seen: set[str] = set()
    last: dict[object, int] = {}
    for mid, body in queued:
        if mid in seen:
            continue
        seen.add(mid)
        n = body["n"]
        assert isinstance(n, int)
        assert n > last.get(body["k"], -1), f"key {body['k']} out of order at {body}"
        last[body["k"]] = n


def test_with_a_ledger_a_cut_window_leaves_one_copy_of_each_message(
    proxy: FaultProxy, tmp_path: Path
) -> None:
    with fresh_prefix("resets") as prefix:
        url = proxy.url(url_with(prefix, ledger="true", retry_for="20"))
        with iqbridge.connect(url, index=f"sqlite:///{tmp_path}/index.db") as hub:
            try:
                _put_windows(hub, proxy)
            finally:
                remember(hub.adapter)
        queued = _queued(f"{prefix}orders.a")
    copies = Counter(mid for mid, _ in queued)
    twice = {m: n for m, n in copies.items() if n > 1}
    assert not twice, f"{len(twice)} messages are in the queue more than once"
    assert len(copies) == WINDOWS * PER_WINDOW
    _first_copies_in_order(queued)


def test_without_a_ledger_only_messages_in_doubt_are_published_again(
    proxy: FaultProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="iqbridge.adapters.rabbitmq")
    with fresh_prefix("resets") as prefix:
        url = proxy.url(url_with(prefix, retry_for="20"))
        with iqbridge.connect(url, index=f"sqlite:///{tmp_path}/index.db") as hub:
            try:
                _put_windows(hub, proxy, replies=True)
            finally:
                remember(hub.adapter)
        queued = _queued(f"{prefix}orders.a")
    in_doubt = sum(
        int(m.group(1))
        for r in caplog.records
        if (m := re.search(r"(\d+) message\(s\) in doubt", r.getMessage()))
    )
    copies = Counter(mid for mid, _ in queued)
    extra = sum(n - 1 for n in copies.values())
    assert len(copies) == WINDOWS * PER_WINDOW
    assert extra <= in_doubt, (
        f"{extra} extra copies, but only {in_doubt} messages were in doubt: confirmed "
        f"messages were published again"
    )
    print(f"without a ledger: {extra} extra copies, {in_doubt} messages were in doubt")
    # Of the 5 cut windows' 500 messages, those confirmed before the cut are not in doubt.
    assert 0 < in_doubt < 5 * PER_WINDOW
    _first_copies_in_order(queued)
