"""The index store contract: batches moved where the store keeps the messages, by a plan
from the transition table, without records: a claim of ready messages
(:meth:`~iqbridge.stores.base.ClaimsReady.claim_ready`), a claim of the messages of
broker entries a consumer group delivered
(:meth:`~iqbridge.stores.base.ClaimsReceived.claim_received`) and a done or in process of
held ones (:meth:`~iqbridge.stores.base.SettlesHeld.settle_held`). A store that does not
offer one (the memory store's claim of ready messages: the facade
decides those batches with the batch engine) skips its tests. See
:mod:`iqbridge.testing.store_contract`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from iqbridge import engine, engine_batch
from iqbridge.ids import new_id, new_token
from iqbridge.model import Audience, Filter, JournalEntry, MessageRecord, Pool
from iqbridge.states import PublisherState, SubscriberState
from iqbridge.stores.base import ClaimsReady, ClaimsReceived, Counting, IndexStore, SettlesHeld
from iqbridge.testing.store_contract_base import SEC, T0, StoreContractBase, unique
from iqbridge.writes import Writes

__all__ = ["ClaimReadyTests", "ClaimReceivedTests", "SettleHeldTests"]

S = SubscriberState
LEASE = 30 * SEC


def _settler(store: IndexStore) -> SettlesHeld:
    if not isinstance(store, SettlesHeld):
        pytest.skip("the store settles no held messages itself (the batch engine does)")
    return store


def _claimer(store: IndexStore) -> ClaimsReady:
    if not isinstance(store, ClaimsReady):
        pytest.skip("the store claims no ready messages itself (the batch engine does)")
    return store


def _receiver(store: IndexStore) -> ClaimsReceived:
    if not isinstance(store, ClaimsReceived):
        pytest.skip("the store claims no broker entries itself (the batch engine does)")
    return store


def _shape(rec: MessageRecord) -> tuple[Any, ...]:
    """What a settle may change of a record, without its identity."""
    members = tuple(
        (
            m.subscriber,
            m.state,
            m.outcome,
            m.attempt,
            m.lease_owner,
            m.lease_until,
            m.not_before,
            m.updated_at,
        )
        for m in sorted(rec.members.values(), key=lambda m: m.subscriber)
    )
    return (rec.publisher_state, rec.updated_at, rec.version, members)


class SettleHeldTests(StoreContractBase):
    """A held batch settled where it is kept moves exactly as the batch engine moves it
    on records, journal included; what is off the common path is left as it is."""

    def _held(
        self, store: IndexStore, queue: str, count: int, to: Sequence[str], **fields: Any
    ) -> tuple[list[str], list[str]]:
        """``count`` new messages to ``to``, claimed by "a" in one batch: their ids and
        lease tokens."""
        items: list[engine_batch.NewItem] = [
            (new_id(), "pub", None, None, 0, (), fields.get("expires_at"), "text/plain", 1)
            for _ in range(count)
        ]
        records, journal = engine_batch.create(queue, Audience(tuple(to)), T0, items)
        assert (
            store.commit_writes(Writes(queue, created=records, journal=journal)) == [True] * count
        )
        tokens = [new_token() for _ in records]
        moved, steps, off = engine_batch.claim(
            records, "a", T0 + SEC, tokens, owner="a@contract", lease_until=T0 + SEC + LEASE
        )
        assert off == []
        assert store.commit_writes(Writes(queue, moved=moved, journal=steps)) == [True] * count
        return [r.msg_id for r in records], tokens

    def _by_engine(
        self, store: IndexStore, queue: str, ids: Sequence[str], tokens: Sequence[str], kind: str
    ) -> None:
        """The reference: the batch engine's settle on the records, committed."""
        loaded = store.load_many(ids)
        moved, steps, off = engine_batch.settle(
            [loaded[i] for i in ids], "a", tokens, kind, T0 + 2 * SEC
        )
        assert off == []
        assert store.commit_writes(Writes(queue, moved=moved, journal=steps)) == [True] * len(ids)

    @pytest.mark.parametrize("to", [("a",), ("a", "b")])
    def test_settle_held_moves_as_the_batch_engine_does(
        self, store: IndexStore, queue: str, to: tuple[str, ...]
    ) -> None:
        settler = _settler(store)
        mine, mine_tokens = self._held(store, queue, 6, to)
        ref, ref_tokens = self._held(store, queue, 6, to)
        plan = engine_batch.settle_plan("a", "done")
        held = list(zip(mine, mine_tokens, strict=True))
        flags = settler.settle_held(queue, plan, T0 + 2 * SEC, held)
        assert flags == [True] * 6
        self._by_engine(store, queue, ref, ref_tokens, "done")
        got, want = store.load_many(mine), store.load_many(ref)
        for a, b in zip(mine, ref, strict=True):
            assert _shape(got[a]) == _shape(want[b])
            assert got[a].members["a"].state is S.JOURNALLED
            assert got[a].members["a"].outcome is S.DONE
            journalled = PublisherState.JOURNALLED if to == ("a",) else PublisherState.REVEALED
            assert got[a].publisher_state is journalled
            assert _entries(store.history(a)) == _entries(store.history(b))
        # Every reader sees one entry per message per transition: the journal too.
        journal = [e for e in store.journal(0, 1_000_000) if e.msg_id in set(mine)]
        assert len(journal) == sum(len(store.history(i)) for i in mine)
        # The settled leases no longer make the messages due.
        due = set(store.due(queue, T0 + 2 * SEC + LEASE, 100))
        assert due.isdisjoint(mine) and due.isdisjoint(ref)

    def test_in_process_then_done(self, store: IndexStore, queue: str) -> None:
        settler = _settler(store)
        ids, tokens = self._held(store, queue, 3, ("a",))
        held = list(zip(ids, tokens, strict=True))
        process = engine_batch.settle_plan("a", "process")
        assert settler.settle_held(queue, process, T0 + 2 * SEC, held) == [True] * 3
        assert {r.members["a"].state for r in store.load_many(ids).values()} == {S.IN_PROCESS}
        # In process only from FETCHED: a second time it is off the plan's path.
        assert settler.settle_held(queue, process, T0 + 3 * SEC, held) == [False] * 3
        done = engine_batch.settle_plan("a", "done")
        assert settler.settle_held(queue, done, T0 + 3 * SEC, held) == [True] * 3
        for msg_id in ids:
            moves = [(e.src, e.dst) for e in store.history(msg_id) if e.actor == "a"]
            assert moves[-3:] == [
                ("FETCHED", "IN_PROCESS"),
                ("IN_PROCESS", "DONE"),
                ("DONE", "JOURNALLED"),
            ]

    def test_settle_held_leaves_what_is_off_the_common_path(
        self, store: IndexStore, queue: str
    ) -> None:
        settler = _settler(store)
        ids, tokens = self._held(store, queue, 3, ("a",))
        limited, limited_tokens = self._held(store, queue, 1, ("a",), expires_at=T0 + 3600 * SEC)
        locked, locked_tokens = self._held(store, queue, 1, ("a",))
        self.move(
            store,
            locked[0],
            lambda r: engine.lock(r, "lock-1", "someone", T0 + SEC, T0 + 3600 * SEC),
        )
        available = self.put(store, queue).msg_id
        other = unique()
        store.declare_queue(other)
        elsewhere, elsewhere_tokens = self._held(store, other, 1, ("a",))
        held = [
            (ids[0], "not-the-token"),
            (ids[1], tokens[1]),
            (ids[1], tokens[1]),  # repeated: moved once
            ("no-such-message", "t"),
            (limited[0], limited_tokens[0]),
            (locked[0], locked_tokens[0]),
            (available, "t"),
            (elsewhere[0], elsewhere_tokens[0]),
        ]
        untouched = [ids[0], limited[0], locked[0], available, elsewhere[0]]
        before = store.load_many(untouched)
        histories = {i: store.history(i) for i in untouched}
        plan = engine_batch.settle_plan("a", "done")
        flags = settler.settle_held(queue, plan, T0 + 2 * SEC, held)
        assert flags == [False, True, False, False, False, False, False, False]
        after = store.load_many(untouched)
        for msg_id in untouched:
            assert after[msg_id].version == before[msg_id].version
            assert _shape(after[msg_id]) == _shape(before[msg_id])
            assert store.history(msg_id) == histories[msg_id]
        assert store.load(ids[1]).members["a"].state is S.JOURNALLED
        assert store.load(ids[2]).members["a"].state is S.FETCHED
        assert settler.settle_held(queue, plan, T0 + 2 * SEC, []) == []


