"""Helpers for the Redis index store's tests: the server URL, a unique key prefix per
test (skipped, or failed under CI=true, when Redis is unreachable), and clean-up."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
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
