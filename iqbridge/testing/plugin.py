"""iqbridge's pytest plugin: test your handlers against every broker with one fixture.

Installed with iqbridge (the ``pytest11`` entry point ``iqbridge``); the broker clients
and testcontainers come with ``pip install 'iqbridge[testing]'``. See docs/testing.md.

Fixtures (all named ``iq_...``):

* ``iq_hub(broker, *, clock=None, publisher=None)``: a connected :class:`iqbridge.Hub`
  on ``sqlite``, ``memory``, ``redis``, ``rabbitmq``, ``kafka``, ``postgres``,
  ``mariadb`` (an embedded SQLite broker with that SQL index store), ``ibmmq`` or
  ``oracle``, with names of its own per test, closed and cleaned up afterwards.
* ``iq_broker``: a test that asks for it runs once per broker (``--iq-broker`` narrows
  the list); pass it to ``iq_hub``.
* ``iq_memory_hub``: an in-memory hub; ``iq_fake_clock``: a settable clock
  (:class:`iqbridge.testing.FakeClock`); ``iq_servers``: where each broker was found.

Markers ``iq_redis``, ``iq_rabbitmq``, ``iq_kafka``, ``iq_postgres``, ``iq_mariadb``,
``iq_ibmmq`` and ``iq_oracle`` mark tests that need that broker; ``iq_broker``'s
parameters carry them, so ``-m "not iq_kafka"`` works.

This module imports nothing heavy at load: it is loaded in every pytest run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from iqbridge.testing import FakeClock
from iqbridge.testing.servers import (
    ALL_BROKERS,
    DEFAULT_BROKERS,
    EMBEDDED,
    ENV_VARS,
    KAFKA_FAST_GROUPS,
    Resolved,
    Servers,
    drop_rabbitmq,
    drop_schema,
    need_server,
    unique,
    with_options,
)

if TYPE_CHECKING:
    from iqbridge.hub import Hub

__all__ = ["HubFactory", "need_server", "open_hub"]

#: The markers the plugin registers, one per broker that needs a server.
MARKERS = {
    f"iq_{name}": f"needs {name} (iqbridge's iq_hub fixture finds or starts it)"
    for name in ("redis", "rabbitmq", "kafka", "postgres", "mariadb", "ibmmq", "oracle")
}


class HubFactory(Protocol):
    """The type of the ``iq_hub`` fixture."""

    def __call__(
        self,
        broker: str,
        *,
        clock: Callable[[], float] | None = None,
        publisher: str | None = None,
    ) -> Hub:
        """A connected hub on ``broker``, with names no other test uses."""
        ...


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--iq-broker NAME``: the brokers ``iq_broker`` runs on (repeat or comma-separate)."""
    group = parser.getgroup("iqbridge")
    group.addoption(
        "--iq-broker",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run iq_broker tests on these brokers only ({', '.join(ALL_BROKERS)}); "
        "repeat or comma-separate",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``iq_*`` markers."""
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def selected_brokers(config: pytest.Config) -> list[str]:
    """The brokers ``iq_broker`` runs on: ``--iq-broker``'s, else the default seven plus
    IBM MQ and Oracle when their environment URL is set."""
    chosen = [n.strip() for arg in config.getoption("iq_broker") for n in arg.split(",")]
    chosen = [n for n in chosen if n]
    for name in chosen:
        if name not in ALL_BROKERS:
            raise pytest.UsageError(
                f"--iq-broker {name}: unknown broker (one of {', '.join(ALL_BROKERS)})"
            )
    if chosen:
        return list(dict.fromkeys(chosen))
    extra = [n for n in ("ibmmq", "oracle") if os.environ.get(ENV_VARS[n])]
    return [*DEFAULT_BROKERS, *extra]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run a test that asks for ``iq_broker`` once per selected broker, marked with it."""
    if "iq_broker" not in metafunc.fixturenames:
        return
    params = [
        pytest.param(
            name, id=name, marks=() if name in EMBEDDED else getattr(pytest.mark, f"iq_{name}")
        )
        for name in selected_brokers(metafunc.config)
    ]
    metafunc.parametrize("iq_broker", params)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--iq-broker``, deselect tests marked for another broker."""
    if not config.getoption("iq_broker"):
        return
    keep = set(selected_brokers(config))
    chosen: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        marked = {m.name[3:] for m in item.iter_markers() if m.name in MARKERS}
        (dropped if marked and not marked & keep else chosen).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = chosen


@pytest.fixture(scope="session")
def iq_servers() -> Iterator[Servers]:
    """The session's brokers: ``iq_servers.resolve("redis")`` says where Redis was found
    (``env``, ``compose``, ``container``, ``tansu``) or why not; containers and Tansu
    started for the session stop at its end."""
    servers = Servers()
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture
def iq_fake_clock() -> FakeClock:
    """A settable clock for ``iqbridge.connect(clock=...)``: ``iq_fake_clock.advance(30)``
    moves leases, time limits and retry delays without sleeping."""
    return FakeClock()


@pytest.fixture
def iq_memory_hub() -> Iterator[Hub]:
    """A private in-memory broker and index, closed after the test."""
    import iqbridge

    with iqbridge.connect("memory://") as hub:
        yield hub


@pytest.fixture
def iq_broker(request: pytest.FixtureRequest) -> str:
    """The broker name of this run of the test (see ``--iq-broker``)."""
    return str(request.param)


@pytest.fixture
def iq_hub(iq_servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubFactory]:
    """``iq_hub(broker, *, clock=None, publisher=None)``: a connected hub on that broker,
    with queue, stream and topic names of its own; closed and cleaned up after the test.
    An unreachable broker skips the test, or fails it under ``CI=true``."""
    cleanups: list[Callable[[], None]] = []

    def make(
        broker: str,
        *,
        clock: Callable[[], float] | None = None,
        publisher: str | None = None,
    ) -> Hub:
        found = iq_servers.resolve(broker)
        if found.how == "no-docker":
            pytest.skip(f"{_describe(found)}: {found.why}; it runs where Docker does")
        need_server(_describe(found), found.url is not None, found.why)
        tmp = tmp_path_factory.mktemp(f"iq-{broker}")
        hub, cleanup = open_hub(found, tmp, clock=clock, publisher=publisher)
        cleanups.append(cleanup)
        return hub

    try:
        yield make
    finally:
        errors: list[BaseException] = []
        for cleanup in reversed(cleanups):
            try:
                cleanup()
            except Exception as exc:  # every hub is closed even if one clean-up fails
                errors.append(exc)
        if errors:
            raise errors[0]


def _describe(found: Resolved) -> str:
    var = ENV_VARS.get(found.broker)
    return f"{found.broker} (set {var}, IQ_TEST_COMPOSE=1 or run Docker)" if var else found.broker


def open_hub(
    found: Resolved,
    tmp: Path,
    *,
    clock: Callable[[], float] | None = None,
    publisher: str | None = None,
) -> tuple[Hub, Callable[[], None]]:
    """Open a hub on a resolved broker with names of its own; return it and a clean-up
    that closes it and deletes what it created: Redis keys and streams, RabbitMQ queues
    and exchanges, Kafka topics and consumer groups, SQL schemas, IBM MQ queues."""
    import iqbridge

    broker, url = found.broker, found.url
    assert url is not None
    sqlite_index = f"sqlite:///{tmp / 'index.db'}"
    drop: Callable[[], None] = lambda: None  # noqa: E731
    kw: dict[str, Any] = {"clock": clock, "publisher": publisher}
    if broker == "sqlite":
        hub = iqbridge.connect(f"sqlite:///{tmp / 'iq.db'}", **kw)
    elif broker == "memory":
        hub = iqbridge.connect("memory://", **kw)
    elif broker == "redis":
        prefix = unique("iqp")
        hub = iqbridge.connect(with_options(url, prefix=prefix, stream_prefix=f"{prefix}:"), **kw)
        drop = lambda: _drop_redis(url, prefix)  # noqa: E731
    elif broker == "rabbitmq":
        prefix = f"{unique('iqp')}-"
        hub = iqbridge.connect(with_options(url, prefix=prefix), index=sqlite_index, **kw)
        drop = lambda: _drop_rabbitmq(url, hub.adapter)  # noqa: E731
    elif broker == "kafka":
        bootstrap = url.split("://", 1)[-1]
        prefix = f"{unique('iqp')}-"
        kafka = with_options(f"kafka://{bootstrap}", **KAFKA_FAST_GROUPS, prefix=prefix)
        hub = iqbridge.connect(kafka, index=sqlite_index, **kw)
        drop = lambda: _drop_kafka(bootstrap, prefix)  # noqa: E731
    elif broker in ("postgres", "mariadb"):
        schema = unique("iqp")
        index = with_options(url, schema=schema)
        hub = iqbridge.connect(f"sqlite:///{tmp / 'iq.db'}", index=index, **kw)
        drop = lambda: drop_schema(url, schema)  # noqa: E731
    elif broker == "oracle":
        prefix = f"T{unique('')[1:7].upper()}_"
        hub = iqbridge.connect(with_options(url, prefix=prefix), index="memory://", **kw)
    else:  # ibmmq: queues of the test's own (create=true makes them), deleted after
        prefix = f"IQP.{unique('')[1:9].upper()}."
        hub = iqbridge.connect(with_options(url, prefix=prefix), index="memory://", **kw)
        drop = lambda: _drop_ibmmq(hub.adapter)  # noqa: E731

    def cleanup() -> None:
        try:
            hub.close()
        finally:
            drop()

    return hub, cleanup


def _drop_redis(url: str, prefix: str) -> None:
    """Delete the index keys (``{iq:<prefix>}:*``) and streams (``<prefix>:*``) of a test."""
    import redis

    client = redis.Redis.from_url(url.split("?", 1)[0])
    try:
        for pattern in (f"{{iq:{prefix}}}:*", f"{prefix}:*"):
            keys = list(client.scan_iter(match=pattern, count=1000))
            for i in range(0, len(keys), 500):
                client.delete(*keys[i : i + 500])
    finally:
        client.close()


def _drop_rabbitmq(url: str, adapter: Any) -> None:
    """Delete the exchanges and queues the RabbitMQ adapter declared for a test."""
    drop_rabbitmq(url, adapter.declared_names())


def _drop_kafka(bootstrap: str, prefix: str) -> None:
    """Delete a test's topics and consumer groups (names starting with ``prefix``)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    for future in (admin.delete_topics(topics, operation_timeout=10) if topics else {}).values():
        future.result(15)
    listed = admin.list_consumer_groups(request_timeout=10).result(15)
    groups = [g.group_id for g in listed.valid if g.group_id.startswith(prefix)]
    for future in (
        admin.delete_consumer_groups(groups, request_timeout=10) if groups else {}
    ).values():
        future.result(15)


def _drop_ibmmq(adapter: Any) -> None:
    """Delete the queues the IBM MQ adapter made for a test (PCF, with their messages)."""
    names = sorted(adapter.declared_queues())
    if names:
        adapter.delete_queues(names)
