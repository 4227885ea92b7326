"""The adapter contract on Kafka (Tansu, a Kafka-wire broker, started for the test
session), with the SQLite index store (Kafka cannot read a record back by reference or
delete one: the facade's retained copies serve peek, browse, re-reveal and redelivery).

Every test uses its own topic and group name prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import iqbridge
from iqbridge.adapters.kafka import KafkaAdapter
from iqbridge.queue import Queue
from iqbridge.testing.adapter_contract import AdapterContract
from tests.kafka_helpers import fresh_prefix, kafka_url

pytestmark = pytest.mark.kafka


class TestKafkaAdapter(AdapterContract):
    @pytest.fixture(autouse=True)
    def _prefix(self, tmp_path: Path) -> None:
        self.hubs: list[iqbridge.Hub] = []
        self.tmp = tmp_path
        self.prefix = fresh_prefix("contract")

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        n = len(self.hubs)
        hub = iqbridge.connect(
            kafka_url(self.prefix),
            index=f"sqlite:///{self.tmp / f'index{n}.db'}" if n == 0 else self.hubs[0].store,
            clock=clock,
        )
        assert hub.adapter.capabilities.forgets
        self.hubs.append(hub)
        return hub

    def force_redelivery(
        self, hub: iqbridge.Hub, queue: Queue, msg_id: str, subscriber: str
    ) -> None:
        """What a commit lost in a crash looks like: the group reads the partition again
        from the message's record on."""
        adapter = hub.adapter
        assert isinstance(adapter, KafkaAdapter)
        rec = hub.store.load(msg_id)
        assert rec.native_ref is not None
        member = rec.members[subscriber]
        adapter.rewind(queue.name, member.pool or subscriber, rec.native_ref)
