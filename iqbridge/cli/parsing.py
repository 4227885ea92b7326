"""Turning command-line text into API values: durations, priorities, states, times, pools.

Every parser raises :class:`typer.BadParameter` (a usage error, exit code 2) with a
message that says what is accepted.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from pathlib import Path

import typer

from iqbridge.durations import seconds
from iqbridge.errors import InvalidArgument
from iqbridge.model import Pool
from iqbridge.states import PublisherState, SubscriberState

__all__ = [
    "STATE_NAMES",
    "parse_duration",
    "parse_header",
    "parse_optional_duration",
    "parse_pool",
    "parse_priority",
    "parse_state",
    "parse_time",
    "read_payload",
]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d|w)?\s*$", re.IGNORECASE)

#: Every state name ``--state`` accepts, publisher's first.
STATE_NAMES: tuple[str, ...] = tuple(
    dict.fromkeys([*(s.value for s in PublisherState), *(s.value for s in SubscriberState)])
)


def parse_duration(text: str, option: str, *, positive: bool = False) -> float:
    """Seconds in ``30s``, ``15m``, ``12h``, ``7d``, ``2w``, ``500ms`` or a bare number,
    checked as the Python API checks durations (:func:`iqbridge.durations.seconds`):
    ``positive`` refuses zero too."""
    match = _DURATION.match(text)
    if match is None:
        raise typer.BadParameter(
            f"{text!r} is not a duration; write e.g. 30s, 15m, 12h, 7d or a number of seconds",
            param_hint=option,
        )
    value = float(match.group(1)) * _UNITS[(match.group(2) or "s").lower()]
    try:
        return seconds(value, option, positive=positive)
    except InvalidArgument as exc:  # "--lease must be ..." reads "must be ..." after the hint
        raise typer.BadParameter(str(exc).removeprefix(f"{option} "), param_hint=option) from None


def parse_optional_duration(
    text: str | None, option: str, *, positive: bool = False
) -> float | None:
    """:func:`parse_duration`, with no option given passed through as None."""
    return None if text is None else parse_duration(text, option, positive=positive)


def parse_priority(text: str) -> int | tuple[int, int]:
    """``N`` or ``N-M`` with 0 <= N <= M <= 9."""
    parts = text.split("-")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if (
        len(values) not in (1, 2)
        or not all(0 <= v <= 9 for v in values)
        or values != sorted(values)
    ):
        raise typer.BadParameter(
            f"{text!r} is not a priority; write N or N-M with 0 <= N <= M <= 9",
            param_hint="--priority",
        )
    return values[0] if len(values) == 1 else (values[0], values[1])


def parse_state(text: str, *, subscriber: bool = False) -> PublisherState | SubscriberState:
    """A publisher or subscriber state by name, case-insensitive (``in-process`` works too).

    JOURNALLED names both a publisher and a subscriber state: it means the subscriber's
    when a subscriber is given (or with a ``sub:`` prefix), else the publisher's
    (``pub:`` forces that).
    """
    raw = text.strip()
    prefix, sep, rest = raw.partition(":")
    side = prefix.lower() if sep else ""
    name = (rest if sep else raw).strip().upper().replace("-", "_").replace(" ", "_")
    if side not in ("", "pub", "sub"):
        name = ""
    pub = PublisherState.__members__.get(name)
    sub = SubscriberState.__members__.get(name)
    if side == "pub" and pub is not None:
        return pub
    if side == "sub" and sub is not None:
        return sub
    if side == "" and (pub is not None or sub is not None):
        if pub is not None and sub is not None:
            return sub if subscriber else pub
        found = pub or sub
        assert found is not None
        return found
    raise typer.BadParameter(
        f"unknown state {text!r}; valid states: {', '.join(STATE_NAMES)} "
        f"(prefix pub: or sub: to choose JOURNALLED's side)",
        param_hint="--state",
    )


def parse_time(text: str, option: str) -> datetime:
    """An ISO 8601 date or date-time; without an offset it is local time."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not an ISO 8601 time; write e.g. 2025-01-31 or 2025-01-31T12:00:00",
            param_hint=option,
        ) from None
    return value if value.tzinfo is not None else value.astimezone()


def parse_header(text: str) -> tuple[str, str]:
    """``KEY=VALUE``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise typer.BadParameter(f"{text!r} is not KEY=VALUE", param_hint="--header")
    return key.strip(), value


def parse_pool(text: str) -> Pool:
    """``NAME=a,b,c`` (a pool with its members) or ``NAME`` (a declared pool)."""
    name, sep, members = text.partition("=")
    names = [m.strip() for m in members.split(",") if m.strip()] if sep else []
    if not name.strip() or (sep and not names):
        raise typer.BadParameter(
            f"{text!r} is not a pool; write NAME=member1,member2 (or NAME for a declared pool)",
            param_hint="--pool",
        )
    return Pool(name.strip(), names)


def read_payload(text: str | None, file: str | None, as_json: bool) -> object:
    """The payload of ``iq put``: the argument or a file (``-`` for stdin).

    Text by default (bytes if a file is not UTF-8); with ``as_json`` the text is parsed
    as JSON.
    """
    if (text is None) == (file is None):
        raise typer.BadParameter(
            "give the payload as an argument or with --file PATH (--file - reads stdin), "
            "not both or neither",
            param_hint="PAYLOAD",
        )
    if file is not None:
        try:
            raw = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
        except OSError as exc:
            raise typer.BadParameter(
                f"cannot read {file}: {exc.strerror or exc}", param_hint="--file"
            ) from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            if as_json:
                raise typer.BadParameter(
                    f"{file} is not UTF-8 text, so it cannot be JSON", param_hint="--json"
                ) from None
            return raw
    assert text is not None
    if not as_json:
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(
            f"payload is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            param_hint="--json",
        ) from None
