"""What the admin app keeps for its lifetime (on ``app.state.admin``)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from iqbridge.admin.auth import TokenRing
from iqbridge.admin.errors import Scrubber
from iqbridge.admin.service import AdminService
from iqbridge.admin.sessions import Sessions
from iqbridge.admin.throttle import Throttle

__all__ = ["AdminState", "admin_state"]


@dataclass(slots=True)
class AdminState:
    """The service over the hubs, the tokens, the dashboard's sessions, the scrubber and
    the count of failed logins."""

    service: AdminService
    tokens: TokenRing
    sessions: Sessions
    scrub: Scrubber
    throttle: Throttle

    def __repr__(self) -> str:
        return f"AdminState({self.tokens!r})"


def admin_state(request: Request) -> AdminState:
    """The app's :class:`AdminState` from a request."""
    state: AdminState = request.app.state.admin
    return state
