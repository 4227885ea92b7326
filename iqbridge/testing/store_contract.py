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

import abc
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from iqbridge import engine
from iqbridge.engine import Change
from iqbridge.errors import MessageNotFound
from iqbridge.ids import new_id, new_token
from iqbridge.model import (
    Audience,
    Filter,
    JournalEntry,
    MessageRecord,
    Pool,
    Retained,
    Subscriptions,
    from_micros,
)
from iqbridge.states import Mode, PublisherState, SubscriberState
from iqbridge.stores.base import IndexStore, PurgedMessage, StaleRecord

__all__ = ["IndexStoreContract"]

P = PublisherState
S = SubscriberState

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


class IndexStoreContract(abc.ABC):
    """Store-level behaviour every index store shares; see the module docstring."""

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

    # --- commit and load -----------------------------------------------------------------

    def test_commit_then_load_round_trips_every_field(self, store: IndexStore, queue: str) -> None:
        change = self.put(
            store,
            queue,
            to=("a", "b"),
            pools=(Pool("p", ["p1", "p2"]),),
            publisher="pub-1",
            ordering_key="key-1",
            correlation_id="corr-1",
            priority=7,
            parents=("parent-1", "parent-2"),
            expires_at=T0 + 60 * SEC,
            max_attempts=3,
            content_type="application/json",
            size=123,
            native_ref="ref-1",
        )
        assert change.record.seq is not None
        loaded = store.load(change.msg_id)
        assert loaded == change.record
        assert loaded.mode is Mode.COMBINED
        assert loaded.parents == ("parent-1", "parent-2")
        assert {n: (m.pool, m.state) for n, m in loaded.members.items()} == {
            "a": (None, S.AVAILABLE),
            "b": (None, S.AVAILABLE),
            "p1": ("p", S.AVAILABLE),
            "p2": ("p", S.AVAILABLE),
        }

    def test_every_kind_of_move_round_trips(self, store: IndexStore, queue: str) -> None:
        msg_id = self.put(store, queue, to=("a",), pools=(Pool("p", ["p1", "p2"]),)).msg_id
        token = new_token()
        ops: list[Callable[[MessageRecord], Change | None]] = [
            lambda r: engine.claim(r, "p1", T0, token=token, owner="o", lease_until=T0 + SEC),
            lambda r: engine.process(r, "p1", token, T0 + 1),
            lambda r: engine.release(r, "p1", token, T0 + 2, reason="later", delay_us=5 * SEC),
            lambda r: engine.lock(r, "lock-1", "auditor", T0 + 3, T0 + 60 * SEC),
            lambda r: engine.unlock(r, "lock-1", T0 + 4),
            lambda r: engine.claim(r, "a", T0 + 5, token=token, owner="o2", lease_until=None),
            lambda r: engine.unusable(r, "a", token, T0 + 6, "poison"),
            lambda r: engine.rereveal(r, "a", T0 + 7),
            lambda r: engine.withdraw(r, T0 + 8, "recalled"),
        ]
        for op in ops:
            change = self.move(store, msg_id, op)
            assert store.load(msg_id) == change.record
        rec = store.load(msg_id)
        assert rec.withdrawn
        assert (rec.members["p1"].reason, rec.members["p1"].outcome) == ("recalled", S.EXPIRED)
        assert rec.members["a"].attempt == 2

    def test_load_of_an_unknown_message_raises(self, store: IndexStore) -> None:
        with pytest.raises(MessageNotFound):
            store.load("no-such-message")

    def test_loaded_records_are_copies(self, store: IndexStore, queue: str) -> None:
        msg_id = self.put(store, queue).msg_id
        loaded = store.load(msg_id)
        loaded.priority = 0
        loaded.members["a"].state = S.DONE
        again = store.load(msg_id)
        assert (again.priority, again.members["a"].state) == (4, S.AVAILABLE)

    def test_set_native_ref_is_kept_by_later_changes(self, store: IndexStore, queue: str) -> None:
        msg_id = self.put(store, queue).msg_id
        store.set_native_ref(msg_id, "ref-9")
        assert store.load(msg_id).native_ref == "ref-9"
        self.claim(store, msg_id)
        assert store.load(msg_id).native_ref == "ref-9"

    def test_seq_follows_put_order_and_version_counts_changes(
        self, store: IndexStore, queue: str
    ) -> None:
        first, second = self.put(store, queue), self.put(store, queue)
        assert first.record.seq is not None and second.record.seq is not None
        assert first.record.seq < second.record.seq
        assert store.load(first.msg_id).version == 1
        self.claim(store, first.msg_id)
        assert store.load(first.msg_id).version == 2

    # --- compare-and-set -----------------------------------------------------------------

    def test_second_change_from_the_same_version_is_stale(
        self, store: IndexStore, queue: str
    ) -> None:
        msg_id = self.put(store, queue, to=(), pools=(Pool("p", ["p1", "p2"]),)).msg_id
        rec = store.load(msg_id)
        one = engine.claim(rec, "p1", T0, token=new_token(), owner="one", lease_until=None)
        two = engine.claim(rec, "p2", T0, token=new_token(), owner="two", lease_until=None)
        store.commit(one)
        journal_before = store.journal(0, 100_000)
        with pytest.raises(StaleRecord):
            store.commit(two)
        assert store.load(msg_id) == one.record
        assert store.journal(0, 100_000) == journal_before
        assert without_seq(store.history(msg_id))[-len(one.journal) :] == without_seq(one.journal)

    def test_creating_an_existing_message_is_stale(self, store: IndexStore, queue: str) -> None:
        change = self.put(store, queue)
        stored = store.load(change.msg_id)
        again = engine.new_message(
            msg_id=change.msg_id, queue=queue, publisher="x", audience=Audience(("z",)), now=T0
        )
        with pytest.raises(StaleRecord):
            store.commit(again)
        assert store.load(change.msg_id) == stored

    def test_change_to_a_purged_message_is_stale_or_not_found(
        self, store: IndexStore, queue: str
    ) -> None:
        msg_id = self.put(store, queue).msg_id
        rec = store.load(msg_id)
        self.move(store, msg_id, lambda r: engine.withdraw(r, T0))
        late = engine.claim(
            rec, "a", T0, token=new_token(), owner="late", lease_until=None
        )  # from the old version
        assert [p.msg_id for p in store.purge(queue, T0 + 1)] == [msg_id]
        with pytest.raises((StaleRecord, MessageNotFound)):
            store.commit(late)
        with pytest.raises(MessageNotFound):
            store.load(msg_id)

    @pytest.mark.parametrize("stale_first", [False, True])
    def test_commit_many_is_all_or_nothing(
        self, store: IndexStore, queue: str, stale_first: bool
    ) -> None:
        msg_id = self.put(store, queue).msg_id
        rec = store.load(msg_id)
        self.claim(store, msg_id)
        stale = engine.claim(rec, "a", T0, token=new_token(), owner="x", lease_until=None)
        fresh = engine.new_message(
            msg_id=new_id(), queue=queue, publisher="pub", audience=Audience(("a",)), now=T0
        )
        current = store.load(msg_id)
        journal_before = store.journal(0, 100_000)
        with pytest.raises(StaleRecord):
            store.commit_many([stale, fresh] if stale_first else [fresh, stale])
        with pytest.raises(MessageNotFound):
            store.load(fresh.msg_id)
        assert store.load(msg_id) == current
        assert store.journal(0, 100_000) == journal_before
        assert store.claimable(queue, "a", T0, 10) == []

    def test_commit_many_commits_every_change_in_order(self, store: IndexStore, queue: str) -> None:
        changes = [
            engine.new_message(
                msg_id=new_id(), queue=queue, publisher="pub", audience=Audience(("a",)), now=T0
            )
            for _ in range(3)
        ]
        store.commit_many(changes)
        seqs = [store.load(c.msg_id).seq or 0 for c in changes]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3
        assert store.claimable(queue, "a", T0, 10) == [c.msg_id for c in changes]
        store.commit_many([])

    def test_concurrent_claims_have_one_winner(self, store: IndexStore, queue: str) -> None:
        members = [f"w{i}" for i in range(4)]
        ids = [self.put(store, queue, to=(), pools=(Pool("p", members),)).msg_id for _ in range(5)]
        winners: dict[str, list[str]] = {m: [] for m in members}
        errors: list[BaseException] = []

        def race(member: str) -> None:
            try:
                for msg_id in ids:
                    for _ in range(100):
                        rec = store.load(msg_id)
                        if rec.members[member].state is not S.AVAILABLE:
                            break
                        change = engine.claim(
                            rec, member, T0, token=new_token(), owner=member, lease_until=None
                        )
                        try:
                            store.commit(change)
                        except StaleRecord:
                            continue
                        winners[member].append(msg_id)
                        break
            except BaseException as exc:  # surfaced by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=race, args=(m,)) for m in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        assert sorted(m for won in winners.values() for m in won) == sorted(ids)
        for msg_id in ids:
            states = [m.state for m in store.load(msg_id).members.values()]
            assert (states.count(S.FETCHED), states.count(S.JOURNALLED)) == (1, 3)

    # --- claimable and redeliverable -----------------------------------------------------

    def test_claimable_orders_by_priority_then_put_order(
        self, store: IndexStore, queue: str
    ) -> None:
        puts = [(p, self.put(store, queue, priority=p).msg_id) for p in (4, 9, 0, 4, 9, 5)]
        expected = [m for _, m in sorted(puts, key=lambda pm: -pm[0])]  # stable: put order
        assert store.claimable(queue, "a", T0, 100) == expected
        assert store.claimable(queue, "a", T0, 2) == expected[:2]

    def test_claimable_only_lists_available_members_of_that_queue(
        self, store: IndexStore, queue: str
    ) -> None:
        other = unique()
        store.declare_queue(other)
        mine = self.put(store, queue, to=("a", "b")).msg_id
        taken = self.put(store, queue, to=("a", "b")).msg_id
        self.put(store, queue, to=("b",))
        self.put(store, queue, confirm=True)
        self.put(store, other)
        self.claim(store, taken, "a")
        assert store.claimable(queue, "a", T0, 100) == [mine]
        assert len(store.claimable(queue, "b", T0, 100)) == 3
        assert store.claimable(queue, "nobody", T0, 100) == []

    def test_claimable_respects_not_before(self, store: IndexStore, queue: str) -> None:
        msg_id = self.put(store, queue).msg_id
        token = new_token()
        self.move(
            store,
            msg_id,
            lambda r: engine.claim(r, "a", T0, token=token, owner="o", lease_until=None),
        )
        self.move(store, msg_id, lambda r: engine.release(r, "a", token, T0, delay_us=10 * SEC))
        assert store.claimable(queue, "a", T0 + 10 * SEC - 1, 10) == []
        assert store.claimable(queue, "a", T0 + 10 * SEC, 10) == [msg_id]

    def test_claimable_filters_browse_locks(self, store: IndexStore, queue: str) -> None:
        free = self.put(store, queue).msg_id
        locked = self.put(store, queue).msg_id
        self.move(store, locked, lambda r: engine.lock(r, "lock-1", "auditor", T0, T0 + 60 * SEC))
        assert store.claimable(queue, "a", T0, 10) == [free]
        assert store.claimable(queue, "a", T0, 10, lock_id="lock-1") == [locked]
        assert store.claimable(queue, "a", T0, 10, lock_id="lock-2") == []
        lapsed = T0 + 60 * SEC
        assert store.claimable(queue, "a", lapsed, 10) == [free, locked]
        assert store.claimable(queue, "a", lapsed, 10, lock_id="lock-1") == []

    def test_claimable_leaves_out_messages_past_their_time_limit(
        self, store: IndexStore, queue: str
    ) -> None:
        lasting = self.put(store, queue).msg_id
        brief = self.put(store, queue, expires_at=T0 + 5 * SEC).msg_id
        assert store.claimable(queue, "a", T0 + 5 * SEC - 1, 10) == [lasting, brief]
        assert store.claimable(queue, "a", T0 + 5 * SEC, 10) == [lasting]

    def test_redeliverable_lists_only_later_attempts(self, store: IndexStore, queue: str) -> None:
        fresh = self.put(store, queue, priority=9).msg_id
        retried = self.put(store, queue).msg_id
        token = new_token()
        self.move(
            store,
            retried,
            lambda r: engine.claim(r, "a", T0, token=token, owner="o", lease_until=None),
        )
        self.move(store, retried, lambda r: engine.release(r, "a", token, T0))
        assert store.claimable(queue, "a", T0, 10) == [fresh, retried]
        assert store.redeliverable(queue, "a", T0, 10) == [retried]
        assert store.redeliverable(queue, "b", T0, 10) == []

    # --- due -----------------------------------------------------------------------------

    def test_due_lists_lapsed_leases(self, store: IndexStore, queue: str) -> None:
        leased = self.put(store, queue).msg_id
        held = self.put(store, queue).msg_id
        self.claim(store, leased, lease=30 * SEC)
        self.claim(store, held, lease=None)
        assert store.due(queue, T0 + 30 * SEC - 1, 10) == []
        assert store.due(queue, T0 + 30 * SEC, 10) == [leased]
        self.move(store, leased, lambda r: engine.expire_due(r, T0 + 30 * SEC))
        assert store.due(queue, T0 + 3600 * SEC, 10) == []
        assert store.load(leased).members["a"].state is S.AVAILABLE

    def test_due_lists_passed_time_limits_of_waiting_members(
        self, store: IndexStore, queue: str
    ) -> None:
        ttl = T0 + 5 * SEC
        waiting = self.put(store, queue, expires_at=ttl).msg_id
        unconfirmed = self.put(store, queue, confirm=True, expires_at=ttl).msg_id
        fetched = self.put(store, queue, expires_at=ttl).msg_id
        self.claim(store, fetched, lease=None)
        assert store.due(queue, T0 + 5 * SEC - 1, 10) == []
        assert sorted(store.due(queue, T0 + 5 * SEC, 10)) == sorted([waiting, unconfirmed])

    def test_due_lists_lapsed_browse_locks(self, store: IndexStore, queue: str) -> None:
        msg_id = self.put(store, queue).msg_id
        self.move(store, msg_id, lambda r: engine.lock(r, "lock-1", "auditor", T0, T0 + 10 * SEC))
        assert store.due(queue, T0 + 10 * SEC - 1, 10) == []
        assert store.due(queue, T0 + 10 * SEC, 10) == [msg_id]
        self.move(store, msg_id, lambda r: engine.expire_due(r, T0 + 10 * SEC))
        assert store.load(msg_id).lock_id is None
        assert store.due(queue, T0 + 10 * SEC, 10) == []

    def test_due_by_queue_or_for_all_queues_up_to_the_limit(
        self, store: IndexStore, queue: str
    ) -> None:
        other = unique()
        store.declare_queue(other)
        mine = [self.put(store, queue, expires_at=T0 + SEC).msg_id for _ in range(3)]
        theirs = self.put(store, other, expires_at=T0 + SEC).msg_id
        later = T0 + 2 * SEC
        assert sorted(store.due(queue, later, 10)) == sorted(mine)
        assert store.due(other, later, 10) == [theirs]
        assert {*mine, theirs} <= set(store.due(None, later, 100))
        assert len(store.due(queue, later, 2)) == 2

    # --- history and journal -------------------------------------------------------------

    def test_history_holds_every_change_in_order(self, store: IndexStore, queue: str) -> None:
        put = self.put(store, queue, to=("a", "b"))
        other = self.put(store, queue)
        changes = [put, self.claim(store, put.msg_id, "a")]
        self.claim(store, other.msg_id, "a")
        changes.append(self.move(store, put.msg_id, lambda r: engine.withdraw(r, T0 + SEC)))
        hist = store.history(put.msg_id)
        assert without_seq(hist) == without_seq([e for c in changes for e in c.journal])
        seqs = [e.seq for e in hist if e.seq is not None]
        assert len(seqs) == len(hist)
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)

    def test_history_of_an_unknown_message_raises(self, store: IndexStore) -> None:
        with pytest.raises(MessageNotFound):
            store.history("no-such-message")

    def test_journal_pages_through_every_entry_in_commit_order(
        self, store: IndexStore, queue: str
    ) -> None:
        start = store.journal(0, 100_000)
        after = start[-1].seq if start else 0
        assert after is not None
        one, two = self.put(store, queue), self.put(store, queue, to=("b",))
        changes = [one, two, self.claim(store, two.msg_id, "b"), self.claim(store, one.msg_id)]
        expected = [e for c in changes for e in c.journal]
        everything = store.journal(after, 100_000)
        assert without_seq(everything) == without_seq(expected)
        paged: list[JournalEntry] = []
        cursor = after
        while page := store.journal(cursor, 3):
            assert len(page) <= 3
            paged.extend(page)
            last = page[-1].seq
            assert last is not None
            cursor = last
        assert paged == everything
        seqs = [e.seq or 0 for e in everything]
        assert seqs == sorted(seqs) and seqs[0] > after

    # --- search --------------------------------------------------------------------------

    @pytest.fixture
    def catalogue(self, store: IndexStore, queue: str) -> dict[str, str]:
        """Messages with distinct index fields, by label (put in label order)."""
        ids = {
            "low": self.put(store, queue, priority=1, publisher="alice", now=T0).msg_id,
            "mid": self.put(
                store, queue, priority=5, correlation_id="c-1", now=T0 + 10 * SEC
            ).msg_id,
            "high": self.put(
                store, queue, to=("a", "b"), priority=9, correlation_id="c-1", now=T0 + 20 * SEC
            ).msg_id,
            "pending": self.put(store, queue, confirm=True, publisher="alice", now=T0).msg_id,
        }
        self.claim(store, ids["mid"], "a", now=T0 + 30 * SEC)
        self.move(store, ids["high"], lambda r: engine.lock(r, "lock-1", "o", T0, None))
        other = unique()
        store.declare_queue(other)
        self.put(store, other, priority=1, correlation_id="c-1", publisher="alice")
        return ids

    @pytest.mark.parametrize(
        ("criteria", "expected"),
        [
            ({}, ["low", "mid", "high", "pending"]),
            ({"correlation_id": "c-1"}, ["mid", "high"]),
            ({"priority": 5}, ["mid"]),
            ({"priority": (1, 5)}, ["low", "mid", "pending"]),
            ({"priority": (6, 9)}, ["high"]),
            ({"publisher": "alice"}, ["low", "pending"]),
            ({"state": P.PUT}, ["pending"]),
            ({"state": P.REVEALED}, ["low", "mid", "high"]),
            ({"state": P.JOURNALLED}, []),
            ({"state": S.AVAILABLE}, ["low", "high"]),
            ({"state": S.FETCHED}, ["mid"]),
            ({"state": S.AVAILABLE, "subscriber": "b"}, ["high"]),
            ({"state": S.FETCHED, "subscriber": "b"}, []),
            ({"subscriber": "b"}, ["high"]),
            ({"state": P.REVEALED, "subscriber": "b"}, ["high"]),
            ({"since": from_micros(T0 + 10 * SEC)}, ["mid", "high"]),
            ({"until": from_micros(T0 + 10 * SEC)}, ["low", "pending"]),
            ({"since": from_micros(T0 + SEC), "until": from_micros(T0 + 11 * SEC)}, ["mid"]),
            ({"lock_id": "lock-1"}, ["high"]),
            ({"lock_id": "lock-2"}, []),
            ({"limit": 2}, ["low", "mid"]),
            ({"publisher": "alice", "priority": 1}, ["low"]),
            ({"correlation_id": "c-1", "state": S.FETCHED}, ["mid"]),
        ],
        ids=lambda v: repr(v) if isinstance(v, dict) else None,
    )
    def test_search_filters(
        self,
        store: IndexStore,
        queue: str,
        catalogue: dict[str, str],
        criteria: dict[str, Any],
        expected: list[str],
    ) -> None:
        hits = store.search(queue, Filter(**criteria))
        assert [h.msg_id for h in hits] == [catalogue[label] for label in expected]

    def test_search_by_msg_id_returns_the_summary(
        self, store: IndexStore, queue: str, catalogue: dict[str, str]
    ) -> None:
        [hit] = store.search(queue, Filter(msg_id=catalogue["high"]))
        assert (hit.msg_id, hit.queue, hit.publisher) == (catalogue["high"], queue, "pub")
        assert (hit.correlation_id, hit.priority, hit.mode) == ("c-1", 9, Mode.PUBSUB)
        assert hit.publisher_state is P.REVEALED
        assert hit.created_at == from_micros(T0 + 20 * SEC)
        assert dict(hit.subscribers) == {"a": S.AVAILABLE, "b": S.AVAILABLE}
        assert store.search(queue, Filter(msg_id="no-such-message")) == []

    # --- purge ---------------------------------------------------------------------------

    def test_purge_removes_journalled_messages_and_keeps_the_journal(
        self, store: IndexStore, queue: str
    ) -> None:
        old = self.put(store, queue, native_ref="ref-old").msg_id
        self.move(store, old, lambda r: engine.withdraw(r, T0 + SEC))
        recent = self.put(store, queue).msg_id
        self.move(store, recent, lambda r: engine.withdraw(r, T0 + 10 * SEC))
        open_ = self.put(store, queue).msg_id
        other = unique()
        store.declare_queue(other)
        elsewhere = self.put(store, other).msg_id
        self.move(store, elsewhere, lambda r: engine.withdraw(r, T0))
        journal_before = store.journal(0, 100_000)
        assert store.purge(queue, T0 + 10 * SEC) == [PurgedMessage(old, "ref-old")]
        with pytest.raises(MessageNotFound):
            store.load(old)
        assert store.search(queue, Filter(msg_id=old)) == []
        assert store.journal(0, 100_000) == journal_before
        for kept in (recent, open_, elsewhere):
            store.load(kept)
        assert store.purge(queue, T0 + 10 * SEC) == []

    def test_purge_stops_at_the_limit(self, store: IndexStore, queue: str) -> None:
        ids = [self.put(store, queue).msg_id for _ in range(3)]
        for msg_id in ids:
            self.move(store, msg_id, lambda r: engine.withdraw(r, T0))
        first = store.purge(queue, T0 + SEC, limit=2)
        assert [p.msg_id for p in first] == ids[:2]
        assert [p.msg_id for p in store.purge(queue, T0 + SEC, limit=2)] == ids[2:]

    # --- queues and subscriptions --------------------------------------------------------

    def test_declare_queue_is_idempotent(self, store: IndexStore) -> None:
        names = [unique(), unique()]
        for name in names + names:
            store.declare_queue(name)
        listed = store.queues()
        assert set(names) <= set(listed)
        assert len(listed) == len(set(listed))

    def test_subscriptions_round_trip(self, store: IndexStore, queue: str) -> None:
        assert store.subscriptions(queue) == Subscriptions()
        subs = Subscriptions(
            ("a", "b"),
            (Pool("p", ["p1", "p2"]),),
            (Pool("adhoc", ["x1"]),),
        )
        store.set_subscriptions(queue, subs)
        assert store.subscriptions(queue) == subs
        replaced = Subscriptions(("c",))
        store.set_subscriptions(queue, replaced)
        assert store.subscriptions(queue) == replaced
        other = unique()
        store.declare_queue(other)
        assert store.subscriptions(other) == Subscriptions()
        assert store.subscriptions(unique()) == Subscriptions()

    # --- commit_each ---------------------------------------------------------------------

    def test_commit_each_applies_current_changes_and_skips_stale_ones(
        self, store: IndexStore, queue: str
    ) -> None:
        first, second, third = (self.put(store, queue).msg_id for _ in range(3))
        stale_rec = store.load(second)
        # A browse lock taken and given back: the record moved on, still AVAILABLE.
        self.move(store, second, lambda r: engine.lock(r, "l", "o", T0, None))
        self.move(store, second, lambda r: engine.unlock(r, "l", T0))
        moved_on = store.load(second)
        after = self._last_seq(store)
        history_before = store.history(second)

        def claim(rec: MessageRecord) -> Change:
            return engine.claim(
                rec, "a", T0, token=new_token(), owner="batch", lease_until=T0 + 30 * SEC
            )

        changes = [claim(store.load(first)), claim(stale_rec), claim(store.load(third))]
        assert store.commit_each(changes) == [True, False, True]

        # The skipped change wrote nothing: record, history, journal, indexes.
        assert store.load(second) == moved_on
        assert store.history(second) == history_before
        assert store.claimable(queue, "a", T0, 10) == [second]
        assert [h.msg_id for h in store.search(queue, Filter(state=S.AVAILABLE))] == [second]
        # The applied ones are fully visible.
        for change in (changes[0], changes[2]):
            assert store.load(change.msg_id) == change.record
            assert without_seq(store.history(change.msg_id))[-len(change.journal) :] == (
                without_seq(change.journal)
            )
        assert without_seq(store.journal(after, 100_000)) == without_seq(
            changes[0].journal + changes[2].journal
        )
        assert [h.msg_id for h in store.search(queue, Filter(state=S.FETCHED))] == [first, third]
        assert store.due(queue, T0 + 30 * SEC - 1, 10) == []
        assert sorted(store.due(queue, T0 + 30 * SEC, 10)) == sorted([first, third])

    def test_commit_each_skips_creations_of_existing_messages(
        self, store: IndexStore, queue: str
    ) -> None:
        existing = self.put(store, queue)
        stored = store.load(existing.msg_id)
        history_before = store.history(existing.msg_id)
        after = self._last_seq(store)
        twin = new_id()
        changes = [
            self.new(queue),
            self.new(queue, msg_id=existing.msg_id, to=("z",), publisher="other"),
            self.new(queue, msg_id=twin),
            self.new(queue, msg_id=twin, to=("z",)),
        ]
        assert store.commit_each(changes) == [True, False, True, False]
        assert store.load(existing.msg_id) == stored
        assert store.history(existing.msg_id) == history_before
        for change in (changes[0], changes[2]):
            assert change.record.seq is not None
            assert store.load(change.msg_id) == change.record
        assert (changes[0].record.seq or 0) < (changes[2].record.seq or 0)
        assert store.claimable(queue, "a", T0, 10) == [existing.msg_id, changes[0].msg_id, twin]
        assert store.claimable(queue, "z", T0, 10) == []
        assert [h.msg_id for h in store.search(queue, Filter(publisher="other"))] == []
        assert without_seq(store.journal(after, 100_000)) == without_seq(
            changes[0].journal + changes[2].journal
        )

    @pytest.mark.parametrize("chained", [False, True])
    def test_commit_each_applies_only_the_first_change_of_a_message(
        self, store: IndexStore, queue: str, chained: bool
    ) -> None:
        msg_id = self.put(store, queue, to=("a", "b")).msg_id
        rec = store.load(msg_id)
        after = self._last_seq(store)
        first = engine.claim(rec, "a", T0, token=new_token(), owner="one", lease_until=None)
        # Chained: the second is computed from the first's result (its expected version
        # is the one the first writes); otherwise both start from the stored record.
        second = engine.claim(
            first.record if chained else rec,
            "b",
            T0,
            token=new_token(),
            owner="two",
            lease_until=None,
        )
        assert store.commit_each([first, second]) == [True, False]
        assert store.load(msg_id) == first.record
        assert store.claimable(queue, "b", T0, 10) == [msg_id]
        assert without_seq(store.journal(after, 100_000)) == without_seq(first.journal)

    def test_commit_each_of_a_stale_first_change_skips_the_second_too(
        self, store: IndexStore, queue: str
    ) -> None:
        msg_id = self.put(store, queue, to=("a", "b")).msg_id
        old = store.load(msg_id)
        self.claim(store, msg_id, "a")
        current = store.load(msg_id)
        stale = engine.claim(old, "b", T0, token=new_token(), owner="x", lease_until=None)
        fresh = engine.claim(current, "b", T0, token=new_token(), owner="y", lease_until=None)
        assert store.commit_each([stale, fresh]) == [False, False]
        assert store.load(msg_id) == current

    def test_commit_each_of_nothing_and_of_a_large_batch(
        self, store: IndexStore, queue: str
    ) -> None:
        assert store.commit_each([]) == []
        puts = [self.new(queue, to=("a", "b")) for _ in range(300)]
        assert store.commit_each(puts) == [True] * 300
        seqs = [c.record.seq or 0 for c in puts]
        assert seqs == sorted(seqs) and len(set(seqs)) == 300
        recs = store.load_many([c.msg_id for c in puts])
        claims = [
            engine.claim(recs[c.msg_id], "a", T0, token=new_token(), owner="o", lease_until=None)
            for c in puts
        ]
        taken = claims[::3]
        store.commit_many(taken)
        assert store.commit_each(claims) == [i % 3 != 0 for i in range(300)]
        assert store.claimable(queue, "a", T0, 1000) == []
        assert len(store.claimable(queue, "b", T0, 1000)) == 300
        states = {m: r.members["a"].state for m, r in store.load_many(list(recs)).items()}
        assert set(states.values()) == {S.FETCHED}

    def test_concurrent_commit_each_batches_have_one_winner_per_message(
        self, store: IndexStore, queue: str
    ) -> None:
        members = [f"w{i}" for i in range(4)]
        puts = [
            engine.new_message(
                msg_id=new_id(),
                queue=queue,
                publisher="pub",
                audience=Audience((), (Pool("p", members),)),
                now=T0,
            )
            for _ in range(40)
        ]
        store.commit_many(puts)
        ids = [c.msg_id for c in puts]
        barrier = threading.Barrier(len(members))
        won: dict[str, list[str]] = {}
        errors: list[BaseException] = []

        def race(n: int, member: str) -> None:
            try:
                recs = store.load_many(ids)
                # Half the batches in the opposite order: a store that locks rows in batch
                # order would deadlock here.
                order = ids if n % 2 else ids[::-1]
                claims = [
                    engine.claim(
                        recs[i], member, T0, token=new_token(), owner=member, lease_until=None
                    )
                    for i in order
                ]
                barrier.wait(10)
                flags = store.commit_each(claims)
                won[member] = [c.msg_id for c, ok in zip(claims, flags, strict=True) if ok]
            except BaseException as exc:  # surfaced by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=race, args=(n, m)) for n, m in enumerate(members)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        assert sorted(m for w in won.values() for m in w) == sorted(ids)
        for member, mine in won.items():
            for rec in store.load_many(mine).values():
                assert rec.members[member].state is S.FETCHED
                states = [m.state for m in rec.members.values()]
                assert states.count(S.JOURNALLED) == 3
        journal = store.journal(0, 1_000_000)
        claims = [e for e in journal if e.dst == "GET" and e.msg_id in set(ids)]
        assert len(claims) == len(ids)

    def test_commit_each_inside_atomic_keeps_the_enclosing_work(
        self, store: IndexStore, queue: str
    ) -> None:
        existing = self.put(store, queue)
        old = store.load(existing.msg_id)
        self.claim(store, existing.msg_id)
        with store.atomic():
            before = self.put(store, queue).msg_id
            fresh = self.new(queue)
            flags = store.commit_each(
                [
                    self.new(queue, msg_id=existing.msg_id),  # exists: skipped
                    fresh,
                    engine.claim(old, "a", T0, token=new_token(), owner="x", lease_until=None),
                ]
            )
            # The enclosing transaction is still usable after the skipped ones.
            later = self.put(store, queue).msg_id
        assert flags == [False, True, False]
        assert store.claimable(queue, "a", T0, 10) == [before, fresh.msg_id, later]
        assert store.load(existing.msg_id).members["a"].state is S.FETCHED

    # --- load_many and set_native_refs -----------------------------------------------------

    def test_load_many_returns_the_known_records(self, store: IndexStore, queue: str) -> None:
        one, two = self.put(store, queue, to=("a", "b")), self.put(store, queue)
        self.claim(store, one.msg_id, "b")
        found = store.load_many([two.msg_id, "no-such-message", one.msg_id, two.msg_id])
        assert found == {one.msg_id: store.load(one.msg_id), two.msg_id: store.load(two.msg_id)}
        assert found[one.msg_id].members["b"].state is S.FETCHED
        found[two.msg_id].members["a"].state = S.DONE  # a copy
        assert store.load(two.msg_id).members["a"].state is S.AVAILABLE
        assert store.load_many([]) == {}
        assert store.load_many(["no-such-message"]) == {}

    def test_set_native_refs_records_each_and_skips_unknown_ids(
        self, store: IndexStore, queue: str
    ) -> None:
        one, two, three = (self.put(store, queue).msg_id for _ in range(3))
        store.set_native_refs([(one, "ref-1"), ("no-such-message", "ref-x"), (two, "ref-2")])
        store.set_native_refs([])
        recs = store.load_many([one, two, three])
        assert {m: (r.native_ref, r.version) for m, r in recs.items()} == {
            one: ("ref-1", 1),
            two: ("ref-2", 1),
            three: (None, 1),
        }
        with pytest.raises(MessageNotFound):
            store.load("no-such-message")
        self.claim(store, one)
        assert store.load(one).native_ref == "ref-1"

    # --- retained payload copies -----------------------------------------------------------

    @pytest.mark.parametrize("how", ["commit", "commit_many", "commit_each"])
    def test_retained_copy_is_written_with_the_creation(
        self, store: IndexStore, queue: str, how: str
    ) -> None:
        kept = Retained(b"payload \x00\xff", {"h1": "v1", "ключ": "значение ✓"})
        change = self.new(queue, retain=kept, content_type="text/plain", size=11)
        plain = self.new(queue)
        if how == "commit":
            store.commit(change)
            store.commit(plain)
        elif how == "commit_many":
            store.commit_many([change, plain])
        else:
            assert store.commit_each([change, plain]) == [True, True]
        assert store.retained([change.msg_id, plain.msg_id, "no-such-message"]) == {
            change.msg_id: kept
        }
        assert store.load(change.msg_id) == change.record
        self.claim(store, change.msg_id)  # later changes keep it
        [copy] = store.retained([change.msg_id]).values()
        assert (copy.body, dict(copy.headers)) == (kept.body, dict(kept.headers))
        envelope = store.load(change.msg_id).envelope(copy)
        assert (envelope.msg_id, envelope.body, envelope.content_type) == (
            change.msg_id,
            kept.body,
            "text/plain",
        )
        assert store.retained([]) == {}

    def test_no_retained_copy_after_a_failed_creation(self, store: IndexStore, queue: str) -> None:
        existing = self.put(store, queue).msg_id
        copy = Retained(b"not kept", {"h": "v"})
        with pytest.raises(StaleRecord):
            store.commit(self.new(queue, msg_id=existing, retain=copy))
        with pytest.raises(StaleRecord):
            store.commit_many([self.new(queue, msg_id=existing, retain=copy)])
        assert store.commit_each([self.new(queue, msg_id=existing, retain=copy)]) == [False]
        # All or nothing: a fresh message in a batch with a stale change is not kept either.
        rec = store.load(existing)
        self.claim(store, existing)
        fresh = self.new(queue, retain=copy)
        stale = engine.claim(rec, "a", T0, token=new_token(), owner="x", lease_until=None)
        with pytest.raises(StaleRecord):
            store.commit_many([fresh, stale])
        assert store.retained([existing, fresh.msg_id]) == {}
        # A duplicate creation within one commit_each keeps the first one's copy.
        twin = new_id()
        first, second = Retained(b"first"), Retained(b"second")
        flags = store.commit_each(
            [
                self.new(queue, msg_id=twin, retain=first),
                self.new(queue, msg_id=twin, retain=second),
            ]
        )
        assert flags == [True, False]
        assert store.retained([twin]) == {twin: first}

    def test_retained_bodies_are_byte_exact(self, store: IndexStore, queue: str) -> None:
        bodies = [
            b"",
            bytes(range(256)),
            b"\xff\xfe\x80 not UTF-8 \xc3\x28 \x00",
            "naïve café ✓".encode(),
            bytes(range(256)) * 1024,  # 256 KiB
        ]
        headers: list[dict[str, str]] = [
            {},
            {"content-encoding": "gzip"},
            {"a": "", "x-ünïcode": "✓ 日本", "quote": '"\\'},
            {"k": "v"},
            {},
        ]
        changes = [
            self.new(queue, retain=Retained(b, h)) for b, h in zip(bodies, headers, strict=True)
        ]
        assert store.commit_each(changes) == [True] * len(changes)
        found = store.retained([c.msg_id for c in changes])
        for change, body, hdrs in zip(changes, bodies, headers, strict=True):
            copy = found[change.msg_id]
            assert type(copy.body) is bytes and copy.body == body
            assert dict(copy.headers) == hdrs

    def test_purge_removes_the_retained_copy_and_keeps_the_journal(
        self, store: IndexStore, queue: str
    ) -> None:
        gone, kept = (
            self.new(queue, retain=Retained(b"gone")),
            self.new(queue, retain=Retained(b"kept")),
        )
        store.commit_many([gone, kept])
        self.move(store, gone.msg_id, lambda r: engine.withdraw(r, T0 + SEC))
        journal_before = store.journal(0, 100_000)
        assert [p.msg_id for p in store.purge(queue, T0 + 2 * SEC)] == [gone.msg_id]
        assert store.retained([gone.msg_id, kept.msg_id]) == {kept.msg_id: Retained(b"kept")}
        assert store.journal(0, 100_000) == journal_before
        assert without_seq(store.history(kept.msg_id)) == without_seq(kept.journal)

    def _last_seq(self, store: IndexStore) -> int:
        everything = store.journal(0, 1_000_000)
        return (everything[-1].seq or 0) if everything else 0

    # --- transactions --------------------------------------------------------------------

    def test_atomic_nests_and_commits(self, store: IndexStore, queue: str) -> None:
        with store.atomic():
            first = self.put(store, queue).msg_id
            with store.atomic():
                second = self.put(store, queue).msg_id
                self.claim(store, first)
            assert store.load(second).members["a"].state is S.AVAILABLE
        assert store.load(first).members["a"].state is S.FETCHED
        assert store.claimable(queue, "a", T0, 10) == [second]

    def test_stale_record_inside_atomic_keeps_earlier_work(
        self, store: IndexStore, queue: str
    ) -> None:
        msg_id = self.put(store, queue).msg_id
        old = store.load(msg_id)
        self.claim(store, msg_id)
        with store.atomic():
            kept = self.put(store, queue).msg_id
            with pytest.raises(StaleRecord):
                store.commit(
                    engine.claim(old, "a", T0, token=new_token(), owner="x", lease_until=None)
                )
        assert store.load(kept).members["a"].state is S.AVAILABLE
