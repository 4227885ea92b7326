"""The index store contract: :meth:`~iqbridge.stores.base.IndexStore.commit_writes`, a
batch's writes with its journal as templates (:mod:`iqbridge.writes`). See
:mod:`iqbridge.testing.store_contract`."""

from __future__ import annotations

from collections.abc import Sequence

from iqbridge import engine, engine_batch
from iqbridge.ids import new_id
from iqbridge.model import Audience, MessageRecord, Retained
from iqbridge.states import PublisherState, SubscriberState
from iqbridge.stores.base import IndexStore
from iqbridge.testing.store_contract_base import SEC, T0, StoreContractBase, without_seq
from iqbridge.writes import Writes

__all__ = ["BatchWriteTests"]

S = SubscriberState


def _items(count: int, publisher: str = "pub") -> list[engine_batch.NewItem]:
    return [
        (new_id(), publisher, None, f"c{i}", i % 10, (), None, "text/plain", 1)
        for i in range(count)
    ]


class BatchWriteTests(StoreContractBase):
    """A batch's records and templated journal: committed where they hold, each
    message's entries readable as if written one change at a time."""

    def _create(
        self, store: IndexStore, queue: str, count: int, to: Sequence[str] = ("a",)
    ) -> tuple[list[MessageRecord], Writes]:
        records, journal = engine_batch.create(queue, Audience(tuple(to)), T0, _items(count))
        writes = Writes(queue, created=records, journal=journal)
        assert store.commit_writes(writes) == [True] * count
        return records, writes

    def test_created_records_and_their_journal_read_as_one_change_each(
        self, store: IndexStore, queue: str
    ) -> None:
        records, writes = self._create(store, queue, 5, to=("a", "b"))
        expected = writes.entries()
        for rec in records:
            loaded = store.load(rec.msg_id)
            assert loaded.publisher_state is PublisherState.REVEALED
            assert {m.subscriber: m.state for m in loaded.members.values()} == {
                "a": S.AVAILABLE,
                "b": S.AVAILABLE,
            }
            history = store.history(rec.msg_id)
            assert without_seq(history) == without_seq(expected[rec.msg_id])
            seqs = [e.seq or 0 for e in history]
            assert seqs == sorted(set(seqs))
        assert store.claimable(queue, "a", T0, 10) == [
            r.msg_id for r in sorted(records, key=lambda r: -r.priority)
        ]

    def test_the_journal_holds_one_entry_per_message_per_transition_in_order(
        self, store: IndexStore, queue: str
    ) -> None:
        _, writes = self._create(store, queue, 4)
        start = store.journal(0, 100_000)
        mine = [e for e in start if e.queue == queue]
        assert sorted(without_seq(mine), key=repr) == sorted(
            without_seq([e for _, e in writes.flat()]), key=repr
        )
        seqs = [e.seq or 0 for e in start]
        assert seqs == sorted(set(seqs))
        # Read a few at a time, the reader's cursor inside a batch's entries.
        got = []
        after = 0
        while True:
            page = store.journal(after, 3)
            if not page:
                break
            got += page
            after = page[-1].seq or 0
        assert without_seq(got) == without_seq(start)

    def test_a_created_record_whose_msg_id_is_taken_writes_nothing(
        self, store: IndexStore, queue: str
    ) -> None:
        [first], _ = self._create(store, queue, 1)
        items = _items(2)
        items[1] = (first.msg_id, *items[1][1:])
        records, journal = engine_batch.create(queue, Audience(("a",)), T0 + SEC, items)
        flags = store.commit_writes(Writes(queue, created=records, journal=journal))
        assert flags == [True, False]
        assert store.load(first.msg_id).created_at == T0
        assert len(store.history(first.msg_id)) == 3  # PUT, REVEALED, AVAILABLE: its own
        assert len(store.history(records[0].msg_id)) == 3

    def test_moves_hold_only_where_the_version_is_still_the_one_moved_from(
        self, store: IndexStore, queue: str
    ) -> None:
        records, _ = self._create(store, queue, 3)
        loaded = [store.load(r.msg_id) for r in records]
        # Someone else claims the second meanwhile.
        other = engine.claim(loaded[1], "a", T0 + SEC, token="x", owner="o", lease_until=None)
        store.commit(other)
        tokens = ["t0", "t1", "t2"]
        moved, journal, off = engine_batch.claim(
            loaded, "a", T0 + 2 * SEC, tokens, owner="me", lease_until=T0 + 30 * SEC
        )
        assert off == []
        flags = store.commit_writes(Writes(queue, moved=moved, journal=journal))
        assert flags == [True, False, True]
        assert store.load(records[0].msg_id).members["a"].lease_token == "t0"
        assert store.load(records[1].msg_id).members["a"].lease_token == "x"
        assert [e.dst for e in store.history(records[1].msg_id)][-2:] == ["GET", "FETCHED"]
        assert len(store.history(records[1].msg_id)) == 5  # the other claim's, not ours
        assert store.claimable(queue, "a", T0 + 3 * SEC, 10) == []

    def test_a_claimed_then_done_batch_journals_the_publisher_once_all_are_done(
        self, store: IndexStore, queue: str
    ) -> None:
        records, _ = self._create(store, queue, 3)
        loaded = [store.load(r.msg_id) for r in records]
        tokens = ["t0", "t1", "t2"]
        moved, journal, _ = engine_batch.claim(
            loaded, "a", T0 + SEC, tokens, owner="me", lease_until=None
        )
        assert store.commit_writes(Writes(queue, moved=moved, journal=journal)) == [True] * 3
        after = [a for _, a in moved]
        settled, journal, off = engine_batch.settle(after, "a", tokens, "done", T0 + 2 * SEC)
        assert off == []
        assert store.commit_writes(Writes(queue, moved=settled, journal=journal)) == [True] * 3
        for rec in records:
            loaded_again = store.load(rec.msg_id)
            assert loaded_again.publisher_state is PublisherState.JOURNALLED
            assert [e.dst for e in store.history(rec.msg_id)] == [
                "PUT",
                "REVEALED",
                "AVAILABLE",
                "GET",
                "FETCHED",
                "DONE",
                "JOURNALLED",
                "JOURNALLED",
            ]

    def test_changes_commit_beside_the_templates(self, store: IndexStore, queue: str) -> None:
        records, _ = self._create(store, queue, 2)
        loaded = [store.load(r.msg_id) for r in records]
        change = engine.withdraw(loaded[1], T0 + SEC, "no longer")
        moved, journal, _ = engine_batch.claim(
            loaded[:1], "a", T0 + SEC, ["t"], owner="me", lease_until=None
        )
        writes = Writes(queue, moved=moved, journal=journal, changes=[change])
        assert store.commit_writes(writes) == [True, True]
        assert store.load(records[1].msg_id).publisher_state is PublisherState.JOURNALLED
        assert store.load(records[0].msg_id).members["a"].state is S.FETCHED

    def test_retained_copies_come_with_the_created_records(
        self, store: IndexStore, queue: str
    ) -> None:
        records, journal = engine_batch.create(queue, Audience(("a",)), T0, _items(2))
        kept = [Retained(b"one", {"h": "1"}), Retained(b"two", {})]
        writes = Writes(queue, created=records, retain=list(kept), journal=journal)
        assert store.commit_writes(writes) == [True, True]
        got = store.retained([r.msg_id for r in records])
        assert [got[r.msg_id].body for r in records] == [b"one", b"two"]
        assert dict(got[records[0].msg_id].headers) == {"h": "1"}

    def test_nothing_to_write_is_no_round_trip(self, store: IndexStore, queue: str) -> None:
        assert store.commit_writes(Writes(queue)) == []
