"""What the Kafka adapter's librdkafka clients are configured with: which properties go to
which kind of client, and where librdkafka's log lines go. See
:mod:`iqbridge.adapters.kafka`."""

from __future__ import annotations

import logging
import threading
from typing import Any

from iqbridge.redaction import get_logger

__all__ = ["CONSUMER_ONLY", "PROBE", "PRODUCER_ONLY", "RdLog", "client_config", "rdlog"]

#: librdkafka's own log lines.
rdlog = get_logger("iqbridge.librdkafka")

#: A reader of the topic's tail (find_sent): its own group, never committing.
PROBE = {"group.id": "iq-probe", "enable.auto.commit": False, "enable.partition.eof": False}
#: librdkafka properties only a consumer takes (the others warn about them), and those
#: only a producer takes; every other property goes to both.
CONSUMER_ONLY = (
    "group.",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "partition.assignment.strategy",
    "max.poll.interval.ms",
    "enable.auto.",
    "auto.",
    "fetch.",
    "queued.",
    "isolation.level",
    "check.crcs",
    "allow.auto.create.topics",
    "consume.callback.max.messages",
    "enable.partition.eof",
    "coordinator.query.interval.ms",
)
PRODUCER_ONLY = (
    "transactional.id",
    "transaction.timeout.ms",
    "enable.idempotence",
    "enable.gapless.guarantee",
    "queue.buffering.",
    "message.send.max.retries",
    "retries",
    "retry.backoff.",
    "linger.ms",
    "batch.",
    "compression.",
    "acks",
    "request.required.acks",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "partitioner",
    "sticky.partitioning.linger.ms",
)


def client_config(config: dict[str, Any], kind: str = "", **extra: Any) -> dict[str, Any]:
    """The librdkafka configuration of a client: a ``producer`` or ``consumer`` gets only
    the properties of ``config`` it takes (the admin client gets neither kind's own),
    then ``extra``."""
    out = {
        name: value
        for name, value in config.items()
        if not (kind != "consumer" and name.startswith(CONSUMER_ONLY))
        and not (kind != "producer" and name.startswith(PRODUCER_ONLY))
    }
    out.update(extra)
    return out


class RdLog:
    """librdkafka's log lines (confluent-kafka's ``logger``) into the Python logger
    ``iqbridge.librdkafka`` at their own levels, except a connection to a broker failing
    (facility ``FAIL``): librdkafka logs that at every retry, many times a second while a
    broker refuses, so it is INFO the first time for each client and DEBUG after that.
    The adapter says itself, once, that Kafka is unreachable, and raises within its
    bounds."""

    def __init__(self) -> None:
        self._failed: set[str] = set()
        self._lock = threading.Lock()

    def log(self, level: int, msg: str, *args: Any) -> None:
        """One line from librdkafka: ``msg`` is ``"%s [%s] %s"`` (facility, client name,
        text)."""
        if len(args) >= 2 and args[0] == "FAIL" and level > logging.INFO:
            client = str(args[1])
            with self._lock:
                level = logging.DEBUG if client in self._failed else logging.INFO
                self._failed.add(client)
        rdlog.log(level, msg, *args)
