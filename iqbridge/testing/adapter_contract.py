"""The shared contract every broker adapter passes, run through the public facade.

Subclass :class:`AdapterContract` in a test module (its name must start with ``Test``)
and implement :meth:`AdapterContract.make_hub`; pytest then runs every test below
against your adapter::

    import iqbridge
    from iqbridge.testing.adapter_contract import AdapterContract

    class TestRedisAdapter(AdapterContract):
        def make_hub(self, clock):
            # A fresh, isolated broker and index for every test: a new database
            # number, key prefix, vhost or temporary file, as the broker allows.
            return iqbridge.connect(REDIS_URL, index=INDEX_URL, clock=clock)

        def force_redelivery(self, hub, queue, msg_id, subscriber):
            ...  # make the broker hand msg_id to the subscriber's group again

Hooks:

* :meth:`~AdapterContract.make_hub` (required): a new :class:`~iqbridge.Hub` whose clock
  is ``clock``. The suite closes it after the test. Every lease, ttl, lock and retry
  delay is driven by that clock, so no test sleeps for them.
* :meth:`~AdapterContract.force_redelivery` (optional): make the broker deliver an
  already-delivered message to a subscriber again (a consumer crash before the ack, a
  network retry). Brokers with native consumer groups must override it; for
  index-driven adapters (the index is the queue) the default hands the stored entry to
  the facade the way a broker redelivery arrives. If the broker truly cannot redeliver,
  skip with the reason (``pytest.skip(...)``).

Fixtures a subclass can use or override: ``clock`` (a :class:`~iqbridge.testing.FakeClock`),
``hub`` and ``q`` (a queue with a unique name, lease 30 s, 3 attempts, 1 s initial retry
delay, and the due-work sweep run on every get). Tests that depend on a capability the
broker lacks (see :class:`~iqbridge.adapter.Capabilities`) skip with the reason.
"""

from __future__ import annotations

from iqbridge.testing.contract_base import (
    LEASE,
    ContractBase,
    count_moves,
    current,
    pub_history,
    sub_history,
    sub_state,
    take,
    unique,
)
from iqbridge.testing.contract_batches import BatchTests
from iqbridge.testing.contract_features import FeatureTests
from iqbridge.testing.contract_retention import RetentionTests
from iqbridge.testing.contract_states import StateModelTests

__all__ = [
    "LEASE",
    "AdapterContract",
    "ContractBase",
    "count_moves",
    "current",
    "pub_history",
    "sub_history",
    "sub_state",
    "take",
    "unique",
]


class AdapterContract(StateModelTests, FeatureTests, BatchTests, RetentionTests):
    """Facade-level behaviour every adapter shares; see the module docstring to subclass.

    The tests live in groups, one module each: :mod:`~iqbridge.testing.contract_states`
    (the state model), :mod:`~iqbridge.testing.contract_features` (browse, search,
    leases, once-only, ordering, ttl, re-reveal, purge, payloads, retry policy),
    :mod:`~iqbridge.testing.contract_batches` (batch consumption) and
    :mod:`~iqbridge.testing.contract_retention` (brokers that forget); hooks and
    fixtures are in :mod:`~iqbridge.testing.contract_base`.
    """
