"""Shared fixtures. Broker tests skip with the reason when their server is unreachable,
and fail instead when CI=true (a skipped suite is never a passing one in CI)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import iqbridge

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need_server(what: str, reachable: bool, why: str = "") -> None:
    """Skip (locally) or fail (in CI) when a server a test needs cannot be reached."""
    if reachable:
        return
    text = f"{what} is not reachable{': ' + why if why else ''}"
    if IN_CI:
        pytest.fail(f"{text} (CI=true: broker tests may not be skipped)")
    pytest.skip(text)


class FakeClock:
    """A settable clock (seconds since the epoch) for lease and TTL tests."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'iq.db'}"


@pytest.fixture
def hub(sqlite_url: str) -> Iterator[iqbridge.Hub]:
    with iqbridge.connect(sqlite_url) as h:
        yield h
