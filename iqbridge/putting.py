"""The publisher side: put, confirm, reveal and withdraw."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from iqbridge import engine, engine_batch
from iqbridge.durations import to_seconds
from iqbridge.errors import (
    InvalidArgument,
    MessageTooLarge,
    PayloadNotRetained,
)
from iqbridge.ids import new_id
from iqbridge.model import Envelope, Retained, check_name, check_text
from iqbridge.observability import tracing
from iqbridge.payload import encode
from iqbridge.put_paths import SEND_FIRST_WINDOW, PutPath, put_path
from iqbridge.queue_core import Part, QueueCore
from iqbridge.redaction import get_logger
from iqbridge.subscribing import AudienceSpec, Subscribing
from iqbridge.writes import Writes

_MSG_ID_MAX = 128
#: What a caller's msg_id must not hold: whitespace (as ``str.isspace``), '/', NUL.
_BAD_IN_ID = re.compile(r"[\s/\x00]")


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message of :meth:`Putting.put_each`, with its own options (as for ``put``)."""

    payload: object
    msg_id: str | None = None
    correlation_id: str | None = None
    priority: int = 4
    ordering_key: str | None = None
    ttl: float | timedelta | None = None
    parents: Sequence[str] = ()
    headers: Mapping[str, str] | None = None
    content_type: str | None = None
    publisher: str | None = None


@dataclass(frozen=True, slots=True)
class _Spec:
    """A message's options, checked."""

    publisher: str
    correlation_id: str | None
    priority: int
    ordering_key: str | None
    ttl: float | None
    parents: tuple[str, ...]
    headers: dict[str, str]
    content_type: str | None

    @classmethod
    def checked(
        cls,
        publisher: str,
        correlation_id: str | None,
        priority: int,
        ordering_key: str | None,
        ttl: float | None,
        parents: tuple[str, ...],
        headers: Mapping[str, str] | None,
        content_type: str | None,
    ) -> _Spec:
        if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 9:
            raise InvalidArgument(f"priority must be an int from 0 to 9, got {priority!r}")
        hdrs = dict(headers or {})
        for k, v in hdrs.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidArgument("headers must map str to str")
            check_text(f"header {k!r}", v)
            check_text("header name", k)
        if correlation_id is not None:
            check_text("correlation_id", correlation_id)
        if ordering_key is not None:
            check_text("ordering_key", ordering_key)
        for p in parents:
            if not isinstance(p, str):
                raise InvalidArgument("parents must be msg_id strings")
        return cls(
            check_name("publisher", publisher),
            correlation_id,
            priority,
            ordering_key or None,  # an empty key is none: the publisher's order
            ttl,
            parents,
            hdrs,
            content_type,
        )


__all__ = ["SEND_FIRST_WINDOW", "Outgoing", "Putting"]

log = get_logger("iqbridge")


