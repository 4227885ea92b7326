"""The moves a held delivery can make, as values: what settling applies, one at a time or
for a whole batch, and what the retry policy decides after a failure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from iqbridge.retry import RetryPolicy

__all__ = ["DONE", "PROCESS", "Move", "after_failure"]

_REASON_MAX = 1000


@dataclass(frozen=True, slots=True)
class Move:
    """One move of a held delivery: ``kind`` is process, done, unusable, release or renew."""

    kind: str
    reason: str = ""
    delay: float = 0.0
    lease: float | None = None


DONE = Move("done")
PROCESS = Move("process")


def after_failure(policy: RetryPolicy, exc: BaseException, attempt: int, max_attempts: int) -> Move:
    """What processing that raised ``exc`` on ``attempt`` leads to: given back after the
    policy's backoff delay, or UNUSABLE once the policy gives up; the reason names the
    exception."""
    reason = f"{type(exc).__name__}: {_text(exc)}"[:_REASON_MAX]
    if policy.gives_up(exc, attempt, max_attempts):
        return Move("unusable", reason=reason)
    return Move("release", reason=reason, delay=policy.delay(attempt))


def _text(exc: BaseException) -> str:
    """The exception's message; one whose ``__str__`` fails is named without it, so the
    delivery is still given back (or made UNUSABLE) at once, not left to its lease."""
    try:
        return str(exc)
    except Exception:
        return "(its message could not be read)"
