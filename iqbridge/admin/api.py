"""The JSON admin API under ``/api``: every route needs ``Authorization: Bearer
<token>``; actions (POST) need an admin token."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from iqbridge.admin.auth import Principal
from iqbridge.admin.errors import AdminHTTPError, ErrorBody
from iqbridge.admin.gate import PRINCIPAL, authenticate
from iqbridge.admin.schemas import (
    ActionResult,
    BridgeHealth,
    HubOut,
    LineageOut,
    MessageOut,
    PurgeRequest,
    PurgeResult,
    QueueCountsOut,
    ReasonRequest,
    RecoveryRequest,
    RecoveryResultOut,
    RedriveRequest,
    RedriveResult,
    RerevealRequest,
    SummaryOut,
)
from iqbridge.admin.service import AdminService, SearchParams
from iqbridge.admin.state import admin_state
from iqbridge.admin.throttle import client_of

__all__ = ["bearer", "reader", "router", "writer"]

_bearer = HTTPBearer(
    auto_error=False,
    description="A token of hubs.yaml: `admin` reads and acts, `readonly` only reads.",
)

_READ_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No token, or a wrong one"},
    429: {"model": ErrorBody, "description": "Too many wrong tokens from this address"},
    404: {"model": ErrorBody, "description": "Unknown hub, queue or message"},
    422: {"model": ErrorBody, "description": "Bad input"},
    503: {"model": ErrorBody, "description": "The hub cannot be reached"},
}
_ACT_ERRORS: dict[int | str, dict[str, Any]] = {
    **_READ_ERRORS,
    403: {"model": ErrorBody, "description": "A read-only token"},
    413: {"model": ErrorBody, "description": "The request body is over max_body_bytes"},
    409: {"model": ErrorBody, "description": "The state table refuses the move; nothing changed"},
}


def bearer(request: Request, credentials: HTTPAuthorizationCredentials | None) -> Principal:
    """The caller of a bearer token; 401 (with WWW-Authenticate) for none or a wrong one,
    429 (with Retry-After) while the client's address has had too many wrong ones."""
    token = credentials.credentials if credentials is not None else None
    return authenticate(admin_state(request), client_of(request), token)


