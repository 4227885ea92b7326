"""Index store contract, retained payload copies: written with the creation and only
then, byte-exact, and removed by a purge."""

from __future__ import annotations

import pytest

from iqbridge import engine
from iqbridge.ids import new_id, new_token
from iqbridge.model import Retained
from iqbridge.stores.base import IndexStore, StaleRecord
from iqbridge.testing.store_contract_base import SEC, T0, StoreContractBase, without_seq


class RetainedCopyTests(StoreContractBase):
    """Retained payload copies (``Change.retain`` and ``retained``)."""

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
