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
