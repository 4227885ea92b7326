"""The door of the admin app, before any route runs: the bearer token of every
token-guarded path is checked before a byte of the request body is read, and a body
announced larger than ``max_body_bytes`` is refused (413) unread.

FastAPI reads and parses a route's JSON body *before* it solves the route's
dependencies, so a token check done as a dependency comes too late: a stranger could
make the server read (and hold) a body of any size just to be told 401. This ASGI
middleware runs first. A body without a ``Content-Length`` (chunked) is counted as it
streams by Starlette's :class:`~starlette.middleware.body_limit.RequestBodyLimitMiddleware`,
installed inside this one with the same limit.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from iqbridge.admin.auth import Principal
from iqbridge.admin.errors import AdminHTTPError
from iqbridge.admin.state import AdminState, admin_state
from iqbridge.admin.throttle import client_of

__all__ = ["PRINCIPAL", "Gate", "authenticate", "bearer_token", "needs_token", "too_large"]

#: The scope key under which the gate leaves the caller it authenticated.
PRINCIPAL = "iqbridge.admin.principal"

#: Paths (besides everything under ``/api``) that need a bearer token.
_GUARDED = frozenset({"/openapi.json", "/docs", "/metrics"})

Responder = Callable[[Request, AdminHTTPError], Response]


def needs_token(path: str) -> bool:
    """Whether a route path needs a bearer token (the API, its OpenAPI document and
    docs page, and the metrics)."""
    return path == "/api" or path.startswith("/api/") or path.rstrip("/") in _GUARDED


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def authenticate(state: AdminState, address: str, token: str | None) -> Principal:
    """The caller of a bearer token; 401 (with WWW-Authenticate) for none or a wrong one,
    429 (with Retry-After) while ``address`` has had too many wrong ones."""
    if token:
        wait = state.throttle.wait(address)
        if wait is not None:
            raise AdminHTTPError(
                429,
                "too_many_attempts",
                f"too many wrong tokens from {address}: try again in {wait} s",
                {"Retry-After": str(wait)},
            )
    principal = state.tokens.check(token)
    if principal is None:
        if token:
            state.throttle.failed(address)
        raise AdminHTTPError(
            401,
            "unauthorized",
            "a valid token is required: Authorization: Bearer <token>",
            {"WWW-Authenticate": "Bearer"},
        )
    return principal


def too_large(limit: int) -> AdminHTTPError:
    """The 413 of a request body over ``limit`` bytes."""
    return AdminHTTPError(
        413,
        "payload_too_large",
        f"the request body is larger than {limit} bytes, the server's max_body_bytes",
    )


def _content_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class Gate:
    """ASGI middleware: the token first (guarded paths), then the announced body size;
    only then the app, which may read the body."""

    def __init__(self, app: ASGIApp, *, max_body: int, respond: Responder) -> None:
        self.app = app
        self.max_body = max_body
        self.respond = respond

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # No receive: this request object cannot read the body, by construction.
        request = Request(scope)
        path = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        try:
            if needs_token(path):
                token = bearer_token(request.headers.get("authorization"))
                scope[PRINCIPAL] = authenticate(admin_state(request), client_of(request), token)
            length = _content_length(request)
            if length is not None and length > self.max_body:
                raise too_large(self.max_body)
        except AdminHTTPError as exc:
            await self.respond(request, exc)(scope, receive, send)
            return
        await self.app(scope, receive, send)
