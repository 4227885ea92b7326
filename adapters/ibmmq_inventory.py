"""Listing IBM MQ group queues without consuming them (``Inventory``, for reconciliation).

Mixed into :class:`~iqbridge.adapters.ibmmq.IbmMqAdapter`:

* ``entries(queue)``: every group queue of the iqbridge queue is browsed with
  ``MQGMO_BROWSE_FIRST`` then ``MQGMO_BROWSE_NEXT`` (``MQGMO_NO_SYNCPOINT``,
  ``MQGMO_NO_WAIT``, until 2033 ``MQRC_NO_MSG_AVAILABLE``); the envelope property gives
  each message's msg_id (a message without it is a plain client's: a stranger, with the
  msg_id its adoption derives). A message sits once on each group's queue with the same
  reference (its msg_id), so it is one entry. Which group queues: the groups
  reconciliation names (``track_groups``) and those this process holds messages of;
* ``unacked(queue, group)``: the messages on the group's queue are unread; the ones this
  process holds under an open unit of work are pending. Anything else the group
  committed away (acknowledged), or another process holds it;
* ``redeliver(queue, group, ref)``: a message this process holds is backed out (True);
  otherwise IBM MQ cannot deliver a committed message again and the adapter keeps no
  payload (False): reconciliation then ``put_back``-s the retained copy on the group's
  queue alone.

**In-flight gets are invisible.** A message under another connection's open (uncommitted)
MQGET is hidden from every browse: no listing can tell it from one whose get was
committed. So ``hides_in_flight`` is True, and reconciliation never reports a member the
index has in doubt (GET, FETCHED, IN_PROCESS) as a missing payload or as acknowledged on
the broker.

**What MQGMO_LOCK buys.** Each browse locks the message under its cursor (one at a time
per open handle; the next browse moves the lock, MQGMO_UNLOCK drops the last one). While
it is locked, a concurrent destructive get skips it and takes the next message, so a
message is never removed between the moment the browse returns it and the moment its
properties are read: what the listing reports was on the queue, visible, when read. A
lock does not make the listing a snapshot (a message got before the cursor reaches it is
not listed; reconciliation reads its suspects again), and for that instant a consumer may
take the next message before the locked one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from iqbridge.inventory import Entry, Unacked
from iqbridge.model import Envelope

from .ibmmq_link import browsed  # noqa: TID251
from .ibmmq_wire import decode  # noqa: TID251

if TYPE_CHECKING:
    from .ibmmq import IbmMqAdapter  # noqa: TID251
    from .ibmmq_link import Conn  # noqa: TID251

__all__ = ["IbmMqInventory"]


class IbmMqInventory:
    """The ``Inventory`` methods of the IBM MQ adapter (see the module docstring)."""

    #: A browse cannot see a message under another connection's open get.
    hides_in_flight = True
    #: Group names per iqbridge queue, told by reconciliation (``track_groups``).
    _tracked: dict[str, set[str]]

    def track_groups(self, queue: str, groups: Sequence[str]) -> None:
        """Remember the consumer groups of ``queue``: :meth:`entries` browses their queues
        (an MQ queue cannot be found by its iqbridge queue's name: names may be hashed)."""
        a = _me(self)
        with a._lock:
            a._tracked.setdefault(queue, set()).update(groups)

    def _groups_of(self, queue: str) -> list[str]:
        a = _me(self)
        with a._lock:
            groups = set(a._tracked.get(queue, ()))
            groups.update(g for (q, g), held in a._held.items() if q == queue and held)
        return sorted(groups)

    def _browse(self, queue: str, group: str) -> list[Entry] | None:
        """The messages on the group's queue, in delivery order, left in place (None when
        the queue does not exist)."""
        a = _me(self)
        c, mod = a._c, a._mod
        name = a.queue_name(queue, group)

        def run(conn: Conn) -> list[Entry] | None:
            try:
                q = conn.queue(name, c.MQOO_BROWSE | c.MQOO_FAIL_IF_QUIESCING)
            except mod.MQMIError as exc:
                if int(exc.reason) == c.MQRC_UNKNOWN_OBJECT_NAME:
                    return None
                raise
            mh = conn.props()
            out: list[Entry] = []
            try:
                for md, body in browsed(mod, q, mh, lock=True):
                    env_json = a._env_property(mh)
                    ref, env, stranger = decode(queue, group, md, body, env_json, c.MQFMT_STRING)
                    out.append(Entry(ref, env.msg_id, stranger, env if stranger else None))
            finally:
                _unlock(mod, c, q)
            return out

        return a._with("browsing a queue", run, lambda: name)

    def entries(self, queue: str) -> Iterator[Entry]:
        """Every message on the queue's group queues, once per reference and msg_id."""
        seen: set[tuple[str, str]] = set()
        for group in self._groups_of(queue):
            for entry in self._browse(queue, group) or ():
                if (entry.native_ref, entry.msg_id) not in seen:
                    seen.add((entry.native_ref, entry.msg_id))
                    yield entry

    def unacked(self, queue: str, group: str) -> Unacked | None:
        """On the group's queue: unread; held by this process under syncpoint: pending.
        None when the group's queue does not exist (nothing can be said)."""
        listed = self._browse(queue, group)
        if listed is None:
            return None
        pending = frozenset(_me(self).held(queue, group))
        return Unacked(pending, frozenset(e.native_ref for e in listed) - pending)

    def redeliver(self, queue: str, group: str, ref: str) -> bool:
        """Back out a message this process holds (True); False for any other: a committed
        get cannot be undone, and the adapter keeps no payload to put back."""
        a = _me(self)
        if ref not in a.held(queue, group):
            return False
        a.requeue(queue, group, ref)
        return True

    def put_back(self, queue: str, group: str, env: Envelope) -> None:
        """Put a copy of ``env`` (the retained payload) on the group's queue alone: its
        reference is its msg_id, the same as before."""
        _me(self).put_again(queue, group, env)


def _me(mixin: IbmMqInventory) -> IbmMqAdapter:
    """The adapter this inventory is mixed into."""
    return cast("IbmMqAdapter", mixin)


def _unlock(mod: Any, c: Any, q: Any) -> None:
    """Drop the browse lock the handle may still hold (2209 MQRC_NO_MSG_LOCKED when it
    holds none: nothing to do)."""
    md, gmo = mod.MD(), mod.GMO()
    gmo.Options = c.MQGMO_UNLOCK | c.MQGMO_NO_WAIT
    with contextlib.suppress(mod.MQMIError):
        q.get(None, md, gmo)
