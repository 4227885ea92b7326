"""The fake python-oracledb behaves as AQ does, where the Oracle AQ adapter relies on it:
transactions per connection, recipients, the three dequeue modes, rollback with
attempts + 1 and the exception queue past max_retries, priority then enqueue order,
correlation and msgid matching, expiration, retention, and the driver's errors."""

from __future__ import annotations

import types
from typing import Any

import pytest

from iqbridge.testing.fakes import oracledb as fake
from tests.oracle_helpers import FAKE_DSN, fake_db_fixture  # noqa: F401 (a fixture)
from tests.oracle_helpers import fake_connect as connect

pytestmark = pytest.mark.oracle

DSN = FAKE_DSN


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(fake, "time", types.SimpleNamespace(monotonic=c.monotonic))
    return c


def make_queue(
    conn: fake.Connection, name: str = "Q", *, max_retries: int = 2, retention: int = 0
) -> None:
    cur = conn.cursor()
    cur.callproc(
        "DBMS_AQADM.CREATE_QUEUE_TABLE",
        keyword_parameters={"queue_table": f"{name}_QT", "queue_payload_type": "RAW",
                            "multiple_consumers": True},
    )  # fmt: skip
    cur.callproc(
        "DBMS_AQADM.CREATE_QUEUE",
        keyword_parameters={"queue_name": name, "queue_table": f"{name}_QT",
                            "max_retries": max_retries, "retention_time": retention},
    )  # fmt: skip
    cur.callproc("DBMS_AQADM.START_QUEUE", keyword_parameters={"queue_name": name})


def deq(conn: fake.Connection, consumer: str, mode: int = fake.DEQ_REMOVE, **opts: Any) -> Any:
    q = conn.queue("Q")
    q.deqoptions.consumername = consumer
    q.deqoptions.mode = mode
    q.deqoptions.wait = fake.DEQ_NO_WAIT
    q.deqoptions.navigation = fake.DEQ_FIRST_MSG
    for k, v in opts.items():
        setattr(q.deqoptions, k, v)
    return q.deqone()


def put(conn: fake.Connection, payload: bytes, **props: Any) -> bytes:
    p = conn.msgproperties(payload=payload, recipients=props.pop("recipients", ["A"]), **props)
    conn.queue("Q").enqone(p)
    assert p.msgid is not None
    return p.msgid


def code(info: pytest.ExceptionInfo[BaseException]) -> tuple[int, str]:
    err = info.value.args[0]
    return err.code, err.full_code


def test_uncommitted_work_is_the_connections_own(db: fake.Database) -> None:
    a, b = connect(), connect()
    make_queue(a)
    put(a, b"x")
    assert deq(b, "A") is None
    a.commit()
    got = deq(b, "A")
    assert got.payload == b"x" and got.state == fake.MSG_READY
    b.rollback()
    put(a, b"y")
    a.rollback()
    assert deq(b, "A").payload == b"x"  # y was rolled back


def test_recipients_each_get_it_once(db: fake.Database) -> None:
    conn = connect()
    make_queue(conn)
    put(conn, b"x", recipients=["A", "B"])
    conn.commit()
    assert deq(conn, "A").payload == b"x"
    assert deq(conn, "A") is None
    assert deq(conn, "B").payload == b"x"
    assert deq(conn, "C") is None


def test_rollback_counts_attempts_then_moves_to_the_exception_queue(db: fake.Database) -> None:
    conn = connect()
    make_queue(conn, max_retries=2)
    msgid = put(conn, b"x")
    conn.commit()
    for attempts in (0, 1, 2):
        got = deq(conn, "A")
        assert got.attempts == attempts
        conn.rollback()
    assert deq(conn, "A") is None  # third rollback: past max_retries
    exc = conn.queue("AQ$_Q_QT_E")
    exc.deqoptions.wait = fake.DEQ_NO_WAIT
    moved = exc.deqone()
    assert moved.msgid == msgid and moved.attempts == 3


