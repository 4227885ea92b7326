"""The facade over one logical queue: put, get, confirm, undo, browse, state, search, purge.

Every state change goes through :mod:`iqbridge.engine` (the transition table) and is
committed to the index store with compare-and-set; the adapter only moves payloads.

:class:`Queue` is a composition: one :class:`~iqbridge.queue_core.QueueCore` (options and
the read-decide-commit loop every change goes through) and the parts that hold it, each
an object in a module named for what it holds:

* :mod:`iqbridge.subscribing`: standing subscribers and pools, a put's audience;
* :mod:`iqbridge.putting`: put, put_many, confirm_put, reveal, withdraw;
* :mod:`iqbridge.getting`: get (from the index or a broker's consumer groups);
* :mod:`iqbridge.settling`: a delivery's moves, confirm_get, undo, transactions;
* :mod:`iqbridge.looking`: state, search, peek, browse with lock;
* :mod:`iqbridge.housekeeping`: recover, reclaim, purge.

Each public method of the queue is its part's method (same signature and documentation).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from iqbridge.getting import Getting
from iqbridge.housekeeping import Housekeeping
from iqbridge.looking import Browse, Looking
from iqbridge.putting import Putting
from iqbridge.queue_core import OverCore, QueueCore
from iqbridge.receiving import Receiving
from iqbridge.settling import Settling
from iqbridge.subscribing import Subscribing

__all__ = ["Browse", "Queue"]

P = ParamSpec("P")
R = TypeVar("R")
PartT = TypeVar("PartT")


def _part(attr: str, fn: Callable[Concatenate[PartT, P], R]) -> Callable[Concatenate[Queue, P], R]:
    """A method of :class:`Queue` that is ``fn`` of the part held in ``attr``."""

    @functools.wraps(fn)
    def method(self: Queue, /, *args: P.args, **kwargs: P.kwargs) -> R:
        part: PartT = getattr(self, attr)
        return fn(part, *args, **kwargs)

    return method


class Queue(OverCore):
    """One logical queue, as seen through a :class:`~iqbridge.hub.Hub`.

    Create it with ``hub.queue(name)``, which makes its
    :class:`~iqbridge.queue_core.QueueCore`. Publishers :meth:`put`; subscribers
    :meth:`get` and finish each :class:`~iqbridge.delivery.Delivery`; anybody can ask
    for :meth:`state` and :meth:`search`.
    """

    def __init__(self, core: QueueCore) -> None:
        super().__init__(core)
        self._subscribing = Subscribing(core)
        self._putting = Putting(core, self._subscribing)
        self._settling = Settling(core)
        self._housekeeping = Housekeeping(core)
        self._receiving = Receiving(core, self._settling)
        self._getting = Getting(core, self._settling, self._housekeeping, self._receiving)
        self._looking = Looking(core)

    subscriptions = _part("_subscribing", Subscribing.subscriptions)
    subscribe = _part("_subscribing", Subscribing.subscribe)
    subscribe_pool = _part("_subscribing", Subscribing.subscribe_pool)
    unsubscribe = _part("_subscribing", Subscribing.unsubscribe)
    unsubscribe_pool = _part("_subscribing", Subscribing.unsubscribe_pool)

    put = _part("_putting", Putting.put)
    put_many = _part("_putting", Putting.put_many)
    put_each = _part("_putting", Putting.put_each)
    confirm_put = _part("_putting", Putting.confirm_put)
    reveal = _part("_putting", Putting.reveal)
    withdraw = _part("_putting", Putting.withdraw)

    get = _part("_getting", Getting.get)
    get_many = _part("_getting", Getting.get_many)
    adopt = _part("_receiving", Receiving.adopt)

    transaction = _part("_settling", Settling.transaction)
    confirm_get = _part("_settling", Settling.confirm_get)
    undo = _part("_settling", Settling.undo)

    state = _part("_looking", Looking.state)
    search = _part("_looking", Looking.search)
    counts = _part("_looking", Looking.counts)
    peek = _part("_looking", Looking.peek)
    browse = _part("_looking", Looking.browse)
    unlock = _part("_looking", Looking.unlock)

    recover = _part("_housekeeping", Housekeeping.recover)
    reclaim = _part("_housekeeping", Housekeeping.reclaim)
    apply_recovery = _part("_housekeeping", Housekeeping.apply_recovery)
    purge = _part("_housekeeping", Housekeeping.purge)
    purge_listed = _part("_housekeeping", Housekeeping.purge_listed)

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} on {self.hub.adapter.url}>"
