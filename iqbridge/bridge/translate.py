"""Translation on a route: envelope and header mapping, content-type conversion, the
user's transform, and the children's deterministic msg_ids.

A transform is a plain function given by a dotted path (``package.module:function``)::

    def enrich(msg: BridgeMessage) -> object:
        if msg.payload.get("test"):
            return None                                  # a filter: no child
        return Outgoing({"order": msg.payload, "seen": True}, ordering_key="orders")

It returns ``None`` (no child), one payload or :class:`~iqbridge.Outgoing`, or a list
(or tuple, or generator) of them for several children. A payload that is itself a
JSON list must be wrapped in an ``Outgoing`` to be sent as one child. A child inherits
the parent's envelope (after the route's mapping) where its ``Outgoing`` leaves a field
unset; its ``msg_id`` and ``parents`` are always the bridge's: the transform must be
deterministic (same input, same children in the same order), since a retry after a
crash derives the same ids to find what the destination already has.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import GeneratorType
from typing import Any

from iqbridge.bridge.config import Route
from iqbridge.errors import ConfigurationError, PayloadError
from iqbridge.payload import BINARY, JSON, TEXT, decode
from iqbridge.putting import Outgoing

__all__ = ["BridgeMessage", "Translator", "child_id", "load_callable"]


@dataclass(frozen=True, slots=True)
class BridgeMessage:
    """A message as a route's transform, key and combine functions see it (read only)."""

    msg_id: str
    queue: str
    body: bytes
    content_type: str
    headers: Mapping[str, str] = field(default_factory=dict)
    correlation_id: str | None = None
    priority: int = 4
    ordering_key: str = ""
    publisher: str = ""
    parents: tuple[str, ...] = ()
    put_at: datetime | None = None

    @property
    def payload(self) -> Any:
        """The decoded payload: bytes, str or a JSON value (by content type)."""
        return decode(self.body, self.content_type)


def child_id(route: str, parents: Iterable[str], n: int = 0) -> str:
    """The msg_id of a route's ``n``-th child of ``parents``: the same inputs give the
    same id in every process and after every restart, so the destination's idempotent
    put refuses a second copy."""
    h = hashlib.blake2b(digest_size=16)
    h.update(route.encode())
    for p in parents:
        h.update(b"\x00")
        h.update(p.encode())
    h.update(b"\x01%d" % n)
    return "br" + h.hexdigest()


