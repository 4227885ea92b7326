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


def test_async_batch_claims_and_settles_through_the_same_core(sqlite_url: str) -> None:
    async def main() -> None:
        async with await aio.connect(sqlite_url) as hub:
            q = hub.queue("orders")
            ids = await q.put_many([b"a", b"b", b"c"], to=["billing"])
            batch = await q.get_many("billing", 10, timeout=1)
            assert batch.msg_ids == ids
            assert [d.body for d in batch] == [b"a", b"b", b"c"]
            batch.unusable(batch[1], "bad")
            settled = await batch.done()
            assert (settled.done, settled.unusable) == ([ids[0], ids[2]], [ids[1]])
            assert not await q.get_many("billing", 10)
            bad = (await q.state(ids[1])).subscribers["billing"]
            assert (bad.state, bad.reason) == (SubscriberState.JOURNALLED, "bad")

    asyncio.run(main())


def test_async_batch_failure_releases_every_delivery(sqlite_url: str) -> None:
    async def main() -> None:
        async with await aio.connect(sqlite_url) as hub:
            q = hub.queue("orders")
            ids = await q.put_many([b"a", b"b"], to=["s"])
            batch = await q.get_many("s", 2)
            with pytest.raises(RuntimeError):
                async with batch:
                    assert all(d.state is SubscriberState.IN_PROCESS for d in batch)
                    raise RuntimeError("boom")
            for msg_id in ids:
                view = (await q.state(msg_id)).subscribers["s"]
                assert (view.state, view.attempt) == (SubscriberState.AVAILABLE, 2)

    asyncio.run(main())
