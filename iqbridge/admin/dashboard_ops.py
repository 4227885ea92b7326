"""The dashboard's queue-wide operations: purge by rule on a queue's page and cross-queue
recovery (``/ui/recovery``).

Like redrive, each shows its dry run first (what would change, nothing changed), then a
form with a confirmation box and the session's CSRF token; a post without the box ticked
changes nothing and says so. The changes go through :class:`AdminService`, as the API's
do: a purge is logged with the token's name, a recovery journalled as ``by recovery
admin-<token>-<hex>: ...``. Elements carry stable ids (``purge-age``, ``recovery-plan``...)
for browser tests.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import Response

from iqbridge.admin.dashboard import UISession, check_csrf, render, require_admin
from iqbridge.admin.errors import classify
from iqbridge.admin.schemas import Endpoint, RecoveryRequest, RecoveryResultOut
from iqbridge.admin.sessions import Session
from iqbridge.admin.state import admin_state
from iqbridge.errors import InvalidArgument, IQError

__all__ = ["parse_age", "router"]

router = APIRouter(prefix="/ui", include_in_schema=False)

#: msg_ids a purge's dry run lists.
PURGE_SHOWN = 50
#: The API's bound on ``older_than`` (PurgeRequest): a hundred years, in seconds.
_MAX_AGE = 100 * 365 * 86400


def parse_age(text: str) -> float:
    """Seconds in an age as ``iq purge --older-than`` takes it (``30m``, ``12h``, ``7d``,
    ``2w`` or a number of seconds); InvalidArgument for anything else."""
    import typer  # the CLI's own parser, so the two read ages alike

    from iqbridge.cli.parsing import parse_duration

    if not text.strip():
        raise InvalidArgument("give an age, e.g. 7d, 12h, 30m or a number of seconds")
    if len(text) > 40:
        raise InvalidArgument("that age is too long; write e.g. 7d, 12h or 30m")
    try:
        secs = parse_duration(text, "age")
    except typer.BadParameter as exc:
        raise InvalidArgument(str(exc)) from None
    if secs > _MAX_AGE:
        raise InvalidArgument("the age may be at most 100 years")
    return secs


def _refuse(request: Request, exc: IQError) -> str:
    """The scrubbed message of an error a form answers on its own page (bad input, a
    refused move); re-raises what goes to the error page (404, 503, bugs)."""
    status, _kind = classify(exc)
    if status in (404, 503) or status >= 500:
        raise exc
    return admin_state(request).scrub(str(exc))


# --- purge by rule -----------------------------------------------------------------------


def _purge_ctx(
    request: Request, hub: str, queue: str, age: str, cutoff: int | None = None
) -> dict[str, Any]:
    """The purge page's dry run: how many would go (now, or up to the ``cutoff`` a
    dry run showed) and the first of their ids."""
    svc = admin_state(request).service
    ctx: dict[str, Any] = {"hub": hub, "queue": queue, "age": age, "result": None}
    secs = parse_age(age)
    if cutoff is None:
        cutoff = svc.purge_cutoff(hub, secs)
    ids = svc.purge_candidates(hub, queue, cutoff)
    ctx.update(cutoff=cutoff, count=len(ids), shown=ids[:PURGE_SHOWN], dry_run=True)
    return ctx


@router.get("/hubs/{hub}/queues/{queue}/purge")
def purge_page(request: Request, hub: str, queue: str, s: UISession, age: str = "") -> Response:
    """The dry run of a purge by rule: how many JOURNALLED messages are older than
    ``age`` (and up to 50 of their msg_ids), and a form to purge them."""
    admin_state(request).service.hubs.queue(hub, queue)  # the typed 404
    try:
        ctx = _purge_ctx(request, hub, queue, age)
    except IQError as exc:
        ctx = {"hub": hub, "queue": queue, "age": age, "dry_run": True, "count": None}
        ctx["error"] = _refuse(request, exc)
        return render(request, "purge.html", ctx, 422, s)
    return render(request, "purge.html", ctx, s=s)


@router.post("/hubs/{hub}/queues/{queue}/purge")
def purge_apply(
    request: Request,
    hub: str,
    queue: str,
    s: UISession,
    csrf: Annotated[str, Form()] = "",
    confirm: Annotated[str, Form()] = "",
    age: Annotated[str, Form(max_length=40)] = "",
    cutoff: Annotated[int | None, Form()] = None,
) -> Response:
    """Purge, once confirmed, what the dry run showed: the queue's messages JOURNALLED
    before its cutoff (and unchanged since)."""
    check_csrf(s, csrf)
    require_admin(s)
    svc = admin_state(request).service
    svc.hubs.queue(hub, queue)
    try:
        ctx = _purge_ctx(request, hub, queue, age, cutoff)
    except IQError as exc:
        ctx = {"hub": hub, "queue": queue, "age": age, "dry_run": True, "count": None}
        ctx["error"] = _refuse(request, exc)
        return render(request, "purge.html", ctx, 422, s)
    if confirm != "yes":
        ctx["error"] = "tick the confirmation box to purge these messages; nothing changed"
        return render(request, "purge.html", ctx, 422, s)
    count = svc.purge_listed(hub, queue, ctx["cutoff"], s.principal)
    ctx.update(dry_run=False, count=count, shown=[])
    ctx["notice"] = f"Purged {count} message(s)."
    return render(request, "purge.html", ctx, s=s)


# --- cross-queue recovery ----------------------------------------------------------------


def _choices(request: Request) -> tuple[list[dict[str, Any]], list[str]]:
    """The hubs that can be reached, each with its queues; the names of the others."""
    hubs: list[dict[str, Any]] = []
    unreachable: list[str] = []
    for h in admin_state(request).service.overview():
        if h.available:
            hubs.append({"name": h.name, "queues": h.queues})
        else:
            unreachable.append(h.name)
    return hubs, unreachable


def _endpoint(
    hubs: list[dict[str, Any]], hub: str, queue: str, side: str, label: str
) -> Endpoint | None:
    """A side of the recovery from the form: None for "none", else a configured hub's
    existing queue (InvalidArgument otherwise)."""
    if not hub and not queue:
        return None
    known = {h["name"]: h["queues"] for h in hubs}
    if not hub:
        raise InvalidArgument(f"choose the {side} hub of queue {queue!r}, or none")
    if hub not in known:
        raise InvalidArgument(f"no reachable hub {hub!r} for the {side} ({label})")
    if not queue:
        raise InvalidArgument(f"choose the {side} queue on hub {hub!r}, or none")
    if queue not in known[hub]:
        raise InvalidArgument(f"hub {hub!r} has no queue {queue!r}")
    return Endpoint(hub=hub, queue=queue)


def _recovery_request(
    hubs: list[dict[str, Any]], form: dict[str, str], dry_run: bool
) -> RecoveryRequest:
    source = _endpoint(hubs, form["source_hub"], form["source_queue"], "source", "the parents")
    target = _endpoint(hubs, form["target_hub"], form["target_queue"], "target", "the children")
    if source is None and target is None:
        raise InvalidArgument("choose the source (parents), the target (children) or both")
    via = form["via"].strip()
    if len(via) > 200:
        raise InvalidArgument("via may be at most 200 characters")
    return RecoveryRequest(source=source, target=target, via=via or None, dry_run=dry_run)


def _recovery_view(req: RecoveryRequest, out: RecoveryResultOut) -> dict[str, Any]:
    """The plan's rows and unresolved children, each with the hub/queue its msg_id is on
    (for the link to its message page)."""
    sides = {"source": req.source, "target": req.target}
    rows = []
    for r in out.rows:
        where = sides.get(r.side)
        rows.append({"row": r, "hub": where.hub if where else None})
    target = req.target
    unresolved = [
        {
            "msg_id": mid,
            "reason": why,
            "hub": target.hub if target else None,
            "queue": target.queue if target else None,
        }
        for mid, why in out.unresolved.items()
    ]
    return {"out": out, "rows": rows, "unresolved": unresolved}


def _recovery_render(
    request: Request,
    s: Session,
    form: dict[str, str],
    *,
    plan: bool,
    apply: bool = False,
    refusal: str | None = None,
) -> Response:
    hubs, unreachable = _choices(request)
    ctx: dict[str, Any] = {"form": form, "hubs": hubs, "unreachable": unreachable, "view": None}
    if not plan:
        return render(request, "recovery.html", ctx, s=s)
    svc = admin_state(request).service
    try:
        req = _recovery_request(hubs, form, dry_run=not apply)
        out = svc.recovery(req, s.principal)
    except IQError as exc:
        ctx["error"] = _refuse(request, exc)
        return render(request, "recovery.html", ctx, 422, s)
    ctx["view"] = _recovery_view(req, out)
    if refusal is not None:
        ctx["error"] = refusal
        return render(request, "recovery.html", ctx, 422, s)
    if apply:
        ctx["notice"] = f"Recovery {out.run} applied: {out.applied} move(s) made, " + (
            f"{out.already} already made."
        )
    return render(request, "recovery.html", ctx, s=s)


def _form(
    source_hub: str, source_queue: str, target_hub: str, target_queue: str, via: str
) -> dict[str, str]:
    return {
        "source_hub": source_hub.strip(),
        "source_queue": source_queue.strip(),
        "target_hub": target_hub.strip(),
        "target_queue": target_queue.strip(),
        "via": via,
    }


@router.get("/recovery")
def recovery_page(
    request: Request,
    s: UISession,
    source_hub: str = "",
    source_queue: str = "",
    target_hub: str = "",
    target_queue: str = "",
    via: str = "",
    plan: str = "",
) -> Response:
    """Cross-queue recovery: the form choosing the source and target queues (either may
    be none) and ``via``; with ``plan``, the dry run (every move, nothing changed) and
    the confirm form."""
    form = _form(source_hub, source_queue, target_hub, target_queue, via)
    return _recovery_render(request, s, form, plan=bool(plan))


@router.post("/recovery")
def recovery_apply(
    request: Request,
    s: UISession,
    csrf: Annotated[str, Form()] = "",
    confirm: Annotated[str, Form()] = "",
    source_hub: Annotated[str, Form(max_length=100)] = "",
    source_queue: Annotated[str, Form(max_length=200)] = "",
    target_hub: Annotated[str, Form(max_length=100)] = "",
    target_queue: Annotated[str, Form(max_length=200)] = "",
    via: Annotated[str, Form(max_length=200)] = "",
) -> Response:
    """Apply the recovery between the chosen queues once confirmed; without the box
    ticked, the plan again and nothing changed."""
    check_csrf(s, csrf)
    require_admin(s)
    form = _form(source_hub, source_queue, target_hub, target_queue, via)
    if confirm != "yes":
        why = "tick the confirmation box to apply this recovery; nothing changed"
        return _recovery_render(request, s, form, plan=True, refusal=why)
    return _recovery_render(request, s, form, plan=True, apply=True)
