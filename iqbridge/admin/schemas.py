"""The admin API's request and response bodies (pydantic models: they are its OpenAPI
schema)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ActionResult",
    "BridgeHealth",
    "Endpoint",
    "HubOut",
    "JournalOut",
    "LineageOut",
    "MessageOut",
    "NodeOut",
    "PayloadOut",
    "PurgeRequest",
    "PurgeResult",
    "QueueCountsOut",
    "ReasonRequest",
    "RecoveryRequest",
    "RecoveryResultOut",
    "RecoveryRowOut",
    "RedriveRequest",
    "RedriveResult",
    "RerevealRequest",
    "StepOut",
    "SubscriberOut",
    "SummaryOut",
]

_REASON = Field(default="", max_length=500, description="Why: journalled with the token name.")


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HubOut(BaseModel):
    """A configured hub: its redacted URL and queues (none when it is unavailable)."""

    name: str
    url: str
    available: bool
    queues: list[str]
    error: str | None = None


class QueueCountsOut(BaseModel):
    """Counts per publisher state and per subscriber per state; the put time and age in
    seconds of each subscriber's oldest message still to process."""

    queue: str
    messages: int
    publisher: dict[str, int]
    subscribers: dict[str, dict[str, int]]
    oldest_undone: dict[str, datetime]
    oldest_undone_age: dict[str, float]


class SummaryOut(BaseModel):
    """One search hit (index fields and current states, no payload)."""

    msg_id: str
    queue: str
    publisher: str
    correlation_id: str | None
    priority: int
    mode: str
    publisher_state: str | None
    created_at: datetime
    subscribers: dict[str, str | None]
    parents: list[str]
    outcomes: dict[str, str] = Field(
        default_factory=dict,
        description="For each JOURNALLED subscriber, the state it was journalled after: "
        "DONE, UNUSABLE or EXPIRED (a pool member that lost the race)",
    )


class StepOut(BaseModel):
    """One state with the time it was entered."""

    state: str
    at: datetime


class SubscriberOut(BaseModel):
    """One subscriber's view of a message."""

    subscriber: str
    pool: str | None
    state: str | None
    attempt: int
    reason: str | None
    lease_owner: str | None
    lease_until: datetime | None
    history: list[StepOut]
    outcome: str | None = Field(
        default=None,
        description="When JOURNALLED, the state it was journalled after: DONE, UNUSABLE "
        "or EXPIRED (a pool member that lost the race); else null",
    )


class JournalOut(BaseModel):
    """One journalled transition."""

    actor: str
    actor_kind: str
    src: str | None
    dst: str
    at: datetime
    attempt: int
    detail: str | None


class PayloadOut(BaseModel):
    """The stored payload, shown as text (truncated), or why it cannot be shown."""

    content_type: str | None = None
    size: int | None = None
    text: str | None = None
    truncated: bool = False
    note: str | None = None


class MessageOut(BaseModel):
    """A message's timeline: publisher and every subscriber with states and times."""

    hub: str
    msg_id: str
    queue: str
    publisher: str
    mode: str
    correlation_id: str | None
    priority: int
    parents: list[str]
    publisher_state: str | None
    publisher_history: list[StepOut]
    subscribers: list[SubscriberOut]
    journal: list[JournalOut]
    payload: PayloadOut


class NodeOut(BaseModel):
    """One message of a lineage, on whichever configured hub holds it."""

    msg_id: str
    hub: str
    queue: str
    publisher_state: str
    subscribers: dict[str, str]
    parents: list[str]
    found: bool = True


class LineageOut(BaseModel):
    """A message, its ancestors (parents, their parents...) and its descendants, across
    every configured hub."""

    msg_id: str
    node: NodeOut
    ancestors: list[NodeOut]
    descendants: list[NodeOut]


class ReasonRequest(_In):
    """An action's reason."""

    reason: str = _REASON


class RerevealRequest(_In):
    """Re-reveal a message to one subscriber."""

    subscriber: str = Field(min_length=1, max_length=200)
    reason: str = _REASON


class ActionResult(BaseModel):
    """What an action did: the message's states after it."""

    action: str
    msg_id: str
    by: str
    detail: str
    publisher_state: str | None
    subscribers: dict[str, str | None]


class RedriveRequest(_In):
    """Re-reveal a subscriber's UNUSABLE messages to that subscriber alone."""

    subscriber: str = Field(min_length=1, max_length=200)
    dry_run: bool = True
    reason: str = _REASON
    limit: int = Field(default=1000, ge=1, le=10000)


class RedriveResult(BaseModel):
    """The UNUSABLE messages found; with dry_run false, those moved and those not."""

    subscriber: str
    dry_run: bool
    candidates: list[str]
    moved: list[str]
    failed: dict[str, str]


class PurgeRequest(_In):
    """Purge messages JOURNALLED longer than ``older_than`` seconds."""

    older_than: float = Field(ge=0, le=100 * 365 * 86400, description="seconds")
    dry_run: bool = True


class PurgeResult(BaseModel):
    """How many would go (dry run) or went."""

    dry_run: bool
    older_than: float
    count: int


class Endpoint(_In):
    """A configured hub and one of its queues."""

    hub: str = Field(min_length=1, max_length=100)
    queue: str = Field(min_length=1, max_length=200)


class RecoveryRequest(_In):
    """Cross-queue recovery between a source (parents) and a target (children)."""

    source: Endpoint | None = None
    target: Endpoint | None = None
    via: str | None = Field(default=None, min_length=1, max_length=200)
    dry_run: bool = True


class RecoveryRowOut(BaseModel):
    """One move of a recovery plan."""

    step: int
    action: str
    side: str
    queue: str
    msg_id: str
    subscriber: str | None
    state: str
    reason: str


class RecoveryResultOut(BaseModel):
    """The plan (dry run) and, when applied, what moved."""

    dry_run: bool
    run: str
    summary: str
    rows: list[RecoveryRowOut]
    unresolved: dict[str, str]
    applied: int = 0
    already: int = 0


class BridgeHealth(BaseModel):
    """A configured bridge daemon's health."""

    name: str
    alive: bool
    reason: str
