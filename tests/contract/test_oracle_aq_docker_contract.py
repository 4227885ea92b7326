"""The adapter contract live, on Oracle Database Free in a testcontainers container
(``gvenzl/oracle-free:slim-faststart``), wherever a Docker engine answers and
python-oracledb is installed (``pip install 'iqbridge[oracle]'``); the module reports
itself skipped, with the reason, where not (the build machines have no Docker: there the
same suite runs on the fake driver, ``test_oracle_aq_contract.py``).

Run it with ``pytest -m "oracle and docker"``. The container is started once for the
module (the image's first start takes a minute or two); an application user gets the AQ
roles from SYS, and every test has AQ object names of its own (the ``prefix`` option).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import iqbridge
from iqbridge.adapters.oracle_aq import OracleAQAdapter
from iqbridge.queue import Queue
from iqbridge.stores.memory import MemoryStore
from iqbridge.testing.adapter_contract import AdapterContract
from tests.docker_helpers import docker_missing

pytestmark = [pytest.mark.oracle, pytest.mark.docker]

#: Oracle Database Free, the small image that starts fastest.
IMAGE = "gvenzl/oracle-free:slim-faststart"
USER, PASSWORD, SYS_PASSWORD = "iq", "iq-Test-1", "Sys-Test-1"


_WHY = docker_missing()
if _WHY is not None:
    pytest.skip(
        f"no Docker engine answers ({_WHY}); the live Oracle AQ suite runs where one does",
        allow_module_level=True,
    )
oracledb: Any = pytest.importorskip(
    "oracledb", reason="python-oracledb is not installed: pip install 'iqbridge[oracle]'"
)


@pytest.fixture(scope="module")
def oracle_free() -> Iterator[str]:
    """``host:port/FREEPDB1`` of an Oracle Free whose user ``iq`` may run DBMS_AQADM."""
    from testcontainers.community.oracle import OracleDbContainer

    container = OracleDbContainer(
        IMAGE, oracle_password=SYS_PASSWORD, username=USER, password=PASSWORD
    )
    with container as db:
        dsn = f"{db.get_container_host_ip()}:{db.get_exposed_port(1521)}/FREEPDB1"
        with (
            oracledb.connect(
                user="sys", password=SYS_PASSWORD, dsn=dsn, mode=oracledb.AUTH_MODE_SYSDBA
            ) as sys_conn,
            sys_conn.cursor() as cur,
        ):
            cur.execute(f"GRANT AQ_ADMINISTRATOR_ROLE TO {USER}")
            cur.execute(f"GRANT EXECUTE ON DBMS_AQ TO {USER}")
            cur.execute(f"GRANT EXECUTE ON DBMS_AQADM TO {USER}")
        yield dsn


class TestOracleAQLive(AdapterContract):
    @pytest.fixture(autouse=True)
    def _database(self, oracle_free: str) -> None:
        self.dsn = oracle_free
        self.prefix = f"T{uuid.uuid4().hex[:6].upper()}_"

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        url = f"oracle+aq://{USER}:{PASSWORD}@{self.dsn}?prefix={self.prefix}"
        return iqbridge.connect(url, index=MemoryStore(), clock=clock)

    def force_redelivery(
        self, hub: iqbridge.Hub, queue: Queue, msg_id: str, subscriber: str
    ) -> None:
        """AQ cannot make a removed message ready again: the adapter enqueues a copy of
        its envelope for the group (``OracleAQAdapter.redeliver``)."""
        adapter = hub.adapter
        assert isinstance(adapter, OracleAQAdapter)
        rec = hub.store.load(msg_id)
        assert rec.native_ref is not None
        group = rec.members[subscriber].pool or subscriber
        assert adapter.redeliver(queue.name, group, rec.native_ref)


class TestOracleAQLiveWithOracleIndex(TestOracleAQLive):
    """The same, with the index in the same database (the SQL store, ``oracle+oracledb``)."""

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        url = f"oracle+aq://{USER}:{PASSWORD}@{self.dsn}?prefix={self.prefix}"
        return iqbridge.connect(url, index=index_url(self.dsn, self.prefix), clock=clock)


def index_url(dsn: str, prefix: str) -> str:
    """The SQL index on the container's database, with tables of the test's own."""
    host_port, service = dsn.split("/")
    return (
        f"oracle+oracledb://{USER}:{PASSWORD}@{host_port}/?service_name={service}"
        f"&prefix={prefix.lower()}"
    )


def test_done_in_the_transaction_removes_the_message_in_that_commit_live(
    oracle_free: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/integration/test_oracle_aq_exactly_once.py's first case on a real Oracle:
    with the after-commit acknowledgement switched off, the message leaves the queue
    exactly when the application's transaction commits."""
    import sqlalchemy as sa

    prefix = f"T{uuid.uuid4().hex[:6].upper()}_"
    url = f"oracle+aq://{USER}:{PASSWORD}@{oracle_free}?prefix={prefix}"
    index = index_url(oracle_free, prefix)
    app = sa.create_engine(index.split("&prefix=")[0])
    invoices = sa.Table(
        f"{prefix.lower()}invoices",
        sa.MetaData(),
        sa.Column("msg_id", sa.String(64), primary_key=True),
    )
    invoices.create(app)
    with iqbridge.connect(url, index=index) as hub:
        q = hub.queue("billing")
        q.subscribe("invoicer")
        msg = q.put(b"invoice me", to=["invoicer"])
        d = q.get("invoicer", timeout=5)
        assert d is not None and d.msg_id == msg
        monkeypatch.setattr(hub.adapter, "ack", lambda *a: None)
        adapter = hub.adapter
        assert isinstance(adapter, OracleAQAdapter)
        name = adapter.queue_name("billing")

        def states() -> list[str]:
            with oracledb.connect(user=USER, password=PASSWORD, dsn=oracle_free) as conn:
                cur = conn.cursor()
                cur.execute(f"SELECT msg_state FROM AQ${name}_QT WHERE queue = :q", {"q": name})
                return [str(s) for (s,) in cur.fetchall()]

        with q.transaction(app) as tx:
            tx.connection.execute(invoices.insert().values(msg_id=d.msg_id))
            d.done(transaction=tx)
            assert states() == ["READY"]
        assert states() == ["PROCESSED"]
        assert q.state(msg).subscribers["invoicer"].state.value in ("DONE", "JOURNALLED")
    app.dispose()
