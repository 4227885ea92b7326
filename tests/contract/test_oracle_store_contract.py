"""The index store contract with the SQL store on Oracle, through SQLAlchemy's real
Oracle dialect (``oracle+oracledb``) against the fake python-oracledb, whose database
holds SQL tables (on SQLite, after rewriting) beside its AQ queues: the same database
and transaction as the AQ dequeues, as exactly-once needs
(:mod:`iqbridge.testing.fakes.oracledb_sql`)."""

from __future__ import annotations

import pytest

from iqbridge.stores.sql import SqlStore
from iqbridge.testing.fakes import oracledb as fake_oracledb
from iqbridge.testing.store_contract import IndexStoreContract
from tests.oracle_helpers import PASSWORD, URL, fake_oracle_fixture  # noqa: F401

pytestmark = pytest.mark.oracle

INDEX_URL = f"oracle+oracledb://iq:{PASSWORD}@oracle.test:1521/?service_name=FREEPDB1"


class TestOracleStoreOnFake(IndexStoreContract):
    @pytest.fixture(autouse=True)
    def _db(self, fake_oracle: fake_oracledb.Database) -> None:
        self.db = fake_oracle

    def make_store(self) -> SqlStore:
        return SqlStore.from_url(INDEX_URL)


def test_the_aq_url_and_the_index_url_reach_one_database(
    fake_oracle: fake_oracledb.Database,
) -> None:
    store = SqlStore.from_url(INDEX_URL)
    try:
        assert store.queues() == []
        store.declare_queue("q1")
        assert store.queues() == ["q1"]
    finally:
        store.close()
    conn = fake_oracledb.connect(user="iq", password=PASSWORD, dsn="oracle.test:1521/FREEPDB1")
    try:
        rows = conn.cursor().execute("SELECT name FROM iq_queues").fetchall()
    finally:
        conn.close()
    assert rows == [("q1",)]
