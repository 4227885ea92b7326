"""Index store contract, the queries: the claim order (claimable, redeliverable), due
work, histories and the journal, search on index fields, purge, queues and subscriptions."""

from __future__ import annotations

from typing import Any

import pytest

from iqbridge import engine
from iqbridge.errors import MessageNotFound
from iqbridge.ids import new_token
from iqbridge.model import (
    Filter,
    JournalEntry,
    Pool,
    QueueCounts,
    Subscriptions,
    from_micros,
    tally,
)
from iqbridge.states import Mode, PublisherState, SubscriberState
from iqbridge.stores.base import Counting, IndexStore, PurgedMessage
from iqbridge.testing.store_contract_base import SEC, T0, StoreContractBase, unique, without_seq

P = PublisherState
S = SubscriberState


class QueryTests(StoreContractBase):
    """Claim order, due work, history and journal, search, purge, queues and
    subscriptions."""

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

    def test_search_says_what_each_journalled_member_was_journalled_after(
        self, store: IndexStore, queue: str
    ) -> None:
        """A JOURNALLED member's summary outcome: DONE (it did the work), EXPIRED (its
        pool went to another member) or UNUSABLE; members not journalled have none."""
        pool = Pool("workers", ("w1", "w2"))
        mid = self.put(store, queue, to=("c", "d"), pools=(pool,)).msg_id
        won = self.claim(store, mid, "w1").record.members["w1"].lease_token
        self.move(store, mid, lambda r: engine.done(r, "w1", won, T0 + SEC))
        bad = self.claim(store, mid, "c").record.members["c"].lease_token
        self.move(store, mid, lambda r: engine.unusable(r, "c", bad, T0 + SEC, "no schema"))
        [hit] = store.search(queue, Filter(msg_id=mid))
        assert dict(hit.subscribers) == {
            "c": S.JOURNALLED,
            "d": S.AVAILABLE,
            "w1": S.JOURNALLED,
            "w2": S.JOURNALLED,
        }
        assert dict(hit.outcomes) == {"c": S.UNUSABLE, "w1": S.DONE, "w2": S.EXPIRED}

    def test_search_by_parent_finds_the_children(self, store: IndexStore, queue: str) -> None:
        parent = self.put(store, queue).msg_id
        # Ids with LIKE wildcards and JSON escapes must match only themselves.
        odd = 'p%_\\x"y'
        first = self.put(store, queue, parents=(parent,)).msg_id
        self.put(store, queue, parents=(parent.upper(),))  # not the parent: another id
        both = self.put(store, queue, parents=("other", parent)).msg_id
        odd_child = self.put(store, queue, parents=(odd,)).msg_id
        self.put(store, queue, parents=("p%_x",))
        other = unique()
        store.declare_queue(other)
        self.put(store, other, parents=(parent,))  # another queue's child
        hits = store.search(queue, Filter(parent=parent))
        assert [h.msg_id for h in hits] == [first, both]
        assert all(parent in h.parents for h in hits)
        assert [h.msg_id for h in store.search(queue, Filter(parent=odd))] == [odd_child]
        assert store.search(queue, Filter(parent="nobody")) == []

    # --- counts --------------------------------------------------------------------------

    def test_counts_per_state_and_the_oldest_undone(self, store: IndexStore, queue: str) -> None:
        self.put(store, queue, to=("b",))  # T0: b AVAILABLE
        fetched = self.put(store, queue, now=T0 + SEC).msg_id
        self.claim(store, fetched, "a", now=T0 + SEC)
        self.put(store, queue, to=("a", "b"), confirm=True, now=T0 + 2 * SEC)  # not revealed
        done = self.put(store, queue, to=("a", "b"), now=T0 + 3 * SEC).msg_id
        token = self.claim(store, done, "a", now=T0 + 3 * SEC).record.members["a"].lease_token
        self.move(store, done, lambda r: engine.done(r, "a", token, T0 + 4 * SEC))
        other = unique()
        store.declare_queue(other)
        self.put(store, other)
        want = QueueCounts(
            queue,
            4,
            {P.REVEALED: 3, P.PUT: 1},
            {"a": {S.FETCHED: 1, S.JOURNALLED: 1}, "b": {S.AVAILABLE: 2}},
            {"a": from_micros(T0 + SEC), "b": from_micros(T0)},
        )
        tallied = tally(queue, store.search(queue, Filter(limit=1000)))
        assert tallied == want
        if isinstance(store, Counting):
            assert store.counts(queue) == want
        empty = unique()
        store.declare_queue(empty)
        assert tally(empty, store.search(empty, Filter())) == QueueCounts(empty, 0, {}, {}, {})
        if isinstance(store, Counting):
            assert store.counts(empty) == QueueCounts(empty, 0, {}, {}, {})

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
        history_before = store.history(old)
        assert store.purge(queue, T0 + 10 * SEC) == [PurgedMessage(old, "ref-old")]
        with pytest.raises(MessageNotFound):
            store.load(old)
        assert store.search(queue, Filter(msg_id=old)) == []
        assert store.journal(0, 100_000) == journal_before
        # The journal stays, and so does the purged message's history.
        assert store.history(old) == history_before
        assert [e.dst for e in history_before][-1] == P.JOURNALLED.value
        with pytest.raises(MessageNotFound):
            store.history(unique())
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

    # --- purge of listed messages (a purge plan) ----------------------------------------

    def journalled(self, store: IndexStore, queue: str, at: int = T0, **fields: Any) -> str:
        """A message put and then withdrawn at ``at`` (publisher JOURNALLED); its id."""
        msg_id = self.put(store, queue, **fields).msg_id
        self.move(store, msg_id, lambda r: engine.withdraw(r, at))
        return msg_id

    def test_purge_of_listed_ids_removes_only_those(self, store: IndexStore, queue: str) -> None:
        first = self.journalled(store, queue, native_ref="ref-1")
        unlisted = self.journalled(store, queue)
        third = self.journalled(store, queue, native_ref="ref-3")
        journal_before = store.journal(0, 100_000)
        # Listed out of put order: they come back in put order.
        gone = store.purge(queue, T0 + SEC, ids=[third, first])
        assert gone == [PurgedMessage(first, "ref-1"), PurgedMessage(third, "ref-3")]
        for msg_id in (first, third):
            with pytest.raises(MessageNotFound):
                store.load(msg_id)
            assert store.search(queue, Filter(msg_id=msg_id)) == []
        assert store.load(unlisted).publisher_state is P.JOURNALLED
        assert store.journal(0, 100_000) == journal_before
        assert any(e.msg_id == first for e in journal_before)
        assert store.history(first) == [e for e in journal_before if e.msg_id == first]
        assert store.purge(queue, T0 + SEC, ids=[third, first]) == []

    def test_purge_of_listed_ids_keeps_those_not_journalled_or_too_recent(
        self, store: IndexStore, queue: str
    ) -> None:
        open_ = self.put(store, queue).msg_id
        recent = self.journalled(store, queue, at=T0 + 10 * SEC)
        rerevealed = self.put(store, queue).msg_id
        token = new_token()
        self.move(
            store,
            rerevealed,
            lambda r: engine.claim(r, "a", T0, token=token, owner="o", lease_until=None),
        )
        self.move(store, rerevealed, lambda r: engine.unusable(r, "a", token, T0, "poison"))
        assert store.load(rerevealed).publisher_state is P.JOURNALLED
        self.move(store, rerevealed, lambda r: engine.rereveal(r, "a", T0 + SEC))
        listed = [open_, recent, rerevealed]
        assert store.purge(queue, T0 + 10 * SEC, ids=listed) == []
        for msg_id in listed:
            store.load(msg_id)
        # Last changed exactly at ``before`` is not before it; a microsecond later it is.
        assert [p.msg_id for p in store.purge(queue, T0 + 10 * SEC + 1, ids=listed)] == [recent]
        assert store.load(rerevealed).members["a"].state is S.AVAILABLE

    def test_purge_of_listed_ids_ignores_unknown_ids_and_other_queues(
        self, store: IndexStore, queue: str
    ) -> None:
        other = unique()
        store.declare_queue(other)
        elsewhere = self.journalled(store, other)
        mine = self.journalled(store, queue)
        listed = ["no-such-message", elsewhere, mine, mine]
        assert store.purge(queue, T0 + SEC, ids=[]) == []
        store.load(mine)
        assert [p.msg_id for p in store.purge(queue, T0 + SEC, ids=listed)] == [mine]
        assert store.load(elsewhere).queue == other
        assert store.purge(unique(), T0 + SEC, ids=[elsewhere]) == []
        assert [p.msg_id for p in store.purge(other, T0 + SEC)] == [elsewhere]

    def test_purge_of_listed_ids_stops_at_the_limit_in_put_order(
        self, store: IndexStore, queue: str
    ) -> None:
        ids = [self.journalled(store, queue) for _ in range(3)]
        first = store.purge(queue, T0 + SEC, limit=2, ids=ids[::-1])
        assert [p.msg_id for p in first] == ids[:2]
        assert [p.msg_id for p in store.purge(queue, T0 + SEC, limit=2, ids=ids)] == ids[2:]

    def test_purge_of_many_listed_ids_spans_the_store_chunks(
        self, store: IndexStore, queue: str
    ) -> None:
        kept = self.journalled(store, queue)
        ids = [self.journalled(store, queue) for _ in range(3)]
        # More ids than one IN (...) list or one script call takes at a time.
        listed = [f"unknown-{n}" for n in range(1200)] + ids
        assert [p.msg_id for p in store.purge(queue, T0 + SEC, ids=listed)] == ids
        store.load(kept)

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
