"""``Queue.counts()`` on the embedded SQLite queue (its store's own grouped query) and on
the memory broker (the facade's tally of a search), and the asyncio twin."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import iqbridge
from iqbridge import PublisherState, SubscriberState, aio

S = SubscriberState
P = PublisherState


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_counts_follow_the_traffic(tmp_path: Path, kind: str) -> None:
    url = f"sqlite:///{tmp_path}/q.db" if kind == "sqlite" else "memory://"
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders")
        q.subscribe("billing", "audit")
        first = q.put({"n": 1})
        q.put({"n": 2})
        q.put({"n": 3}, confirm=True)
        d = q.get("billing")
        assert d is not None and d.msg_id == first
        d.done()
        held = q.get("billing")
        assert held is not None
        c = q.counts()
        assert (c.queue, c.messages) == ("orders", 3)
        assert c.publisher == {P.REVEALED: 2, P.PUT: 1}
        assert c.subscribers == {
            "billing": {S.JOURNALLED: 1, S.FETCHED: 1},
            "audit": {S.AVAILABLE: 2},
        }
        assert c.oldest_undone["audit"] == q.state(first).publisher_history[0][1]
        assert c.oldest_undone["billing"] == q.state(held.msg_id).publisher_history[0][1]
        held.done()
        assert "billing" not in q.counts().oldest_undone

    if kind == "sqlite":  # a second memory:// hub would be a broker of its own

        async def twin() -> None:
            async with await aio.connect(url) as ahub:
                counts = await ahub.queue("orders").counts()
                assert counts.subscribers["billing"] == {S.JOURNALLED: 2}

        asyncio.run(twin())
