"""The adapter contract on IBM MQ, against the in-process fake of IBM's client
(:mod:`iqbridge.testing.fakes.ibmmq`, installed as the ``ibmmq`` module), with the SQLite
index store. IBM MQ forgets a message once its get is committed: the facade's retained
copies serve peek, browse, re-reveal and redelivery. The same suite runs against a real
queue manager under Docker in ``test_ibmmq_docker_contract.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import iqbridge
from iqbridge.adapters.ibmmq import IbmMqAdapter
from iqbridge.queue import Queue
from iqbridge.testing.adapter_contract import AdapterContract
from iqbridge.testing.fakes import ibmmq as fake

# The fake's queue manager, as the developer image sets it up: QM1 on port 1414, the
# application user ``app`` (allowed to create queues here, so ``create=true`` works).
from tests.ibmmq_helpers import URL, qm_fixture  # noqa: F401 (a fixture)

pytestmark = pytest.mark.ibmmq


class TestIbmMqAdapter(AdapterContract):
    @pytest.fixture(autouse=True)
    def _broker(self, qm: fake.FakeQueueManager, tmp_path: Path) -> None:
        self.qm = qm
        self.tmp = tmp_path
        self.hubs: list[iqbridge.Hub] = []

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        n = len(self.hubs)
        hub = iqbridge.connect(
            URL,
            index=f"sqlite:///{self.tmp / 'index.db'}" if n == 0 else self.hubs[0].store,
            clock=clock,
        )
        assert isinstance(hub.adapter, IbmMqAdapter)
        assert hub.adapter.capabilities.forgets
        self.hubs.append(hub)
        return hub

    def force_redelivery(
        self, hub: iqbridge.Hub, queue: Queue, msg_id: str, subscriber: str
    ) -> None:
        """What a lost commit looks like: the group's queue has the message again."""
        adapter = hub.adapter
        assert isinstance(adapter, IbmMqAdapter)
        rec = hub.store.load(msg_id)
        kept = hub.store.retained([msg_id])[msg_id]
        member = rec.members[subscriber]
        adapter.put_again(queue.name, member.pool or subscriber, rec.envelope(kept))