class Putting(Part):
    """The publisher side: put and put_many (idempotent with msg_ids), confirm_put,
    reveal and withdraw.

    One part of :class:`~iqbridge.queue.Queue`; a put's audience comes from the
    subscribing part."""

    def __init__(self, core: QueueCore, subscribing: Subscribing) -> None:
        super().__init__(core)
        self._subscribing = subscribing
        #: How puts reach the broker and the index, chosen once for the hub's broker and
        #: index (not asked on every put).
        self._path: PutPath = put_path(core)

    def put(
        self,
        payload: object,
        *,
        to: AudienceSpec | None = None,
        publisher: str | None = None,
        correlation_id: str | None = None,
        priority: int = 4,
        ordering_key: str | None = None,
        ttl: float | timedelta | None = None,
        confirm: bool = False,
        parents: Iterable[str] = (),
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
        msg_id: str | None = None,
    ) -> str:
        """Put one message; return its msg_id.

        ``to`` names subscribers and pools (``Pool(name, members)`` or a declared pool's
        name); without it the queue's standing subscriptions are the audience. A plain
        put is PUT then REVEALED at once; with ``confirm=True`` it stays PUT (hidden)
        until :meth:`confirm_put`, or :meth:`undo` withdraws it. ``ttl`` seconds after the
        put, members that have not got it yet go EXPIRED. ``priority`` is 0-9 (9 first).

        ``msg_id`` makes the put idempotent (see :meth:`put_many`'s ``msg_ids``).
        """
        return self.put_many(
            [payload],
            to=to,
            publisher=publisher,
            correlation_id=correlation_id,
            priority=priority,
            ordering_key=ordering_key,
            ttl=ttl,
            confirm=confirm,
            parents=parents,
            headers=headers,
            content_type=content_type,
            msg_ids=None if msg_id is None else [msg_id],
        )[0]

    def put_many(
        self,
        payloads: Iterable[object],
        *,
        to: AudienceSpec | None = None,
        publisher: str | None = None,
        correlation_id: str | None = None,
        priority: int = 4,
        ordering_key: str | None = None,
        ttl: float | timedelta | None = None,
        confirm: bool = False,
        parents: Iterable[str] = (),
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
        msg_ids: Sequence[str] | None = None,
    ) -> list[str]:
        """Put several messages with the same options in one transaction; return their ids.

        ``msg_ids`` (one per payload, chosen by the caller, as a transactional outbox
        does) makes the put idempotent: a message whose id the index already has is not
        put again, and is only sent to the broker if an earlier attempt stopped before
        the broker had it. A put with ``msg_ids`` that failed (say, the broker went away)
        is safe to repeat with the same ids and arguments: unlike a plain put, it leaves
        the index record in place for the repeat to finish, instead of withdrawing it.
        """
        spec = _Spec.checked(
            publisher or self.hub.publisher,
            correlation_id,
            priority,
            ordering_key,
            to_seconds(ttl, "ttl"),
            tuple(parents),
            headers,
            content_type,
        )
        items = list(payloads)
        return self._put_specs(
            [(payload, spec) for payload in items],
            msg_ids=msg_ids,
            to=to,
            confirm=confirm,
        )

    def put_each(
        self,
        messages: Iterable[Outgoing],
        *,
        to: AudienceSpec | None = None,
        confirm: bool = False,
    ) -> list[str]:
        """Put several messages, each with its own options (:class:`Outgoing`), in one
        transaction, as :meth:`put_many` does; return their ids in order.

        A message with a ``msg_id`` is put idempotently (see :meth:`put_many`); either
        every message has one or none has. This is the put of a bridge or relay whose
        messages carry their own keys, parents and headers, at the cost of one batch."""
        outs = list(messages)
        if not outs:
            return []
        for o in outs:
            if not isinstance(o, Outgoing):
                raise InvalidArgument(f"put_each takes Outgoing messages, got {type(o).__name__}")
        with_ids = [o.msg_id is not None for o in outs]
        if any(with_ids) and not all(with_ids):
            raise InvalidArgument("give every message of a put_each a msg_id, or none")
        pairs = [
            (
                o.payload,
                _Spec.checked(
                    o.publisher or self.hub.publisher,
                    o.correlation_id,
                    o.priority,
                    o.ordering_key,
                    to_seconds(o.ttl, "ttl"),
                    tuple(o.parents),
                    o.headers,
                    o.content_type,
                ),
            )
            for o in outs
        ]
        ids = [o.msg_id or "" for o in outs] if all(with_ids) else None
        return self._put_specs(pairs, msg_ids=ids, to=to, confirm=confirm)

    @tracing.traced_put
    def _put_specs(
        self,
        pairs: list[tuple[object, _Spec]],
        *,
        msg_ids: Sequence[str] | None,
        to: AudienceSpec | None,
        confirm: bool,
    ) -> list[str]:
        ids = self._check_ids(msg_ids, len(pairs)) if msg_ids is not None else None
        audience = self._subscribing.audience(to)
        now = self._now()
        limit = min(self.max_bytes, self._adapter.capabilities.max_payload_bytes)
        envelopes: list[Envelope] = []
        items: list[engine_batch.NewItem] = []
        retain: list[Retained | None] = []
        # Messages with the same options and content type are alike: they differ only in
        # msg_id, body and size (Writes.kinds).
        kind_of: dict[tuple[int, str], int] = {}
        kinds: list[int] = []
        groups = (*audience.subscribers, *(p.name for p in audience.pools))
        for i, (payload, spec) in enumerate(pairs):
            body, ctype = encode(payload, spec.content_type)
            kinds.append(kind_of.setdefault((id(spec), ctype), len(kind_of)))
            if len(body) > limit:
                raise MessageTooLarge(len(body), limit, self.name)
            msg_id = ids[i] if ids is not None else new_id()
            expires_at = now + int(spec.ttl * 1_000_000) if spec.ttl is not None else None
            envelopes.append(
                Envelope(
                    msg_id=msg_id,
                    body=body,
                    content_type=ctype,
                    headers=spec.headers,
                    publisher=spec.publisher,
                    correlation_id=spec.correlation_id,
                    priority=spec.priority,
                    ordering_key=spec.ordering_key or spec.publisher,
                    parents=spec.parents,
                    put_at=now,
                    groups=groups,
                    expires_at=expires_at,
                )
            )
            items.append(
                (
                    msg_id,
                    spec.publisher,
                    spec.ordering_key,
                    spec.correlation_id,
                    spec.priority,
                    tuple(spec.parents),
                    expires_at,
                    ctype,
                    len(body),
                )
            )
            if self.retain:
                # The broker forgets: a copy beside the index, in the same commit.
                retain.append(Retained(body, spec.headers))
        if not envelopes:
            return []
        records, journal = engine_batch.create(
            self.name,
            audience,
            now,
            items,
            confirm=confirm,
            max_attempts=self.retry.max_attempts,
        )
        writes = Writes(self.name, created=records, retain=retain, journal=journal, kinds=kinds)
        if ids is not None:
            self._path.put_idempotent(audience, envelopes, writes)
        else:
            self._path.put_new(audience, envelopes, writes)
        self.hub.notify()
        return [e.msg_id for e in envelopes]

    def _check_ids(self, msg_ids: Sequence[str], count: int) -> list[str]:
        ids = [msg_ids] if isinstance(msg_ids, str) else list(msg_ids)
        if len(ids) != count:
            raise InvalidArgument(f"got {len(ids)} msg_ids for {count} payloads; pass one each")
        for i in ids:
            if (
                not isinstance(i, str)
                or not 0 < len(i) <= _MSG_ID_MAX
                or _BAD_IN_ID.search(i) is not None
            ):
                raise InvalidArgument(
                    f"msg_id {i!r} must be a string of 1 to {_MSG_ID_MAX} characters without "
                    f"whitespace, '/' or NUL; iqbridge.ids.new_id() makes one"
                )
        if len(set(ids)) != len(ids):
            raise InvalidArgument("msg_ids must be distinct within one put")
        return ids

    def confirm_put(self, msg_id: str, *, detail: str | None = None) -> None:
        """Reveal a put made with ``confirm=True``: PUT -> REVEALED (``detail``, who and
        why, is journalled with it)."""
        change = self._apply(msg_id, lambda r: engine.reveal(r, self._now(), detail))
        if change is not None:
            self._wake(change.record)
        self.hub.notify()

    def reveal(self, msg_id: str, to: str | None = None, *, detail: str | None = None) -> None:
        """Confirm a pending put, or with ``to`` re-reveal the message to one subscriber
        that found it UNUSABLE (AVAILABLE again, attempt + 1). ``detail`` is journalled
        with the move (who asked, and why); a re-reveal's default is "re-revealed by
        publisher"."""
        if to is None:
            self.confirm_put(msg_id, detail=detail)
            return
        if self._adapter.capabilities.forgets:
            # The member's entry is gone from the broker: the retained copy serves the
            # redelivery, so without one there is nothing to reveal.
            rec = self._store.load(msg_id)
            if rec.queue == self.name and not self._envelopes([rec]):
                raise PayloadNotRetained(msg_id, self.name, self._adapter.url, "re-reveal")
        why = detail or "re-revealed by publisher"
        self._apply(msg_id, lambda r: engine.rereveal(r, to, self._now(), why))
        self.hub.notify()

    def withdraw(self, msg_id: str, reason: str = "withdrawn by publisher") -> None:
        """No subscriber may retrieve it any more; those already past GET finish normally."""
        self._apply(msg_id, lambda r: engine.withdraw(r, self._now(), reason))
