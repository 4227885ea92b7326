"""The broker adapter contract: a few methods plus a :class:`Capabilities` value.

An adapter moves envelopes to and from one kind of broker and nothing more: it never
decides state (the engine does) and never records it (the index store does). Driver
exceptions are translated into :mod:`iqbridge.errors` at this boundary.

Two delivery styles exist, declared in :attr:`Capabilities.native_groups`:

* native groups (Redis Streams, RabbitMQ, Kafka, ...): the broker hands each consumer
  group its entries (:meth:`Adapter.receive`), keeps unacknowledged ones pending and lets
  idle ones be claimed again; the facade claims each in the index and acks when the
  subscriber is finished.
* index-driven (the embedded SQLite queue): the broker only stores payloads; the index
  decides what each subscriber gets next and the facade reads the payload by reference
  (:meth:`Adapter.read`), in the same transaction when
  :attr:`Capabilities.shares_index_transaction` is true.

Every adapter passes the shared suite in :mod:`iqbridge.testing.adapter_contract`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from iqbridge.model import Envelope, Received

if TYPE_CHECKING:
    from iqbridge.engine import Change
    from iqbridge.engine_batch import SettlePlan
    from iqbridge.writes import Writes

__all__ = [
    "AcksInTransaction",
    "Adapter",
    "Capabilities",
    "ClaimOnReceive",
    "Colocated",
    "Fenced",
    "HoldsAcks",
    "LocksNatively",
]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a broker can do natively; the facade fills the gaps the same way everywhere."""

    #: The broker serves consumer groups itself (receive/ack); else delivery is index-driven.
    native_groups: bool
    #: Payloads can be read again by native reference (peek, browse under a lock,
    #: re-reveal, redelivery through the index). Where not, the facade keeps a retained
    #: copy of each payload beside the index (see ``hub.queue(retain=...)``).
    read_by_ref: bool = True
    #: send/read run inside the index store's transaction (same database).
    shares_index_transaction: bool = False
    #: The broker orders deliveries by priority itself.
    native_priority: bool = False
    #: Largest payload the broker accepts, in bytes.
    max_payload_bytes: int = 64 * 1024 * 1024
    #: Payloads stay after acknowledgement until deleted (journalled retention). Where
    #: not (the broker forgets a message once every group acknowledged it, or keeps it
    #: only for a retention time), the facade keeps a retained copy as for read_by_ref.
    retains_after_ack: bool = True
    #: Each consumer group delivers to one consumer at a time (RabbitMQ's single active
    #: consumer), or each of its partitions does (Kafka): the others stand by until it
    #: goes. The facade then never claims, through the index, messages the active
    #: consumer holds read ahead, so a pool's messages (a partition's, on Kafka) are
    #: handled by one process at a time, each key in put order.
    single_active_groups: bool = False
    #: A put sends first and then records its messages, native references included, in
    #: one index commit once the broker confirmed them (not the record first and the
    #: references in a second commit). Its entries carry their msg_id, so a get that
    #: reads one before its record exists gives it back: a put in flight (see
    #: :data:`iqbridge.putting.SEND_FIRST_WINDOW`). Needs native groups whose entries can
    #: be handed out again at once (``requeue``) and left pending, key fenced (Kafka).
    index_after_send: bool = False

    @property
    def forgets(self) -> bool:
        """The broker cannot be relied on to give a payload again after its first
        delivery: the facade keeps a copy unless the queue says otherwise."""
        return not (self.read_by_ref and self.retains_after_ack)


