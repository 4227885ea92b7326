"""The adapter contract against a real IBM MQ queue manager, IBM's developer image in a
testcontainers container, wherever a Docker engine answers and IBM's client (``ibmmq``,
with the MQ C client) imports; the module reports itself skipped, with the reason,
elsewhere (the build machines have neither: there the same suite runs on the fake of the
client, ``test_ibmmq_contract.py``).

Run it with ``pytest -m "ibmmq and docker"``. The queue manager is QM1; the suite connects
as its ``admin`` user over DEV.ADMIN.SVRCONN with ``create=true``, so the adapter creates
each test's queues with PCF (every test uses queue names of its own).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import iqbridge
import tests.contract.test_ibmmq_contract as on_fake
from iqbridge.adapters.ibmmq import IbmMqAdapter
from tests.docker_helpers import docker_missing

pytestmark = [pytest.mark.ibmmq, pytest.mark.docker]

#: IBM MQ Advanced for Developers.
IMAGE = "icr.io/ibm-messaging/mq:latest"
PASSWORD = "passw0rd"


def _client_missing() -> str | None:
    """Why IBM's client cannot be imported here, or None when it can."""
    try:
        importlib.import_module("ibmmq")
    except ImportError as exc:  # the package, or the MQ C client under it
        return f"{type(exc).__name__}: {exc}"
    return None


_WHY = docker_missing()
if _WHY is not None:
    pytest.skip(
        f"no Docker engine answers ({_WHY}); the live IBM MQ suite runs where one does",
        allow_module_level=True,
    )
_WHY = _client_missing()
if _WHY is not None:
    pytest.skip(
        f"IBM's MQ client does not import ({_WHY}): pip install 'iqbridge[ibmmq]' and the "
        f"IBM MQ redistributable client",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def queue_manager() -> Iterator[str]:
    """host:port of QM1 in IBM's developer image, for this module."""
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    container = (
        DockerContainer(IMAGE)
        .with_env("LICENSE", "accept")
        .with_env("MQ_QMGR_NAME", "QM1")
        .with_env("MQ_APP_PASSWORD", PASSWORD)
        .with_env("MQ_ADMIN_PASSWORD", PASSWORD)
        .with_exposed_ports(1414)
    )
    with container:
        # AMQ5026I: the listener has started; then the queue manager takes clients.
        wait_for_logs(container, "AMQ5026I", timeout=300)
        deadline = time.monotonic() + 120
        while container.exec("chkmqready").exit_code != 0:  # the image's readiness probe
            if time.monotonic() > deadline:
                pytest.fail("IBM MQ's chkmqready did not succeed within 2 minutes")
            time.sleep(1)
        yield f"{container.get_container_host_ip()}:{container.get_exposed_port(1414)}"


class TestIbmMqLive(on_fake.TestIbmMqAdapter):
    @pytest.fixture(autouse=True)
    def _broker(self, queue_manager: str, tmp_path: Path) -> None:  # type: ignore[override]
        self.address = queue_manager
        self.tmp = tmp_path
        self.hubs: list[iqbridge.Hub] = []

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        n = len(self.hubs)
        hub = iqbridge.connect(
            f"ibmmq://admin:{PASSWORD}@{self.address}/QM1?channel=DEV.ADMIN.SVRCONN&create=true",
            index=f"sqlite:///{self.tmp / 'index.db'}" if n == 0 else self.hubs[0].store,
            clock=clock,
        )
        assert isinstance(hub.adapter, IbmMqAdapter)
        self.hubs.append(hub)
        return hub
