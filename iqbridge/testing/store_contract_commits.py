"""Index store contract, commits: a change committed and loaded back, compare-and-set
(stale changes, all-or-nothing batches, concurrent claims) and transactions."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from iqbridge import engine
from iqbridge.engine import Change
from iqbridge.errors import MessageNotFound
from iqbridge.ids import new_id, new_token
from iqbridge.model import Audience, MessageRecord, Pool
from iqbridge.states import Mode, SubscriberState
from iqbridge.stores.base import IndexStore, StaleRecord
from iqbridge.testing.store_contract_base import SEC, T0, StoreContractBase, without_seq

S = SubscriberState


class CommitTests(StoreContractBase):
    """Commit, load, compare-and-set and transactions."""

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
