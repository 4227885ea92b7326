"""The fake of IBM's MQ client behaves as the MQI documents, in what the adapter relies
on: syncpoint commit and backout (BackoutCount), priority order, expiry, browse with
MQGMO_LOCK, matching by MsgId and CorrelId, properties, reason codes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from iqbridge.testing.fakes import ibmmq as mq

C = mq.CMQC
pytestmark = pytest.mark.ibmmq


@pytest.fixture
def qm() -> Iterator[mq.FakeQueueManager]:
    mq.reset()
    qm = mq.queue_manager("QM1", "localhost", 1414)
    qm.define("Q1")
    yield qm
    mq.reset()


def conn() -> mq.QueueManager:
    qmgr = mq.QueueManager(None)
    cd = mq.CD(ChannelName=b"DEV.APP.SVRCONN", ConnectionName=b"localhost(1414)")
    qmgr.connect_with_options("QM1", cd=cd, user="app", password="x")
    return qmgr


def put(q: mq.Queue, body: bytes, **md: object) -> bytes:
    d = mq.MD(**md)
    q.put(body, d, mq.PMO())
    return bytes(d.MsgId)


def get(q: mq.Queue, options: int = C.MQGMO_NO_SYNCPOINT, **md: object) -> tuple[bytes, mq.MD]:
    d = mq.MD(**md)
    gmo = mq.GMO(Options=options)
    return q.get(None, d, gmo), d


def reason(call: object) -> int:
    assert callable(call)
    with pytest.raises(mq.MQMIError) as info:
        call()
    return info.value.reason


def test_syncpoint_get_is_hidden_then_backed_out_with_a_count(qm: mq.FakeQueueManager) -> None:
    a, b = conn(), conn()
    qa = mq.Queue(a, "Q1", C.MQOO_INPUT_SHARED | C.MQOO_OUTPUT)
    qb = mq.Queue(b, "Q1", C.MQOO_INPUT_SHARED)
    put(qa, b"m")
    body, md = get(qa, C.MQGMO_SYNCPOINT)
    assert (body, md.BackoutCount) == (b"m", 0)
    assert reason(lambda: get(qb)) == C.MQRC_NO_MSG_AVAILABLE  # hidden from others
    a.backout()
    body, md = get(qb, C.MQGMO_SYNCPOINT)
    assert (body, md.BackoutCount) == (b"m", 1)
    b.commit()
    assert reason(lambda: get(qa)) == C.MQRC_NO_MSG_AVAILABLE


def test_syncpoint_put_appears_at_commit_and_disconnect_commits(qm: mq.FakeQueueManager) -> None:
    a = conn()
    q = mq.Queue(a, "Q1", C.MQOO_INPUT_SHARED | C.MQOO_OUTPUT)
    q.put(b"p", mq.MD(), mq.PMO(Options=C.MQPMO_SYNCPOINT))
    assert qm.messages("Q1") == []
    a.commit()
    assert [m[0] for m in qm.messages("Q1")] == [b"p"]
    get(q, C.MQGMO_SYNCPOINT)
    a.disconnect()  # MQDISC commits (distributed platforms)
    assert qm.messages("Q1") == []


def test_broken_connection_backs_out(qm: mq.FakeQueueManager) -> None:
    a = conn()
    q = mq.Queue(a, "Q1", C.MQOO_INPUT_SHARED | C.MQOO_OUTPUT)
    put(q, b"m")
    get(q, C.MQGMO_SYNCPOINT)
    qm.break_connections()
    assert reason(a.commit) == C.MQRC_CONNECTION_BROKEN
    assert [(m[0], m[2]) for m in qm.messages("Q1")] == [(b"m", 1)]


def test_priority_order_then_fifo_and_expiry(qm: mq.FakeQueueManager) -> None:
    q = mq.Queue(conn(), "Q1", C.MQOO_INPUT_SHARED | C.MQOO_OUTPUT)
    for body, prio in ((b"a", 1), (b"b", 9), (b"c", 4), (b"d", 9)):
        put(q, body, Priority=prio)
    put(q, b"gone", Priority=9, Expiry=1)  # a tenth of a second
    time.sleep(0.15)
    assert [get(q)[0] for _ in range(4)] == [b"b", b"d", b"c", b"a"]
    assert reason(lambda: get(q)) == C.MQRC_NO_MSG_AVAILABLE


def test_match_by_msg_id_and_correl_id(qm: mq.FakeQueueManager) -> None:
    q = mq.Queue(conn(), "Q1", C.MQOO_INPUT_SHARED | C.MQOO_OUTPUT)
    first = put(q, b"1", CorrelId=b"x".ljust(24, b"\0"))
    put(q, b"2", CorrelId=b"y".ljust(24, b"\0"))
    assert len(first) == 24 and first != C.MQMI_NONE
    assert get(q, CorrelId=b"y".ljust(24, b"\0"))[0] == b"2"
    assert reason(lambda: get(q, MsgId=b"z" * 24)) == C.MQRC_NO_MSG_AVAILABLE
    assert get(q, MsgId=first)[0] == b"1"


def test_browse_first_next_and_lock(qm: mq.FakeQueueManager) -> None:
    a, b = conn(), conn()
    qa = mq.Queue(a, "Q1", C.MQOO_BROWSE | C.MQOO_INPUT_SHARED | C.MQOO_OUTPUT)
    qb = mq.Queue(b, "Q1", C.MQOO_INPUT_SHARED | C.MQOO_BROWSE)
    put(qa, b"1")
    put(qa, b"2")
    assert get(qa, C.MQGMO_BROWSE_FIRST)[0] == b"1"
    assert get(qa, C.MQGMO_BROWSE_NEXT)[0] == b"2"
    assert reason(lambda: get(qa, C.MQGMO_BROWSE_NEXT)) == C.MQRC_NO_MSG_AVAILABLE
    assert get(qa, C.MQGMO_BROWSE_FIRST | C.MQGMO_LOCK)[0] == b"1"
    assert get(qb, C.MQGMO_BROWSE_FIRST)[0] == b"2"  # the locked one is hidden
    assert get(qb)[0] == b"2"
    assert reason(lambda: get(qb)) == C.MQRC_NO_MSG_AVAILABLE
    assert get(qa, C.MQGMO_MSG_UNDER_CURSOR)[0] == b"1"  # the lock holder takes it
    assert qm.messages("Q1") == []


def test_properties_travel_in_message_handles(qm: mq.FakeQueueManager) -> None:
    a = conn()
    q = mq.Queue(a, "Q1", C.MQOO_INPUT_SHARED | C.MQOO_OUTPUT)
    out = mq.MessageHandle(a)
    out.properties.set("iqEnv", "x" * 100)
    q.put(b"m", mq.MD(), mq.PMO(Version=3, OriginalMsgHandle=out.msg_handle))
    inp = mq.MessageHandle(a)
    q.get(None, mq.MD(), mq.GMO(Options=C.MQGMO_PROPERTIES_IN_HANDLE, MsgHandle=inp.msg_handle))
    assert inp.properties.get("iqEnv", max_value_length=1000) == "x" * 100
    with pytest.raises(mq.MQMIError) as info:
        inp.properties.get("iqEnv")  # longer than the default 64
    assert info.value.reason == C.MQRC_PROPERTY_VALUE_TOO_BIG
    assert reason(lambda: inp.properties.get("other")) == C.MQRC_PROPERTY_NOT_AVAILABLE


def test_reason_codes_of_connect_and_open(qm: mq.FakeQueueManager) -> None:
    qm.users = {"app": "right"}
    cd = mq.CD(ChannelName=b"DEV.APP.SVRCONN", ConnectionName=b"localhost(1414)")
    qmgr = mq.QueueManager(None)
    assert reason(
        lambda: qmgr.connect_with_options("QM1", cd=cd, user="app", password="wrong")
    ) == (C.MQRC_NOT_AUTHORIZED)
    other = mq.CD(ChannelName=b"DEV.APP.SVRCONN", ConnectionName=b"localhost(1415)")
    assert reason(lambda: qmgr.connect_with_options("QM1", cd=other)) == 2538
    qmgr.connect_with_options("QM1", cd=cd, user="app", password="right")
    assert reason(lambda: mq.Queue(qmgr, "NOPE", C.MQOO_OUTPUT)) == C.MQRC_UNKNOWN_OBJECT_NAME
    qm.deny("app", "Q1")
    assert reason(lambda: mq.Queue(qmgr, "Q1", C.MQOO_OUTPUT)) == C.MQRC_NOT_AUTHORIZED
    qm.stop()
    assert reason(
        lambda: mq.QueueManager(None).connect_with_options(
            "QM1", cd=cd, user="app", password="right"
        )
    ) == (C.MQRC_Q_MGR_NOT_AVAILABLE)
