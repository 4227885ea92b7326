"""What happens when processing a delivery raises.

A :class:`RetryPolicy` decides, per exception and attempt, between giving the message
back for another attempt after a delay (AVAILABLE, attempt + 1) and declaring it
UNUSABLE with the exception as the reason. The number of attempts a message gets is
fixed when it is put (``max_attempts``), so every consumer and the lease sweeper agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from iqbridge.errors import PayloadError

__all__ = ["RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff between attempts; some exceptions are never retried.

    ``max_attempts`` is stamped on messages put through a queue with this policy.
    """

    max_attempts: int = 5
    initial_delay: float = 0.5
    multiplier: float = 2.0
    max_delay: float = 60.0
    #: Exceptions that make a message UNUSABLE at once: retrying cannot help.
    permanent: tuple[type[BaseException], ...] = field(default=(PayloadError,))

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.initial_delay < 0 or self.multiplier < 1 or self.max_delay < 0:
            raise ValueError("delays must be >= 0 and multiplier >= 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1``."""
        return min(self.max_delay, self.initial_delay * self.multiplier ** max(attempt - 1, 0))

    def gives_up(self, exc: BaseException, attempt: int, max_attempts: int) -> bool:
        """True if this failure makes the message UNUSABLE rather than retried."""
        return isinstance(exc, self.permanent) or attempt >= max_attempts
