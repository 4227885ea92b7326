"""The record JSON cut around its size (the Redis put's template for alike messages)."""

from __future__ import annotations

import dataclasses

from iqbridge import engine_batch
from iqbridge.model import Audience, Pool
from iqbridge.stores.codec import record_from_json, record_json_around_size, record_to_json


def test_the_json_around_the_size_makes_the_record_json_of_every_size() -> None:
    items: list[engine_batch.NewItem] = [
        ("m1", "pub", "key", 'c"1', 9, ("p1", "p2"), 1_800_000_060_000_000, "text/plain", 7),
    ]
    audience = Audience(("a", "b"), (Pool("pool", ("m1", "m2")),))
    [rec], _ = engine_batch.create("q", audience, 1_800_000_000_000_000, items)
    before, after = record_json_around_size(rec)
    for size in (0, 7, 10_000, 2**40):
        text = before + str(size) + after
        assert text == record_to_json(dataclasses.replace(rec, size=size))
        back = record_from_json("m1", text, version=1, seq=None, native_ref=None)
        assert back.size == size
        assert dataclasses.replace(back, size=rec.size) == rec
