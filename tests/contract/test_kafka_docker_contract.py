"""The adapter contract against Apache Kafka itself, in a testcontainers container (KRaft,
one node), wherever a Docker engine answers; the module reports itself skipped, with the
reason, where none does (the build machines have none: there the same suite runs on Tansu,
``test_kafka_contract.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

import iqbridge
import tests.contract.test_kafka_contract as on_tansu
from tests.docker_helpers import docker_missing
from tests.kafka_helpers import FAST_GROUPS

pytestmark = [pytest.mark.kafka, pytest.mark.docker]

#: The Apache Kafka image (Confluent's build, KRaft mode).
IMAGE = "confluentinc/cp-kafka:7.6.0"


_WHY = docker_missing()
if _WHY is not None:
    pytest.skip(
        f"no Docker engine answers ({_WHY}); the Apache Kafka suite runs where one does",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def apache_kafka() -> Iterator[str]:
    """host:port of a single-node Apache Kafka (KRaft) for this module."""
    from testcontainers.community.kafka import KafkaContainer

    with KafkaContainer(IMAGE).with_kraft() as kafka:
        yield kafka.get_bootstrap_server()


class TestApacheKafka(on_tansu.TestKafkaAdapter):
    @pytest.fixture(autouse=True)
    def _broker(self, apache_kafka: str) -> None:
        self.bootstrap = apache_kafka

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        n = len(self.hubs)
        query = "&".join(f"{k}={v}" for k, v in {**FAST_GROUPS, "prefix": self.prefix}.items())
        hub = iqbridge.connect(
            f"kafka://{self.bootstrap}?{query}",
            index=f"sqlite:///{self.tmp / f'index{n}.db'}" if n == 0 else self.hubs[0].store,
            clock=clock,
        )
        self.hubs.append(hub)
        return hub
