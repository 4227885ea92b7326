"""Shared by the Oracle AQ tests: the fake python-oracledb, put where the adapter's lazy
import finds it (``sys.modules["oracledb"]``), with one database listening at
``oracle.test:1521/FREEPDB1`` and a user ``iq``."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from iqbridge.testing.fakes import oracledb as fake_oracledb

PASSWORD = "s3cret-Pa55"
URL = f"oracle+aq://iq:{PASSWORD}@oracle.test:1521/FREEPDB1"


@pytest.fixture(name="fake_oracle")
def fake_oracle_fixture(monkeypatch: pytest.MonkeyPatch) -> Iterator[fake_oracledb.Database]:
    """A fresh fake database in place of python-oracledb for one test."""
    monkeypatch.setitem(sys.modules, "oracledb", fake_oracledb)
    db = fake_oracledb.reset()
    db.listen("oracle.test", 1521, "FREEPDB1")
    db.add_user("iq", PASSWORD)
    yield db
    fake_oracledb.reset()


#: The database the fake's own unit tests talk to, as user ``app``.
FAKE_DSN = "db.test:1521/FREEPDB1"


@pytest.fixture(name="db")
def fake_db_fixture() -> Iterator[fake_oracledb.Database]:
    """A fresh fake database at :data:`FAKE_DSN` with a user ``app`` (password ``pw``)."""
    d = fake_oracledb.reset()
    d.listen("db.test", 1521, "FREEPDB1")
    d.add_user("app", "pw")
    yield d
    fake_oracledb.reset()


def fake_connect() -> fake_oracledb.Connection:
    """A session of user ``app`` on :data:`FAKE_DSN`."""
    return fake_oracledb.connect(user="app", password="pw", dsn=FAKE_DSN)
