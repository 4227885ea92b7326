"""The base of the index store contract suite: hooks, fixtures and helpers its test
groups share. See :mod:`iqbridge.testing.store_contract` for how to run the suite."""

from __future__ import annotations

import abc
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from iqbridge import engine
from iqbridge.engine import Change
from iqbridge.ids import new_id, new_token
from iqbridge.model import Audience, JournalEntry, MessageRecord, Pool, Retained
from iqbridge.stores.base import IndexStore

__all__ = ["SEC", "T0", "StoreContractBase", "unique", "without_seq"]

#: The suite's "now": microseconds since the epoch.
T0 = 1_800_000_000_000_000
#: One second in microseconds.
SEC = 1_000_000


def unique(prefix: str = "sq") -> str:
    """A queue name no other test uses (stores shared between tests stay apart)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def without_seq(entries: Sequence[JournalEntry]) -> list[tuple[Any, ...]]:
    """Journal entries as tuples without the store-assigned ``seq``."""
    return [
        (e.msg_id, e.queue, e.actor, e.actor_kind, e.src, e.dst, e.at, e.attempt, e.detail)
        for e in entries
    ]


class StoreContractBase(abc.ABC):
    """Hooks, fixtures and helpers of the index store contract; the test groups subclass
    it."""

    # --- hooks -------------------------------------------------------------------------

    @abc.abstractmethod
    def make_store(self) -> IndexStore:
        """A fresh, empty index store."""

    # --- fixtures and helpers ------------------------------------------------------------

    @pytest.fixture
    def store(self) -> Iterator[IndexStore]:
        """A fresh store from :meth:`make_store`, closed after the test."""
        store = self.make_store()
        try:
            yield store
        finally:
            store.close()

    @pytest.fixture
    def queue(self, store: IndexStore) -> str:
        """A declared queue with a unique name."""
        name = unique()
        store.declare_queue(name)
        return name

    def put(
        self,
        store: IndexStore,
        queue: str,
        *,
        to: Sequence[str] = ("a",),
        pools: Sequence[Pool] = (),
        now: int = T0,
        **fields: Any,
    ) -> Change:
        """Commit a new message made by the engine; return its change."""
        change = engine.new_message(
            msg_id=new_id(),
            queue=queue,
            publisher=fields.pop("publisher", "pub"),
            audience=Audience(tuple(to), tuple(pools)),
            now=now,
            **fields,
        )
        store.commit(change)
        return change

    def new(
        self,
        queue: str,
        *,
        to: Sequence[str] = ("a",),
        msg_id: str | None = None,
        retain: Retained | None = None,
        **fields: Any,
    ) -> Change:
        """A new message made by the engine (not committed), with ``retain`` set."""
        change = engine.new_message(
            msg_id=msg_id or new_id(),
            queue=queue,
            publisher=fields.pop("publisher", "pub"),
            audience=Audience(tuple(to)),
            now=fields.pop("now", T0),
            **fields,
        )
        change.retain = retain
        return change

    def move(
        self, store: IndexStore, msg_id: str, op: Callable[[MessageRecord], Change | None]
    ) -> Change:
        """Load, apply an engine operation, commit; return the change."""
        change = op(store.load(msg_id))
        assert change is not None, "the operation changed nothing"
        store.commit(change)
        return change

    def claim(
        self,
        store: IndexStore,
        msg_id: str,
        subscriber: str = "a",
        now: int = T0,
        lease: int | None = 30 * SEC,
        lock_id: str | None = None,
    ) -> Change:
        """Claim a message for a subscriber (GET, FETCHED) under a new token."""
        return self.move(
            store,
            msg_id,
            lambda r: engine.claim(
                r,
                subscriber,
                now,
                token=new_token(),
                owner=f"{subscriber}@contract",
                lease_until=now + lease if lease is not None else None,
                lock_id=lock_id,
            ),
        )

    def _last_seq(self, store: IndexStore) -> int:
        everything = store.journal(0, 1_000_000)
        return (everything[-1].seq or 0) if everything else 0
