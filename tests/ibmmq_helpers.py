"""Shared by the IBM MQ tests: the fake ``ibmmq`` client in ``sys.modules`` with one
queue manager QM1 at localhost:1414, whose user ``app`` may administer it, and a plain
MQ application's connection to it."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from iqbridge.testing.fakes import ibmmq as fake_mq

PASSWORD = "passw0rd"
URL = f"ibmmq://app:{PASSWORD}@localhost:1414/QM1?channel=DEV.APP.SVRCONN&create=true"


@pytest.fixture(name="qm")
def qm_fixture(monkeypatch: pytest.MonkeyPatch) -> Iterator[fake_mq.FakeQueueManager]:
    """A fresh fake queue manager QM1, the fake installed as the ``ibmmq`` module."""
    fake_mq.reset()
    monkeypatch.setitem(sys.modules, "ibmmq", fake_mq)
    qmgr = fake_mq.queue_manager("QM1", "localhost", 1414)
    qmgr.users = {"app": PASSWORD}
    qmgr.admins = {"app"}
    yield qmgr
    fake_mq.reset()


def mq_client() -> fake_mq.QueueManager:
    """A plain MQ application's connection (the client's own ``connect``)."""
    return fake_mq.connect("QM1", "DEV.APP.SVRCONN", "localhost(1414)", "app", PASSWORD)
