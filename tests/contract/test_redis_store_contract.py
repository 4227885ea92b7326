"""The shared contract suites with the Redis index store on the real Redis server.

``TestRedisStore`` runs the store-level suite on :class:`RedisStore`;
``TestSqliteQueueWithRedisIndex`` runs the facade-level suite on the embedded SQLite
queue with its index in Redis (index-driven delivery, so every claim is the Redis
store's compare-and-set). Every test gets its own key prefix, so runs (and other tests
on the same server) never see each other's keys; the keys are deleted afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from conftest import need_server

import iqbridge
from iqbridge.stores.redis import RedisStore
from iqbridge.testing.adapter_contract import AdapterContract
from iqbridge.testing.store_contract import IndexStoreContract

REDIS_URL = os.environ.get("IQ_REDIS_URL", "redis://127.0.0.1:6379/0")

pytestmark = pytest.mark.redis


def redis_reachable() -> tuple[bool, str]:
    """Whether the test Redis answers, and why not."""
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
        try:
            client.ping()
        finally:
            client.close()
    except redis.RedisError as exc:
        return False, str(exc)
    return True, ""


def drop_keys(prefix: str) -> None:
    """Delete every key of one index (its keys all start with ``{iq:<prefix>}:``)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{{iq:{prefix}}}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix no other test uses; its keys are deleted afterwards."""
    need_server(f"Redis at {REDIS_URL}", *redis_reachable())
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    yield prefix
    drop_keys(prefix)


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