def _entries(history: Sequence[JournalEntry]) -> list[tuple[Any, ...]]:
    """History entries without their message, queue and seq."""
    return [(e.actor, e.actor_kind, e.src, e.dst, e.at, e.attempt, e.detail) for e in history]


def _at_once(count: int, work: Callable[[], list[Any]]) -> list[Any]:
    """Run ``work`` in ``count`` threads started together; every claim they made."""
    start = threading.Barrier(count)
    with ThreadPoolExecutor(count) as pool:

        def run() -> list[Any]:
            start.wait()
            return work()

        futures = [pool.submit(run) for _ in range(count)]
        return [c for f in futures for c in f.result(timeout=120)]


def _claimed_once(store: IndexStore, ids: list[str], claims: list[Any]) -> None:
    """Claims made at once by several claimers took every message once, none twice, each
    held under the token its claim returned and journalled once."""
    assert sorted(c[0] for c in claims) == sorted(ids)
    for msg_id, _, _, _, token in claims:
        assert store.load(msg_id).members["a"].lease_token == token
        moves = [(e.src, e.dst) for e in store.history(msg_id) if e.actor == "a"]
        assert moves == [(None, "AVAILABLE"), ("AVAILABLE", "GET"), ("GET", "FETCHED")]


def _readers_see_the_claim(
    store: IndexStore, queue: str, claimed: list[str], rest: list[str], until: int
) -> None:
    """Every reader of a member's state answers for ``claimed`` (claimed in place by
    subscriber ``a``) as for a claim of the batch engine: search by state and by
    subscriber, the counts, the due list; ``rest`` still AVAILABLE to ``a``."""
    fetched = store.search(queue, Filter(state=S.FETCHED, subscriber="a", limit=1000))
    assert sorted(h.msg_id for h in fetched) == sorted(claimed)
    ready = store.search(queue, Filter(state=S.AVAILABLE, subscriber="a", limit=1000))
    assert sorted(h.msg_id for h in ready) == sorted(rest)
    if isinstance(store, Counting):
        counts = store.counts(queue)
        assert counts.subscribers["a"].get(S.FETCHED, 0) == len(claimed)
        assert counts.subscribers["a"].get(S.AVAILABLE, 0) == len(rest)
    assert set(claimed) <= set(store.due(queue, until, 1000))
    assert not set(claimed) & set(store.due(queue, until - 1, 1000))


