"""Real iqbridge traffic with known anomalies, exported for the analytics tests.

The flow is seed 000's: a point-of-sale queue feeds a credit-approval module that puts
child messages on a customer-database queue; beside it an orders queue with two
subscribers and a payments queue. Every message goes through the facade on the embedded
SQLite default; the anomalies are injected where they happen in real life:

- ``orders``: o1..o5 processed by billing and shipping; billing's DONE of o2 written a
  second time into the index (a consumer that bypassed the index, or a bug): the one
  once-only violation.
- ``payments``: p0 committed to the index but never reached the broker (the index and
  broker disagree), then p1 taken by ledger and never settled (stuck in doubt), p2 done:
  p0 is passed over (lost), p1 is stuck.
- ``credit`` -> ``customers``: c1 approved and its child k1 revealed; c2 taken, child k2
  put unconfirmed, then the module "crashes" (c2 in doubt, k2 PUT: an orphan the plan
  withdraws, c2 released); c3 done but its child k3 never confirmed (the plan reveals
  k3); c4 taken and no child yet (step 5 releases it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import iqbridge
from iqbridge import engine
from iqbridge.analytics.export import export_journal
from iqbridge.model import JournalEntry
from iqbridge.states import ActorKind


@dataclass
class Traffic:
    """What the generated journal holds, by name."""

    url: str
    journal: Path
    ids: dict[str, str] = field(default_factory=dict)


def _done_all(q: iqbridge.Queue, subscriber: str) -> None:
    while (d := q.get(subscriber)) is not None:
        d.done()


def _duplicate_done(hub: iqbridge.Hub, msg_id: str, subscriber: str) -> None:
    """Write a second DONE of ``subscriber`` into the index, bypassing the engine."""
    store = hub.store
    rec = store.load(msg_id)
    again = rec.copy()
    again.version = rec.version + 1
    at = rec.updated_at + 1000
    entry = JournalEntry(
        msg_id,
        rec.queue,
        subscriber,
        ActorKind.SUBSCRIBER,
        "IN_PROCESS",
        "DONE",
        at,
        2,
        "injected: processed twice",
    )
    store.commit(engine.Change(again, [entry], rec.version, dirty={subscriber}))


def _index_only(hub: iqbridge.Hub, queue: str, msg_id: str) -> None:
    """A message revealed in the index that the broker never received."""
    change = engine.new_message(
        msg_id=msg_id,
        queue=queue,
        publisher="till",
        audience=hub.queue(queue).subscriptions().audience(),  # the standing audience
        now=hub.now_us(),
    )
    hub.store.commit(change)


def make_traffic(root: Path) -> Traffic:
    """Run the flows, inject the anomalies, export the journal to ``root/export``."""
    url = f"sqlite:///{root / 'iq.db'}"
    out = Traffic(url, root / "export")
    with iqbridge.connect(url) as hub:
        orders = hub.queue("orders", create=True, retain=True)
        orders.subscribe("billing", "shipping")
        for i in range(1, 6):
            out.ids[f"o{i}"] = orders.put(f"order {i}".encode(), publisher="till")
        _done_all(orders, "billing")
        _done_all(orders, "shipping")
        _duplicate_done(hub, out.ids["o2"], "billing")

        payments = hub.queue("payments", create=True)
        payments.subscribe("ledger")
        out.ids["p0"] = "p0-" + out.ids["o1"]
        _index_only(hub, "payments", out.ids["p0"])
        out.ids["p1"] = payments.put(b"pay 1", publisher="till")
        out.ids["p2"] = payments.put(b"pay 2", publisher="till")
        held = payments.get("ledger", lease=3600)
        assert held is not None
        assert held.msg_id == out.ids["p1"], "p0 never reached the broker: p1 comes first"
        last = payments.get("ledger")
        assert last is not None
        last.done()

        credit = hub.queue("credit", create=True)
        credit.subscribe("approver")
        customers = hub.queue("customers", create=True)
        customers.subscribe("crm")
        for i in range(1, 5):
            out.ids[f"c{i}"] = credit.put(f"sale {i}".encode(), publisher="pos")
        for i in range(1, 5):
            d = credit.get("approver", lease=3600)
            assert d is not None and d.msg_id == out.ids[f"c{i}"]
            if i == 4:
                break  # taken, no child yet
            child = customers.put(
                f"customer of {i}".encode(),
                publisher="approver",
                parents=[d.msg_id],
                confirm=True,
            )
            out.ids[f"k{i}"] = child
            if i == 2:
                continue  # crash: c2 in doubt, k2 PUT
            d.done()
            if i == 1:
                customers.confirm_put(child)
            # i == 3: c3 DONE, k3 never confirmed
        _done_all(customers, "crm")
    export_journal(iqbridge.connect(url).store, out.journal)
    return out
