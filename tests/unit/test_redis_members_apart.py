"""What the Redis index writes apart for a batch move (stores/redis_commit.members_apart):
the moved members' rows and a publisher state that moved, or None (the record JSON is
written whole) when the move changed anything else of the record."""

from __future__ import annotations

import dataclasses

import orjson

import iqbridge
from iqbridge import engine_batch
from iqbridge.model import MessageRecord
from iqbridge.states import PublisherState, SubscriberState
from iqbridge.stores.redis_commit import members_apart


def _put(n: int = 1) -> list[MessageRecord]:
    with iqbridge.connect("memory://") as hub:
        q = hub.queue("q")
        q.subscribe("a")
        q.subscribe("b")
        ids = q.put_many([b"x"] * n)
        return [hub.store.load(i) for i in ids]


def test_a_claim_sends_the_claimed_members_row_only() -> None:
    [rec] = _put()
    [(before, after)], _, _ = engine_batch.claim(
        [rec], "a", rec.updated_at + 1, ["tok"], owner="o", lease_until=None
    )
    text = members_apart(before, after)
    assert text is not None
    ps, name, row = text.split("\n")
    assert (ps, name) == ("-", "a")
    decoded = orjson.loads(row)
    assert decoded[0] == "a" and decoded[2] == SubscriberState.FETCHED.value
    assert decoded[5] == "tok"


def test_the_last_done_sends_the_publisher_state_too() -> None:
    [rec] = _put()
    now = rec.updated_at + 1
    for sub in ("a", "b"):
        [(rec, after)], _, _ = engine_batch.claim(
            [rec], sub, now, [sub], owner="o", lease_until=None
        )
        rec = after
    [(before, after)], _, _ = engine_batch.settle([rec], "a", ["a"], "done", now)
    first = members_apart(before, after)
    assert first is not None and first.split("\n")[:2] == ["-", "a"]
    [(before, after)], _, _ = engine_batch.settle([after], "b", ["b"], "done", now)
    last = members_apart(before, after)
    assert last is not None
    assert last.split("\n")[:2] == [PublisherState.JOURNALLED.value, "b"]


def test_a_move_of_more_than_members_writes_the_record_whole() -> None:
    [rec] = _put()
    [(before, after)], _, _ = engine_batch.claim(
        [rec], "a", rec.updated_at + 1, ["t"], owner="o", lease_until=None
    )
    assert members_apart(before, dataclasses.replace(after, withdrawn=True)) is None
    assert members_apart(before, dataclasses.replace(after, lock_id="L")) is None
    assert members_apart(before, dataclasses.replace(after, publisher_state=None)) is None
    # Nothing moved: no member object of its own.
    assert members_apart(before, dataclasses.replace(before, version=before.version + 1)) is None
