"""Browse with lock on IBM MQ: the index's lock and MQGMO_LOCK on the queue manager.

A plain MQ application (the fake client's own ``connect``, no iqbridge) reads the same
group queue: while ``queue.browse(lock=True)`` holds a message it gets the others and
never that one; once the lock ends (``unlock``, a get under the lock, ``lock_for``, the
hub closing) it gets it. Against the in-process fake of the ``ibmmq`` client
(``iqbridge.testing.fakes.ibmmq``), which models MQGMO_LOCK per open handle.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import iqbridge
from iqbridge.adapter import LocksNatively
from iqbridge.adapters.ibmmq import IbmMqAdapter
from iqbridge.testing.fakes import ibmmq as fake
from iqbridge.testing.fakes.ibmmq_defs import CMQC as C
from tests.ibmmq_helpers import URL, mq_client, qm_fixture  # noqa: F401 (a fixture)

pytestmark = pytest.mark.ibmmq


@pytest.fixture
def hub(qm: fake.FakeQueueManager, tmp_path: Path) -> Iterator[iqbridge.Hub]:
    """A hub on a fresh fake queue manager QM1 (the fake installed as ``ibmmq``)."""
    with iqbridge.connect(URL, index=f"sqlite:///{tmp_path / 'index.db'}") as h:
        yield h


def plain_get(name: str) -> str | None:
    """A plain MQ client's destructive get (no syncpoint): the body, or None (2033)."""
    qmgr = mq_client()
    try:
        q = fake.Queue(qmgr, name, C.MQOO_INPUT_SHARED)
        gmo = fake.GMO(Options=C.MQGMO_NO_SYNCPOINT | C.MQGMO_NO_WAIT)
        try:
            return q.get(None, fake.MD(), gmo).decode()
        except fake.MQMIError as exc:
            assert exc.reason == C.MQRC_NO_MSG_AVAILABLE
            return None
    finally:
        qmgr.disconnect()


def group_queue(hub: iqbridge.Hub, queue: str, group: str) -> str:
    adapter = hub.adapter
    assert isinstance(adapter, IbmMqAdapter)
    return adapter.queue_name(queue, group)


def test_the_adapter_locks_natively(hub: iqbridge.Hub) -> None:
    assert isinstance(hub.adapter, LocksNatively)


def test_a_plain_client_skips_a_locked_message_until_unlock(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    q.subscribe("billing")
    first = q.put(b"first", to=["billing"])
    q.put(b"second", to=["billing"])
    browse = q.browse(msg_id=first, lock=True)
    assert [m.msg_id for m in browse.messages] == [first] and browse.lock_id
    name = group_queue(hub, "orders", "billing")
    # The queue delivers first-in first: without the lock the plain client would get
    # "first"; it gets "second", then nothing.
    assert plain_get(name) == "second"
    assert plain_get(name) is None
    assert q.unlock(browse.lock_id) == 1
    assert plain_get(name) == "first"


def test_a_get_under_the_lock_releases_the_native_lock(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    q.subscribe("billing")
    msg = q.put(b"locked", to=["billing"])
    browse = q.browse(msg_id=msg, lock=True)
    name = group_queue(hub, "orders", "billing")
    assert plain_get(name) is None
    assert q.get("billing", timeout=0) is None  # iqbridge's own gets pass it by too
    d = q.get("billing", timeout=0, lock_id=browse.lock_id)
    assert d is not None and d.msg_id == msg and d.body == b"locked"
    adapter = hub.adapter
    assert isinstance(adapter, IbmMqAdapter)
    assert adapter._native_locks == {}
    d.done()
    assert q.state(msg).subscribers["billing"].state.value in ("DONE", "JOURNALLED")


def test_the_native_lock_ends_after_lock_for(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders")
    q.subscribe("billing")
    msg = q.put(b"short", to=["billing"])
    q.browse(msg_id=msg, lock=True, lock_for=0.3)
    name = group_queue(hub, "orders", "billing")
    assert plain_get(name) is None
    deadline = time.monotonic() + 5.0
    got = None
    while got is None and time.monotonic() < deadline:
        time.sleep(0.05)
        got = plain_get(name)
    assert got == "short"


def test_each_group_queue_is_locked_and_closing_the_hub_releases_them(
    hub: iqbridge.Hub,
) -> None:
    q = hub.queue("orders")
    q.subscribe("billing")
    q.subscribe("shipping")
    msg = q.put(b"both", to=["billing", "shipping"])
    q.browse(msg_id=msg, lock=True)
    names = [group_queue(hub, "orders", g) for g in ("billing", "shipping")]
    assert [plain_get(n) for n in names] == [None, None]
    hub.adapter.close()
    assert [plain_get(n) for n in names] == ["both", "both"]


def test_another_groups_copy_is_locked_while_one_group_holds_it_under_syncpoint(
    hub: iqbridge.Hub,
) -> None:
    q = hub.queue("orders")
    q.subscribe("billing")
    q.subscribe("audit")
    msg = q.put(b"held", to=["billing", "audit"])
    d = q.get("billing", timeout=1)
    assert d is not None
    browse = q.browse(msg_id=msg, lock=True)
    assert [m.msg_id for m in browse.messages] == [msg]
    # audit's copy is locked natively; billing's, in billing's unit of work, cannot be
    # browsed and is left alone (its delivery settles as usual).
    assert plain_get(group_queue(hub, "orders", "audit")) is None
    d.done()
    assert q.unlock(browse.lock_id) == 1
    assert plain_get(group_queue(hub, "orders", "audit")) == "held"


def test_past_the_cap_messages_are_locked_in_the_index_only(
    hub: iqbridge.Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    from iqbridge.adapters import ibmmq_locks

    monkeypatch.setattr(ibmmq_locks, "MAX_NATIVE_LOCKS", 2)
    q = hub.queue("orders")
    q.subscribe("billing")
    q.put_many([b"1", b"2", b"3"], to=["billing"])
    browse = q.browse(lock=True)
    assert len(browse.messages) == 3
    name = group_queue(hub, "orders", "billing")
    # Two are locked on the queue manager; the third only in the index, so a plain
    # client may take it, while iqbridge's gets pass all three by.
    assert plain_get(name) == "3"
    assert plain_get(name) is None
    assert q.get("billing", timeout=0) is None
