"""The batch engine decides exactly what the per-message engine decides.

For random batches (audiences with pools, confirm, time limits, retry delays, locks,
states along a message's life, stale tokens), every message the batch engine moves ends
in the record the per-message engine makes, with the same journal entries, and every
message it leaves off its common path is one the per-message engine moves differently
or refuses.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from iqbridge import engine, engine_batch
from iqbridge.errors import IQError
from iqbridge.model import Audience, MessageRecord, Pool
from iqbridge.writes import Writes

NOW = 1_800_000_000_000_000


def _state(rec: MessageRecord) -> dict[str, Any]:
    out = dict(rec.__dict__)
    out["members"] = {k: dict(m.__dict__) for k, m in rec.members.items()}
    return out


def _audience(pooled: bool, extra: int) -> Audience:
    """``s`` named, or in the pool ``p`` with ``w1``; plus ``extra`` named others."""
    names = tuple(f"s{i}" for i in range(extra))
    if pooled:
        return Audience(names, (Pool("p", ["s", "w1"]),))
    return Audience(("s", *names), ())


def _new(i: int, audience: Audience, confirm: bool, ttl: int | None) -> MessageRecord:
    return engine.new_message(
        msg_id=f"m{i}",
        queue="q",
        publisher="pub",
        audience=audience,
        now=NOW,
        priority=i % 10,
        expires_at=NOW + ttl if ttl is not None else None,
        confirm=confirm,
    ).record


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, 6),
    pooled=st.booleans(),
    extra=st.integers(0, 2),
    confirm=st.booleans(),
    ttl=st.one_of(st.none(), st.integers(1, 10**7)),
)
def test_create_is_new_message(
    count: int, pooled: bool, extra: int, confirm: bool, ttl: int | None
) -> None:
    audience = _audience(pooled, extra)
    items = [
        (f"m{i}", "pub", None, None, i % 10, (), NOW + ttl if ttl else None, "text/plain", 3)
        for i in range(count)
    ]
    records, journal = engine_batch.create("q", audience, NOW, items, confirm=confirm)
    writes = Writes("q", created=records, journal=journal)
    entries = writes.entries()
    for item, rec in zip(items, records, strict=True):
        want = engine.new_message(
            msg_id=item[0],
            queue="q",
            publisher="pub",
            audience=audience,
            now=NOW,
            priority=item[4],
            expires_at=item[6],
            content_type="text/plain",
            size=3,
            confirm=confirm,
        )
        assert _state(rec) == _state(want.record)
        assert entries[rec.msg_id] == want.journal


# A message's life up to a point, by the per-message engine: (steps, then the subscriber
# whose turn it is). Each step: "get:<who>", "done:<who>", "release:<who>", "lock".
LIVES = [
    [],
    ["get:s"],
    ["get:s", "process:s"],
    ["get:s", "done:s"],
    ["get:s", "release:s"],
    ["get:s", "release-later:s"],
    ["get:w1"],
    ["lock"],
    ["lock-lapsed"],
    ["get:s", "unusable:s"],
]


def _live(rec: MessageRecord, life: list[str], now: int) -> tuple[MessageRecord, dict[str, str]]:
    tokens: dict[str, str] = {}
    for step in life:
        what, _, who = step.partition(":")
        if who and who not in rec.members:
            continue
        if what == "get":
            tokens[who] = f"t-{who}"
            rec = engine.claim(
                rec, who, now, token=tokens[who], owner="o", lease_until=now + 30
            ).record
        elif what == "process":
            rec = engine.process(rec, who, tokens[who], now).record
        elif what == "done":
            rec = engine.done(rec, who, tokens[who], now).record
        elif what == "unusable":
            rec = engine.unusable(rec, who, tokens[who], now, "bad").record
        elif what in ("release", "release-later"):
            delay = 10**9 if what == "release-later" else 0
            rec = engine.release(rec, who, tokens[who], now, delay_us=delay).record
        elif what in ("lock", "lock-lapsed"):
            until = now - 1 if what == "lock-lapsed" else now + 10**9
            rec = engine.lock(rec, "L", "browser", now, until).record
    return rec, tokens


lives = st.lists(
    st.tuples(st.sampled_from(range(len(LIVES))), st.booleans(), st.booleans()),
    min_size=1,
    max_size=6,
)


@settings(max_examples=80, deadline=None)
@given(lives=lives, later=st.integers(0, 5 * 10**7))
def test_claim_is_claim(lives: list[tuple[int, bool, bool]], later: int) -> None:
    at = NOW + later
    records = []
    for i, (life, pooled, expiring) in enumerate(lives):
        rec = _new(i, _audience(pooled, 1), False, 10**7 if expiring else None)
        rec, _ = _live(rec, LIVES[life], NOW)
        records.append(rec)
    tokens = [f"new-{i}" for i in range(len(records))]
    moved, journal, off = engine_batch.claim(
        records, "s", at, tokens, owner="me", lease_until=at + 5
    )
    entries = Writes("q", moved=moved, journal=journal).entries()
    positions = {r.msg_id: i for i, r in enumerate(records)}
    assert sorted(off + [positions[b.msg_id] for b, _ in moved]) == list(range(len(records)))
    for before, after in moved:
        i = positions[before.msg_id]
        want = engine.claim(before, "s", at, token=tokens[i], owner="me", lease_until=at + 5)
        assert _state(after) == _state(want.record)
        assert entries[after.msg_id] == want.journal
        assert _state(before) == _state(records[i])  # the input record is untouched
    for i in off:
        rec = records[i]
        try:
            want = engine.claim(rec, "s", at, token=tokens[i], owner="me", lease_until=at + 5)
        except IQError:
            continue
        # Off the common path but legal: a pool member's claim, which expires others.
        assert rec.members["s"].pool is not None or len(want.journal) != 2


@settings(max_examples=80, deadline=None)
@given(
    lives=lives,
    kind=st.sampled_from(["done", "process"]),
    stale=st.booleans(),
    later=st.integers(0, 10**6),
    auto=st.booleans(),
)
def test_settle_is_done_or_process(
    lives: list[tuple[int, bool, bool]], kind: str, stale: bool, later: int, auto: bool
) -> None:
    at = NOW + later
    records = []
    tokens: list[str | None] = []
    for i, (life, pooled, expiring) in enumerate(lives):
        rec = _new(i, _audience(pooled, 1), False, 10**7 if expiring else None)
        rec, held = _live(rec, LIVES[life], NOW)
        records.append(rec)
        token = held.get("s")
        tokens.append("stale" if stale and token else token)
    moved, journal, off = engine_batch.settle(records, "s", tokens, kind, at, auto_journal=auto)
    entries = Writes("q", moved=moved, journal=journal).entries()
    positions = {r.msg_id: i for i, r in enumerate(records)}
    for before, after in moved:
        i = positions[before.msg_id]
        if kind == "done":
            want = engine.done(before, "s", tokens[i], at, auto_journal=auto)
        else:
            want = engine.process(before, "s", tokens[i], at)
        assert _state(after) == _state(want.record)
        assert entries[after.msg_id] == want.journal
        assert _state(before) == _state(records[i])
    for i in off:
        rec = records[i]
        try:
            if kind == "done":
                engine.done(rec, "s", tokens[i], at, auto_journal=auto)
            else:
                engine.process(rec, "s", tokens[i], at)
        except IQError:
            continue
        raise AssertionError(f"{rec.msg_id} was left off but the engine moves it")


def test_as_changes_gives_a_change_per_record_in_order() -> None:
    audience = _audience(False, 1)
    items = [("a", "pub", None, None, 4, (), None, "text/plain", 1)]
    records, journal = engine_batch.create("q", audience, NOW, items)
    writes = Writes("q", created=records, journal=journal)
    [change] = writes.as_changes()
    assert change.created and change.expected_version == 0
    assert change.dirty == {"s", "s0"}
    assert writes.created[0].members["s"].state is not None
    assert [e.dst for e in change.journal] == ["PUT", "REVEALED", "AVAILABLE", "AVAILABLE"]