def test_priority_then_enqueue_order(db: fake.Database) -> None:
    conn = connect()
    make_queue(conn)
    for payload, priority in ((b"late-low", 5), (b"high", 0), (b"low", 5), (b"mid", 2)):
        put(conn, payload, priority=priority)
    conn.commit()
    got = [deq(conn, "A").payload for _ in range(4)]
    assert got == [b"high", b"mid", b"late-low", b"low"]


def test_correlation_and_msgid(db: fake.Database) -> None:
    conn = connect()
    make_queue(conn)
    put(conn, b"1", correlation="order-1")
    second = put(conn, b"2", correlation="order-22")
    conn.commit()
    assert deq(conn, "A", fake.DEQ_BROWSE, correlation="order-2%").payload == b"2"
    assert deq(conn, "A", fake.DEQ_BROWSE, correlation="order-_").payload == b"1"
    assert deq(conn, "A", msgid=second).payload == b"2"
    conn.commit()
    with pytest.raises(fake.DatabaseError) as info:
        deq(conn, "A", msgid=b"\0" * 16)
    assert code(info) == (25263, "ORA-25263")


def test_browse_and_locked(db: fake.Database) -> None:
    a, b = connect(), connect()
    make_queue(a)
    put(a, b"1")
    put(a, b"2")
    a.commit()
    q = a.queue("Q")
    q.deqoptions.consumername, q.deqoptions.mode = "A", fake.DEQ_BROWSE
    q.deqoptions.wait = fake.DEQ_NO_WAIT
    assert [q.deqone().payload, q.deqone().payload, q.deqone()] == [b"1", b"2", None]
    assert deq(a, "A", fake.DEQ_LOCKED).payload == b"1"
    assert deq(b, "A", fake.DEQ_LOCKED).payload == b"2"  # 1 is locked by a: skipped
    assert deq(b, "A", fake.DEQ_BROWSE).payload == b"1"  # browse sees locked ones
    a.rollback()  # a lock released: no attempt counted
    got = deq(b, "A", fake.DEQ_REMOVE)
    assert (got.payload, got.attempts) == (b"1", 0)


def test_expiration_moves_to_the_exception_queue(db: fake.Database, clock: Clock) -> None:
    conn = connect()
    make_queue(conn)
    put(conn, b"x", expiration=5)
    conn.commit()
    clock.now += 6
    assert deq(conn, "A") is None
    assert len(db.queue("AQ$_Q_QT_E").messages) == 1


def test_retention_keeps_dequeued_messages_in_the_view(db: fake.Database, clock: Clock) -> None:
    conn = connect()
    make_queue(conn, retention=60)
    msgid = put(conn, b"x")
    conn.commit()
    deq(conn, "A")
    conn.commit()
    sql = "SELECT msg_id, msg_state, user_data FROM AQ$Q_QT WHERE queue = :q AND msg_id IN (:m)"
    rows = conn.cursor().execute(sql, {"q": "Q", "m": msgid}).fetchall()
    assert rows == [(msgid, "PROCESSED", b"x")]
    clock.now += 61
    assert conn.cursor().execute(sql, {"q": "Q", "m": msgid}).fetchall() == []


def test_errors_as_the_driver_raises_them(db: fake.Database) -> None:
    with pytest.raises(fake.OperationalError) as info:
        fake.connect(user="app", password="pw", dsn="nowhere.test:1521/FREEPDB1")
    assert code(info)[1] == "DPY-6005"
    with pytest.raises(fake.DatabaseError) as info:
        fake.connect(user="app", password="nope", dsn=DSN)
    assert code(info) == (1017, "ORA-01017")
    conn = connect()
    with pytest.raises(fake.DatabaseError) as info:
        deq(conn, "A")
    assert code(info) == (24010, "ORA-24010")
    make_queue(conn)
    with pytest.raises(fake.DatabaseError) as info:
        deq(conn, "")
    assert code(info) == (25231, "ORA-25231")
    with pytest.raises(fake.DatabaseError) as info:
        put(conn, b"x", recipients=[])
    assert code(info) == (24033, "ORA-24033")
    with pytest.raises(fake.DatabaseError) as info:
        make_queue(conn)
    assert code(info) == (24001, "ORA-24001")