def load_callable(path: str, what: str) -> Callable[..., Any]:
    """Import ``package.module:function``; a ConfigurationError names what failed."""
    mod_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ConfigurationError(f"{what} {path!r}: cannot import {mod_name!r} ({exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigurationError(f"{what} {path!r}: {mod_name} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


def _convert(body: bytes, ctype: str, target: str) -> tuple[bytes, str]:
    """Content-type conversion: ``bytes``, ``text``, ``json`` or ``keep``."""
    if target == "keep":
        return body, ctype
    if target == "bytes":
        return body, BINARY
    if target == "text":
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise PayloadError("payload is not UTF-8 text; cannot convert it to text") from None
        return text.encode("utf-8"), TEXT
    # json
    base = ctype.split(";", 1)[0].strip().lower()
    if base == JSON or base.endswith("+json"):
        decode(body, ctype)  # checked: malformed JSON is a PayloadError
        return body, JSON
    if base.startswith("text/"):
        value: Any = decode(body, ctype)
        try:
            json.loads(value)
            return value.encode("utf-8"), JSON
        except ValueError:
            return json.dumps(value).encode("utf-8"), JSON
    raise PayloadError(f"a {ctype} payload cannot be converted to JSON; use content_type: bytes")


class Translator:
    """Turns one source message into its children for a route (see the module docs)."""

    def __init__(self, route: Route) -> None:
        self.route = route
        self.publisher = route.publisher or f"bridge.{route.name}"
        self.transform = (
            load_callable(route.transform, f"route {route.name!r}, field transform")
            if route.transform
            else None
        )

    def headers(self, parent: Mapping[str, str]) -> dict[str, str]:
        """The route's header mapping applied to a parent's headers."""
        hm = self.route.headers
        out = dict(parent) if hm.keep else {}
        for old, new in hm.rename.items():
            if old in out:
                out[new] = out.pop(old)
        for name in hm.drop:
            out.pop(name, None)
        out.update(hm.set)
        return out

    def _field(self, spec: str, msg: BridgeMessage, keep: str | None) -> str | None:
        if spec == "keep":
            return keep
        if spec == "msg_id":
            return msg.msg_id
        if spec == "correlation_id":
            return msg.correlation_id
        return msg.headers.get(spec[len("header:") :])

    def base(self, msg: BridgeMessage) -> Outgoing:
        """The child a parent makes without a transform: its envelope after the route's
        mapping, its payload after content-type conversion."""
        env = self.route.envelope
        body, ctype = _convert(msg.body, msg.content_type, self.route.content_type)
        prio = msg.priority if env.priority == "keep" else int(env.priority)
        return Outgoing(
            body,
            correlation_id=self._field(env.correlation_id, msg, msg.correlation_id),
            priority=prio,
            ordering_key=self._field(env.ordering_key, msg, msg.ordering_key) or msg.ordering_key,
            headers=self.headers(msg.headers),
            content_type=ctype,
            publisher=self.publisher,
        )

    def children(self, msg: BridgeMessage) -> list[Outgoing]:
        """The children of one parent, with their final msg_ids and parents."""
        base = self.base(msg)
        if self.transform is None:
            made: list[Outgoing] = [base]
        else:
            view = BridgeMessage(
                msg.msg_id,
                msg.queue,
                base.payload if isinstance(base.payload, bytes) else msg.body,
                base.content_type or msg.content_type,
                base.headers or {},
                base.correlation_id,
                base.priority,
                base.ordering_key or msg.ordering_key,
                msg.publisher,
                msg.parents,
                msg.put_at,
            )
            made = [self._fill(o, base) for o in _many(self.transform(view))]
        return [
            _with_ids(o, child_id(self.route.name, (msg.msg_id,), n), (msg.msg_id,))
            for n, o in enumerate(made)
        ]

    def _fill(self, out: object, base: Outgoing) -> Outgoing:
        if not isinstance(out, Outgoing):
            # A bare payload: the parent's envelope, the payload's own content type.
            return Outgoing(
                out,
                correlation_id=base.correlation_id,
                priority=base.priority,
                ordering_key=base.ordering_key,
                headers=base.headers,
                publisher=self.publisher,
            )
        return Outgoing(
            out.payload,
            correlation_id=out.correlation_id
            if out.correlation_id is not None
            else base.correlation_id,
            priority=out.priority,
            ordering_key=out.ordering_key or base.ordering_key,
            ttl=out.ttl,
            headers=out.headers if out.headers is not None else base.headers,
            content_type=out.content_type,
            publisher=out.publisher or self.publisher,
        )


def _many(result: object) -> list[object]:
    if result is None:
        return []
    if isinstance(result, list | tuple | GeneratorType):
        return list(result)
    return [result]


def _with_ids(o: Outgoing, msg_id: str, parents: tuple[str, ...]) -> Outgoing:
    return Outgoing(
        o.payload,
        msg_id=msg_id,
        correlation_id=o.correlation_id,
        priority=o.priority,
        ordering_key=o.ordering_key,
        ttl=o.ttl,
        parents=parents,
        headers=o.headers,
        content_type=o.content_type,
        publisher=o.publisher,
    )


def message_of(delivery: Any) -> BridgeMessage:
    """The read-only view of a delivery (or an envelope-like object)."""
    return BridgeMessage(
        delivery.msg_id,
        delivery.queue,
        delivery.body,
        delivery.content_type,
        dict(delivery.headers),
        delivery.correlation_id,
        delivery.priority,
        delivery.ordering_key,
        delivery.publisher,
        tuple(delivery.parents),
        delivery.put_at,
    )
