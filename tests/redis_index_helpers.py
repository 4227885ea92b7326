"""Helpers for the Redis index store's tests: the server URL, a unique key prefix per
test (skipped, or failed under CI=true, when Redis is unreachable), clean-up, and a
check of the index's own bookkeeping (check_redis_index)."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from conftest import need_server

#: The Redis the tests use (override with IQ_REDIS_URL).
REDIS_URL = os.environ.get("IQ_REDIS_URL", "redis://127.0.0.1:6379/0")


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


def other_db_url() -> str:
    """REDIS_URL on another database of the same server (an index kept apart)."""
    parts = urlsplit(REDIS_URL)
    db = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{(db + 1) % 16}"))


def drop_keys(prefix: str, url: str = REDIS_URL) -> None:
    """Delete every key of one index (its keys all start with ``{iq:<prefix>}:``)."""
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{{iq:{prefix}}}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


@contextlib.contextmanager
def fresh_prefix(label: str = "test") -> Iterator[str]:
    """A key prefix no other test uses; its keys are deleted afterwards."""
    need_server(f"Redis at {REDIS_URL}", *redis_reachable())
    prefix = f"{label}-{uuid.uuid4().hex[:12]}"
    try:
        yield prefix
    finally:
        drop_keys(prefix)


def drop_streams(prefix: str) -> None:
    """Delete the streams (and dead-letter streams) whose keys start with ``prefix``."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


def check_redis_index(store: Any) -> None:
    """Every sorted set of the index holds exactly the records whose ``ix`` names it, and
    every record's optional fields are exactly those its state calls for."""
    from iqbridge.stores.redis import RedisStore

    assert isinstance(store, RedisStore)
    client = store.client
    records = {
        key[len(store.keyspace) + 2 :]: key
        for key in client.scan_iter(match=f"{store.keyspace}m:*", count=1000)
    }
    listed: dict[str, set[str]] = {}
    for msg_id, key in records.items():
        raw = client.hgetall(key)
        ix = set(json.loads(raw["ix"]))
        for index in ix:
            assert client.zscore(index, msg_id) is not None, f"{msg_id} missing from {index}"
            listed.setdefault(index, set()).add(msg_id)
        rec = store.load(msg_id)
        _, _, _, optional = store._layout(rec)
        present = {f for f in raw if f in ("x", "lk", "lu") or f.startswith("b:")}
        assert present == set(optional), f"{msg_id}: fields {present}, state calls for {optional}"
        for name, value in optional.items():
            assert raw[name] == value, (msg_id, name)
    for index in client.scan_iter(match=f"{store.keyspace}*", count=1000, _type="zset"):
        members = set(client.zrange(index, 0, -1))
        assert members == listed.get(index, set()), f"{index}: {members} vs {listed.get(index)}"
    # Member rows kept apart by moves of members only: only for records marked so, only
    # of their own members, and the publisher state under "" as the record reads it.
    for key in client.scan_iter(match=f"{store.keyspace}ms:*", count=1000):
        msg_id = key[len(store.keyspace) + 3 :]
        assert msg_id in records, f"member rows of {msg_id} outlived its record"
        assert client.hget(records[msg_id], "mo") == "1", f"{msg_id}: rows apart, unmarked"
        apart = client.hgetall(key)
        rec = store.load(msg_id)
        assert set(apart) - {""} <= set(rec.members), msg_id
        if "" in apart:
            assert rec.publisher_state is not None
            assert apart[""] == rec.publisher_state.value, msg_id
