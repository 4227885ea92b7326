"""The wire format of the RabbitMQ adapter (how an envelope travels in AMQP properties
and headers) and the deliveries as one process holds them. See
:mod:`iqbridge.adapters.rabbitmq`."""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pika.spec import BasicProperties

from iqbridge.ids import adopted_id
from iqbridge.model import Envelope

__all__ = ["Msg", "Slot", "decode", "as_int", "encode"]

_PRIORITIES = 10

_AT = "x-iq-at"
_PUB = "x-iq-pub"
_KEY = "x-iq-key"
_PARENTS = "x-iq-parents"
_TO = "x-iq-to"
_H = "x-iq-h-"
#: Headers the broker or iqbridge set, never an application's.
_BROKER_HEADERS = frozenset({"x-death", "x-delivery-count", "CC", "BCC"})
_BROKER_PREFIXES = ("x-first-death-", "x-last-death-", "x-iq-")


# --- the wire format ---------------------------------------------------------------------


def encode(env: Envelope) -> tuple[str, BasicProperties]:
    """The routing key and properties a message is published with (the body is the
    payload as it is)."""
    headers: dict[str, Any] = {}
    for name, value in env.headers.items():
        reserved = name in _BROKER_HEADERS or name.startswith(_BROKER_PREFIXES)
        headers[f"{_H}{name}" if reserved else name] = value
    headers[_AT] = env.put_at
    headers[_PUB] = env.publisher
    if env.ordering_key:
        headers[_KEY] = env.ordering_key
    if env.parents:
        headers[_PARENTS] = list(env.parents)
    groups = list(env.groups)
    headers[_TO] = groups
    if len(groups) > 1:
        headers["BCC"] = groups[1:]
    expiration = None
    if env.expires_at is not None:
        expiration = str(max((env.expires_at - env.put_at) // 1000, 0))
    props = BasicProperties(
        content_type=env.content_type,
        delivery_mode=2,
        priority=env.priority,
        correlation_id=env.correlation_id,
        message_id=env.msg_id,
        timestamp=env.put_at // 1_000_000,
        expiration=expiration,
        headers=headers,
    )
    return (groups[0] if groups else ""), props


def decode(
    queue: str, group: str, props: BasicProperties, body: bytes
) -> tuple[str, Envelope, bool]:
    """The native reference, envelope and whether it was adopted, of a delivery.

    iqbridge's messages have ``x-iq-at``; their reference is their msg_id. A stranger's
    is adopted: its reference is ``<group>/id/<message_id>`` when the producer set a
    ``message_id``, else ``<group>/sha/<digest of body and properties>`` (so a redelivery
    of it is known again; two byte-identical messages without ids count as one), and its
    msg_id derives from the queue and that reference. Adopted messages are addressed to
    the group whose queue they were found on.
    """
    raw: Mapping[str, Any] = props.headers or {}
    if _AT in raw:
        headers = {
            (k[len(_H) :] if k.startswith(_H) else k): _text(v)
            for k, v in raw.items()
            if k.startswith(_H) or not (k in _BROKER_HEADERS or k.startswith(_BROKER_PREFIXES))
        }
        env = Envelope(
            msg_id=props.message_id or "",
            body=body,
            content_type=props.content_type or "application/octet-stream",
            headers=headers,
            publisher=_text(raw.get(_PUB, "")),
            correlation_id=props.correlation_id,
            priority=props.priority if props.priority is not None else 4,
            ordering_key=_text(raw.get(_KEY, "")),
            parents=tuple(_text(p) for p in raw.get(_PARENTS) or ()),
            put_at=as_int(raw.get(_AT)),
            groups=tuple(_text(g) for g in raw.get(_TO) or ()),
        )
        return env.msg_id, env, False
    if props.message_id:
        ref = f"{group}/id/{props.message_id}"
    else:
        digest = hashlib.sha256(body)
        for name in ("content_type", "correlation_id", "type", "app_id", "user_id"):
            digest.update(f"\x00{name}={getattr(props, name)}".encode())
        digest.update(repr(sorted((k, repr(v)) for k, v in raw.items())).encode())
        ref = f"{group}/sha/{digest.hexdigest()[:32]}"
    priority = props.priority if props.priority is not None else 4
    env = Envelope(
        msg_id=adopted_id("rabbitmq", queue, ref),
        body=body,
        content_type=props.content_type or "application/octet-stream",
        headers={
            k: _text(v)
            for k, v in raw.items()
            if not (k in _BROKER_HEADERS or k.startswith(_BROKER_PREFIXES))
        },
        publisher=props.app_id or "(legacy)",
        correlation_id=props.correlation_id,
        priority=min(max(priority, 0), 9),
        put_at=(props.timestamp or 0) * 1_000_000,
        groups=(group,),
    )
    return ref, env, True


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def as_int(value: Any) -> int:
    """A header value as an int, 0 when it is not one (a stranger's header)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


# --- deliveries as this process holds them -----------------------------------------------


@dataclass(slots=True)
class Msg:
    """One delivery pushed to this process and not yet settled."""

    generation: int
    tag: int
    redelivered: bool
    props: BasicProperties
    body: bytes
    count: int = 1
    ref: str = ""
    env: Envelope | None = None
    adopted: bool = False
    #: Who it was last handed to, and when (monotonic seconds).
    consumer: str = ""
    since: float = 0.0


@dataclass(slots=True)
class Slot:
    """One consumer group's queue as this process sees it."""

    queue: str
    group: str
    name: str
    #: Pushed and not handed out yet, one deque per priority (9 first).
    ready: list[deque[Msg]] = field(default_factory=lambda: [deque() for _ in range(10)])
    #: Handed out and not settled: native reference -> deliveries (a duplicate publish
    #: of one message gives two).
    held: dict[str, list[Msg]] = field(default_factory=dict)
    consumer_tag: str = ""
    generation: int = 0
    idle_checked: float = 0.0
    #: Until when deliveries this process gave back (nack with requeue) may still be on
    #: their way back (a quorum queue requeues through its log, after any barrier).
    returning_until: float = 0.0

    def waiting(self) -> int:
        return sum(len(d) for d in self.ready)