def reader(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """Any valid token (reads). The app's gate has checked it before the body was read
    (:mod:`iqbridge.admin.gate`); checked here otherwise."""
    checked = request.scope.get(PRINCIPAL)
    if isinstance(checked, Principal):
        return checked
    return bearer(request, credentials)


def writer(principal: Annotated[Principal, Depends(reader)]) -> Principal:
    """An admin token (actions); 403 for a read-only one."""
    if not principal.is_admin:
        raise AdminHTTPError(
            403,
            "forbidden",
            f"token {principal.name!r} is read-only; actions need an admin token",
        )
    return principal


Reader = Annotated[Principal, Depends(reader)]
Writer = Annotated[Principal, Depends(writer)]


def _svc(request: Request) -> AdminService:
    return admin_state(request).service


router = APIRouter(prefix="/api", tags=["admin"])

_MSG = "/hubs/{hub}/queues/{queue}/messages/{msg_id}"


@router.get("/hubs", response_model=list[HubOut], responses=_READ_ERRORS)
def list_hubs(request: Request, _: Reader) -> list[HubOut]:
    """Every configured hub with its redacted URL and its queues."""
    return _svc(request).overview()


@router.get("/hubs/{hub}/queues", response_model=list[QueueCountsOut], responses=_READ_ERRORS)
def queue_counts(request: Request, hub: str, _: Reader) -> list[QueueCountsOut]:
    """Each queue of a hub: messages per publisher state, per subscriber per state, and
    the age of each subscriber's oldest message still to process."""
    return _svc(request).counts(hub)


@router.get(
    "/hubs/{hub}/queues/{queue}/messages", response_model=list[SummaryOut], responses=_READ_ERRORS
)
def search_messages(
    request: Request,
    hub: str,
    queue: str,
    _: Reader,
    msg_id: Annotated[str | None, Query(max_length=200)] = None,
    correlation_id: Annotated[str | None, Query(max_length=1000)] = None,
    priority: Annotated[int | None, Query(ge=0, le=9)] = None,
    publisher: Annotated[str | None, Query(max_length=200)] = None,
    state: Annotated[
        str | None,
        Query(
            max_length=20,
            description="A publisher or subscriber state; JOURNALLED with "
            "`subscriber` is the subscriber's",
        ),
    ] = None,
    subscriber: Annotated[str | None, Query(max_length=200)] = None,
    since: Annotated[datetime | None, Query(description="Put at or after (ISO 8601)")] = None,
    until: Annotated[datetime | None, Query(description="Put at or before (ISO 8601)")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    parent: Annotated[
        str | None, Query(max_length=200, description="Children of this msg_id")
    ] = None,
) -> list[SummaryOut]:
    """Messages of a queue matching every filter given, from the index (no payloads)."""
    params = SearchParams(
        msg_id, correlation_id, priority, publisher, state, subscriber, since, until, limit, parent
    )
    return _svc(request).search(hub, queue, params)


@router.get(_MSG, response_model=MessageOut, responses=_READ_ERRORS)
def message_timeline(request: Request, hub: str, queue: str, msg_id: str, _: Reader) -> MessageOut:
    """The message's timeline: publisher and every subscriber, states with times,
    attempts, parents, the journal and a payload preview."""
    return _svc(request).message(hub, queue, msg_id)


@router.get(_MSG + "/lineage", response_model=LineageOut, responses=_READ_ERRORS)
def message_lineage(request: Request, hub: str, queue: str, msg_id: str, _: Reader) -> LineageOut:
    """The message's ancestors and descendants on every configured hub."""
    return _svc(request).lineage(hub, queue, msg_id)


_NO_REASON = ReasonRequest()


@router.post(_MSG + "/reveal", response_model=ActionResult, responses=_ACT_ERRORS)
def reveal(
    request: Request,
    hub: str,
    queue: str,
    msg_id: str,
    by: Writer,
    body: Annotated[ReasonRequest | None, Body()] = None,
) -> ActionResult:
    """Confirm a pending put: publisher PUT -> REVEALED."""
    why = (body or _NO_REASON).reason
    return _svc(request).reveal(hub, queue, msg_id, by, why)


@router.post(_MSG + "/withdraw", response_model=ActionResult, responses=_ACT_ERRORS)
def withdraw(
    request: Request,
    hub: str,
    queue: str,
    msg_id: str,
    by: Writer,
    body: Annotated[ReasonRequest | None, Body()] = None,
) -> ActionResult:
    """Withdraw the message: no subscriber may retrieve it any more."""
    why = (body or _NO_REASON).reason
    return _svc(request).withdraw(hub, queue, msg_id, by, why)


@router.post(_MSG + "/rereveal", response_model=ActionResult, responses=_ACT_ERRORS)
def rereveal(
    request: Request, hub: str, queue: str, msg_id: str, by: Writer, body: RerevealRequest
) -> ActionResult:
    """Re-reveal the message to one subscriber that found it UNUSABLE (AVAILABLE again,
    attempt + 1)."""
    return _svc(request).rereveal(hub, queue, msg_id, body.subscriber, by, body.reason)


@router.post(
    "/hubs/{hub}/queues/{queue}/redrive", response_model=RedriveResult, responses=_ACT_ERRORS
)
def redrive(
    request: Request, hub: str, queue: str, by: Writer, body: RedriveRequest
) -> RedriveResult:
    """A subscriber's UNUSABLE messages, re-revealed to it alone (``dry_run``, the
    default, only lists them)."""
    return _svc(request).redrive(hub, queue, body, by)


@router.post("/hubs/{hub}/queues/{queue}/purge", response_model=PurgeResult, responses=_ACT_ERRORS)
def purge(request: Request, hub: str, queue: str, by: Writer, body: PurgeRequest) -> PurgeResult:
    """Purge messages JOURNALLED longer than ``older_than`` seconds (``dry_run``, the
    default, only counts them)."""
    return _svc(request).purge(hub, queue, body, by)


@router.post("/recovery", response_model=RecoveryResultOut, responses=_ACT_ERRORS)
def recovery(request: Request, by: Writer, body: RecoveryRequest) -> RecoveryResultOut:
    """Cross-queue recovery (seed 000) between a source queue (the parents) and a target
    queue (the children) on any configured hubs: the plan (``dry_run``, the default) or
    the plan applied."""
    return _svc(request).recovery(body, by)


@router.get("/bridges", response_model=list[BridgeHealth], responses=_READ_ERRORS)
def bridges(request: Request, _: Reader) -> list[BridgeHealth]:
    """Each configured bridge daemon's health (from its health file)."""
    return _svc(request).bridge_health()
