"""IBM MQ: bad input, faults and the native mapping, against the fake of IBM's client
(:mod:`iqbridge.testing.fakes.ibmmq`, installed as the ``ibmmq`` module).

Every fault is a typed iqbridge error that names the problem and the fix, never a driver
exception, and no password appears in it: the client library missing (with the MQ C
client hint), a wrong URL, an unreachable queue manager (2059, 2538), an authorisation
failure (2035), an unknown queue (2085). Then what the mapping promises: one copy per
group in one syncpoint (all or none), MQMD fields, a crashed consumer's message coming
back with its BackoutCount raised, UNUSABLE parked on the backout queue with the reason,
and a plain MQ producer's message adopted.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import iqbridge
from iqbridge import Pool
from iqbridge.adapters.ibmmq import IbmMqAdapter
from iqbridge.adapters.ibmmq_wire import msg_id_bytes
from iqbridge.errors import (
    BrokerRefused,
    BrokerUnavailable,
    ConfigurationError,
    IQError,
    UnknownQueueError,
)
from iqbridge.model import Envelope
from iqbridge.testing.fakes import ibmmq as fake

pytestmark = pytest.mark.ibmmq

SECRET = "s3cr3t-Pa55"
URL = f"ibmmq://app:{SECRET}@localhost:1414/QM1?channel=DEV.APP.SVRCONN&create=true"


@pytest.fixture
def qm(monkeypatch: pytest.MonkeyPatch) -> Iterator[fake.FakeQueueManager]:
    fake.reset()
    monkeypatch.setitem(sys.modules, "ibmmq", fake)
    qm = fake.queue_manager("QM1", "localhost", 1414)
    qm.users = {"app": SECRET}
    qm.admins = {"app"}
    yield qm
    fake.reset()


@pytest.fixture
def index(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'index.db'}"


def _fails(url: str, index: str, kind: type[IQError], *words: str) -> str:
    with pytest.raises(kind) as info:
        iqbridge.connect(url, index=index)
    text = str(info.value)
    for word in words:
        assert word in text, text
    assert SECRET not in text
    return text


# --- bad input and faults ---------------------------------------------------------------


def test_missing_client_library_names_the_extra_and_the_c_client(
    monkeypatch: pytest.MonkeyPatch, index: str
) -> None:
    monkeypatch.setitem(sys.modules, "ibmmq", None)
    monkeypatch.setitem(sys.modules, "pymqi", None)
    _fails(URL, index, ConfigurationError, "pip install 'iqbridge[ibmmq]'", "C client", "ibm.com")


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ibmmq://app@localhost:1414/", ["queue manager", "ibmmq://user@host:1414/QM1"]),
        ("ibmmq://app@localhost:notaport/QM1", ["IBM MQ URL"]),
        ("ibmmq://app@localhost/QM1?chanel=X", ["unknown IBM MQ option", "chanel", "channel"]),
        ("ibmmq://app@localhost/QM1?tls=ANY_TLS12", ["key_repository"]),
        ("ibmmq://app@localhost/QM1?create=maybe", ["create must be true or false"]),
        ("ibmmq://app@localhost/QM1?backout_threshold=-1", ["backout_threshold"]),
    ],
)
def test_wrong_url_is_a_configuration_error(
    qm: fake.FakeQueueManager, index: str, url: str, words: list[str]
) -> None:
    _fails(url, index, ConfigurationError, *words)


def test_password_is_never_in_the_url_it_shows(qm: fake.FakeQueueManager, index: str) -> None:
    with iqbridge.connect(URL, index=index) as hub:
        assert SECRET not in hub.adapter.url
        assert "***" in hub.adapter.url
        assert SECRET not in repr(hub.adapter)


def test_password_from_the_environment(
    qm: fake.FakeQueueManager, index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IQBRIDGE_IBMMQ_PASSWORD", SECRET)
    with iqbridge.connect("ibmmq://app@localhost:1414/QM1?create=true", index=index) as hub:
        q = hub.queue("env")
        q.put(b"x", to=["a"])
        assert q.get("a") is not None


def test_stopped_queue_manager_is_unavailable(qm: fake.FakeQueueManager, index: str) -> None:
    qm.stop()
    _fails(URL, index, BrokerUnavailable, "2059 MQRC_Q_MGR_NOT_AVAILABLE", "dspmq", "QM1")


def test_nobody_listening_is_unavailable(qm: fake.FakeQueueManager, index: str) -> None:
    url = URL.replace(":1414", ":1499")
    _fails(url, index, BrokerUnavailable, "2538 MQRC_HOST_NOT_AVAILABLE", "localhost(1499)")


def test_queue_manager_stopping_mid_stream(qm: fake.FakeQueueManager, index: str) -> None:
    with iqbridge.connect(URL, index=index) as hub:
        q = hub.queue("mid")
        q.put(b"1", to=["a"])
        qm.stop()
        with pytest.raises(BrokerUnavailable) as info:
            q.put(b"2", to=["a"])
        assert "dspmq" in str(info.value)
        assert SECRET not in str(info.value)
        qm.start()
        q.put(b"3", to=["a"])  # a new connection
        got = []
        while (d := q.get("a")) is not None:
            got.append(d.payload)
            d.done()
        assert got == [b"1", b"3"]


def test_wrong_queue_manager_name(qm: fake.FakeQueueManager, index: str) -> None:
    _fails(URL.replace("/QM1", "/QM9"), index, ConfigurationError, "2058", "QM9")


def test_unknown_channel(qm: fake.FakeQueueManager, index: str) -> None:
    url = URL.replace("DEV.APP.SVRCONN", "NO.SUCH.SVRCONN")
    _fails(url, index, ConfigurationError, "2540", "NO.SUCH.SVRCONN", "channel=")


def test_wrong_password_is_not_authorised(qm: fake.FakeQueueManager, index: str) -> None:
    qm.users = {"app": "another"}
    _fails(URL, index, ConfigurationError, "2035 MQRC_NOT_AUTHORIZED", "app", "CHLAUTH")


def test_queue_the_user_may_not_open(qm: fake.FakeQueueManager, index: str) -> None:
    with iqbridge.connect(URL, index=index) as hub:
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        q = hub.queue("guarded")
        qm.deny("app", adapter.queue_name("guarded", "a"))
        with pytest.raises(ConfigurationError) as info:
            q.put(b"x", to=["a"])
        text = str(info.value)
        assert "2035" in text and "SET AUTHREC" in text
        assert adapter.queue_name("guarded", "a") in text
        assert SECRET not in text


def test_unknown_queue_without_create(qm: fake.FakeQueueManager, index: str) -> None:
    url = URL.replace("&create=true", "")
    with pytest.raises(UnknownQueueError) as info:
        iqbridge.connect(url, index=index).queue("orders")
    text = str(info.value)
    assert "2085 MQRC_UNKNOWN_OBJECT_NAME" in text
    assert "DEFINE QLOCAL('orders/BACKOUT')" in text and "create=true" in text
    qm.define("orders/BACKOUT")
    qm.define("orders.billing", backout_threshold=3, boqname="orders/BACKOUT")
    with iqbridge.connect(url, index=index) as hub:
        q = hub.queue("orders")
        q.put(b"x", to=["billing"])
        d = q.get("billing")
        assert d is not None and d.payload == b"x"
        d.done()
        with pytest.raises(UnknownQueueError):
            q.put(b"y", to=["shipping"])


# --- the native mapping -----------------------------------------------------------------


def test_fan_out_one_copy_per_group_with_the_mqmd(qm: fake.FakeQueueManager, index: str) -> None:
    with iqbridge.connect(URL, index=index) as hub:
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        q = hub.queue("fan")
        msg_id = q.put(
            b"body", to=["a", "b", Pool("p", ["w1", "w2"])], priority=7, correlation_id="c-1"
        )
        for group in ("a", "b", "p"):
            name = adapter.queue_name("fan", group)
            [(body, props, backout)] = qm.messages(name)
            assert body == b"body" and backout == 0 and "iqEnv" in props
            m = qm.queues[name].msgs[0]
            assert m.msg_id == msg_id_bytes(msg_id)
            assert m.priority == 7
            assert m.correl_id == b"c-1".ljust(24, b"\0")


def test_a_failed_put_stores_no_copy(qm: fake.FakeQueueManager, index: str) -> None:
    with iqbridge.connect(URL, index=index) as hub:
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        q = hub.queue("full")
        q.subscribe("a")
        q.subscribe("b")
        qm.queues[adapter.queue_name("full", "b")].max_depth = 0
        with pytest.raises(BrokerRefused) as info:
            q.put(b"x")
        assert "2053 MQRC_Q_FULL" in str(info.value)
        assert qm.messages(adapter.queue_name("full", "a")) == []  # backed out with b's
        assert q.get("a") is None


def test_crashed_consumer_message_comes_back(qm: fake.FakeQueueManager, index: str) -> None:
    with iqbridge.connect(URL, index=index) as hub:
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        q = hub.queue("crash")
        q.put(b"x", to=["a"])
        assert q.get("a") is not None
        name = adapter.queue_name("crash", "a")
        assert qm.messages(name) == []  # hidden in the uncommitted unit of work
        qm.break_connections()  # the consumer's connection dies
        [(body, _props, backout)] = qm.messages(name)
        assert (body, backout) == (b"x", 1)


def test_release_and_done_commit_once(qm: fake.FakeQueueManager, index: str) -> None:
    with iqbridge.connect(URL, index=index) as hub:
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        q = hub.queue("rel")
        q.put_many([b"1", b"2", b"3"], to=["a"])
        batch = q.get_many("a", max=3)
        assert len(batch) == 3
        assert len(adapter.held("rel", "a")) == 3
        batch.done()
        assert adapter.held("rel", "a") == {}
        assert qm.messages(adapter.queue_name("rel", "a")) == []
        assert all(not entries for entries in qm.uow.values())


def test_unusable_goes_to_the_backout_queue(qm: fake.FakeQueueManager, index: str) -> None:
    with iqbridge.connect(URL, index=index) as hub:
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        q = hub.queue("poison")
        q.put(b"bad", to=["a"])
        d = q.get("a")
        assert d is not None
        d.unusable("cannot parse")
        [(body, props)] = adapter.browse("poison")
        assert body == b"bad"
        assert props["iqReason"] == "cannot parse" and props["iqGroup"] == "a"
        assert qm.messages(adapter.queue_name("poison", "a")) == []
        created = qm.queues[adapter.queue_name("poison", "a")]
        assert created.boqname == adapter.backout_name("poison")
        assert created.backout_threshold == 5


def test_plain_producer_message_is_adopted(qm: fake.FakeQueueManager, index: str) -> None:
    with iqbridge.connect(URL, index=index) as hub:
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        q = hub.queue("legacy")
        q.subscribe("a")
        qmgr = fake.QueueManager(None)
        cd = fake.CD(ChannelName=b"DEV.APP.SVRCONN", ConnectionName=b"localhost(1414)")
        qmgr.connect_with_options("QM1", user="app", password=SECRET, cd=cd)
        md = fake.MD(Format=fake.CMQC.MQFMT_STRING, Priority=3)
        fake.Queue(qmgr, adapter.queue_name("legacy", "a"), fake.CMQC.MQOO_OUTPUT).put(
            b"hello", md, fake.PMO()
        )
        qmgr.disconnect()
        d = q.get("a")
        assert d is not None
        assert d.payload == "hello"
        d.done()
        assert q.get("a") is None


def test_long_and_odd_names_map_to_valid_mq_names(qm: fake.FakeQueueManager, index: str) -> None:
    with iqbridge.connect(URL, index=index) as hub:
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        q = hub.queue("orders-eu-" + "x" * 60)
        q.put(b"x", to=["sub-1"])
        name = adapter.queue_name(q.name, "sub-1")
        assert len(name) == 48 and "%" in name
        d = q.get("sub-1")
        assert d is not None
        d.done()


def test_broken_connections_are_replaced(qm: fake.FakeQueueManager, index: str) -> None:
    with iqbridge.connect(URL, index=index) as hub:
        q = hub.queue("broken")
        q.put(b"1", to=["a"])
        qm.break_connections()  # the pooled connections die (a network cut)
        q.put(b"2", to=["a"])
        got = []
        while (d := q.get("a")) is not None:
            got.append(d.payload)
            d.done()
        assert got == [b"1", b"2"]


@pytest.mark.parametrize(
    ("call", "applied"), [("commit", True), ("commit", False), ("put", True), ("put", False)]
)
def test_a_put_whose_connection_breaks_leaves_one_copy_per_group(
    qm: fake.FakeQueueManager, index: str, call: str, applied: bool
) -> None:
    """The connection breaks at an MQPUT or at the MQCMIT of a put of 20 messages to two
    groups, before the call reached the queue manager or after it took
    effect (a lost reply). The put is repeated on a new connection only if the queue
    manager does not hold it: each group queue has each message once, in put order,
    counted on the fake's own queues. Before the fix a commit that had committed (its
    2009 a lost reply, "the call did complete" as IBM documents it) was put again: two
    copies of every message on every group."""
    with iqbridge.connect(URL, index=index) as hub:
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        q = hub.queue("doubt")
        q.subscribe("a", "b")
        q.put(b"warm-up")  # queues made, a pooled connection open
        qm.break_at(call, applied=applied)
        ids = q.put_many(
            [b"%d" % i for i in range(20)],
            msg_ids=[f"doubt-{i}" for i in range(20)],
        )
        assert not qm.breaks, "the break did not happen"
        for group in ("a", "b"):
            name = adapter.queue_name("doubt", group)
            bodies = [body for body, _props, _backout in qm.messages(name)]
            assert bodies == [b"warm-up"] + [b"%d" % i for i in range(20)], (group, bodies)
        got = []
        while (d := q.get("a")) is not None:
            got.append(d.msg_id)
            d.done()
        assert got[1:] == ids


def test_requeue_inside_a_busy_unit_puts_a_copy_back(qm: fake.FakeQueueManager, index: str) -> None:
    """A batch got in one unit of work: one message is claimed, the other is hidden by
    the index (a put awaiting confirm). Its confirm makes it deliverable again while the
    unit is still busy: a copy goes back on the queue, and the original is committed
    away with the unit."""
    with iqbridge.connect(URL, index=index) as hub:
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        q = hub.queue("busy")
        first = q.put(b"1", to=["a"])
        second = q.put(b"2", to=["a"], confirm=True)
        batch = q.get_many("a", max=2)
        assert [d.msg_id for d in batch] == [first]
        assert set(adapter.held("busy", "a")) == {first, second}
        q.confirm_put(second)
        name = adapter.queue_name("busy", "a")
        assert [body for body, _p, _b in qm.messages(name)] == [b"2"]  # the copy
        d = q.get("a")
        assert d is not None and d.msg_id == second
        d.done()
        batch.done()
        assert adapter.held("busy", "a") == {}
        assert qm.messages(name) == []
        assert all(not entries for entries in qm.uow.values())
        assert q.get("a") is None


def test_threads_share_a_pool_and_process_each_message_once(
    qm: fake.FakeQueueManager, index: str
) -> None:
    import threading
    from collections import Counter

    with iqbridge.connect(URL, index=index) as hub:
        q = hub.queue("threads")
        ids = q.put_many([str(i) for i in range(200)], to=Pool("p", ["w1", "w2", "w3", "w4"]))
        seen: Counter[str] = Counter()
        lock = threading.Lock()

        def work(member: str) -> None:
            while True:
                batch = q.get_many(member, max=7)
                if not batch:
                    return
                with lock:
                    seen.update(d.msg_id for d in batch)
                batch.done()

        threads = [threading.Thread(target=work, args=(m,)) for m in ("w1", "w2", "w3", "w4")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert seen == Counter(ids)
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        assert qm.messages(adapter.queue_name("threads", "p")) == []
        assert all(not entries for entries in qm.uow.values())


def test_settings_never_show_the_password(qm: fake.FakeQueueManager, index: str) -> None:
    with iqbridge.connect(URL, index=index) as hub:
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        assert adapter.settings.password == SECRET
        assert SECRET not in repr(adapter.settings)


def test_a_message_finished_elsewhere_leaves_this_unit(
    qm: fake.FakeQueueManager, index: str
) -> None:
    """Process A gets a message and stalls past its lease; process B takes it over
    through the index and finishes it. A's unit of work still holds the MQ message; A's
    next get finds it idle, the index says it is done, and A's unit commits."""
    import time

    with (
        iqbridge.connect(URL, index=index) as a,
        iqbridge.connect(URL, index=a.store) as b,
    ):
        adapter = a.adapter
        assert isinstance(adapter, IbmMqAdapter)
        qa = a.queue("idle", lease=0.2, sweep_interval=0.0)
        qb = b.queue("idle", lease=0.2, sweep_interval=0.0)
        msg_id = qa.put(b"x", to=["s"])
        assert qa.get("s") is not None  # and A stalls
        time.sleep(0.3)
        d = qb.get("s")
        assert d is not None and d.msg_id == msg_id
        d.done()
        assert adapter.held("idle", "s") == {msg_id: "s"}  # still in A's unit of work
        time.sleep(0.3)
        assert qa.get("s") is None
        assert adapter.held("idle", "s") == {}
        assert qm.messages(adapter.queue_name("idle", "s")) == []
        assert all(not entries for entries in qm.uow.values())