def _stale_reads_are_refused(store: IndexStore, queue: str, before: MessageRecord) -> None:
    """A record read before an in-place claim cannot be moved on that read, in a batch
    or alone: the claim is seen by every compare-and-set."""
    at = T0 + 2 * SEC
    moved, steps, off = engine_batch.claim(
        [before], "a", at, [new_token()], owner="late@contract", lease_until=at + LEASE
    )
    assert off == []
    assert store.commit_writes(Writes(queue, moved=moved, journal=steps)) == [False]
    late = engine.claim(
        before, "a", at, token=new_token(), owner="late@contract", lease_until=at + LEASE
    )
    assert store.commit_each([late]) == [False]
    rec = store.load(before.msg_id)
    assert rec.members["a"].lease_owner == "a@contract"  # the in-place claim's, unchanged


class _Ready(StoreContractBase):
    """New messages put as a batch and known by their broker references."""

    def _put(self, store: IndexStore, queue: str, count: int, **fields: Any) -> list[str]:
        items: list[engine_batch.NewItem] = [
            (new_id(), "pub", None, None, fields.get("priority", 0), (), None, "text/plain", 1)
            for _ in range(count)
        ]
        to = fields.get("to", ("a",))
        records, journal = engine_batch.create(queue, Audience(tuple(to)), T0, items)
        assert (
            store.commit_writes(Writes(queue, created=records, journal=journal)) == [True] * count
        )
        store.set_native_refs([(r.msg_id, f"ref-{r.msg_id}") for r in records])
        return [r.msg_id for r in records]


