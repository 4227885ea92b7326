"""Listing an Oracle AQ queue without consuming it (``Inventory``, for reconciliation).

Mixed into :class:`~iqbridge.adapters.oracle_aq.OracleAQAdapter`, whose own
``redeliver`` completes the protocol (a held entry is rolled back; a removed one is
enqueued again, as a copy for that group alone, from the queue table):

* ``entries(queue)``: the ``AQ$<queue table>`` view, ``WHERE queue = :q ORDER BY
  enq_time``, one entry per AQ msgid. Not a browse: a browse dequeue (``DEQ_BROWSE``)
  sees only the messages still READY for the consumer name it gives, so it misses what
  every group already removed and AQ retention keeps (``retention=-1``, the default) and
  messages for consumer names iqbridge does not know; the view shows them all.
* ``unacked(queue, group)``: a browse (``DEQ_BROWSE``, ``DEQ_FIRST_MSG`` then
  ``DEQ_NEXT_MSG``, ``DEQ_NO_WAIT``) with the group's consumer name lists what is still
  READY for it. A browse is a consistent read: an entry another session holds (LOCKED,
  or REMOVEd and not committed) is still READY there, so a get in flight shows and is
  never taken for an acknowledgement. The entries this process holds for the group are
  pending, the others unread; a removed entry is acknowledged. An entry whose message
  (same iqbridge msg_id) has a copy READY for the group, put there by ``redeliver``, is
  unread too: the group has the message still to read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from iqbridge.inventory import Entry, Unacked

if TYPE_CHECKING:
    from .oracle_aq import OracleAQAdapter  # noqa: TID251

__all__ = ["OracleAQInventory"]

#: Messages per browse round trip.
_PAGE = 500


class OracleAQInventory:
    """The ``entries`` and ``unacked`` methods of the Oracle AQ adapter (see the module
    docstring); ``redeliver`` is the adapter's own."""

    def entries(self, queue: str) -> Iterator[Entry]:
        """Every message of the queue in its queue table (retained ones included), oldest
        first."""
        return iter(self._listing(queue))

    def _listing(self, queue: str) -> list[Entry]:
        from .oracle_aq import _from_row  # noqa: TID251

        a = _me(self)
        name = a.queue_name(queue)
        sql = (
            f"SELECT msg_id, user_data, corr_id, priority FROM AQ${name}_QT "
            "WHERE queue = :q ORDER BY enq_time"
        )
        with a._lock:
            try:
                with a._db().cursor() as cur:
                    cur.execute(sql, {"q": name})
                    rows: list[Any] = cur.fetchall()
            except a.client.Error as exc:
                a._rollback(a._main, exc)
                raise a._error(exc, "list messages", queue) from exc
        out: dict[str, Entry] = {}
        for row in rows:  # one row per consumer: once per msgid
            if bytes(row[0]).hex() in out:
                continue
            ref, env, stranger = _from_row(row, lambda r: a._adopted(queue, r))
            out[ref] = Entry(ref, env.msg_id, stranger, env if stranger else None)
        return list(out.values())

    def _ready(self, queue: str, group: str) -> set[str]:
        """The msgids a browse with the group's consumer name finds READY."""
        a = _me(self)
        c = a.client
        out: set[str] = set()
        with a._lock:
            try:
                q = a._deq(a._db(), queue, group, c.DEQ_BROWSE)
                while True:
                    got = a._pull(q, _PAGE)
                    out.update(props.msgid.hex() for props in got)
                    if len(got) < _PAGE:
                        return out
                    q.deqoptions.navigation = c.DEQ_NEXT_MSG
            except c.Error as exc:
                a._rollback(a._main, exc)
                raise a._error(exc, "browse messages", queue) from exc

    def unacked(self, queue: str, group: str) -> Unacked:
        """READY for the group (a browse): held by this process, pending; else unread."""
        a = _me(self)
        ready = self._ready(queue, group)
        with a._lock:
            pending = {r for r in ready if (queue, group, r) in a._held}
        unread = ready - pending
        if ready:
            listing = self._listing(queue)
            by_ref = {e.native_ref: e.msg_id for e in listing}
            waiting = {by_ref[r] for r in unread if r in by_ref}
            # Another entry of a message the group has a copy of still to read.
            unread.update(e.native_ref for e in listing if e.msg_id in waiting)
            unread -= pending
        return Unacked(frozenset(pending), frozenset(unread))


def _me(mixin: OracleAQInventory) -> OracleAQAdapter:
    """The adapter this inventory is mixed into."""
    return cast("OracleAQAdapter", mixin)
