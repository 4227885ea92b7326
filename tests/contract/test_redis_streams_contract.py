"""The adapter contract on Redis Streams, with the Redis index store, on the real server.

Twice: with the index in the broker's database (the default: co-located, a put and a
receive are one round trip each with the index) and with the index in another database
(the general path: index and broker written apart).

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
from tests.redis_index_helpers import REDIS_URL, drop_keys, drop_streams, fresh_prefix, other_db_url

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
        hub = iqbridge.connect(
            f"{REDIS_URL}?prefix={self.prefix}&stream_prefix={self.prefix}:", clock=clock
        )
        assert hub.colocated is not None
        return hub

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


class TestRedisStreamsIndexApart(TestRedisStreamsAdapter):
    """The same contract with the index in another database: not co-located."""

    @pytest.fixture(autouse=True)
    def _apart(self, _prefix: None) -> Iterator[None]:
        try:
            yield
        finally:
            drop_keys(self.prefix, other_db_url())

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        hub = iqbridge.connect(
            f"{REDIS_URL}?prefix={self.prefix}&stream_prefix={self.prefix}:",
            index=f"{other_db_url()}?prefix={self.prefix}",
            clock=clock,
        )
        assert hub.colocated is None
        return hub
