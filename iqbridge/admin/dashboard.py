"""The server-rendered dashboard under ``/ui`` (Jinja2, autoescaped): log in with a
token, queues with their state counts, search, a message's timeline and lineage, and the
actions (re-reveal to one subscriber, withdraw, reveal, redrive), each behind a
confirmation box and a per-session CSRF token.

Elements carry stable ids (``token``, ``search-msg-id``, ``rereveal-subscriber``...) and
state cells a ``data-state`` attribute, for browser tests.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import jinja2
from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from iqbridge.admin.dashboard_views import PER_PAGE, paging, timeline
from iqbridge.admin.errors import AdminHTTPError, classify
from iqbridge.admin.hubs import HubUnavailable
from iqbridge.admin.schemas import QueueCountsOut, RedriveRequest
from iqbridge.admin.service import SearchParams
from iqbridge.admin.sessions import COOKIE, Session
from iqbridge.admin.state import admin_state
from iqbridge.admin.throttle import client_of
from iqbridge.errors import InvalidArgument, IQError

__all__ = [
    "LoginRequired",
    "UISession",
    "check_csrf",
    "error_page",
    "render",
    "require_admin",
    "router",
]

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)
templates = Jinja2Templates(env=_ENV)

router = APIRouter(prefix="/ui", include_in_schema=False)

_ACTIONS = ("rereveal", "withdraw", "reveal")


class LoginRequired(AdminHTTPError):
    """No live dashboard session: the handler redirects to the log-in page."""

    def __init__(self) -> None:
        super().__init__(401, "login_required", "log in first")


def ui_session(request: Request) -> Session:
    """The browser's live session; LoginRequired without one."""
    s = admin_state(request).sessions.get(request.cookies.get(COOKIE))
    if s is None:
        raise LoginRequired()
    return s


UISession = Annotated[Session, Depends(ui_session)]


def render(
    request: Request, name: str, ctx: dict[str, Any], status: int = 200, s: Session | None = None
) -> Response:
    """Render a template with the session, and no error or notice unless given."""
    base: dict[str, Any] = {"session": s, "error": None, "notice": None}
    base.update(ctx)
    return templates.TemplateResponse(request, name, base, status_code=status)


def error_page(request: Request, status: int, kind: str, detail: str) -> Response:
    """An error as an HTML page (the API answers the same error as JSON)."""
    s = admin_state(request).sessions.get(request.cookies.get(COOKIE))
    ctx = {"status": status, "kind": kind, "detail": detail}
    return render(request, "error.html", ctx, status, s)


# --- log-in ------------------------------------------------------------------------------


@router.get("/login")
def login_form(request: Request) -> Response:
    """The log-in page: paste a token."""
    return render(request, "login.html", {})


