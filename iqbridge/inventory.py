"""What a broker holds, listed without consuming it: the optional :class:`Inventory`
protocol, used by reconciliation (:mod:`iqbridge.recovery.reconcile`).

An adapter that implements it lists the entries of a queue (:meth:`Inventory.entries`),
says for one consumer group which entries it has handed out and not acknowledged and
which it has not handed out yet (:meth:`Inventory.unacked`), and can make a group deliver
an entry again even after it was acknowledged (:meth:`Inventory.redeliver`), where the
broker can.

Brokers that cannot list without consuming (RabbitMQ) do not implement it; index-driven
brokers (the embedded SQLite queue) list entries but keep no acknowledgement of their
own (the index is the acknowledgement), so their :meth:`Inventory.unacked` is None.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

from iqbridge.model import Envelope

__all__ = ["Entry", "HidesInFlight", "Inventory", "PutsBack", "TracksGroups", "Unacked"]


class Entry(NamedTuple):
    """One entry a broker stores for a queue."""

    #: The broker's reference to the entry (what an index record's ``native_ref`` holds).
    native_ref: str
    #: The msg_id the facade knows (or would know) the entry by: the envelope's, or for a
    #: stranger's entry the id adoption derives for it.
    msg_id: str
    #: The entry has no iqbridge envelope (a plain client put it): a get adopts it.
    stranger: bool = False
    #: A stranger's entry as the facade would receive it, where the listing read it
    #: (what adoption needs on a broker that cannot read an entry by reference).
    envelope: Envelope | None = None


@dataclass(frozen=True, slots=True)
class Unacked:
    """One consumer group's view of a queue's entries on the broker.

    An entry in neither set was acknowledged by the group (or dead-lettered)."""

    #: Handed out to a consumer of the group and not acknowledged (Redis: in the PEL).
    pending: frozenset[str]
    #: Not yet handed out to the group (Redis: after the group's last-delivered id).
    unread: frozenset[str]

    def acked(self, native_ref: str) -> bool:
        """Whether the group is finished with the entry, as the broker sees it."""
        return native_ref not in self.pending and native_ref not in self.unread


@runtime_checkable
class Inventory(Protocol):
    """An adapter that can list what its broker holds without consuming it."""

    def entries(self, queue: str) -> Iterator[Entry]:
        """Every entry the broker stores for the queue, oldest first (acknowledged ones
        included, as long as the broker keeps them)."""
        ...

    def unacked(self, queue: str, group: str) -> Unacked | None:
        """The group's pending and unread entries, or None when the broker keeps no
        acknowledgement of its own (index-driven delivery)."""
        ...

    def redeliver(self, queue: str, group: str, ref: str) -> bool:
        """Make the group deliver the entry again, even if it acknowledged it; False when
        the broker cannot do that for one entry and one group (the caller may put the
        payload on the broker again instead)."""
        ...


@runtime_checkable
class HidesInFlight(Protocol):
    """An inventory whose listing cannot see an entry under another connection's open
    get (IBM MQ's uncommitted MQGET): a member the index has in doubt may just be in
    flight, so reconciliation never reports it as a missing payload or acked on the
    broker."""

    hides_in_flight: bool


@runtime_checkable
class TracksGroups(Protocol):
    """An inventory that keeps one broker queue per consumer group and cannot list them
    by the iqbridge queue's name (IBM MQ): it is told every group before a listing."""

    def track_groups(self, queue: str, groups: Sequence[str]) -> None:
        """Remember ``groups`` as the consumer groups of ``queue``."""
        ...


@runtime_checkable
class PutsBack(Protocol):
    """An inventory that can put a copy of a message back for one group alone (same
    native reference), where the broker cannot redeliver the entry itself."""

    def put_back(self, queue: str, group: str, env: Envelope) -> None:
        """Put ``env`` (the retained payload) on ``group``'s share of ``queue``."""
        ...
