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


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local[2] Spark session for every analytics test (a JVM start costs seconds)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    try:
        import pyspark  # noqa: F401
    except ImportError:
        need_server("PySpark", False, "pip install 'iqbridge[spark]'")
    from iqbridge.analytics.session import AnalyticsError, spark_session

    try:
        session = spark_session("local[2]", app_name="iqbridge-tests")
    except AnalyticsError as exc:
        need_server("Spark (Java 17+)", False, str(exc))
        raise
    yield session
    session.stop()


#: Modules that must not share the machine with other tests: they kill processes on a
#: schedule sized to this 2-core machine, time leases, or restart the shared RabbitMQ.
#: ``scripts/test`` runs everything else on two workers first, then these alone.
SERIAL_MODULES = frozenset(
    {
        "test_batch_kill.py",
        "test_bridge_kill.py",
        "test_crash_recovery.py",
        "test_kafka_kill.py",
        "test_multiprocess_pool.py",
        "test_outbox_relay_kill.py",
        "test_rabbitmq_faults.py",
        "test_rabbitmq_kill.py",
        "test_sql_exactly_once.py",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of :data:`SERIAL_MODULES` ``serial``."""
    del config
    for item in items:
        if item.path.name in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)
