"""The base of the adapter contract suite: hooks, fixtures and helpers its test groups
share. See :mod:`iqbridge.testing.adapter_contract` for how to run the suite."""

from __future__ import annotations

import abc
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from iqbridge.delivery import Delivery
from iqbridge.hub import Hub
from iqbridge.model import MessageState, Received
from iqbridge.queue import Queue
from iqbridge.retry import RetryPolicy
from iqbridge.states import PublisherState, SubscriberState
from iqbridge.testing import FakeClock

__all__ = [
    "LEASE",
    "ContractBase",
    "count_moves",
    "current",
    "delay_broker_read",
    "pub_history",
    "sub_history",
    "sub_state",
    "take",
    "unique",
]

P = PublisherState
S = SubscriberState

#: The lease of the ``q`` fixture's queue, in seconds.
LEASE = 30.0


def unique(prefix: str = "cq") -> str:
    """A queue name no other test uses (brokers shared between tests stay apart)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def take(q: Queue, subscriber: str, **kw: Any) -> Delivery:
    """A get that must deliver something."""
    d = q.get(subscriber, **kw)
    assert d is not None, f"{subscriber!r} got nothing from {q.name!r}"
    return d


def sub_state(q: Queue, msg_id: str, subscriber: str) -> SubscriberState | None:
    """One subscriber's current state."""
    return q.state(msg_id).subscribers[subscriber].state


def sub_history(q: Queue, msg_id: str, subscriber: str) -> list[SubscriberState]:
    """One subscriber's states, oldest first."""
    return [s for s, _ in q.state(msg_id).subscribers[subscriber].history]


def pub_history(q: Queue, msg_id: str) -> list[PublisherState]:
    """The publisher's states, oldest first."""
    return [s for s, _ in q.state(msg_id).publisher_history]


def current(delivery: Delivery) -> SubscriberState:
    """The state a delivery says it is in (read anew after each move)."""
    return delivery.state


def delay_broker_read(
    hub: Hub, clock: FakeClock, seconds: float, monkeypatch: pytest.MonkeyPatch
) -> list[float]:
    """Make the next broker read that finds something take ``seconds`` on the hub's
    clock (a slow broker, a consumer group joining): the real read runs against the real
    broker, and the clock moves on before it returns. The read is the adapter's
    ``receive`` (``receive_indexed`` where broker and index are co-located), or, for an
    index-driven adapter, the index's ``claimable`` (and its ``claim_ready``, which
    reads what is ready and claims the common path in one transaction: what it leaves
    to the per-message engine is claimed after the delay). Returns the list of the
    clock's times the delayed read returned at (one at most)."""
    reads: list[tuple[object, str]]
    if not hub.adapter.capabilities.native_groups:
        reads = [(hub.store, "claimable"), (hub.store, "claim_ready")]  # the index is the queue
    elif hub.colocated is not None:
        reads = [(hub.colocated, "receive_indexed")]
    else:
        reads = [(hub.adapter, "receive")]
    delayed: list[float] = []
    for target, name in reads:
        real = getattr(target, name, None)
        if real is None:
            continue

        def slow(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            got = _real(*args, **kwargs)
            found = any(got) if isinstance(got, tuple) else bool(got)
            if found and not delayed:
                clock.advance(seconds)
                delayed.append(clock.now)
            return got

        monkeypatch.setattr(target, name, slow)
    return delayed


def count_moves(state: MessageState, subscriber: str, dst: SubscriberState) -> int:
    """How often the journal records ``subscriber`` moving to ``dst``."""
    return sum(1 for e in state.journal if e.actor == subscriber and e.dst == dst.value)


class ContractBase(abc.ABC):
    """Hooks and fixtures of the adapter contract; the test groups subclass it."""

    # --- hooks -------------------------------------------------------------------------

    @abc.abstractmethod
    def make_hub(self, clock: Callable[[], float]) -> Hub:
        """A fresh hub (broker plus index) with nothing from other tests in it."""

    def force_redelivery(self, hub: Hub, queue: Queue, msg_id: str, subscriber: str) -> None:
        """Make the broker hand ``msg_id`` to ``subscriber`` again after it was delivered.

        The default serves index-driven adapters, where the index is the queue and no
        broker redelivers: it hands the stored entry to the facade the way a broker
        redelivery arrives (``Receiving._accept``, which resolves every broker delivery
        against the index) and fails the test if the facade turns it into a delivery.
        """
        if hub.adapter.capabilities.native_groups:
            pytest.skip(
                f"{type(self).__name__} must override force_redelivery() to make its "
                f"broker redeliver a message"
            )
        rec = hub.store.load(msg_id)
        assert rec.native_ref is not None, f"message {msg_id} has no native reference"
        env = hub.adapter.read(queue.name, rec.native_ref)
        assert env is not None, f"the broker lost the payload of {msg_id}"
        member = rec.members[subscriber]
        received = Received(rec.native_ref, member.pool or subscriber, env, delivery_count=2)
        owner = f"{subscriber}@{hub.client_id}"
        dup = queue._receiving._accept(received, subscriber, owner, int(queue.lease * 1e6))
        if dup is not None:
            pytest.fail(f"the facade handed {msg_id} to {subscriber!r} again on redelivery")

    # --- fixtures ----------------------------------------------------------------------

    @pytest.fixture
    def clock(self) -> FakeClock:
        """The hub's clock; advance it to run leases, ttl and locks out."""
        return FakeClock()

    @pytest.fixture
    def hub(self, clock: FakeClock) -> Iterator[Hub]:
        """A fresh hub from :meth:`make_hub`, closed after the test."""
        hub = self.make_hub(clock)
        try:
            yield hub
        finally:
            hub.close()

    @pytest.fixture
    def q(self, hub: Hub) -> Queue:
        """A new queue: lease 30 s, 3 attempts, 1 s then 2 s retry delays."""
        return self.open_queue(hub)

    def open_queue(self, hub: Hub, **options: Any) -> Queue:
        """A queue with a unique name and the suite's defaults, overridable by ``options``."""
        opts: dict[str, Any] = {
            "retry": RetryPolicy(max_attempts=3, initial_delay=1.0, multiplier=2.0),
            "lease": LEASE,
            "sweep_interval": 0.0,
        }
        opts.update(options)
        return hub.queue(unique(), **opts)
