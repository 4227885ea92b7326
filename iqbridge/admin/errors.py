"""Typed JSON errors of the admin API: every failure answers ``{"error": kind,
"detail": message}`` with the status its kind calls for, scrubbed of every secret.

=====================================================  ======  =====================
error                                                  status  kind
=====================================================  ======  =====================
no or a wrong token                                    401     unauthorized
a readonly token on an action                          403     forbidden
unknown hub, queue or message                          404     not_found
a route called with a method it does not take          405     method_not_allowed
IllegalTransition, ConcurrentUpdate, locks, leases     409     conflict kinds
a request body over max_body_bytes                     413     payload_too_large
bad input (validation, InvalidArgument, bad JSON)      422     invalid_argument
too many wrong tokens from one address                 429     too_many_attempts
a hub's broker or index unreachable                    503     unavailable
anything else                                          500     internal
=====================================================  ======  =====================
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from iqbridge.admin.hubs import HubNotFound, HubUnavailable
from iqbridge.errors import (
    AudienceError,
    ConcurrentUpdate,
    ConfigurationError,
    ConnectionError,
    IllegalTransition,
    InvalidArgument,
    LeaseLost,
    LockedError,
    MessageNotFound,
    MessageTooLarge,
    PayloadError,
    PayloadNotRetained,
    UnknownQueueError,
)
from iqbridge.redaction import scrub

__all__ = ["AdminHTTPError", "ErrorBody", "Scrubber", "classify"]


class ErrorBody(BaseModel):
    """Every error response of the API."""

    error: str
    detail: str


class AdminHTTPError(Exception):
    """An error the admin server raises itself (authentication, permission, input)."""

    def __init__(
        self, status: int, kind: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        self.status = status
        self.kind = kind
        self.detail = detail
        self.headers = headers or {}
        super().__init__(detail)


_KINDS: tuple[tuple[type[BaseException], int, str], ...] = (
    (HubNotFound, 404, "not_found"),
    (UnknownQueueError, 404, "not_found"),
    (MessageNotFound, 404, "not_found"),
    (IllegalTransition, 409, "illegal_transition"),
    (ConcurrentUpdate, 409, "concurrent_update"),
    (LockedError, 409, "locked"),
    (LeaseLost, 409, "lease_lost"),
    (PayloadNotRetained, 409, "payload_not_retained"),
    (InvalidArgument, 422, "invalid_argument"),
    (AudienceError, 422, "invalid_argument"),
    (PayloadError, 422, "invalid_argument"),
    (MessageTooLarge, 422, "invalid_argument"),
    (HubUnavailable, 503, "unavailable"),
    (ConnectionError, 503, "unavailable"),
    (ConfigurationError, 503, "unavailable"),
)


def classify(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and error kind of an exception."""
    if isinstance(exc, AdminHTTPError):
        return exc.status, exc.kind
    for cls, status, kind in _KINDS:
        if isinstance(exc, cls):
            return status, kind
    return 500, "internal"


class Scrubber:
    """Replaces every secret (token values, URL passwords) in a text by ``***``."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def __repr__(self) -> str:
        return f"Scrubber({len(self._secrets)} secret(s))"

    def __call__(self, text: str) -> str:
        return scrub(text, self._secrets)
