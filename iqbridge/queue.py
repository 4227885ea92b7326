"""The facade over one logical queue: put, get, confirm, undo, browse, state, search, purge.

Every state change goes through :mod:`iqbridge.engine` (the transition table) and is
committed to the index store with compare-and-set; the adapter only moves payloads.

:class:`Queue` is a composition of parts, each in a module named for what it holds:

* :mod:`iqbridge.queue_core`: options and the read-decide-commit loop they all share;
* :mod:`iqbridge.subscribing`: standing subscribers and pools, a put's audience;
* :mod:`iqbridge.putting`: put, put_many, confirm_put, reveal, withdraw;
* :mod:`iqbridge.getting`: get (from the index or a broker's consumer groups);
* :mod:`iqbridge.settling`: a delivery's moves, confirm_get, undo, transactions;
* :mod:`iqbridge.looking`: state, search, peek, browse with lock;
* :mod:`iqbridge.housekeeping`: recover, purge.
"""

from __future__ import annotations

from iqbridge.getting import Getting
from iqbridge.looking import Browse, Looking
from iqbridge.putting import Putting

__all__ = ["Browse", "Queue"]


class Queue(Putting, Getting, Looking):
    """One logical queue, as seen through a :class:`~iqbridge.hub.Hub`.

    Create it with ``hub.queue(name)``. Publishers :meth:`put`; subscribers :meth:`get`
    and finish each :class:`~iqbridge.delivery.Delivery`; anybody can ask for
    :meth:`state` and :meth:`search`.
    """

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} on {self._adapter.url}>"