@router.post("/login")
def login(request: Request, token: Annotated[str, Form(max_length=4096)] = "") -> Response:
    """Check the token; open a session (HttpOnly, SameSite=Strict cookie on /ui)."""
    state = admin_state(request)
    address = client_of(request)
    wait = state.throttle.wait(address)
    if wait is not None:
        resp = render(
            request, "login.html", {"error": f"Too many wrong tokens: wait {wait} s."}, 429
        )
        resp.headers["Retry-After"] = str(wait)
        return resp
    principal = state.tokens.check(token.strip())
    if principal is None:
        if token.strip():
            state.throttle.failed(address)
        return render(request, "login.html", {"error": "That token is not valid."}, 401)
    s = state.sessions.open(principal)
    resp = RedirectResponse("/ui/", status_code=303)
    resp.set_cookie(
        COOKIE,
        s.sid,
        max_age=int(state.sessions.ttl),
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return resp


@router.post("/logout")
def logout(request: Request, s: UISession, csrf: Annotated[str, Form()] = "") -> Response:
    """End the session."""
    check_csrf(s, csrf)
    admin_state(request).sessions.close(s.sid)
    resp = RedirectResponse("/ui/login", status_code=303)
    resp.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
    return resp


def check_csrf(s: Session, presented: str) -> None:
    """403 unless ``presented`` is the session's CSRF token (compared in constant time)."""
    if not s.csrf_ok(presented):
        raise AdminHTTPError(403, "csrf", "the form is stale or forged: reload the page")


# --- reading -----------------------------------------------------------------------------


@router.get("/")
def home(request: Request, s: UISession) -> Response:
    """Every hub with its queues, state counts and oldest-undone ages; bridges."""
    svc = admin_state(request).service
    hubs: list[dict[str, Any]] = []
    for h in svc.overview():
        counts: list[QueueCountsOut] = []
        error = h.error
        if h.available:
            try:
                counts = svc.counts(h.name)
            except HubUnavailable as exc:
                error = str(exc)
        hubs.append({"hub": h, "counts": counts, "error": error})
    return render(request, "home.html", {"hubs": hubs, "bridges": svc.bridge_health()}, s=s)


def _opt_int(value: str, name: str) -> int | None:
    if not value.strip():
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(f"{name} must be a whole number, not {value!r}") from None


def _opt_time(value: str, name: str) -> datetime | None:
    if not value.strip():
        return None
    try:
        return datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidArgument(f"{name} must be a date and time (ISO 8601)") from None


@router.get("/hubs/{hub}/queues/{queue}")
def queue_page(
    request: Request,
    hub: str,
    queue: str,
    s: UISession,
    msg_id: str = "",
    correlation_id: str = "",
    priority: str = "",
    publisher: str = "",
    state: str = "",
    subscriber: str = "",
    since: str = "",
    until: str = "",
    limit: str = str(PER_PAGE),
    offset: str = "",
) -> Response:
    """A queue's search form and a page of the messages it finds (``limit`` a page,
    from ``offset``), with how many match in all and links to the other pages."""
    svc = admin_state(request).service
    form = {
        "msg_id": msg_id,
        "correlation_id": correlation_id,
        "priority": priority,
        "publisher": publisher,
        "state": state,
        "subscriber": subscriber,
        "since": since,
        "until": until,
        "limit": limit,
    }
    counts = next((c for c in svc.counts(hub) if c.queue == queue), None)
    if counts is None:
        svc.hubs.queue(hub, queue)  # the typed 404
    ctx: dict[str, Any] = {"hub": hub, "queue": queue, "form": form, "counts": counts}
    ctx["paging"] = None
    try:
        lim = _opt_int(limit, "limit") or PER_PAGE
        if not 1 <= lim <= 1000:
            raise InvalidArgument("limit (messages per page) must be between 1 and 1000")
        start = _opt_int(offset, "offset") or 0
        prio = _opt_int(priority, "priority")
        if prio is not None and not 0 <= prio <= 9:
            raise InvalidArgument("priority must be between 0 and 9")
        params = SearchParams(
            msg_id.strip() or None,
            correlation_id or None,
            prio,
            publisher.strip() or None,
            state.strip() or None,
            subscriber.strip() or None,
            _opt_time(since, "since"),
            _opt_time(until, "until"),
            lim,
        )
        total = counts.messages if counts is not None else 0
        page = svc.search_page(hub, queue, params, start, total)
        ctx["results"] = page.rows
        ctx["paging"] = paging(request.url.path, form, page, lim)
    except IQError as exc:
        status, _kind = classify(exc)
        if status >= 500 or status == 404:
            raise
        ctx["results"] = []
        ctx["error"] = admin_state(request).scrub(str(exc))
        return render(request, "queue.html", ctx, status, s)
    return render(request, "queue.html", ctx, s=s)


def _message_ctx(request: Request, hub: str, queue: str, msg_id: str) -> dict[str, Any]:
    svc = admin_state(request).service
    msg = svc.message(hub, queue, msg_id)
    return {
        "hub": hub,
        "queue": queue,
        "msg": msg,
        "timeline": timeline(msg),
        "lineage": svc.lineage(hub, queue, msg_id),
    }


@router.get("/hubs/{hub}/queues/{queue}/messages/{msg_id}")
def message_page(
    request: Request, hub: str, queue: str, msg_id: str, s: UISession, done: str = ""
) -> Response:
    """A message's timeline, journal, payload, lineage and action forms."""
    ctx = _message_ctx(request, hub, queue, msg_id)
    notices = {
        "rereveal": "Re-revealed.",
        "withdraw": "Withdrawn.",
        "reveal": "Revealed.",
    }
    ctx["notice"] = notices.get(done)
    return render(request, "message.html", ctx, s=s)


def require_admin(s: Session) -> None:
    """403 unless the session's token is an admin token."""
    if not s.principal.is_admin:
        raise AdminHTTPError(
            403,
            "forbidden",
            f"token {s.principal.name!r} is read-only; actions need an admin token",
        )


@router.post("/hubs/{hub}/queues/{queue}/messages/{msg_id}/{action}")
def message_action(
    request: Request,
    hub: str,
    queue: str,
    msg_id: str,
    action: str,
    s: UISession,
    csrf: Annotated[str, Form()] = "",
    confirm: Annotated[str, Form()] = "",
    reason: Annotated[str, Form(max_length=500)] = "",
    subscriber: Annotated[str, Form(max_length=200)] = "",
) -> Response:
    """Make one action on a message once its confirmation box is ticked."""
    check_csrf(s, csrf)
    require_admin(s)
    if action not in _ACTIONS:
        raise AdminHTTPError(404, "not_found", f"no action {action!r}")
    svc = admin_state(request).service
    try:
        if confirm != "yes":
            raise InvalidArgument("tick the confirmation box to make this change")
        if action == "rereveal":
            if not subscriber:
                raise InvalidArgument("choose the subscriber to re-reveal to")
            svc.rereveal(hub, queue, msg_id, subscriber, s.principal, reason)
        elif action == "withdraw":
            svc.withdraw(hub, queue, msg_id, s.principal, reason)
        else:
            svc.reveal(hub, queue, msg_id, s.principal, reason)
    except IQError as exc:
        status, _kind = classify(exc)
        if status in (404, 503) or status >= 500:
            raise
        ctx = _message_ctx(request, hub, queue, msg_id)
        ctx["error"] = admin_state(request).scrub(str(exc))
        return render(request, "message.html", ctx, status, s)
    url = request.url_for("message_page", hub=hub, queue=queue, msg_id=msg_id)
    return RedirectResponse(f"{url.path}?done={action}", status_code=303)


@router.get("/hubs/{hub}/queues/{queue}/redrive")
def redrive_page(
    request: Request, hub: str, queue: str, s: UISession, subscriber: str = ""
) -> Response:
    """The dry run of a redrive: the subscriber's UNUSABLE messages, and a form to
    re-reveal them to it alone."""
    ctx: dict[str, Any] = {"hub": hub, "queue": queue, "subscriber": subscriber, "result": None}
    if subscriber:
        req = RedriveRequest(subscriber=subscriber[:200], dry_run=True)
        ctx["result"] = admin_state(request).service.redrive(hub, queue, req, s.principal)
    else:
        admin_state(request).service.hubs.queue(hub, queue)
    return render(request, "redrive.html", ctx, s=s)


@router.post("/hubs/{hub}/queues/{queue}/redrive")
def redrive_apply(
    request: Request,
    hub: str,
    queue: str,
    s: UISession,
    csrf: Annotated[str, Form()] = "",
    confirm: Annotated[str, Form()] = "",
    subscriber: Annotated[str, Form(max_length=200)] = "",
    reason: Annotated[str, Form(max_length=500)] = "",
) -> Response:
    """Re-reveal the subscriber's UNUSABLE messages once confirmed."""
    check_csrf(s, csrf)
    require_admin(s)
    svc = admin_state(request).service
    ctx: dict[str, Any] = {"hub": hub, "queue": queue, "subscriber": subscriber}
    if not subscriber:
        raise InvalidArgument("choose the subscriber to redrive")
    dry = confirm != "yes"
    req = RedriveRequest(subscriber=subscriber, dry_run=dry, reason=reason)
    ctx["result"] = svc.redrive(hub, queue, req, s.principal)
    if dry:
        ctx["error"] = "tick the confirmation box to redrive these messages"
        return render(request, "redrive.html", ctx, 422, s)
    return render(request, "redrive.html", ctx, s=s)
