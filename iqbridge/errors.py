"""The one exception tree of iqbridge.

Callers never import a driver (pika, redis, sqlite3, pymqi ...) to catch an error:
adapters and index stores translate driver exceptions at their boundary into this tree.
Connection errors stand apart from message errors, so a retry loop can catch the first
without swallowing the second::

    IQError
    ├── ConfigurationError            bad URL, unknown scheme, missing extra, bad option
    │   └── UnknownSchemeError
    ├── InvalidArgument               a bad value passed to an API call (also a ValueError)
    ├── ConnectionError               a server cannot be reached or went away
    │   ├── BrokerUnavailable
    │   └── IndexUnavailable
    ├── QueueError
    │   └── UnknownQueueError
    ├── MessageError                  something about one message
    │   ├── MessageNotFound
    │   ├── IllegalTransition         the state table refuses the move; nothing changed
    │   ├── LeaseLost                 the delivery's lease was taken over; nothing changed
    │   │   └── BatchLeaseLost        ... for some of a batch settled in your transaction
    │   ├── LockedError               the message is browse-locked by someone else
    │   ├── AudienceError             bad audience, or the subscriber is not in it
    │   ├── PayloadError              payload cannot be encoded or decoded
    │   ├── PayloadNotRetained        the broker forgot the payload and no copy was kept
    │   └── MessageTooLarge
    └── ConcurrentUpdate              optimistic compare-and-set lost too many times

Every message names what was wrong and, where there is one, what to do about it.
"""

from __future__ import annotations

__all__ = [
    "AudienceError",
    "BatchLeaseLost",
    "BrokerRefused",
    "BrokerUnavailable",
    "ConcurrentUpdate",
    "ConfigurationError",
    "ConnectionError",
    "IQError",
    "IllegalTransition",
    "IndexUnavailable",
    "InvalidArgument",
    "LeaseLost",
    "LockedError",
    "MessageError",
    "MessageNotFound",
    "MessageTooLarge",
    "PayloadError",
    "PayloadNotRetained",
    "QueueError",
    "UnknownQueueError",
    "UnknownSchemeError",
]


class IQError(Exception):
    """Root of every error iqbridge raises."""


class ConfigurationError(IQError):
    """A URL, option or installation problem: fix the configuration and retry."""


class UnknownSchemeError(ConfigurationError):
    """The URL scheme names no known adapter or index store."""

    def __init__(self, scheme: str, known: list[str], hint: str | None = None) -> None:
        self.scheme = scheme
        self.known = known
        text = f"unknown URL scheme {scheme!r}"
        text += f"; did you mean {hint!r}?" if hint else "."
        text += f" Known schemes: {', '.join(sorted(known))}."
        super().__init__(text)


class InvalidArgument(IQError, ValueError):
    """A value passed to an API call is out of range or of the wrong kind."""


class ConnectionError(IQError):
    """A server (broker or index store) cannot be reached or the connection broke."""


class BrokerUnavailable(ConnectionError):
    """The broker behind an adapter cannot be reached."""


class BrokerRefused(IQError):
    """The broker answered but did not take a message: it nacked a publish, or returned
    it because no queue matched its routing. Nothing was stored; the put raised."""


class IndexUnavailable(ConnectionError):
    """The side-index store cannot be reached."""


class QueueError(IQError):
    """A problem with a queue as a whole."""


class UnknownQueueError(QueueError):
    """The queue does not exist on the broker and may not be created implicitly."""


class MessageError(IQError):
    """A problem with one message."""


class MessageNotFound(MessageError):
    """No message with this id in this queue (never put, or purged; or, ``elsewhere``
    names it, put to another queue of the same index)."""

    def __init__(self, msg_id: str, queue: str | None = None, elsewhere: str | None = None) -> None:
        self.msg_id = msg_id
        self.queue = queue
        self.elsewhere = elsewhere
        where = f" in queue {queue!r}" if queue else ""
        if elsewhere is not None:
            super().__init__(
                f"message {msg_id} not found{where}: it was put to queue {elsewhere!r}"
            )
        else:
            super().__init__(f"message {msg_id}{where} not found (never put, or purged)")


