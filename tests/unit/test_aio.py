"""The asyncio API drives the same core as the sync one."""

from __future__ import annotations

import asyncio

import pytest

from iqbridge import SubscriberState, aio


def test_async_round_trip(sqlite_url: str) -> None:
    async def main() -> None:
        async with await aio.connect(sqlite_url) as hub:
            q = hub.queue("orders")
            msg_id = await q.put({"n": 1}, to=["billing"])
            async with await q.get("billing", timeout=1) as d:  # type: ignore[union-attr]
                assert d.payload == {"n": 1}
                assert d.msg_id == msg_id
            state = await q.state(msg_id)
            assert state.subscribers["billing"].state is SubscriberState.JOURNALLED
            assert await q.get("billing") is None

    asyncio.run(main())


def test_async_failure_follows_retry_policy(sqlite_url: str) -> None:
    async def main() -> None:
        async with await aio.connect(sqlite_url) as hub:
            q = hub.queue("orders")
            msg_id = await q.put(b"x", to=["s"])
            d = await q.get("s")
            assert d is not None
            with pytest.raises(RuntimeError):
                async with d:
                    raise RuntimeError("boom")
            view = (await q.state(msg_id)).subscribers["s"]
            assert view.state is SubscriberState.AVAILABLE
            assert view.attempt == 2
            assert view.reason == "RuntimeError: boom"

    asyncio.run(main())
