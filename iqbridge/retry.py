"""What happens when processing a delivery raises.

A :class:`RetryPolicy` decides, per exception and attempt, between giving the message
back for another attempt after a delay (AVAILABLE, attempt + 1) and declaring it
UNUSABLE with the exception as the reason. The number of attempts a message gets is
fixed when it is put (``max_attempts``), so every consumer and the lease sweeper agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from iqbridge.durations import seconds
from iqbridge.errors import InvalidArgument, PayloadError

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
            raise InvalidArgument(f"max_attempts must be at least 1, got {self.max_attempts}")
        seconds(self.initial_delay, "initial_delay")
        seconds(self.max_delay, "max_delay")
        m = self.multiplier
        if not (isinstance(m, int | float) and math.isfinite(m) and m >= 1):
            raise InvalidArgument(f"multiplier must be a finite number >= 1, got {m!r}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1``."""
        steps = max(attempt - 1, 0)
        try:
            grown = self.initial_delay * self.multiplier**steps
        except OverflowError:  # thousands of attempts: far past max_delay anyway
            return self.max_delay
        return min(self.max_delay, grown)

    def gives_up(self, exc: BaseException, attempt: int, max_attempts: int) -> bool:
        """True if this failure makes the message UNUSABLE rather than retried."""
        return isinstance(exc, self.permanent) or attempt >= max_attempts