class IllegalTransition(MessageError):
    """The transition table refuses a move; the message was left unchanged."""

    def __init__(
        self,
        msg_id: str,
        actor: str,
        src: object,
        dst: object,
        event: str,
        why: str | None = None,
    ) -> None:
        self.msg_id = msg_id
        self.actor = actor
        self.src = src
        self.dst = dst
        self.event = event
        self.why = why
        src_name = getattr(src, "value", None) or "(none)"
        dst_name = getattr(dst, "value", None) or str(dst)
        text = (
            f"illegal transition for message {msg_id}, actor {actor!r}: "
            f"{event} cannot move {src_name} -> {dst_name}"
        )
        if why:
            text += f" ({why})"
        text += "; nothing was changed"
        super().__init__(text)


class LeaseLost(MessageError):
    """The caller's lease on a delivery expired and someone else holds or finished it."""

    def __init__(self, msg_id: str, subscriber: str, why: str) -> None:
        self.msg_id = msg_id
        self.subscriber = subscriber
        super().__init__(
            f"delivery of message {msg_id} to {subscriber!r} is no longer held by this "
            f"caller ({why}); nothing was changed. Renew leases for long work "
            f"(delivery.renew()) or get a longer lease (get(..., lease=...))."
        )


class BatchLeaseLost(LeaseLost):
    """Settling a batch in the application's transaction found some of its leases taken
    over. Raised so that the transaction rolls back: no business rows are committed for
    messages another holder now has. ``lost`` maps each such msg_id to why."""

    def __init__(self, subscriber: str, lost: dict[str, str]) -> None:
        self.lost = dict(lost)
        first, why = next(iter(self.lost.items()))
        MessageError.__init__(
            self,
            f"{len(self.lost)} of the batch's deliveries to {subscriber!r} are no longer "
            f"held by this caller (first: {first}: {why}); nothing was changed. Roll back "
            f"your transaction (a queue.transaction block does when this propagates) and "
            f"settle the batch again: it leaves the lost ones out. Or pass partial=True to "
            f"batch.done(transaction=...) to commit the rest and handle Settled.lost yourself",
        )
        self.msg_id = first
        self.subscriber = subscriber


class LockedError(MessageError):
    """The message is browse-locked by another caller."""


class AudienceError(MessageError):
    """The audience of a put is malformed, or a subscriber is not in a message's audience."""


class PayloadError(MessageError):
    """A payload cannot be encoded (unsupported type) or decoded (malformed data)."""


class PayloadNotRetained(MessageError):
    """A call needs a payload again that the broker no longer gives (it forgets a message
    once acknowledged, or keeps it only for a while) and the queue kept no copy."""

    def __init__(self, msg_id: str, queue: str, broker: str, what: str) -> None:
        self.msg_id = msg_id
        self.queue = queue
        super().__init__(
            f"cannot {what} message {msg_id} of queue {queue!r}: the broker {broker} cannot "
            f"give its payload again once delivered, and no copy of it was kept (the queue "
            f"was opened with retain=False when it was put); nothing was changed. Open the "
            f"queue with retain=True (the default on such a broker) to keep copies"
        )


class MessageTooLarge(MessageError):
    """The encoded payload exceeds the queue's or the broker's size limit."""

    def __init__(self, size: int, limit: int, queue: str) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"message of {size} bytes exceeds the limit of {limit} bytes for queue {queue!r}; "
            f"store large bodies elsewhere and send a reference, or raise max_bytes"
        )


class ConcurrentUpdate(IQError):
    """Optimistic compare-and-set on a message kept losing to concurrent writers."""

    def __init__(self, msg_id: str, attempts: int) -> None:
        self.msg_id = msg_id
        super().__init__(
            f"message {msg_id} changed under us {attempts} times in a row; "
            f"nothing was changed by this call; retry it"
        )