class ClaimReadyTests(_Ready):
    """Ready messages claimed where they are kept move exactly as the batch engine
    claims them, in claim order; what is off the common path is handed back."""

    @pytest.mark.parametrize("to", [("a",), ("a", "b")])
    def test_claim_ready_claims_as_the_batch_engine_does(
        self, store: IndexStore, queue: str, to: tuple[str, ...]
    ) -> None:
        claimer = _claimer(store)
        mine = self._put(store, queue, 5, to=to)
        at, until = T0 + SEC, T0 + SEC + LEASE
        plan = engine_batch.claim_plan("a", "a@contract", until)
        tokens = [new_token() for _ in range(5)]
        claimed, off = claimer.claim_ready(queue, plan, at, tokens)
        assert off == []
        assert [c[0] for c in claimed] == mine  # claim order: priority, then put order
        assert [(c[1], c[2], c[3], c[4]) for c in claimed] == [
            (f"ref-{m}", 1, 5, t) for m, t in zip(mine, tokens, strict=True)
        ]
        ref = self._put(store, queue, 5, to=to)
        loaded = store.load_many(ref)
        moved, steps, _ = engine_batch.claim(
            [loaded[i] for i in ref], "a", at, tokens, owner="a@contract", lease_until=until
        )
        assert store.commit_writes(Writes(queue, moved=moved, journal=steps)) == [True] * 5
        got, want = store.load_many(mine), store.load_many(ref)
        for a, b in zip(mine, ref, strict=True):
            assert _shape(got[a]) == _shape(want[b])
            assert got[a].members["a"].lease_token == want[b].members["a"].lease_token
            assert _entries(store.history(a)) == _entries(store.history(b))
        assert store.claimable(queue, "a", at, 100) == []
        assert set(store.due(queue, until, 100)) == set(mine) | set(ref)
        if to == ("a", "b"):
            assert store.claimable(queue, "b", at, 100) == mine + ref
        # Nothing left: an empty claim.
        assert claimer.claim_ready(queue, plan, at, [new_token()]) == ([], [])

    def test_claim_ready_is_what_every_reader_and_compare_and_set_sees(
        self, store: IndexStore, queue: str
    ) -> None:
        claimer = _claimer(store)
        ids = self._put(store, queue, 6)
        before = store.load(ids[0])  # read before the claim
        until = T0 + SEC + LEASE
        plan = engine_batch.claim_plan("a", "a@contract", until)
        claimed, off = claimer.claim_ready(queue, plan, T0 + SEC, [new_token() for _ in range(4)])
        assert off == [] and [c[0] for c in claimed] == ids[:4]
        _readers_see_the_claim(store, queue, ids[:4], ids[4:], until)
        _stale_reads_are_refused(store, queue, before)

    def test_claim_ready_by_claimers_at_once_claims_each_message_once(
        self, store: IndexStore, queue: str
    ) -> None:
        claimer = _claimer(store)
        ids = self._put(store, queue, 40, to=("a", "b"))
        plan = engine_batch.claim_plan("a", "a@contract", T0 + SEC + LEASE)

        def claim() -> list[Any]:
            got: list[Any] = []
            for _ in range(100):
                claimed, off = claimer.claim_ready(
                    queue, plan, T0 + SEC, [new_token() for _ in range(3)]
                )
                got += claimed
                if not claimed and not off:
                    break
            return got

        _claimed_once(store, ids, _at_once(4, claim))

    def test_claim_ready_takes_priority_first_and_at_most_one_per_token(
        self, store: IndexStore, queue: str
    ) -> None:
        claimer = _claimer(store)
        low = self._put(store, queue, 3, priority=1)
        high = self._put(store, queue, 2, priority=7)
        plan = engine_batch.claim_plan("a", "a@contract", T0 + SEC + LEASE)
        claimed, off = claimer.claim_ready(queue, plan, T0 + SEC, [new_token() for _ in range(3)])
        assert ([c[0] for c in claimed], off) == ([*high, low[0]], [])
        claimed, _ = claimer.claim_ready(queue, plan, T0 + SEC, [new_token() for _ in range(9)])
        assert [c[0] for c in claimed] == low[1:]

    def test_claim_ready_hands_back_what_is_off_the_common_path(
        self, store: IndexStore, queue: str
    ) -> None:
        claimer = _claimer(store)
        plain = self._put(store, queue, 1)[0]
        pooled = self.put(store, queue, to=(), pools=[Pool("a", ["a1", "a2"])]).msg_id
        limited = self.put(store, queue, expires_at=T0 + 3600 * SEC).msg_id
        no_ref = self.put(store, queue).msg_id  # its broker reference not recorded yet
        for msg_id in (pooled, limited):
            store.set_native_refs([(msg_id, f"ref-{msg_id}")])
        before = store.load_many([pooled, limited, no_ref])
        plan = engine_batch.claim_plan("a", "a@contract", T0 + SEC + LEASE)
        claimed, off = claimer.claim_ready(queue, plan, T0 + SEC, [new_token() for _ in range(9)])
        assert [c[0] for c in claimed] == [plain]
        assert sorted(off) == sorted([limited, no_ref])
        # A pool's member: the per-message engine decides who of the pool takes it.
        pool_plan = engine_batch.claim_plan("a1", "a1@contract", T0 + SEC + LEASE)
        assert claimer.claim_ready(queue, pool_plan, T0 + SEC, [new_token()]) == ([], [pooled])
        after = store.load_many([pooled, limited, no_ref])
        for msg_id, rec in before.items():
            assert after[msg_id].version == rec.version
            assert _shape(after[msg_id]) == _shape(rec)


