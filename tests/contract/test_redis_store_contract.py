"""The shared contract suites with the Redis index store on the real Redis server.

``TestRedisStore`` runs the store-level suite on :class:`RedisStore`;
``TestSqliteQueueWithRedisIndex`` runs the facade-level suite on the embedded SQLite
queue with its index in Redis (index-driven delivery, so every claim is the Redis
store's compare-and-set). Every test gets its own key prefix, so runs (and other tests
on the same server) never see each other's keys; the keys are deleted afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import iqbridge
from iqbridge.stores.redis import RedisStore
from iqbridge.testing.adapter_contract import AdapterContract
from iqbridge.testing.store_contract import IndexStoreContract
from tests.redis_index_helpers import REDIS_URL, fresh_prefix

pytestmark = pytest.mark.redis


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix no other test uses; its keys are deleted afterwards."""
    with fresh_prefix("contract") as prefix:
        yield prefix


class TestRedisStore(IndexStoreContract):
    @pytest.fixture(autouse=True)
    def _prefix(self, redis_prefix: str) -> None:
        self.prefix = redis_prefix

    def make_store(self) -> RedisStore:
        return RedisStore.from_url(f"{REDIS_URL}?prefix={self.prefix}")


class TestSqliteQueueWithRedisIndex(AdapterContract):
    @pytest.fixture(autouse=True)
    def _prefix(self, redis_prefix: str, tmp_path: Path) -> None:
        self.prefix = redis_prefix
        self.db_dir = tmp_path

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        return iqbridge.connect(
            f"sqlite:///{self.db_dir / 'queue.db'}",
            index=f"{REDIS_URL}?prefix={self.prefix}",
            clock=clock,
        )
