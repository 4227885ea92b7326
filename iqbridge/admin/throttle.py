"""Failed logins counted per client address: past the limit the address waits (429).

A wrong bearer token on the API, or a wrong token on the dashboard's log-in form, counts
one failure for the client's address, in a moving window (the ``limits`` library,
in memory: one admin server process). While an address is over the limit its requests
with a token are refused with 429 and ``Retry-After`` before any token is compared,
right or wrong, so guessing tokens costs the window's length per few guesses. Requests
without a token never count: a scraper not yet configured is not guessing.

The address is ``request.client.host``: the connecting peer's, since ``iq admin serve``
believes no ``X-Forwarded-For`` unless ``trusted_proxies`` names the proxy that sends it
(:mod:`iqbridge.admin.server`). Behind a proxy not named there every client shares the
proxy's address, so the limit applies to them together.
"""

from __future__ import annotations

import math
import time

from limits import RateLimitItem, parse
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from starlette.requests import Request

from iqbridge.admin.config import DEFAULT_RATE

__all__ = ["Throttle", "client_of"]

_NAMESPACE = "iqbridge-admin-login"


def client_of(request: Request) -> str:
    """The address a request came from (``unknown`` when the server does not say)."""
    return request.client.host if request.client is not None else "unknown"


class Throttle:
    """Counts failed logins per address; says how long an address over the limit waits."""

    def __init__(self, rate: str = DEFAULT_RATE) -> None:
        self.rate: RateLimitItem = parse(rate)
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    def __repr__(self) -> str:
        return f"Throttle({self.rate})"

    def wait(self, address: str) -> int | None:
        """Seconds ``address`` must wait before its next try, or None when it may try."""
        if self._limiter.test(self.rate, _NAMESPACE, address):
            return None
        stats = self._limiter.get_window_stats(self.rate, _NAMESPACE, address)
        return max(1, math.ceil(stats.reset_time - time.time()))

    def failed(self, address: str) -> None:
        """Count one failed login of ``address``."""
        self._limiter.hit(self.rate, _NAMESPACE, address)