class ClaimReceivedTests(_Ready):
    """The messages of a consumer group's broker entries claimed where they are kept move
    exactly as the batch engine claims them; an entry off the common path, and every
    later entry of its ordering key, is handed back (None) with nothing changed."""

    def test_claim_received_claims_as_the_batch_engine_does(
        self, store: IndexStore, queue: str
    ) -> None:
        receiver = _receiver(store)
        mine = self._put(store, queue, 5, to=("a", "b"))
        at, until = T0 + SEC, T0 + SEC + LEASE
        plan = engine_batch.claim_plan("a", "a@contract", until)
        tokens = [new_token() for _ in range(5)]
        entries = [(m, f"ref-{m}", "") for m in reversed(mine)]  # in the broker's order
        got = receiver.claim_received(queue, plan, at, entries, tokens)
        assert got == [
            (m, f"ref-{m}", 1, 5, t) for m, t in zip(reversed(mine), tokens, strict=True)
        ]
        ref = self._put(store, queue, 5, to=("a", "b"))
        loaded = store.load_many(ref)
        moved, steps, _ = engine_batch.claim(
            [loaded[i] for i in reversed(ref)],
            "a",
            at,
            tokens,
            owner="a@contract",
            lease_until=until,
        )
        assert store.commit_writes(Writes(queue, moved=moved, journal=steps)) == [True] * 5
        got_recs, want = store.load_many(mine), store.load_many(ref)
        for a, b in zip(mine, ref, strict=True):
            assert _shape(got_recs[a]) == _shape(want[b])
            assert got_recs[a].members["a"].lease_token == want[b].members["a"].lease_token
            assert _entries(store.history(a)) == _entries(store.history(b))
        assert store.claimable(queue, "a", at, 100) == []
        assert store.claimable(queue, "b", at, 100) == mine + ref
        assert set(store.due(queue, until, 100)) == set(mine) | set(ref)
        # Entries delivered again: the member is FETCHED now, off the common path.
        again = receiver.claim_received(queue, plan, at, entries[:2], tokens[:2])
        assert again == [None, None]

    def test_claim_received_is_what_every_reader_and_compare_and_set_sees(
        self, store: IndexStore, queue: str
    ) -> None:
        receiver = _receiver(store)
        ids = self._put(store, queue, 6)
        before = store.load(ids[0])  # read before the claim
        until = T0 + SEC + LEASE
        plan = engine_batch.claim_plan("a", "a@contract", until)
        entries = [(m, f"ref-{m}", "") for m in ids[:4]]
        got = receiver.claim_received(
            queue, plan, T0 + SEC, entries, [new_token() for _ in entries]
        )
        assert [c[0] if c else None for c in got] == ids[:4]
        _readers_see_the_claim(store, queue, ids[:4], ids[4:], until)
        _stale_reads_are_refused(store, queue, before)

    def test_claim_received_of_entries_claimed_at_once_claims_each_message_once(
        self, store: IndexStore, queue: str
    ) -> None:
        receiver = _receiver(store)
        ids = self._put(store, queue, 30, to=("a", "b"))
        plan = engine_batch.claim_plan("a", "a@contract", T0 + SEC + LEASE)
        entries = [(m, f"ref-{m}", "") for m in ids]  # delivered to three claimers at once

        def claim() -> list[Any]:
            got = receiver.claim_received(
                queue, plan, T0 + SEC, entries, [new_token() for _ in entries]
            )
            return [c for c in got if c is not None]

        _claimed_once(store, ids, _at_once(3, claim))

    def test_claim_received_hands_back_what_is_off_the_common_path(
        self, store: IndexStore, queue: str
    ) -> None:
        receiver = _receiver(store)
        plain, twice, wrong_ref = self._put(store, queue, 3)
        elsewhere = self._put(store, unique("other"), 1)[0]
        pooled = self.put(store, queue, to=(), pools=[Pool("a", ["a1", "a2"])]).msg_id
        limited = self.put(store, queue, expires_at=T0 + 3600 * SEC).msg_id
        no_ref = self.put(store, queue).msg_id  # its broker reference not recorded yet
        for msg_id in (pooled, limited):
            store.set_native_refs([(msg_id, f"ref-{msg_id}")])
        everyone = [plain, twice, wrong_ref, elsewhere, pooled, limited, no_ref]
        before = store.load_many(everyone)
        entries = [
            (new_id(), "ref-unknown", ""),  # no record (purged, or not yet committed)
            ("", "ref-stranger", ""),  # a stranger's entry (adopted apart)
            (twice, f"ref-{twice}", ""),
            (twice, "ref-again", ""),  # a second entry of one message
            (wrong_ref, "ref-other", ""),  # not the entry the index knows it by
            (elsewhere, f"ref-{elsewhere}", ""),  # another queue's message
            (pooled, f"ref-{pooled}", ""),  # no member "a" (a pool "a" of a1, a2)
            (limited, f"ref-{limited}", ""),  # a time limit
            (no_ref, "ref-late", ""),  # the index has no reference yet
            (plain, f"ref-{plain}", ""),
        ]
        plan = engine_batch.claim_plan("a", "a@contract", T0 + SEC + LEASE)
        tokens = [new_token() for _ in entries]
        got = receiver.claim_received(queue, plan, T0 + SEC, entries, tokens)
        assert [g[0] if g else None for g in got] == [
            None, None, twice, None, None, None, None, None, None, plain,
        ]  # fmt: skip
        # The claims take the tokens in order, one each.
        assert [g[4] for g in got if g] == tokens[:2]
        # A pool's member, through the pool's group: the per-message engine decides who
        # of the pool takes it.
        pool_plan = engine_batch.claim_plan("a1", "a1@contract", T0 + SEC + LEASE)
        pooled_entry = [(pooled, f"ref-{pooled}", "")]
        assert receiver.claim_received(queue, pool_plan, T0 + SEC, pooled_entry, ["t"]) == [None]
        after = store.load_many(everyone)
        for msg_id in (wrong_ref, elsewhere, pooled, limited, no_ref):
            assert after[msg_id].version == before[msg_id].version
            assert _shape(after[msg_id]) == _shape(before[msg_id])
        assert after[plain].members["a"].state is S.FETCHED
        assert after[twice].members["a"].state is S.FETCHED
        assert receiver.claim_received(queue, plan, T0 + SEC, [], []) == []

    def test_claim_received_holds_back_an_ordering_key_after_an_entry_off_the_path(
        self, store: IndexStore, queue: str
    ) -> None:
        receiver = _receiver(store)
        first, second, third, fourth = self._put(store, queue, 4)
        held = self.put(store, queue, expires_at=T0 + 3600 * SEC).msg_id  # off the path
        store.set_native_refs([(held, f"ref-{held}")])
        entries = [
            (first, f"ref-{first}", "k1"),
            (held, f"ref-{held}", "k2"),
            (second, f"ref-{second}", "k2"),  # after k2's entry off the path: held back
            (third, f"ref-{third}", "k1"),
            (fourth, f"ref-{fourth}", ""),  # no key: nothing holds it back
        ]
        plan = engine_batch.claim_plan("a", "a@contract", T0 + SEC + LEASE)
        got = receiver.claim_received(
            queue, plan, T0 + SEC, entries, [new_token() for _ in entries]
        )
        assert [g[0] if g else None for g in got] == [first, None, None, third, fourth]
        assert store.load(second).members["a"].state is S.AVAILABLE
        assert set(store.claimable(queue, "a", T0 + SEC, 100)) == {second, held}
