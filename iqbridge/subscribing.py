"""The standing audience of a queue: subscribers, pools, and who a put is for."""

from __future__ import annotations

import time
from collections.abc import Iterable

from iqbridge.errors import AudienceError
from iqbridge.model import Audience, Pool, Subscriptions, check_name
from iqbridge.queue_core import QueueCore
from iqbridge.redaction import get_logger

AudienceSpec = str | Pool | Iterable[str | Pool]

__all__ = ["Subscribing"]

log = get_logger("iqbridge")


class Subscribing(QueueCore):
    """Standing subscribers and pools of a queue, and the audience a put is revealed to.

    One part of :class:`~iqbridge.queue.Queue`."""

    def subscriptions(self) -> Subscriptions:
        """The queue's standing subscribers and pools."""
        return self._subscriptions(fresh=True)

    def subscribe(self, *subscribers: str) -> None:
        """Add named subscribers to the standing audience (each gets every message)."""
        subs = self._subscriptions(fresh=True)
        names = list(subs.subscribers)
        for s in subscribers:
            check_name("subscriber", s)
            if subs.pool(s) is not None:
                raise AudienceError(f"{s!r} already names a pool on queue {self.name!r}")
            if s not in names:
                names.append(s)
        self._set_subscriptions(Subscriptions(tuple(names), subs.pools, subs.adhoc_pools))

    def subscribe_pool(self, pool: str, members: Iterable[str]) -> None:
        """Declare (or redefine) a pool in the standing audience: one member gets each message."""
        new = Pool(pool, members)
        if not new.members:
            raise AudienceError(f"pool {pool!r} needs at least one member")
        subs = self._subscriptions(fresh=True)
        if pool in subs.subscribers:
            raise AudienceError(f"{pool!r} already names a subscriber on queue {self.name!r}")
        pools = (*(p for p in subs.pools if p.name != pool), new)
        adhoc = tuple(p for p in subs.adhoc_pools if p.name != pool)
        self._set_subscriptions(Subscriptions(subs.subscribers, pools, adhoc))

    def unsubscribe(self, name: str) -> None:
        """Remove a subscriber or pool from the standing audience (messages already put
        keep their audience)."""
        subs = self._subscriptions(fresh=True)
        self._set_subscriptions(
            Subscriptions(
                tuple(s for s in subs.subscribers if s != name),
                tuple(p for p in subs.pools if p.name != name),
                subs.adhoc_pools,
            )
        )

    def _set_subscriptions(self, subs: Subscriptions) -> None:
        self._store.set_subscriptions(self.name, subs)
        self._subs, self._subs_at = subs, time.monotonic()
        if self._native:
            self._declare_groups([*subs.subscribers, *(p.name for p in subs.pools)])

    def _audience(self, to: AudienceSpec | None) -> Audience:
        subs = self._subscriptions()
        if to is None:
            return subs.audience().validate()
        items: list[str | Pool] = [to] if isinstance(to, str | Pool) else list(to)
        names: list[str] = []
        pools: list[Pool] = []
        adhoc: list[Pool] = []
        for item in items:
            if isinstance(item, Pool):
                known = subs.pool(item.name)
                if not item.members:
                    if known is None:
                        raise AudienceError(
                            f"pool {item.name!r} is not declared on queue {self.name!r}; "
                            f"declare it with queue.subscribe_pool(name, members) or pass "
                            f"Pool(name, members)"
                        )
                    pools.append(known)
                    continue
                if (
                    known is not None
                    and set(known.members) != set(item.members)
                    and (known in subs.pools)
                ):
                    raise AudienceError(
                        f"pool {item.name!r} is declared on queue {self.name!r} with members "
                        f"{list(known.members)}, not {list(item.members)}"
                    )
                if known is None or set(known.members) != set(item.members):
                    adhoc.append(item)
                pools.append(item)
            elif isinstance(item, str):
                known = subs.pool(item)
                if known is not None:
                    pools.append(known)
                else:
                    names.append(check_name("subscriber", item))
            else:
                raise AudienceError(
                    f"audience entries must be subscriber names or Pool(...), not "
                    f"{type(item).__name__}"
                )
        audience = Audience(tuple(names), tuple(pools)).validate()
        if adhoc:
            fresh = self._subscriptions(fresh=True)
            keep = tuple(p for p in fresh.adhoc_pools if p.name not in {a.name for a in adhoc})
            self._set_subscriptions(
                Subscriptions(fresh.subscribers, fresh.pools, keep + tuple(adhoc))
            )
        return audience
