"""Index store contract, batches: ``commit_each`` (what still holds is written, the
rest skipped, also between concurrent batches and inside a transaction), ``load_many``
and ``set_native_refs``."""

from __future__ import annotations

import threading

import pytest

from iqbridge import engine
from iqbridge.engine import Change
from iqbridge.errors import MessageNotFound
from iqbridge.ids import new_id, new_token
from iqbridge.model import Audience, Filter, MessageRecord, Pool
from iqbridge.states import SubscriberState
from iqbridge.stores.base import IndexStore
from iqbridge.testing.store_contract_base import SEC, T0, StoreContractBase, without_seq

S = SubscriberState


class BatchCommitTests(StoreContractBase):
    """commit_each, load_many and set_native_refs."""

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
