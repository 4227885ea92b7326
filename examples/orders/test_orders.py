"""Integration tests of the order handler against every broker, through iqbridge's pytest
plugin: ``iq_broker`` runs each test once per broker and ``iq_hub`` opens a hub on it
with names of its own. They assert what iqbridge recorded, not only what the handler did.

    pytest examples/orders                      # every broker the plugin can find or start
    pytest examples/orders --iq-broker sqlite   # one broker
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from orders import ACCOUNTING, INVOICES, ORDERS, MalformedOrder, invoice_for, order_handler

from iqbridge import RetryPolicy, SubscriberState
from iqbridge.delivery import Delivery
from iqbridge.hub import Hub
from iqbridge.worker import Worker

#: How long a get waits: Kafka's first group join takes a second or two.
WAIT = 15.0


def order(n: int, customer: str = "c-1") -> dict[str, object]:
    return {
        "order": n,
        "customer": customer,
        "lines": [{"sku": "A", "qty": 2, "price": 9.5}, {"sku": "B", "qty": 1, "price": n}],
    }


def states(hub: Hub, queue: str, msg_id: str, subscriber: str) -> list[str]:
    """The states the index journalled for one subscriber of one message, in order."""
    journal = hub.queue(queue).state(msg_id).journal
    return [entry.dst for entry in journal if entry.actor == subscriber]


def test_invoice_totals() -> None:
    assert invoice_for(order(3))["total"] == 22.0
    with pytest.raises(MalformedOrder):
        invoice_for({"order": 4, "lines": [{"sku": "A", "qty": 0, "price": 1}]})


def test_done_once_per_subscriber(iq_hub: Callable[..., Hub], iq_broker: str) -> None:
    hub = iq_hub(iq_broker, publisher="webshop")
    orders, invoices = hub.queue(ORDERS), hub.queue(INVOICES)
    msg_id = orders.put(order(1), to=["billing", "audit"], correlation_id="cart-1")

    stats = Worker(orders, "billing", order_handler(invoices), threads=2).run(
        until_idle=WAIT, max_messages=1
    )
    assert stats.done == 1
    audited = orders.get("audit", timeout=WAIT)
    assert audited is not None
    with audited:  # IN_PROCESS, then DONE on a clean exit
        assert audited.msg_id == msg_id

    for subscriber in ("billing", "audit"):
        assert states(hub, ORDERS, msg_id, subscriber).count(SubscriberState.DONE) == 1

    invoice = invoices.get(ACCOUNTING, timeout=WAIT)
    assert invoice is not None
    with invoice:
        assert invoice.payload == {"order": 1, "customer": "c-1", "total": 20.0}
        assert invoice.correlation_id == "cart-1"
    assert invoices.state(invoice.msg_id).parents == (msg_id,)
    assert states(hub, INVOICES, invoice.msg_id, ACCOUNTING).count(SubscriberState.DONE) == 1
    assert invoices.get(ACCOUNTING, timeout=0.5) is None  # one invoice, not two


def test_per_key_order(iq_hub: Callable[..., Hub], iq_broker: str) -> None:
    hub = iq_hub(iq_broker)
    orders, invoices = hub.queue(ORDERS), hub.queue(INVOICES)
    customers = ("c-1", "c-2", "c-3")
    for n in range(12):
        customer = customers[n % 3]
        orders.put(order(n, customer), to=["billing"], ordering_key=customer)

    seen: list[tuple[str, int]] = []
    invoice = order_handler(invoices)

    def handle(delivery: Delivery) -> None:
        invoice(delivery)
        seen.append((delivery.ordering_key, delivery.payload["order"]))

    stats = Worker(orders, "billing", handle, threads=4).run(until_idle=WAIT, max_messages=12)
    assert stats.done == 12
    for customer in customers:
        assert [n for key, n in seen if key == customer] == sorted(
            n for n in range(12) if customers[n % 3] == customer
        )
    done = orders.search(subscriber="billing")
    assert len(done) == 12
    for hit in done:
        assert states(hub, ORDERS, hit.msg_id, "billing").count(SubscriberState.DONE) == 1


def test_malformed_order_unusable(iq_hub: Callable[..., Hub], iq_broker: str) -> None:
    hub = iq_hub(iq_broker)
    policy = RetryPolicy(max_attempts=3, initial_delay=0.01, max_delay=0.01)
    orders, invoices = hub.queue(ORDERS, retry=policy), hub.queue(INVOICES)
    bad = orders.put({"order": 9, "lines": []}, to=["billing"])

    tries: list[int] = []
    invoice = order_handler(invoices)

    def handle(delivery: Delivery) -> None:
        tries.append(delivery.attempt)
        invoice(delivery)

    stats = Worker(orders, "billing", handle, threads=2).run(until_idle=WAIT, max_messages=1)
    assert stats.unusable == 1
    assert tries == [1, 2, 3]
    view = orders.state(bad).subscribers["billing"]
    assert SubscriberState.UNUSABLE in [s for s, _ in view.history]
    assert SubscriberState.DONE not in [s for s, _ in view.history]
    assert invoices.search() == []  # no invoice for a malformed order
