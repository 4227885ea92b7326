"""The URL of the RabbitMQ adapter and its options, for
:meth:`iqbridge.adapters.rabbitmq.RabbitMQAdapter.from_url`."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pika

from iqbridge.errors import ConfigurationError
from iqbridge.redaction import scrub, url_secrets

__all__ = ["parse_url"]

_OWN_OPTIONS = frozenset(
    {
        "prefix",
        "prefetch",
        "queue_type",
        "max_priority",
        "retry_for",
        "connect_timeout",
        "confirm_timeout",
        "single_active",
        "ledger",
    }
)
_PIKA_OPTIONS = frozenset(
    {
        "heartbeat",
        "blocked_connection_timeout",
        "channel_max",
        "frame_max",
        "locale",
        "socket_timeout",
        "stack_timeout",
        "ssl_options",
        "tcp_options",
    }
)


def parse_url(url: str) -> tuple[pika.URLParameters, dict[str, Any]]:
    """pika's parameters and the adapter's keyword options of an ``amqp://`` or
    ``amqps://`` URL (ConfigurationError naming what is wrong)."""
    from iqbridge.registry import redact, url_number

    safe = redact(url)
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps"):
        raise ConfigurationError(
            f"not an AMQP URL: {safe!r}; write amqp://user:password@host:5672/vhost"
        )
    opts = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = set(opts) - _OWN_OPTIONS - _PIKA_OPTIONS
    if unknown:
        raise ConfigurationError(
            f"unknown RabbitMQ option(s) {sorted(unknown)} in {safe}; known: "
            f"{', '.join(sorted(_OWN_OPTIONS | _PIKA_OPTIONS))}"
        )

    def number(name: str, default: float, low: float = 0.0) -> float:
        return url_number(opts, name, default, low=low, url=f"RabbitMQ URL {safe}")

    queue_type = opts.get("queue_type", "classic")
    if queue_type not in ("classic", "quorum"):
        raise ConfigurationError(
            f"RabbitMQ URL {safe}: queue_type must be classic or quorum, not {queue_type!r}"
        )
    max_priority = int(number("max_priority", 9))
    if max_priority > 9:
        raise ConfigurationError(
            f"RabbitMQ URL {safe}: max_priority must be 0 (none) to 9, not {max_priority}"
        )
    single_active = opts.get("single_active", "false").lower()
    if single_active not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        raise ConfigurationError(
            f"RabbitMQ URL {safe}: single_active must be true or false, not {single_active!r}"
        )
    pika_query = urlencode({k: v for k, v in opts.items() if k in _PIKA_OPTIONS})
    try:
        params = pika.URLParameters(urlunsplit(parts._replace(query=pika_query, fragment="")))
    except (ValueError, TypeError, SyntaxError) as exc:  # pika literal_evals ssl_options
        why = scrub(f"{type(exc).__name__}: {exc}", url_secrets(url))
        raise ConfigurationError(f"RabbitMQ URL {safe}: {why}") from None  # cause quotes it
    params.connection_attempts = 1  # retries are ours (tenacity), with backoff
    return params, {
        "prefix": opts.get("prefix", ""),
        "prefetch": int(number("prefetch", 256, 1)),
        "queue_type": queue_type,
        "max_priority": max_priority,
        "retry_for": number("retry_for", 30.0),
        "connect_timeout": number("connect_timeout", 10.0, 0.1),
        "confirm_timeout": number("confirm_timeout", 30.0, 0.1),
        "single_active": single_active in ("true", "1", "yes", "on"),
        "ledger": opts.get("ledger", "false").lower() in ("true", "1", "yes", "on"),
    }
