"""The pytest plugin's hubs leave nothing behind on shared servers: after a test, its
Kafka topics and consumer groups (on the session's Tansu) and its IBM MQ queues (on the
fake queue manager) are gone, while another test's are untouched."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from iqbridge.adapters.ibmmq import IbmMqAdapter
from iqbridge.testing.fakes import ibmmq as fake_mq
from iqbridge.testing.plugin import open_hub
from iqbridge.testing.servers import Resolved
from tests.ibmmq_helpers import URL as MQ_URL
from tests.ibmmq_helpers import qm_fixture  # noqa: F401 (a fixture)
from tests.kafka_helpers import kafka_bootstrap


@pytest.mark.kafka
def test_kafka_topics_and_groups_are_deleted(tmp_path: Path) -> None:
    bootstrap = kafka_bootstrap()
    found = Resolved("kafka", f"kafka://{bootstrap}", "tansu")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    mine, mine_done = open_hub(found, tmp_path / "a")
    theirs, theirs_done = open_hub(found, tmp_path / "b")
    try:
        for hub in (mine, theirs):
            q = hub.queue("orders")
            q.subscribe("billing")
            q.put(b"x", to=["billing"])
            d = q.get("billing", timeout=20)
            assert d is not None
            d.done()
        mine_prefix = mine.adapter.prefix  # type: ignore[attr-defined]
        theirs_prefix = theirs.adapter.prefix  # type: ignore[attr-defined]
        admin = AdminClient({"bootstrap.servers": bootstrap})

        def names(prefix: str) -> tuple[list[str], list[str]]:
            topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
            listed = admin.list_consumer_groups(request_timeout=10).result(15)
            groups = [g.group_id for g in listed.valid if g.group_id.startswith(prefix)]
            return topics, groups

        topics, groups = names(mine_prefix)
        assert topics and groups, "the test made no topic or group to delete"
        mine_done()
        assert names(mine_prefix) == ([], [])
        assert names(theirs_prefix)[0], "another test's topics were deleted"
    finally:
        theirs_done()


def test_ibmmq_queues_are_deleted_with_their_messages(
    qm: fake_mq.FakeQueueManager, tmp_path: Path
) -> None:
    found = Resolved("ibmmq", MQ_URL, "env")
    mine, mine_done = open_hub(found, tmp_path / "a")
    theirs, theirs_done = open_hub(found, tmp_path / "b")
    try:
        for hub in (mine, theirs):
            q = hub.queue("orders")
            q.subscribe("billing")
            q.put(b"left on the queue", to=["billing"])
        adapter = mine.adapter
        assert isinstance(adapter, IbmMqAdapter)
        made = adapter.declared_queues()
        assert made and made <= set(qm.queues)
        mine_done()
        assert not made & set(qm.queues)
        other = theirs.adapter
        assert isinstance(other, IbmMqAdapter)
        assert other.declared_queues() <= set(qm.queues)
    finally:
        theirs_done()
