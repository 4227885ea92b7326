"""The shared contract suites run against the embedded SQLite queue and index."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import iqbridge
from iqbridge.stores.sqlite import SqliteStore
from iqbridge.testing.adapter_contract import AdapterContract
from iqbridge.testing.store_contract import IndexStoreContract


class TestSqliteAdapter(AdapterContract):
    """Index-driven: the default force_redelivery replays duplicates through the facade."""

    @pytest.fixture(autouse=True)
    def _db_dir(self, tmp_path: Path) -> None:
        self.db_dir = tmp_path

    def make_hub(self, clock: Callable[[], float]) -> iqbridge.Hub:
        return iqbridge.connect(f"sqlite:///{self.db_dir / 'queue.db'}", clock=clock)


class TestSqliteStore(IndexStoreContract):
    @pytest.fixture(autouse=True)
    def _db_dir(self, tmp_path: Path) -> None:
        self.db_dir = tmp_path

    def make_store(self) -> SqliteStore:
        return SqliteStore.from_url(f"sqlite:///{self.db_dir / 'index.db'}")
