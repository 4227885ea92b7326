"""The admin application: the JSON API (``/api``), the dashboard (``/ui``), ``/health``,
and the OpenAPI document and its docs page (``/openapi.json``, ``/docs``), which need a
token like the API: the route list tells a stranger which actions exist.

Every error is a typed JSON body (``{"error", "detail"}``, see
:mod:`iqbridge.admin.errors`), scrubbed of token values and URL passwords; on the
dashboard the same error is an HTML page, and a missing session goes to the log-in page.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY, RequestBodyLimitMiddleware

import iqbridge
from iqbridge.admin import dashboard, dashboard_ops
from iqbridge.admin.api import reader, router
from iqbridge.admin.auth import Principal, TokenRing
from iqbridge.admin.config import AdminConfig
from iqbridge.admin.errors import AdminHTTPError, Scrubber, classify
from iqbridge.admin.gate import Gate, too_large
from iqbridge.admin.hubs import Hubs
from iqbridge.admin.service import AdminService
from iqbridge.admin.sessions import Sessions
from iqbridge.admin.state import AdminState, admin_state
from iqbridge.admin.throttle import Throttle
from iqbridge.errors import IQError
from iqbridge.redaction import get_logger

__all__ = ["create_app"]

log = get_logger("iqbridge.admin")

_HERE = Path(__file__).parent


def create_app(
    config: AdminConfig,
    *,
    environ: Mapping[str, str] | None = None,
    tokens: TokenRing | None = None,
) -> FastAPI:
    """The admin app over ``config``'s hubs. Token values are read now from the
    environment (``environ``, default ``os.environ``) or their files, unless ``tokens``
    is given; hubs are connected on first use and closed when the app shuts down."""
    ring = tokens if tokens is not None else TokenRing.from_config(config, environ)
    hubs = Hubs(config.hubs)
    state = AdminState(
        service=AdminService(hubs, config.bridges),
        tokens=ring,
        sessions=Sessions(),
        scrub=Scrubber([*ring.secrets(), *hubs.secrets()]),
        throttle=Throttle(config.failed_logins),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            hubs.close()

    app = FastAPI(
        title="iqbridge admin",
        version=iqbridge.__version__,
        description="Queues, messages and their states on every configured hub; actions "
        "through the state engine, journalled with the token's name.",
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.admin = state
    app.include_router(router)
    app.include_router(dashboard.router)
    app.include_router(dashboard_ops.router)
    app.mount("/ui/static", StaticFiles(directory=_HERE / "static"), name="static")
    _add_meta_routes(app)
    _add_metrics(app, hubs)
    _add_error_handlers(app)
    # Innermost first: the streamed body counted, then the gate (token and announced
    # size, before any body is read), then the security headers on every answer.
    app.add_middleware(RequestBodyLimitMiddleware, max_body_size=config.max_body_bytes)
    app.add_middleware(Gate, max_body=config.max_body_bytes, respond=_refuse)
    app.middleware("http")(_headers)
    return app


def _add_meta_routes(app: FastAPI) -> None:
    @app.get("/health", include_in_schema=False)
    def health() -> dict[str, str]:
        """Liveness only: no detail about the configuration."""
        return {"status": "ok"}

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(_: Annotated[Principal, Depends(reader)]) -> dict[str, Any]:
        """The OpenAPI document (needs a token)."""
        return app.openapi()

    @app.get("/docs", include_in_schema=False)
    def docs(_: Annotated[Principal, Depends(reader)]) -> HTMLResponse:
        """Swagger UI (needs a token; it fetches /openapi.json with the same header only
        through a client that sends it, such as a header-adding proxy)."""
        return get_swagger_ui_html(openapi_url="/openapi.json", title="iqbridge admin API")


def _add_metrics(app: FastAPI, hubs: Hubs) -> None:
    """``/metrics``: Prometheus metrics over every configured hub (needs a token, like
    the API: Prometheus sends it with ``authorization: {credentials_file: ...}``)."""
    from iqbridge.observability.metrics import build_registry, render

    registry = build_registry({name: functools.partial(hubs.hub, name) for name in hubs.names()})

    @app.get("/metrics", include_in_schema=False)
    def metrics(_: Annotated[Principal, Depends(reader)]) -> Response:
        """The Prometheus exposition (see docs/observability.md)."""
        body, content_type = render(registry)
        return Response(body, media_type=content_type)


async def _headers(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    response = await call_next(request)
    h = response.headers
    h.setdefault("X-Content-Type-Options", "nosniff")
    h.setdefault("Referrer-Policy", "no-referrer")
    if request.url.path.startswith(("/ui", "/api")):
        h.setdefault("Cache-Control", "no-store")
    if request.url.path.startswith("/ui"):
        h.setdefault("X-Frame-Options", "DENY")
        h.setdefault(
            "Content-Security-Policy",
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
            "form-action 'self'; base-uri 'none'",
        )
    return response


def _error(
    request: Request, status: int, kind: str, detail: str, headers: dict[str, str]
) -> Response:
    text = admin_state(request).scrub(detail)
    if request.url.path.startswith("/ui"):
        return dashboard.error_page(request, status, kind, text)
    return JSONResponse({"error": kind, "detail": text}, status_code=status, headers=headers)


def _refuse(request: Request, exc: AdminHTTPError) -> Response:
    return _error(request, exc.status, exc.kind, exc.detail, exc.headers)


def _unreadable(exc: StarletteHTTPException) -> str:
    """What was wrong with a body FastAPI could not parse (its 400)."""
    cause = exc.__cause__
    if isinstance(cause, RecursionError):
        return "the JSON body is nested too deeply to decode; send a flat object"
    if exc.detail == "There was an error parsing the body":
        return "the request body cannot be decoded: send a JSON object"
    return str(exc.detail)


def _add_error_handlers(app: FastAPI) -> None:
    async def on_admin(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, AdminHTTPError)
        if isinstance(exc, dashboard.LoginRequired):
            return RedirectResponse("/ui/login", status_code=303)
        return _error(request, exc.status, exc.kind, exc.detail, exc.headers)

    async def on_iq(request: Request, exc: Exception) -> Response:
        status, kind = classify(exc)
        text = admin_state(request).scrub(str(exc))
        if status >= 500:
            log.warning(
                "admin request %r failed: %s: %s", request.url.path, type(exc).__name__, text
            )
        return _error(request, status, kind, text, {})

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        parts = []
        for err in exc.errors()[:3]:
            where = ".".join(str(p) for p in err.get("loc", ()))
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
        return _error(request, 422, "invalid_argument", "; ".join(parts) or "bad input", {})

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 400:  # a body that cannot be decoded is bad input
            return _error(request, 422, "invalid_argument", _unreadable(exc), headers)
        if exc.status_code == 413:  # a streamed body past the limit
            return _refuse(request, too_large(request.scope.get(MAX_BODY_SIZE_SCOPE_KEY, 0)))
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(request, exc.status_code, kind, str(exc.detail), headers)

    async def on_other(request: Request, exc: Exception) -> Response:
        trace = admin_state(request).scrub("".join(traceback.format_exception(exc)))
        log.error("admin request %r failed: unexpected %s", request.url.path, trace)
        return _error(request, 500, "internal", "internal error; see the server log", {})

    app.add_exception_handler(AdminHTTPError, on_admin)
    app.add_exception_handler(IQError, on_iq)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_other)