def test_the_largest_payload_fits_mq_default_maxmsgl(qm: fake.FakeQueueManager, index: str) -> None:
    from iqbridge.errors import MessageTooLarge

    with iqbridge.connect(URL, index=index) as hub:
        limit = hub.adapter.capabilities.max_payload_bytes
        assert limit == 4 * 1024 * 1024 - 64 * 1024
        q = hub.queue("big")
        q.put(b"x" * limit, to=["a"], headers={"h": "y" * 1000})
        d = q.get("a")
        assert d is not None and len(d.payload) == limit
        d.done()
        with pytest.raises(MessageTooLarge):
            q.put(b"x" * (limit + 1), to=["a"])


def test_a_full_backout_queue_keeps_the_message_held(
    qm: fake.FakeQueueManager, index: str, caplog: pytest.LogCaptureFixture
) -> None:
    with iqbridge.connect(URL, index=index) as hub:
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        q = hub.queue("fullboq")
        msg_id = q.put(b"bad", to=["a"])
        qm.queues[adapter.backout_name("fullboq")].max_depth = 0
        d = q.get("a")
        assert d is not None
        d.unusable("poison")  # the index records UNUSABLE; the broker call fails
        assert "2053" in caplog.text and SECRET not in caplog.text
        assert adapter.held("fullboq", "a") == {msg_id: "a"}  # not dropped from MQ
        assert adapter.browse("fullboq") == []


