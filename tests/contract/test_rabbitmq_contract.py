"""The adapter contract on RabbitMQ, on the real broker of this machine, with the SQLite
index store (RabbitMQ forgets acknowledged messages: the facade's retained copies serve
peek, browse, re-reveal and redelivery).

Twice: on classic queues (priorities through ``x-max-priority``) and on quorum queues
(``?queue_type=quorum``). Every test declares under its own name prefix; what it declared
is deleted afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest

import iqbridge
from iqbridge.adapters.rabbitmq import RabbitMQAdapter
from iqbridge.queue import Queue
from iqbridge.testing.adapter_contract import AdapterContract
from tests.rabbitmq_helpers import fresh_prefix, remember, url_with

pytestmark = pytest.mark.rabbitmq


class TestRabbitMQAdapter(AdapterContract):
    options: ClassVar[dict[str, str]] = {}

    @pytest.fixture(autouse=True)
    def _prefix(self, tmp_path: Path) -> Iterator[None]:
        self.hubs: list[iqbridge.Hub] = []
        self.tmp = tmp_path
        with fresh_prefix("contract") as prefix:
            self.prefix = prefix
            try:
                yield
            finally:
                for hub in self.hubs:
                    remember(hub.adapter)

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        n = len(self.hubs)
        hub = iqbridge.connect(
            url_with(self.prefix, **self.options),
            index=f"sqlite:///{self.tmp / f'index{n}.db'}" if n == 0 else self.hubs[0].store,
            clock=clock,
        )
        assert hub.adapter.capabilities.forgets
        self.hubs.append(hub)
        return hub

    def force_redelivery(
        self, hub: iqbridge.Hub, queue: Queue, msg_id: str, subscriber: str
    ) -> None:
        """What a lost acknowledgement looks like: the group's queue has the message again."""
        adapter = hub.adapter
        assert isinstance(adapter, RabbitMQAdapter)
        rec = hub.store.load(msg_id)
        kept = hub.store.retained([msg_id])[msg_id]
        member = rec.members[subscriber]
        adapter.redeliver(queue.name, member.pool or subscriber, rec.envelope(kept))


class TestRabbitMQQuorumQueues(TestRabbitMQAdapter):
    """The same contract on quorum queues (no broker priorities: the facade's order)."""

    options: ClassVar[dict[str, str]] = {"queue_type": "quorum"}


class TestRabbitMQSingleActiveConsumer(TestRabbitMQAdapter):
    """The same contract with single-active-consumer queues (``?single_active=true``:
    one process at a time reads a group; the facade claims nothing another holds)."""

    options: ClassVar[dict[str, str]] = {"single_active": "true"}
