"""The adapter contract on Oracle AQ, against the in-process fake of python-oracledb.

Oracle cannot run on the build machines, so ``iqbridge.testing.fakes.oracledb`` (written
from python-oracledb's own code and Oracle's DBMS_AQ documentation) stands in for the
driver: it is put in ``sys.modules["oracledb"]``, where the adapter's lazy import finds
it; the adapter has no branch for it. The index is a separate memory store, and, in
``TestOracleAQWithOracleIndex``, the SQL store on the same (fake) Oracle database. The
same suite runs live on Oracle Free under Docker in ``test_oracle_aq_docker_contract.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import iqbridge
from iqbridge.adapters.oracle_aq import OracleAQAdapter
from iqbridge.queue import Queue
from iqbridge.stores.memory import MemoryStore
from iqbridge.testing.adapter_contract import AdapterContract
from iqbridge.testing.fakes import oracledb as fake_oracledb
from tests.oracle_helpers import PASSWORD, URL, fake_oracle_fixture  # noqa: F401 (a fixture)

pytestmark = pytest.mark.oracle

INDEX_URL = f"oracle+oracledb://iq:{PASSWORD}@oracle.test:1521/?service_name=FREEPDB1"


class TestOracleAQAdapter(AdapterContract):
    @pytest.fixture(autouse=True)
    def _database(self, fake_oracle: fake_oracledb.Database) -> None:
        self.db = fake_oracle

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        return iqbridge.connect(URL, index=MemoryStore(), clock=clock)

    def force_redelivery(
        self, hub: iqbridge.Hub, queue: Queue, msg_id: str, subscriber: str
    ) -> None:
        """The group's copy is READY again, as when a session that removed it died
        before its commit and Oracle rolled it back."""
        adapter = hub.adapter
        assert isinstance(adapter, OracleAQAdapter)
        rec = hub.store.load(msg_id)
        assert rec.native_ref is not None
        group = rec.members[subscriber].pool or subscriber
        self.db.reset_consumer(
            adapter.queue_name(queue.name),
            bytes.fromhex(rec.native_ref),
            adapter.consumer_name(group),
        )


class TestOracleAQNoRetention(TestOracleAQAdapter):
    """AQ without retention (``retention=0``): a dequeued message leaves the queue table,
    so the facade keeps its own retained copy and the retention tests run."""

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        hub = iqbridge.connect(f"{URL}?retention=0", index=MemoryStore(), clock=clock)
        assert hub.adapter.capabilities.forgets
        return hub


class TestOracleAQRedeliverByCopy(TestOracleAQAdapter):
    """The same contract with redelivery as the live suite makes it: AQ cannot make a
    removed message ready again, so ``OracleAQAdapter.redeliver`` enqueues a copy of its
    envelope for the group, and the facade must treat it as the same message."""

    def force_redelivery(
        self, hub: iqbridge.Hub, queue: Queue, msg_id: str, subscriber: str
    ) -> None:
        adapter = hub.adapter
        assert isinstance(adapter, OracleAQAdapter)
        rec = hub.store.load(msg_id)
        assert rec.native_ref is not None
        group = rec.members[subscriber].pool or subscriber
        assert adapter.redeliver(queue.name, group, rec.native_ref)


class TestOracleAQWithOracleIndex(TestOracleAQAdapter):
    """The contract with the index where production keeps it: the SQL store on the same
    Oracle database (``oracle+oracledb://``, SQLAlchemy's Oracle dialect against the
    fake's SQL side), which exactly-once with the application's transaction needs."""

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        return iqbridge.connect(URL, index=INDEX_URL, clock=clock)
