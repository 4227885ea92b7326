"""The standing audience of a queue: subscribers, pools, and who a put is for."""

from __future__ import annotations

from collections.abc import Iterable

from iqbridge.errors import AudienceError
from iqbridge.model import Audience, Pool, Subscriptions, check_name
from iqbridge.queue_core import Part
from iqbridge.redaction import get_logger

AudienceSpec = str | Pool | Iterable[str | Pool]

__all__ = ["Subscribing"]

log = get_logger("iqbridge")


class Subscribing(Part):
    """Standing subscribers and pools of a queue, and the audience a put is revealed to.

    One part of :class:`~iqbridge.queue.Queue`."""

    def subscriptions(self) -> Subscriptions:
        """The queue's standing subscribers and pools."""
        return self._subscriptions(fresh=True)

    def subscribe(self, *subscribers: str) -> None:
        """Add named subscribers to the standing audience (each gets every message).

        Raises :class:`~iqbridge.errors.AudienceError`, changing nothing, for a name that
        is a standing pool or a member of one (see :meth:`Subscriptions.adding
        <iqbridge.model.Subscriptions.adding>`)."""
        subs = self._subscriptions(fresh=True)
        self._set_subscriptions(subs.adding(self.name, subscribers=subscribers))

    def subscribe_pool(self, pool: str, members: Iterable[str]) -> None:
        """Declare (or redefine) a pool in the standing audience: one member gets each message.

        Raises :class:`~iqbridge.errors.AudienceError`, changing nothing, for a pool
        without members, a member listed twice, a member that is a standing subscriber
        or in another standing pool, or a pool name that is a standing subscriber: every
        put without ``to`` would be refused."""
        new = Pool(pool, members)
        subs = self._subscriptions(fresh=True)
        self._set_subscriptions(subs.adding(self.name, pools=[new]))

    def unsubscribe(self, *names: str) -> None:
        """Remove standing subscribers or pools, by name, from the standing audience.

        Only puts made afterwards are affected: a message already put keeps its audience
        (every intended subscriber's state is tracked until it is JOURNALLED or EXPIRED).
        This also removes a standing subscriber or pool that makes every put without
        ``to`` fail (declared before such entries were refused). Raises
        :class:`~iqbridge.errors.AudienceError`, changing nothing, for a name that is
        neither."""
        self._remove(names, ())

    def unsubscribe_pool(self, pool: str) -> None:
        """Remove a standing pool (not a subscriber of the same name); as
        :meth:`unsubscribe`, messages already put keep their audience."""
        self._remove((), (pool,))

    def _remove(self, names: tuple[str, ...], pools: tuple[str, ...]) -> None:
        subs = self._subscriptions(fresh=True)
        standing = [p.name for p in subs.pools]
        missing = [
            ("subscriber or pool", n) for n in names if n not in (*subs.subscribers, *standing)
        ]
        missing += [("pool", p) for p in pools if p not in standing]
        if missing:
            what, name = missing[0]
            has = ", ".join([*subs.subscribers, *(f"pool {p}" for p in standing)]) or "none"
            raise AudienceError(
                f"no standing {what} {name!r} on queue {self.name!r} to unsubscribe "
                f"(standing: {has}); nothing was changed"
            )
        self._set_subscriptions(
            Subscriptions(
                tuple(s for s in subs.subscribers if s not in names),
                tuple(p for p in subs.pools if p.name not in (*names, *pools)),
                subs.adhoc_pools,
            )
        )

    def _set_subscriptions(self, subs: Subscriptions) -> None:
        self._store.set_subscriptions(self.name, subs)
        self.core.cached(subs)
        if self._native:
            self._declare_groups([*subs.subscribers, *(p.name for p in subs.pools)])

    def audience(self, to: AudienceSpec | None) -> Audience:
        """Who a put is for: ``to`` (names, pools, or both), or without it the standing
        audience; raises :class:`~iqbridge.errors.AudienceError` naming what is wrong."""
        subs = self._subscriptions()
        if to is None:
            try:
                return subs.audience().validate()
            except AudienceError as exc:
                if not (subs.subscribers or subs.pools):
                    raise
                raise AudienceError(
                    f"the standing audience of queue {self.name!r} is inconsistent: {exc}. "
                    f"Remove the offending subscriber or pool with queue.unsubscribe(name) "
                    f"(iq unsubscribe {self.name} NAME), or pass to=..."
                ) from None
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
