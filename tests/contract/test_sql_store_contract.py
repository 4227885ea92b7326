"""The shared contract suites with the SQL index store, on the real PostgreSQL and
MariaDB servers and on an SQLite file (``sql+sqlite://``).

Each server gets a schema (PostgreSQL) or database (MariaDB) of its own for the test
session, dropped afterwards; each test class a table prefix of its own in it, whose rows
are deleted before every test, so every test starts on an empty index.
``TestSqliteQueueWithPostgresIndex`` runs the facade-level suite on the embedded SQLite
queue with its index in PostgreSQL (index-driven delivery: every claim is the SQL
store's compare-and-set).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import iqbridge
from iqbridge.stores.sql import SqlStore
from iqbridge.testing.adapter_contract import AdapterContract
from iqbridge.testing.store_contract import IndexStoreContract
from tests.sql_helpers import MARIADB_URL, PG_URL, empty_index, fresh_schema


@pytest.fixture(scope="session")
def pg_index() -> Iterator[str]:
    """An index URL on a PostgreSQL schema made for this session."""
    with fresh_schema(PG_URL, "PostgreSQL at 127.0.0.1:5432") as url:
        yield url


@pytest.fixture(scope="session")
def mariadb_index() -> Iterator[str]:
    """An index URL on a MariaDB database made for this session."""
    with fresh_schema(MARIADB_URL, "MariaDB at 127.0.0.1:3306") as url:
        yield url


def _prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}_"


@pytest.fixture(scope="class")
def class_prefix() -> str:
    """A table prefix for one test class."""
    return _prefix()


@pytest.mark.postgres
class TestPostgresStore(IndexStoreContract):
    @pytest.fixture(autouse=True)
    def _url(self, pg_index: str, class_prefix: str) -> None:
        self.url = f"{pg_index}&prefix={class_prefix}"
        empty_index(self.url)

    def make_store(self) -> SqlStore:
        return SqlStore.from_url(self.url)


@pytest.mark.mariadb
class TestMariadbStore(IndexStoreContract):
    @pytest.fixture(autouse=True)
    def _url(self, mariadb_index: str, class_prefix: str) -> None:
        self.url = f"{mariadb_index}&prefix={class_prefix}"
        empty_index(self.url)

    def make_store(self) -> SqlStore:
        return SqlStore.from_url(self.url)


class TestSqlOnSqliteStore(IndexStoreContract):
    @pytest.fixture(autouse=True)
    def _url(self, tmp_path: Path) -> None:
        self.url = f"sql+sqlite:///{tmp_path / 'index.db'}"

    def make_store(self) -> SqlStore:
        return SqlStore.from_url(self.url)


@pytest.mark.postgres
class TestSqliteQueueWithPostgresIndex(AdapterContract):
    @pytest.fixture(autouse=True)
    def _urls(self, pg_index: str, class_prefix: str, tmp_path: Path) -> None:
        self.index = f"{pg_index}&prefix={class_prefix}"
        empty_index(self.index)
        self.db_dir = tmp_path

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        return iqbridge.connect(
            f"sqlite:///{self.db_dir / 'queue.db'}", index=self.index, clock=clock
        )