@runtime_checkable
class Adapter(Protocol):
    """One broker. Methods raise only :mod:`iqbridge.errors` exceptions."""

    #: The broker URL with any password removed (safe to log).
    url: str
    capabilities: Capabilities

    def declare(self, queue: str, groups: Sequence[str]) -> None:
        """Create the queue and the consumer groups if missing (idempotent).

        New groups start at the beginning of the queue, so they see earlier entries.
        """
        ...

    def send(self, queue: str, envelopes: Sequence[Envelope]) -> list[str]:
        """Store envelopes in order; return their native references."""
        ...

    def receive(
        self,
        queue: str,
        group: str,
        consumer: str,
        *,
        count: int,
        timeout: float,
        min_idle: float | None = None,
    ) -> list[Received]:
        """Up to ``count`` entries for a consumer of a group (native groups only).

        With ``min_idle``, entries pending with other consumers for longer than that many
        seconds are claimed first (crashed consumers' work). Blocks up to ``timeout``.
        """
        ...

    def ack(self, queue: str, group: str, refs: Sequence[str]) -> None:
        """The group is finished with these entries."""
        ...

    def requeue(self, queue: str, group: str, ref: str) -> None:
        """Make a pending entry deliverable to the group again."""
        ...

    def dead_letter(self, queue: str, group: str, ref: str, reason: str) -> None:
        """The group gives up on an entry (UNUSABLE): ack it and park it where the broker
        keeps dead letters, if it has such a place."""
        ...

    def read(self, queue: str, ref: str) -> Envelope | None:
        """The envelope at a native reference, or None if the broker no longer has it."""
        ...

    def read_many(self, queue: str, refs: Sequence[str]) -> list[Envelope | None]:
        """:meth:`read` for several references in one round trip, in order."""
        ...

    def delete(self, queue: str, refs: Sequence[str]) -> None:
        """Remove stored entries (purge of journalled messages)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


@dataclass(slots=True)
class ClaimOnReceive:
    """Asks a co-located receive (:meth:`Colocated.receive_indexed`) to claim, in the
    same atomic step as the read, the entries of ``subscriber``'s own group whose
    messages are on the claim's common path (see :func:`iqbridge.engine_batch.claim`),
    at ``now()`` for ``lease_us`` microseconds (None: no lease) by ``owner``.

    The receive fills in ``at`` and ``lease_until`` (the claim's time and lease end) and
    ``tokens`` (entry id -> lease token of each entry it claimed); the entries come back
    with their records as they were before the claim, and the caller applies the same
    claim to them. The other entries are for the caller to decide."""

    subscriber: str
    owner: str
    lease_us: int | None
    now: Callable[[], int]
    at: int = 0
    lease_until: int | None = None
    tokens: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Colocated(Protocol):
    """An adapter that can run its broker's work and the index store's writes in one
    round trip when both live on one server (Redis Streams with the Redis index).

    The hub asks :meth:`colocated` once; when true, a put is one atomic step (the index
    records and the broker entries appear together, or neither) and a receive reads the
    entries' index records with them.
    """

    def colocated(self, store: object) -> bool:
        """True when ``store`` is an index this adapter can write in its own round trips."""
        ...

    def send_indexed(
        self,
        queue: str,
        envelopes: Sequence[Envelope],
        changes: Sequence[Change] | Writes,
        store: object,
    ) -> list[str]:
        """Commit ``changes`` (new messages, one change each or a batch's
        :class:`~iqbridge.writes.Writes` of created records, in the order of
        ``envelopes``) and store ``envelopes`` in one atomic step; each record gets its
        entry's native reference. Return the references.

        Raises StaleRecord (nothing written) when a record exists already.
        """
        ...

    def settle_indexed(
        self,
        queue: str,
        writes: Writes,
        acks: Sequence[tuple[int, str, str]],
        store: object,
    ) -> list[bool]:
        """Commit a batch's settles (as :meth:`IndexStore.commit_writes
        <iqbridge.stores.base.IndexStore.commit_writes>`, one flag per record) and
        acknowledge, in the same atomic step, the broker entries ``acks`` names (the
        record's position in the order created, moved, changes; the group; the entry)
        of the records that hold."""
        ...

    def settle_held(
        self,
        queue: str,
        plan: SettlePlan,
        at: int,
        held: Sequence[tuple[str, str, str, str]],
        store: object,
    ) -> list[bool]:
        """Settle held messages of one subscriber where the index lives, by ``plan``
        (decided from the transition table once for the batch), acknowledging the broker
        entries of what moved in the same atomic step: ``held`` is (msg_id, lease token,
        consumer group, entry id) per message, no record. One flag per message: moved, or
        left as it was for the per-message engine."""
        ...

    def receive_indexed(
        self,
        queue: str,
        groups: Sequence[str],
        consumer: str,
        *,
        count: int,
        min_idle: float | None,
        store: object,
        claim: ClaimOnReceive | None = None,
    ) -> list[Received]:
        """Like :meth:`Adapter.receive` (without blocking), over several groups in order
        until one has entries, each with its index record as a hint
        (:attr:`Received.record`); with ``claim``, claiming what it can on the way."""
        ...


@runtime_checkable
class Fenced(Protocol):
    """An adapter that keeps each ordering key in order across its consumers (Kafka).

    The broker redelivers every message a group has not settled, to whichever process
    reads its partition; so the facade hands a message out again through the index (a
    release, a lapsed lease, a re-reveal) only in the process that reads its partition
    (:meth:`owns`), and tells the adapter which deliveries it left pending because the
    index says another consumer holds them (:meth:`left_pending`): no later message of
    their keys is handed out meanwhile."""

    def left_pending(self, queue: str, group: str, refs: Sequence[str]) -> None:
        """The facade did not claim these deliveries: someone else holds them."""
        ...

    def owns(self, queue: str, group: str, native_ref: str) -> bool:
        """Whether this process reads the entry's partition for the group now."""
        ...


@runtime_checkable
class Probing(Protocol):
    """An adapter that can say which messages reached the broker (Redis Streams, Kafka,
    RabbitMQ with a ledger).

    A put that stopped between the broker and the index (the process was killed after
    the broker took the entries, before the index recorded where) leaves records without
    a native reference. An idempotent repeat of the put asks here first and sends only
    what the broker does not hold, so the broker never stores a message twice."""

    def find_sent(self, queue: str, sent: Sequence[tuple[str, int]]) -> dict[str, str]:
        """Of these ``(msg_id, put_at)`` pairs (put_at: microseconds since the epoch, when
        the put began), the msg_ids the broker holds entries of, with their native
        references. Looks only at entries from shortly before ``put_at`` on."""
        ...


@runtime_checkable
class TakesOver(Protocol):
    """An adapter whose consumer groups keep entries pending with the consumer that read
    them, beyond what the index knows was handed out (Redis Streams' read-ahead).

    When every consumer of a group is known to be gone (a bridge route taken over), the
    entries they held are made due at once, oldest first, ahead of new ones: otherwise
    they would come back only after their idle time, behind later entries of their keys."""

    def take_over(self, queue: str, group: str) -> int:
        """Give back every entry the group's consumers hold; returns how many."""
        ...


@runtime_checkable
class AcksInTransaction(Protocol):
    """An adapter whose broker lives in a database the application can write in (Oracle
    AQ): the acknowledgement of a delivery finished in the application's transaction
    (``delivery.done(transaction=...)``) is made in that same transaction, so the broker
    forgets the message exactly when the business rows and the DONE of the index commit,
    and never otherwise."""

    def ack_in(self, connection: object, queue: str, group: str, refs: Sequence[str]) -> list[str]:
        """Acknowledge ``refs`` (entries this process holds for ``group``) on the
        application's driver connection ``connection``, uncommitted; return those it
        could (the others are acknowledged after the commit, as on any broker)."""
        ...

    def ack_rolled_back(self, queue: str, group: str, refs: Sequence[str]) -> None:
        """The transaction of an :meth:`ack_in` rolled back: ``refs`` are the broker's
        again; hold them for the group once more where possible."""
        ...


@runtime_checkable
class LocksNatively(Protocol):
    """An adapter that also locks browsed messages on the broker itself (IBM MQ's
    MQGMO_LOCK), so that plain clients of the broker pass them by too while the index's
    lock (``queue.browse(lock=True)``) lasts."""

    def lock_natively(
        self, queue: str, entries: Sequence[tuple[str, str]], lock_id: str, lock_for: float | None
    ) -> int:
        """Lock each ``(group, native reference)`` under ``lock_id`` for at most
        ``lock_for`` seconds; return how many the broker locked."""
        ...

    def unlock_natively(self, queue: str, lock_id: str, refs: Sequence[str] | None = None) -> int:
        """Release the broker's locks of ``lock_id`` (only of ``refs``, when given)."""
        ...


@runtime_checkable
class HoldsAcks(Protocol):
    """An adapter that holds acknowledgements back to send them in batches (Redis
    Streams); :meth:`flush` sends them now (reconciliation's repairs, before it reports)."""

    def flush(self) -> None:
        """Send every held acknowledgement now."""
        ...
