"""Helpers for the RabbitMQ tests: the broker URL, a check that it answers (skipped, or
failed under CI=true, when it does not), and clean-up of what a test declared."""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pika
import pika.exceptions
from conftest import need_server

from iqbridge.testing.servers import drop_rabbitmq

#: The RabbitMQ the tests use (override with IQ_AMQP_URL).
AMQP_URL = os.environ.get("IQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


def rabbitmq_reachable() -> tuple[bool, str]:
    """Whether the test broker accepts a connection, and why not."""
    parts = urlsplit(AMQP_URL)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), 2):
            pass
        pika.BlockingConnection(pika.URLParameters(AMQP_URL)).close()
    except (OSError, pika.exceptions.AMQPError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


def need_rabbitmq() -> None:
    """Skip (or fail under CI=true) when the test broker is unreachable."""
    ok, why = rabbitmq_reachable()
    need_server(f"RabbitMQ at {AMQP_URL}", ok, why)


def url_with(prefix: str, **options: str) -> str:
    """AMQP_URL with a name prefix and more options."""
    query = "&".join(f"{k}={v}" for k, v in {"prefix": prefix, **options}.items())
    return f"{AMQP_URL}?{query}"


@contextlib.contextmanager
def fresh_prefix(what: str = "t") -> Iterator[str]:
    """A name prefix no other test uses; what was declared under it is deleted after."""
    need_rabbitmq()
    prefix = f"iqt-{what}-{uuid.uuid4().hex[:8]}-"
    try:
        yield prefix
    finally:
        drop_prefixed(prefix)


def drop_prefixed(prefix: str) -> None:
    """Delete the exchanges and queues a test declared under ``prefix``: iqbridge's
    names are ``<prefix><queue>``, ``<prefix><queue>.<group>`` and
    ``<prefix><queue>/dead``; the broker has no listing over AMQP, so the adapters
    record what they declared (:func:`remember`)."""
    drop_rabbitmq(AMQP_URL, _declared.pop(prefix, set()))


_declared: dict[str, set[tuple[str, str]]] = {}


def remember(adapter: object) -> None:
    """Record the names an adapter declared, for :func:`drop_prefixed`."""
    from iqbridge.adapters.rabbitmq import RabbitMQAdapter

    assert isinstance(adapter, RabbitMQAdapter)
    _declared.setdefault(adapter.prefix, set()).update(adapter.declared_names())
