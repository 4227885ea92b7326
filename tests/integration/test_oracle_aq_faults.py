"""Oracle AQ with bad input and faults, against the fake python-oracledb.

Each fault is a typed iqbridge error that names the problem and the fix, with the driver
exception kept as its cause, never a raw driver error; the password appears nowhere
(message, log, ``hub.adapter.url``).

* the driver is not installed: ConfigurationError naming ``pip install 'iqbridge[oracle]'``;
  one older than 3.1 (no thin-mode array AQ): ConfigurationError naming the version
* a wrong URL (no user, no service, a bad port, an unknown option, a bad number, no
  password in the URL nor in the environment): ConfigurationError naming what was wrong
* the server cannot be reached (DPY-6005) or the service is unknown (ORA-12514):
  BrokerUnavailable
* the password is wrong (ORA-01017): ConfigurationError naming the user and where the
  password comes from
* the queue was dropped behind the hub's back (ORA-24010): UnknownQueueError naming the
  queue and how to create it
* a payload over AQ's RAW limit: MessageTooLarge
* a connection lost in the commit of a put: the put stands if the database committed
  (found in the queue table by msgid), else it raises and its repeat enqueues it once
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

import iqbridge
from iqbridge.adapters.oracle_aq import OracleAQAdapter
from iqbridge.errors import (
    BrokerUnavailable,
    ConfigurationError,
    IQError,
    MessageTooLarge,
    UnknownQueueError,
)
from iqbridge.testing.fakes import oracledb as fake_oracledb
from tests.oracle_helpers import PASSWORD, URL, fake_oracle_fixture  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.oracle, pytest.mark.usefixtures("fake_oracle")]


def _fails(url: str, caplog: pytest.LogCaptureFixture) -> IQError:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(IQError) as info:
        iqbridge.connect(url, index="memory://")
    err = info.value
    assert PASSWORD not in str(err) and PASSWORD not in caplog.text
    assert "Traceback" not in str(err)
    return err


def test_missing_driver_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "oracledb", None)  # as if not installed
    err = _fails(URL, caplog)
    assert isinstance(err, ConfigurationError)
    assert "pip install 'iqbridge[oracle]'" in str(err)
    assert isinstance(err.__cause__, ModuleNotFoundError)


def test_too_old_driver_names_the_version(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(fake_oracledb, "__version__", "2.5.1")
    err = _fails(URL, caplog)
    assert isinstance(err, ConfigurationError)
    assert "python-oracledb 3.1 or later" in str(err) and "not 2.5.1" in str(err)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("oracle+aq://oracle.test:1521/FREEPDB1", "oracle+aq://user@host"),
        (f"oracle+aq://iq:{PASSWORD}@oracle.test:1521", "name the database service"),
        (f"oracle+aq://iq:{PASSWORD}@oracle.test:99999/FREEPDB1", "bad host or port"),
        (f"{URL}?colour=blue", "unknown option(s) ['colour']"),
        (f"{URL}?max_retries=many", "max_retries must be an integer"),
        (f"{URL}?retention=-5", "retention must be an integer >= -1"),
        (f"{URL}?prefix=1x", "prefix must be a letter"),
        ("oracle+aq://iq@oracle.test:1521/FREEPDB1", "$IQBRIDGE_ORACLE_PASSWORD"),
    ],
)
def test_wrong_url_is_a_configuration_error(
    url: str, says: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("IQBRIDGE_ORACLE_PASSWORD", raising=False)
    err = _fails(url, caplog)
    assert isinstance(err, ConfigurationError)
    assert says in str(err)


def test_password_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AQ_PW", PASSWORD)
    with iqbridge.connect(
        "oracle+aq://iq@oracle.test:1521/FREEPDB1?password_env=AQ_PW", index="memory://"
    ) as hub:
        q = hub.queue("orders")
        msg_id = q.put(b"x", to=["a"])
        with q.get("a") as d:
            assert d.msg_id == msg_id
        assert PASSWORD not in hub.adapter.url


def test_unreachable_server(caplog: pytest.LogCaptureFixture) -> None:
    err = _fails(f"oracle+aq://iq:{PASSWORD}@elsewhere.test:1521/FREEPDB1", caplog)
    assert isinstance(err, BrokerUnavailable)
    assert "cannot reach Oracle at oracle+aq://iq@elsewhere.test:1521/FREEPDB1" in str(err)
    assert "DPY-6005" in str(err) and "database up" in str(err)
    assert isinstance(err.__cause__, fake_oracledb.OperationalError)


def test_unknown_service(caplog: pytest.LogCaptureFixture) -> None:
    err = _fails(f"oracle+aq://iq:{PASSWORD}@oracle.test:1521/NOPE", caplog)
    assert isinstance(err, BrokerUnavailable)
    assert "ORA-12514" in str(err) and "service name" in str(err)


def test_wrong_password(caplog: pytest.LogCaptureFixture) -> None:
    err = _fails("oracle+aq://iq:wrong@oracle.test:1521/FREEPDB1", caplog)
    assert isinstance(err, ConfigurationError)
    assert "refused the login of 'iq'" in str(err) and "ORA-01017" in str(err)
    assert "password" in str(err) and "wrong" not in str(err).replace("wrong@", "")
    assert isinstance(err.__cause__, fake_oracledb.DatabaseError)


def test_queue_dropped_behind_the_hubs_back(fake_oracle: fake_oracledb.Database) -> None:
    with iqbridge.connect(URL, index="memory://") as hub:
        q = hub.queue("orders")
        adapter = hub.adapter
        assert isinstance(adapter, OracleAQAdapter)
        operator = fake_oracledb.connect(user="iq", password=PASSWORD, dsn="oracle.test/FREEPDB1")
        operator.cursor().callproc(
            "DBMS_AQADM.DROP_QUEUE", keyword_parameters={"queue_name": adapter.queue_name("orders")}
        )
        with pytest.raises(UnknownQueueError) as info:
            q.put(b"x", to=["a"])
        text = str(info.value)
        assert "'orders'" in text and "ORA-24010" in text and "DBMS_AQADM" in text
        assert isinstance(info.value.__cause__, fake_oracledb.DatabaseError)
        q = hub.queue("orders")  # declares it again, as the message says
        msg_id = q.put(b"x", to=["a"])
        with q.get("a") as d:
            assert d.msg_id == msg_id


def test_undeclared_queue_on_the_adapter() -> None:
    adapter = OracleAQAdapter.from_url(URL)
    try:
        with pytest.raises(UnknownQueueError, match="ORA-24010"):
            adapter.receive("never-declared", "a", "a", count=1, timeout=0)
    finally:
        adapter.close()


def test_payload_over_the_raw_limit() -> None:
    with iqbridge.connect(URL, index="memory://") as hub:
        q = hub.queue("big")
        limit = hub.adapter.capabilities.max_payload_bytes
        q.put(b"x" * limit, to=["a"])
        with pytest.raises(MessageTooLarge):
            q.put(b"x" * (limit + 1), to=["a"])


def _filler(n: int) -> list[str]:
    """``n`` msgids no message has."""
    return [f"{i:032x}" for i in range(1, n + 1)]


def test_read_many_and_delete_chunk_long_in_lists(fake_oracle: fake_oracledb.Database) -> None:
    """Oracle takes at most 1000 items in an IN list (ORA-01795, which the fake raises
    too): reading or purging more msgids at once is split into several statements."""
    with iqbridge.connect(URL, index="memory://") as hub:
        q = hub.queue("orders")
        adapter = hub.adapter
        assert isinstance(adapter, OracleAQAdapter)
        ids = [q.put(f"m{i}".encode(), to=["a"]) for i in range(3)]
        refs = [hub.store.load(m).native_ref or "" for m in ids]
        wanted = _filler(1200)
        for at, ref in zip((0, 700, 1150), refs, strict=True):
            wanted[at] = ref
        got = adapter.read_many("orders", wanted)
        assert len(got) == 1200
        assert [e.msg_id if e else None for e in (got[0], got[700], got[1150])] == ids
        assert sum(e is not None for e in got) == 3
        adapter.delete("orders", wanted)
        assert fake_oracle.queue(adapter.queue_name("orders")).messages == []
        assert adapter.read_many("orders", refs) == [None, None, None]


def test_read_many_keeps_a_plain_producers_priority(fake_oracle: fake_oracledb.Database) -> None:
    """read_many decodes the queue-table row with its priority, as the listing does."""
    with iqbridge.connect(URL, index="memory://") as hub:
        q = hub.queue("orders")
        q.subscribe("a")
        adapter = hub.adapter
        assert isinstance(adapter, OracleAQAdapter)
        plain = fake_oracledb.connect(user="iq", password=PASSWORD, dsn="oracle.test/FREEPDB1")
        plain.queue(adapter.queue_name("orders")).enqone(
            plain.msgproperties(payload=b"legacy", priority=1)
        )
        plain.commit()
        (m,) = fake_oracle.queue(adapter.queue_name("orders")).messages
        env = adapter.read("orders", m.msgid.hex())
        assert env is not None and env.priority == 9 - 1
        (entry,) = adapter.entries("orders")
        assert entry.envelope is not None and entry.envelope.priority == env.priority


@pytest.mark.parametrize("applied", [True, False])
def test_a_put_whose_commit_loses_its_connection_leaves_one_copy(
    fake_oracle: fake_oracledb.Database, tmp_path: Path, applied: bool
) -> None:
    """The connection is lost in the commit of a put of 20 messages (msg_ids, as a bridge
    puts; the index apart from Oracle), after the database committed (the reply lost) or
    before. Like a bridge, the caller repeats a put that raised. Counted in the queue
    table with the driver itself: each message once per group, and a subscriber gets them
    in put order. Before the fix the committed put raised BrokerUnavailable, its repeat
    enqueued all 20 again: two copies of each for a plain AQ consumer."""
    with iqbridge.connect(URL, index=f"sqlite:///{tmp_path / 'index.db'}") as hub:
        q = hub.queue("orders")
        q.subscribe("a", "b")
        adapter = hub.adapter
        assert isinstance(adapter, OracleAQAdapter)
        ids = [f"doubt-{i}" for i in range(20)]
        fake_oracle.break_at("commit", applied=applied)
        raised = 0
        for _ in range(3):
            try:
                q.put_many([b"%d" % i for i in range(20)], msg_ids=ids)
                break
            except BrokerUnavailable:
                raised += 1
        assert not fake_oracle.breaks
        plain = fake_oracledb.connect(user="iq", password=PASSWORD, dsn="oracle.test/FREEPDB1")
        name = adapter.queue_name("orders")
        cur = plain.cursor()
        cur.execute(f"SELECT msg_id, consumer_name FROM AQ${name}_QT WHERE queue = :q", {"q": name})
        rows = cur.fetchall()
        assert len({msgid for msgid, _ in rows}) == 20, f"{len(rows)} rows for 20 messages"
        assert len(rows) == 40  # one per message and group
        assert raised == (0 if applied else 1)
        got = []
        while (d := q.get("a")) is not None:
            got.append(d.msg_id)
            d.done()
        assert got == ids
