"""The wire format of the Kafka adapter: how an envelope travels in a record's key and
headers (the value is the payload as it is). See :mod:`iqbridge.adapters.kafka`."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from iqbridge.ids import adopted_id
from iqbridge.model import Envelope

__all__ = [
    "Header",
    "Headers",
    "addressed_to",
    "decode",
    "encode",
    "header_items",
    "header_text",
    "parse_ref",
    "ref",
]

#: A record header as confluent-kafka gives and takes it.
Header = tuple[str, str | bytes | None]
#: A record's headers as confluent-kafka gives them (a list, or None).
Headers = dict[str, str | bytes | None] | list[Header] | None

_ID = "iq-id"
_CT = "iq-ct"
_PUB = "iq-pub"
_CORR = "iq-corr"
_PRIO = "iq-prio"
_PARENTS = "iq-parents"
_AT = "iq-at"
_TO = "iq-to"
_EXP = "iq-exp"
#: An application header whose name starts like ours travels as ``iq-h-<name>``.
_H = "iq-h-"
_OURS = "iq-"


def ref(partition: int, offset: int) -> str:
    """The native reference of a record of a queue's topic: ``<partition>:<offset>``."""
    return f"{partition}:{offset}"


def parse_ref(native_ref: str) -> tuple[int, int]:
    """(partition, offset) of a native reference; ValueError when it is not one."""
    part, _, off = native_ref.partition(":")
    return int(part), int(off)


def encode(env: Envelope) -> tuple[bytes | None, list[Header]]:
    """The record key (the ordering key, so a key stays in one partition) and headers a
    message is produced with; the value is its payload, unchanged."""
    headers: list[Header] = [
        (f"{_H}{name}" if name.startswith(_OURS) else name, value.encode())
        for name, value in env.headers.items()
    ]
    headers += [
        (_ID, env.msg_id.encode()),
        (_AT, str(env.put_at).encode()),
        (_PUB, env.publisher.encode()),
        (_PRIO, str(env.priority).encode()),
        (_CT, env.content_type.encode()),
    ]
    if env.correlation_id is not None:
        headers.append((_CORR, env.correlation_id.encode()))
    if env.parents:
        headers.append((_PARENTS, orjson.dumps(list(env.parents))))
    if env.groups:
        headers.append((_TO, orjson.dumps(list(env.groups))))
    if env.expires_at is not None:
        headers.append((_EXP, str(env.expires_at).encode()))
    key = env.ordering_key.encode() if env.ordering_key else None
    return key, headers


def header_items(headers: Headers) -> Sequence[Header]:
    if isinstance(headers, dict):
        return list(headers.items())
    return headers or ()


def addressed_to(headers: Headers) -> list[str] | None:
    """The groups an iqbridge record is addressed to, or None for every group (no
    ``iq-to``: addressed to all, or a stranger's record)."""
    for name, value in header_items(headers):
        if name == _TO and value is not None:
            return _names(value)
    return None


def decode(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    timestamp_ms: int,
) -> tuple[Envelope, bool]:
    """The envelope of a record and whether it is a stranger's (adopted).

    iqbridge's records carry ``iq-id``. A record without it (a plain producer's) is
    adopted: its msg_id derives from the topic, partition and offset, its payload is the
    value, its ``content-type`` header (if any) gives the content type, the record key is
    its ordering key, and every header is an application header. It is addressed to the
    queue's whole standing audience.
    """
    fields: dict[str, str] = {}
    app: dict[str, str] = {}
    for name, raw in header_items(headers):
        text = header_text(raw)
        if name.startswith(_H):
            app[name[len(_H) :]] = text
        elif name.startswith(_OURS):
            fields[name] = text
        else:
            app[name] = text
    body = value if value is not None else b""
    ordering_key = key.decode("utf-8", "replace") if key else ""
    if _ID not in fields:
        content_type = app.get("content-type") or app.get("Content-Type")
        env = Envelope(
            msg_id=adopted_id("kafka", topic, ref(partition, offset)),
            body=body,
            content_type=content_type or "application/octet-stream",
            headers=app,
            publisher="(legacy)",
            ordering_key=ordering_key,
            put_at=max(timestamp_ms, 0) * 1000,
        )
        return env, True
    groups = _names(fields.get(_TO)) or []
    env = Envelope(
        msg_id=fields[_ID],
        body=body,
        content_type=fields.get(_CT) or "application/octet-stream",
        headers=app,
        publisher=fields.get(_PUB, ""),
        correlation_id=fields.get(_CORR),
        priority=_int(fields.get(_PRIO), 4),
        ordering_key=ordering_key,
        parents=tuple(_names(fields.get(_PARENTS)) or ()),
        put_at=_int(fields.get(_AT), 0),
        groups=tuple(str(g) for g in groups),
        expires_at=_int(fields.get(_EXP), 0) or None,
    )
    return env, False


def _names(raw: str | bytes | None) -> list[str] | None:
    """A JSON list of names from a header; None when absent or malformed (a header
    another producer set by our name must not stop the consumer)."""
    if raw is None:
        return None
    try:
        names = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return [str(n) for n in names] if isinstance(names, list) else None


def header_text(raw: str | bytes | None) -> str:
    if raw is None:
        return ""
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default
