"""A route's lease: at most one bridge process works a route at a time.

The lease is an ordinary iqbridge message on the bridge's state hub (queue
``iq.bridge.<bridge>.<route>.lease``, one message, subscriber ``holder``): holding it is
holding a delivery of it, taken with the index's compare-and-set claim and kept by
renewing its lease, so it works on every store the state hub can be (SQLite for one
host, Redis or a SQL database for many). A standby process takes over when the holder's
lease lapses; on the same host, a holder whose process is gone is taken over at once
(``reclaim``), so a restarted bridge does not wait for its predecessor's lease.
"""

from __future__ import annotations

import os
import socket

from iqbridge.delivery import Delivery
from iqbridge.errors import IQError, LeaseLost, MessageNotFound
from iqbridge.hub import Hub
from iqbridge.redaction import get_logger
from iqbridge.retry import RetryPolicy

__all__ = ["RouteLease", "holder_gone"]

log = get_logger("iqbridge.bridge")

_HOLDER = "holder"


def holder_gone(owner: str | None) -> bool:
    """Whether ``owner`` (``subscriber@host:pid``) is a process of this host that no
    longer runs. A holder on another host is never judged gone here: its lease decides."""
    if not owner or "@" not in owner:
        return False
    host, _, pid_s = owner.rpartition("@")[2].rpartition(":")
    if host != socket.gethostname() or not pid_s.isdigit():
        return False
    pid = int(pid_s)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class RouteLease:
    """The lease of one route (see the module documentation)."""

    def __init__(self, hub: Hub, bridge: str, route: str, ttl: float) -> None:
        self.hub = hub
        self.ttl = ttl
        self.queue = hub.queue(
            f"iq.bridge.{bridge}.{route}.lease",
            retry=RetryPolicy(max_attempts=2**31 - 1),
            lease=ttl,
        )
        self.msg_id = f"lease.{bridge}.{route}"
        self.held: Delivery | None = None

    def acquire(self) -> bool:
        """Try once to take the lease; True if this process holds it now."""
        if self.held is not None:
            return True
        self.queue.put(b"", to=[_HOLDER], msg_id=self.msg_id)
        got = self.queue.get(_HOLDER, lease=self.ttl)
        if got is None:
            owner = self._owner()
            if holder_gone(owner):
                log.info("route lease %s: holder %s is gone, taking over", self.msg_id, owner)
                self.queue.reclaim(_HOLDER, owner, reason=f"holder {owner} is gone")
                got = self.queue.get(_HOLDER, lease=self.ttl)
        self.held = got
        return got is not None

    def _owner(self) -> str | None:
        try:
            rec = self.hub.store.load(self.msg_id)
        except MessageNotFound:
            return None
        member = rec.members.get(_HOLDER)
        return member.lease_owner if member is not None else None

    def renew(self) -> bool:
        """Extend the lease; False if it was lost (another process holds the route now)."""
        if self.held is None:
            return False
        try:
            self.held.renew(self.ttl)
        except LeaseLost:
            log.warning("route lease %s lost: another bridge process holds it", self.msg_id)
            self.held = None
            return False
        return True

    def release(self) -> None:
        """Give the lease up at once, for a standby to take."""
        held, self.held = self.held, None
        if held is None:
            return
        try:
            held.release(reason="bridge stopped")
        except IQError as exc:
            log.warning("route lease %s not given back (%s): it lapses", self.msg_id, exc)
