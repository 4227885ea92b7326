"""The shared contract every side-index store passes, at the store level.

Subclass :class:`IndexStoreContract` in a test module (its name must start with ``Test``)
and implement :meth:`IndexStoreContract.make_store`; pytest then runs every test below
against your store::

    from iqbridge.testing.store_contract import IndexStoreContract

    class TestRedisStore(IndexStoreContract):
        def make_store(self):
            # A fresh, empty store for every test (a new database number, key prefix,
            # schema or temporary file).
            return RedisStore.from_url(REDIS_URL)

The suite builds records with the state engine (:func:`iqbridge.engine.new_message`,
:func:`~iqbridge.engine.claim`, ...), exactly as the facade does, so a store is tested
on the changes it will really be given. Times are plain microsecond integers: stores
never read a clock. The ``store`` fixture closes the store after each test.
"""

from __future__ import annotations

from iqbridge.testing.store_contract_base import SEC, T0, StoreContractBase, unique, without_seq
from iqbridge.testing.store_contract_batches import BatchCommitTests
from iqbridge.testing.store_contract_commits import CommitTests
from iqbridge.testing.store_contract_queries import QueryTests
from iqbridge.testing.store_contract_retained import RetainedCopyTests
from iqbridge.testing.store_contract_settle import (
    ClaimReadyTests,
    ClaimReceivedTests,
    SettleHeldTests,
)
from iqbridge.testing.store_contract_writes import BatchWriteTests

__all__ = [
    "SEC",
    "T0",
    "IndexStoreContract",
    "StoreContractBase",
    "unique",
    "without_seq",
]


class IndexStoreContract(
    CommitTests,
    QueryTests,
    BatchCommitTests,
    RetainedCopyTests,
    BatchWriteTests,
    ClaimReadyTests,
    ClaimReceivedTests,
    SettleHeldTests,
):
    """Store-level behaviour every index store shares; see the module docstring.

    The tests live in groups, one module each:
    :mod:`~iqbridge.testing.store_contract_commits` (commit and load, compare-and-set,
    transactions), :mod:`~iqbridge.testing.store_contract_queries` (claim order, due
    work, history and journal, search, purge, queues and subscriptions),
    :mod:`~iqbridge.testing.store_contract_batches` (``commit_each``, ``load_many``,
    ``set_native_refs``), :mod:`~iqbridge.testing.store_contract_retained` (retained
    payload copies) and :mod:`~iqbridge.testing.store_contract_writes` (a batch's writes
    with its journal as templates, ``commit_writes``) and
    :mod:`~iqbridge.testing.store_contract_settle` (``claim_ready``,
    ``claim_received`` and ``settle_held``, where a store offers them); hooks,
    fixtures and helpers are in :mod:`~iqbridge.testing.store_contract_base`.
    """
