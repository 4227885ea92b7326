"""Browse with lock on Oracle AQ: the index's lock and a LOCKED dequeue in a session the
adapter keeps for the lock. A plain AQ consumer (the fake python-oracledb's own
``connect``, no iqbridge) dequeuing for the same consumer name gets the other messages
and never the locked one until the lock ends: ``unlock``, a get under the lock,
``lock_for``, or the hub closing."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import iqbridge
from iqbridge.adapter import LocksNatively
from iqbridge.adapters.oracle_aq import OracleAQAdapter, ident
from iqbridge.testing.fakes import oracledb as fake
from tests.oracle_helpers import PASSWORD, URL, fake_oracle_fixture  # noqa: F401 (a fixture)

pytestmark = pytest.mark.oracle


@pytest.fixture
def hub(fake_oracle: fake.Database) -> Iterator[iqbridge.Hub]:
    with iqbridge.connect(URL, index="memory://") as h:
        yield h


def plain_get(queue: str, group: str) -> str | None:
    """A plain AQ consumer's dequeue (REMOVE, no wait) for the group's consumer name,
    committed: the body's text, or None."""
    conn: fake.Connection = fake.connect(
        user="iq", password=PASSWORD, dsn="oracle.test:1521/FREEPDB1"
    )
    try:
        q = conn.queue(ident(queue, prefix="IQ_"))  # the adapter's names, as it makes them
        q.deqoptions.wait = fake.DEQ_NO_WAIT
        q.deqoptions.consumername = ident(group, size=30)
        props = q.deqone()
        conn.commit()
        if props is None:
            return None
        raw = bytes(props.payload)
        return raw[8 + int.from_bytes(raw[4:8], "big") :].decode()  # past the frame
    finally:
        conn.close()


def test_the_adapter_locks_natively(hub: iqbridge.Hub) -> None:
    assert isinstance(hub.adapter, LocksNatively)


def test_a_plain_consumer_skips_a_locked_message_until_unlock(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    q.subscribe("billing")
    first = q.put(b"first", to=["billing"])
    q.put(b"second", to=["billing"])
    browse = q.browse(msg_id=first, lock=True)
    assert [m.msg_id for m in browse.messages] == [first] and browse.lock_id
    assert plain_get("orders", "billing") == "second"
    assert plain_get("orders", "billing") is None
    assert q.unlock(browse.lock_id) == 1
    assert plain_get("orders", "billing") == "first"


def test_a_get_under_the_lock_releases_it_and_done_removes_it(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    q.subscribe("billing")
    msg = q.put(b"locked", to=["billing"])
    browse = q.browse(msg_id=msg, lock=True)
    assert q.get("billing", timeout=0) is None
    d = q.get("billing", timeout=0, lock_id=browse.lock_id)
    assert d is not None and d.msg_id == msg and d.body == b"locked"
    adapter = hub.adapter
    assert isinstance(adapter, OracleAQAdapter)
    assert adapter._native_locks == {}
    d.done()
    assert plain_get("orders", "billing") is None


def test_the_lock_ends_after_lock_for(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    q.subscribe("billing")
    msg = q.put(b"short", to=["billing"])
    q.browse(msg_id=msg, lock=True, lock_for=0.3)
    assert plain_get("orders", "billing") is None
    deadline = time.monotonic() + 5.0
    got = None
    while got is None and time.monotonic() < deadline:
        time.sleep(0.05)
        got = plain_get("orders", "billing")
    assert got == "short"


def test_every_group_is_locked_and_closing_the_hub_releases_them(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    q.subscribe("billing")
    q.subscribe("shipping")
    msg = q.put(b"both", to=["billing", "shipping"])
    q.browse(msg_id=msg, lock=True)
    assert [plain_get("orders", g) for g in ("billing", "shipping")] == [None, None]
    hub.adapter.close()
    assert [plain_get("orders", g) for g in ("billing", "shipping")] == ["both", "both"]
