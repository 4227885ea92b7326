"""Dashboard sessions: a log-in with a token opens a server-side session; the browser
holds only a random session id (HttpOnly, SameSite=Strict cookie on /ui), never the
token. Each session has its own CSRF token, checked on every form POST."""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from iqbridge.admin.auth import Principal

__all__ = ["COOKIE", "Session", "Sessions"]

#: The session cookie's name.
COOKIE = "iq_admin_session"


@dataclass(slots=True)
class Session:
    """One logged-in browser."""

    sid: str = field(repr=False)
    principal: Principal
    csrf: str = field(repr=False)
    expires: float

    def csrf_ok(self, presented: str | None) -> bool:
        """Whether a form's CSRF field is this session's (constant-time compare)."""
        return bool(presented) and hmac.compare_digest(
            str(presented).encode("utf-8", "surrogateescape"), self.csrf.encode()
        )


class Sessions:
    """Sessions in process memory (a restart logs everyone out), each for ``ttl`` s."""

    def __init__(
        self, ttl: float = 8 * 3600, limit: int = 10_000, clock: Callable[[], float] | None = None
    ) -> None:
        self.ttl = ttl
        self.limit = limit
        self._clock = clock or time.monotonic
        self._by_id: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, principal: Principal) -> Session:
        """A new session for a logged-in principal."""
        now = self._clock()
        s = Session(secrets.token_urlsafe(32), principal, secrets.token_urlsafe(32), now + self.ttl)
        with self._lock:
            self._prune(now)
            if len(self._by_id) >= self.limit:
                oldest = min(self._by_id.values(), key=lambda x: x.expires)
                del self._by_id[oldest.sid]
            self._by_id[s.sid] = s
        return s

    def get(self, sid: str | None) -> Session | None:
        """The live session of a cookie value, or None."""
        if not sid:
            return None
        with self._lock:
            s = self._by_id.get(sid)
            if s is None:
                return None
            if s.expires <= self._clock():
                del self._by_id[sid]
                return None
            return s

    def close(self, sid: str | None) -> None:
        """End a session (log-out)."""
        if sid:
            with self._lock:
                self._by_id.pop(sid, None)

    def _prune(self, now: float) -> None:
        for sid in [k for k, v in self._by_id.items() if v.expires <= now]:
            del self._by_id[sid]
