"""Exactly once on Oracle AQ: the AQ removal, the index's DONE and the application's rows
commit in the application's one Oracle transaction, or none of them does.

The queue is an AQ queue, the index the SQL store on the same database
(``oracle+oracledb://``), and the application writes its invoices there too; all three
through the in-process fake of python-oracledb, which keeps one transaction per session
over its AQ queues and its SQL tables (SQL runs on SQLite after the Oracle dialect's
rendering is rewritten; see ``iqbridge.testing.fakes.oracledb_sql``). To show that the
removal is part of the application's commit and not the acknowledgement sent after it,
the tests that need it turn the adapter's after-commit ``ack`` into a no-op: the message
must leave the queue all the same, exactly when the invoice commits.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import iqbridge
from iqbridge.adapters.oracle_aq import OracleAQAdapter
from iqbridge.errors import ConfigurationError
from iqbridge.testing.fakes import oracledb as fake_oracledb
from tests.oracle_helpers import PASSWORD, URL, fake_oracle_fixture  # noqa: F401 (a fixture)

pytestmark = pytest.mark.oracle

DB_URL = f"oracle+oracledb://iq:{PASSWORD}@oracle.test:1521/?service_name=FREEPDB1"

meta = sa.MetaData()
invoices = sa.Table(
    "invoices",
    meta,
    sa.Column("msg_id", sa.String(64), primary_key=True),
    sa.Column("body", sa.String(200), nullable=False),
)


@pytest.fixture
def app(fake_oracle: fake_oracledb.Database) -> Iterator[sa.Engine]:
    """The application's own engine on the database, with its invoices table."""
    engine = sa.create_engine(DB_URL)
    meta.create_all(engine)
    yield engine
    engine.dispose()


def open_hub(lease: float = 30.0) -> tuple[iqbridge.Hub, iqbridge.Queue]:
    hub = iqbridge.connect(URL, index=DB_URL)
    q = hub.queue("billing", lease=lease)
    q.subscribe("invoicer")
    return hub, q


def states(hub: iqbridge.Hub, queue: str) -> list[tuple[str, str]]:
    """(consumer, msg_state) of the queue's messages, from the ``AQ$`` view as another
    session sees it."""
    adapter = hub.adapter
    assert isinstance(adapter, OracleAQAdapter)
    name = adapter.queue_name(queue)
    conn: Any = fake_oracledb.connect(user="iq", password=PASSWORD, dsn="oracle.test:1521/FREEPDB1")
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT consumer_name, msg_state FROM AQ${name}_QT WHERE queue = :q", {"q": name}
            )
            return [(str(c), str(s)) for c, s in cur.fetchall()]
    finally:
        conn.close()


def invoice_count(app: sa.Engine) -> int:
    with app.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(invoices)).scalar_one())


def no_ack_after_commit(hub: iqbridge.Hub, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Make the acknowledgement sent after a commit do nothing (as if the process died
    right after the commit); return the calls it got."""
    calls: list[Any] = []
    monkeypatch.setattr(hub.adapter, "ack", lambda *a: calls.append(a))
    return calls


def test_done_in_the_transaction_removes_the_message_in_that_commit(
    app: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, q = open_hub()
    with hub:
        msg = q.put(b"invoice me", to=["invoicer"])
        d = q.get("invoicer", timeout=1)
        assert d is not None and d.msg_id == msg
        acks = no_ack_after_commit(hub, monkeypatch)
        with q.transaction(app) as tx:
            tx.connection.execute(invoices.insert().values(msg_id=d.msg_id, body="paid"))
            d.done(transaction=tx)
            # Uncommitted: every other session still sees the message unprocessed.
            assert [s for _, s in states(hub, "billing")] == ["READY"]
            assert invoice_count(app) == 0
            assert q.state(msg).subscribers["invoicer"].state.value == "FETCHED"
        assert [s for _, s in states(hub, "billing")] == ["PROCESSED"]
        assert invoice_count(app) == 1
        assert q.state(msg).subscribers["invoicer"].state.value in ("DONE", "JOURNALLED")
        assert acks == []  # nothing was left to acknowledge after the commit
        assert q.get("invoicer", timeout=0.2) is None


def test_a_rolled_back_transaction_leaves_the_message_held_and_unprocessed(
    app: sa.Engine,
) -> None:
    hub, q = open_hub()
    with hub:
        msg = q.put(b"invoice me", to=["invoicer"])
        d = q.get("invoicer", timeout=1)
        assert d is not None
        with pytest.raises(RuntimeError, match="card declined"), q.transaction(app) as tx:
            tx.connection.execute(invoices.insert().values(msg_id=d.msg_id, body="paid"))
            d.done(transaction=tx)
            raise RuntimeError("card declined")
        assert invoice_count(app) == 0
        assert q.state(msg).subscribers["invoicer"].state.value == "FETCHED"
        assert [s for _, s in states(hub, "billing")] == ["READY"]
        # Held again by this process: another consumer of the group gets nothing.
        other = iqbridge.connect(URL, index=DB_URL)
        with other:
            assert other.queue("billing").get("invoicer", timeout=0.2) is None
        d.done()
        assert [s for _, s in states(hub, "billing")] == ["PROCESSED"]


def test_a_session_that_dies_before_its_commit_loses_nothing_and_processes_once(
    app: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, q = open_hub(lease=0.5)
    msg = q.put(b"invoice me", to=["invoicer"])
    d = q.get("invoicer", timeout=1)
    assert d is not None and d.attempt == 1
    conn = app.connect()
    conn.begin()
    conn.execute(invoices.insert().values(msg_id=d.msg_id, body="paid"))
    d.done(transaction=conn)
    # The process dies before the commit: Oracle rolls the session back.
    conn.connection.driver_connection.close()  # type: ignore[union-attr]
    conn.invalidate()
    hub.close()
    assert invoice_count(app) == 0
    assert [s for _, s in states(hub, "billing")] == ["READY"]
    time.sleep(0.6)  # the dead process's lease runs out
    hub2, q2 = open_hub()
    with hub2:
        again = q2.get("invoicer", timeout=2)
        assert again is not None and again.msg_id == msg and again.attempt == 2
        no_ack_after_commit(hub2, monkeypatch)
        with q2.transaction(app) as tx:
            tx.connection.execute(invoices.insert().values(msg_id=again.msg_id, body="paid"))
            again.done(transaction=tx)
        assert invoice_count(app) == 1
        assert [s for _, s in states(hub2, "billing")] == ["PROCESSED"]
        assert q2.get("invoicer", timeout=0.2) is None


def test_a_bare_connection_commits_the_removal_with_its_own_commit(
    app: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, q = open_hub()
    with hub:
        q.put_many([b"%d" % n for n in range(5)], to=["invoicer"])
        batch = q.get_many("invoicer", max=5, timeout=1)  # held by one session
        assert len(batch) == 5
        no_ack_after_commit(hub, monkeypatch)
        with app.connect() as conn:
            for d in batch:
                conn.execute(invoices.insert().values(msg_id=d.msg_id, body="paid"))
            batch.done(transaction=conn)
            assert [s for _, s in states(hub, "billing")] == ["READY"] * 5
            conn.commit()
        assert [s for _, s in states(hub, "billing")] == ["PROCESSED"] * 5
        assert invoice_count(app) == 5


def test_the_index_elsewhere_cannot_join_the_transaction(
    app: sa.Engine,
) -> None:
    with iqbridge.connect(URL, index="memory://") as hub:
        q = hub.queue("billing")
        with pytest.raises(ConfigurationError, match="cannot join your database transaction"):
            q.transaction(app)
