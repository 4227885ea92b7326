"""The URL of the Kafka adapter and its options, for
:meth:`iqbridge.adapters.kafka.KafkaAdapter.from_url`."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from iqbridge.errors import ConfigurationError
from iqbridge.redaction import redact

__all__ = ["parse_url"]

_OWN_OPTIONS = frozenset(
    {
        "prefix",
        "partitions",
        "replication",
        "retry_for",
        "connect_timeout",
        "join_timeout",
        "buffer",
        "revoke_wait",
    }
)


def parse_url(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """librdkafka's configuration and the adapter's keyword options of a ``kafka://``
    URL (ConfigurationError naming what is wrong, the URL redacted)."""
    from iqbridge.registry import url_number

    safe = redact(url)
    parts = urlsplit(url)
    if parts.scheme != "kafka" or not parts.netloc:
        raise ConfigurationError(
            f"not a Kafka URL: {safe!r}; write kafka://host:9092[,host2:9092][?options]"
        )
    hosts = parts.netloc.rpartition("@")[2]
    opts = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = {k for k in opts if "." not in k} - _OWN_OPTIONS
    if unknown:
        raise ConfigurationError(
            f"unknown Kafka option(s) {sorted(unknown)} in {safe}; known: "
            f"{', '.join(sorted(_OWN_OPTIONS))}, and librdkafka's properties (a name "
            f"with a dot, such as security.protocol)"
        )

    def number(name: str, default: float, low: float = 0.0) -> float:
        return url_number(opts, name, default, low=low, url=f"Kafka URL {safe}")

    config: dict[str, Any] = {"bootstrap.servers": hosts}
    if "@" in parts.netloc:
        user, _, password = parts.netloc.rpartition("@")[0].partition(":")
        config.update(
            {
                "sasl.username": unquote(user),
                "sasl.password": unquote(password),
                "sasl.mechanism": "PLAIN",
                "security.protocol": "SASL_PLAINTEXT",
            }
        )
    config.update({k: v for k, v in opts.items() if "." in k})
    return config, {
        "prefix": opts.get("prefix", ""),
        "partitions": int(number("partitions", 1, 1)),
        "replication": int(number("replication", 1, 1)),
        "retry_for": number("retry_for", 30.0, 0.1),
        "connect_timeout": number("connect_timeout", 10.0, 0.1),
        "join_timeout": number("join_timeout", 5.0, 0.0),
        "buffer": int(number("buffer", 20000, 1)),
        "revoke_wait": number("revoke_wait", 10.0),
    }
