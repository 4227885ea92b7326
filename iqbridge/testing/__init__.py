"""Test helpers shipped with iqbridge: a fake clock and the shared contract suites.

Every broker adapter and every index store must behave the same, so each one runs the
same tests. The suites are base classes of pytest test methods with a few abstract hooks;
a backend's test module only subclasses them and says how to open a fresh backend::

    # tests/contract/test_mybroker_contract.py
    import iqbridge
    from iqbridge.testing.adapter_contract import AdapterContract
    from iqbridge.testing.store_contract import IndexStoreContract

    class TestMyBrokerAdapter(AdapterContract):
        def make_hub(self, clock):
            return iqbridge.connect("mybroker://localhost/test-db", clock=clock)

    class TestMyStore(IndexStoreContract):
        def make_store(self):
            return MyStore.from_url("mystore://localhost/test-db")

* :mod:`iqbridge.testing.adapter_contract` -- :class:`AdapterContract`, the facade-level
  suite (state model, modes, confirm/undo, browse, search, leases, once-only, ordering,
  ttl, purge, payloads, retry policy, timeouts, batch consumption, payloads needed again
  after delivery on brokers that forget) run through a :class:`~iqbridge.Hub`.
* :mod:`iqbridge.testing.store_contract` -- :class:`IndexStoreContract`, the store-level
  suite (compare-and-set, batch commits, claim order, due work, journal, search, purge,
  retained payload copies, subscriptions).
* :mod:`iqbridge.testing.plugin` -- the pytest plugin (entry point ``iqbridge``):
  ``iq_hub("redis")`` and the other ``iq_*`` fixtures for users' own tests on every
  broker, with :mod:`iqbridge.testing.servers` finding or starting the brokers
  (docs/testing.md).
* :mod:`iqbridge.testing.proxy` -- :class:`~iqbridge.testing.proxy.FaultProxy`, a TCP
  proxy that resets connections to a broker on demand, on a schedule, or in the middle
  of a request, for tests of what a lost connection does.
* :mod:`iqbridge.testing.fakes` -- faithful in-process fakes of IBM MQ's and
  python-oracledb's clients, with faults at a chosen call (``break_at``).

The suites import pytest, which is a test extra; importing this package itself does not.
"""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """A settable clock in seconds since the epoch, for ``connect(..., clock=...)``.

    Leases, time limits (ttl), browse locks and retry delays all read the hub's clock,
    so a test moves time with :meth:`advance` instead of sleeping.
    """

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self.now += seconds
