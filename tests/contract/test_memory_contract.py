"""The shared contract suites run against the in-process broker and the memory index."""

from __future__ import annotations

from collections.abc import Callable

import iqbridge
from iqbridge.adapters.memory import MemoryAdapter
from iqbridge.queue import Queue
from iqbridge.stores.memory import MemoryStore
from iqbridge.testing.adapter_contract import AdapterContract
from iqbridge.testing.store_contract import IndexStoreContract


class TestMemoryAdapter(AdapterContract):
    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        # memory:// without a name is a private broker with a private index.
        return iqbridge.connect("memory://", clock=clock)

    def force_redelivery(
        self, hub: iqbridge.Hub, queue: Queue, msg_id: str, subscriber: str
    ) -> None:
        adapter = hub.adapter
        assert isinstance(adapter, MemoryAdapter)
        rec = hub.store.load(msg_id)
        assert rec.native_ref is not None
        member = rec.members[subscriber]
        adapter.inject(queue.name, member.pool or subscriber, rec.native_ref)


class TestForgetfulMemoryAdapter(TestMemoryAdapter):
    """The memory broker in the mode that forgets an entry once acknowledged and reads
    nothing by reference, as RabbitMQ and IBM MQ: the whole contract holds through the
    facade's retained copies."""

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        hub = iqbridge.connect("memory://?forget=true", clock=clock)
        assert hub.adapter.capabilities.forgets
        return hub


class TestMemoryStore(IndexStoreContract):
    def make_store(self) -> MemoryStore:
        return MemoryStore()
