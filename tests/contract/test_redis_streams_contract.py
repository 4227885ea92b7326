"""The adapter contract on Redis Streams, with the Redis index store, on the real server.

Every test gets its own stream prefix and index key prefix, so tests never see each
other's streams; both are deleted afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

import iqbridge
from iqbridge.adapters.redis_streams import RedisStreamsAdapter
from iqbridge.queue import Queue
from iqbridge.testing.adapter_contract import AdapterContract
from tests.redis_index_helpers import REDIS_URL, drop_streams, fresh_prefix

pytestmark = pytest.mark.redis


class TestRedisStreamsAdapter(AdapterContract):
    @pytest.fixture(autouse=True)
    def _prefix(self) -> Iterator[None]:
        with fresh_prefix("streams") as prefix:
            self.prefix = prefix
            try:
                yield
            finally:
                drop_streams(f"{prefix}:")

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        return iqbridge.connect(
            f"{REDIS_URL}?prefix={self.prefix}&stream_prefix={self.prefix}:", clock=clock
        )

    def force_redelivery(
        self, hub: iqbridge.Hub, queue: Queue, msg_id: str, subscriber: str
    ) -> None:
        """XCLAIM FORCE: the group holds the entry again as if its ack had been lost."""
        adapter = hub.adapter
        assert isinstance(adapter, RedisStreamsAdapter)
        rec = hub.store.load(msg_id)
        assert rec.native_ref is not None
        member = rec.members[subscriber]
        adapter.redeliver(queue.name, member.pool or subscriber, rec.native_ref)