def _plain_put(adapter: IbmMqAdapter, queue: str, group: str, body: bytes, env: str) -> None:
    """Put ``body`` as a plain MQ client would, with ``env`` as the iqbridge envelope
    property (a broken one)."""
    qmgr = fake.QueueManager(None)
    cd = fake.CD(ChannelName=b"DEV.APP.SVRCONN", ConnectionName=b"localhost(1414)")
    qmgr.connect_with_options("QM1", user="app", password=SECRET, cd=cd)
    mh = fake.MessageHandle(qmgr)
    mh.properties.set("iqEnv", env)
    pmo = fake.PMO(Version=fake.CMQC.MQPMO_VERSION_3, OriginalMsgHandle=mh.msg_handle)
    md = fake.MD(Format=fake.CMQC.MQFMT_STRING)
    fake.Queue(qmgr, adapter.queue_name(queue, group), fake.CMQC.MQOO_OUTPUT).put(body, md, pmo)
    qmgr.disconnect()


@pytest.mark.parametrize("env", ['{"ct": "text/plain"', '{"ct": "text/plain"}', "[1, 2]"])
def test_an_undecodable_envelope_property_is_adopted(
    qm: fake.FakeQueueManager, index: str, env: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Bad JSON, or no "id": the message is a stranger's, adopted with a warning that
    does not show the property, neither left at the head of the queue nor breaking the
    reconciliation's browse."""
    with iqbridge.connect(URL, index=index) as hub:
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        q = hub.queue("badenv")
        q.subscribe("a")
        _plain_put(adapter, "badenv", "a", b"payload-xyz", env)
        adapter.track_groups("badenv", ["a"])
        [entry] = list(adapter.entries("badenv"))
        assert entry.stranger and entry.envelope is not None
        d = q.get("a")
        assert d is not None and d.msg_id == entry.msg_id
        assert d.payload == "payload-xyz"
        d.done()
        assert q.get("a") is None
        assert qm.messages(adapter.queue_name("badenv", "a")) == []
    assert "undecodable iqEnv property" in caplog.text
    assert env not in caplog.text and "payload-xyz" not in caplog.text


@pytest.mark.parametrize("settle", ["ack", "requeue", "dead_letter"])
def test_one_unit_failing_to_end_leaves_no_other_open(
    qm: fake.FakeQueueManager, index: str, monkeypatch: pytest.MonkeyPatch, settle: str
) -> None:
    """Two units of work hold copies of one message; ending the first fails (MQCMIT or
    MQBACK broken once): the other still ends, and the first error is raised."""
    with iqbridge.connect(URL, index=index) as hub:
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        q = hub.queue("units")
        msg_id = q.put(b"x", to=["a"])
        adapter.put_again("units", "a", Envelope(msg_id, b"x", groups=("a",)))  # same ref
        got = [adapter.receive("units", "a", "c", count=1, timeout=0) for _ in range(2)]
        assert [r.native_ref for [r] in got] == [msg_id, msg_id]
        broken = [1]

        def once(real: Any) -> Any:
            def call(self: fake.QueueManager) -> None:
                if broken:
                    broken.pop()
                    raise fake.MQMIError(fake.CMQC.MQCC_FAILED, fake.CMQC.MQRC_CONNECTION_BROKEN)
                real(self)

            return call

        monkeypatch.setattr(fake.QueueManager, "commit", once(fake.QueueManager.commit))
        monkeypatch.setattr(fake.QueueManager, "backout", once(fake.QueueManager.backout))
        with pytest.raises(IQError, match="2009"):
            if settle == "ack":
                adapter.ack("units", "a", [msg_id])
            elif settle == "requeue":
                adapter.requeue("units", "a", msg_id)
            else:
                adapter.dead_letter("units", "a", msg_id, "poison")
        assert adapter.held("units", "a") == {}
        assert all(not entries for entries in qm.uow.values())  # no unit left open
        left = qm.messages(adapter.queue_name("units", "a"))
        assert len(left) == (2 if settle == "requeue" else 1)  # the failed one came back
