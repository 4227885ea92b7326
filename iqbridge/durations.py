"""The one check of every duration an API call or command takes: lease, ttl, timeout,
lock_for, delays, poll, until_idle, duration.

A duration is seconds, as a number or a :class:`~datetime.timedelta`, finite, not
negative (more than zero where zero means nothing useful, such as a lease) and at most
:data:`MAX_SECONDS` (a hundred years: whatever waits, sleeps or stores it as microseconds
can). Anything else is :class:`~iqbridge.errors.InvalidArgument` (also a ``ValueError``)
naming the parameter and the value, raised before anything is changed. ``None`` is not
a duration: parameters where it means "no limit" or "the default" take it through
:func:`to_seconds`.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import overload

from iqbridge.errors import InvalidArgument

__all__ = ["MAX_SECONDS", "seconds", "to_seconds"]

#: The longest duration accepted anywhere: a hundred years, in seconds.
MAX_SECONDS = 100 * 365.25 * 86_400


def seconds(value: object, name: str, *, positive: bool = False) -> float:
    """``value`` (a number of seconds or a timedelta) as float seconds, checked; see the
    module documentation. ``positive`` refuses zero too."""
    if isinstance(value, timedelta):
        secs = value.total_seconds()
    elif isinstance(value, bool | str | bytes) or value is None:
        raise InvalidArgument(f"{name} must be a number of seconds or a timedelta, got {value!r}")
    else:
        try:
            secs = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            raise InvalidArgument(
                f"{name} must be a number of seconds or a timedelta, got {value!r}"
            ) from None
    if math.isnan(secs):
        raise InvalidArgument(f"{name} must be a number of seconds (e.g. 30 or 0.5), got nan")
    if secs < 0 or (positive and secs == 0):
        limit = "more than 0" if positive else "0 or more"
        raise InvalidArgument(f"{name} must be {limit} seconds, got {_show(value, secs)}")
    if secs > MAX_SECONDS:
        raise InvalidArgument(
            f"{name} must be at most {MAX_SECONDS:.0f} seconds (100 years), got "
            f"{_show(value, secs)}"
        )
    return secs


@overload
def to_seconds(value: None, name: str, *, positive: bool = False) -> None: ...
@overload
def to_seconds(value: float | timedelta, name: str, *, positive: bool = False) -> float: ...
@overload
def to_seconds(
    value: float | timedelta | None, name: str, *, positive: bool = False
) -> float | None: ...
def to_seconds(
    value: float | timedelta | None, name: str, *, positive: bool = False
) -> float | None:
    """:func:`seconds`, with ``None`` passed through (no limit, or the default)."""
    return None if value is None else seconds(value, name, positive=positive)


def _show(value: object, secs: float) -> str:
    return repr(value) if isinstance(value, timedelta) else f"{secs:g}"
