"""An order-processing handler, the kind of code the integration tests beside it check.

An order is a mapping ``{"order": 7, "customer": "c-1", "lines": [{"sku": "A", "qty": 2,
"price": 9.5}, ...]}``. :func:`process_order` reads one from the ``orders`` queue, computes
its total and puts an invoice on the ``invoices`` queue, with the order as its parent (so
``iq lineage`` links them). A malformed order raises :class:`MalformedOrder`; the queue's
retry policy then decides between another attempt and UNUSABLE.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from iqbridge.delivery import Delivery
from iqbridge.queue import Queue

ORDERS = "orders"
INVOICES = "invoices"
#: Who reads the invoices.
ACCOUNTING = "accounting"


class MalformedOrder(ValueError):
    """The order has no lines, or a line without a positive quantity and a price."""


def invoice_for(order: Any) -> dict[str, Any]:
    """The invoice of an order: its number, customer and total (rounded to cents)."""
    if not isinstance(order, Mapping) or not order.get("lines"):
        raise MalformedOrder(f"not an order with lines: {order!r}")
    total = 0.0
    for line in order["lines"]:
        qty, price = line.get("qty"), line.get("price")
        if not isinstance(qty, int) or qty <= 0 or not isinstance(price, int | float):
            raise MalformedOrder(f"bad line in order {order.get('order')}: {line!r}")
        total += qty * price
    return {
        "order": order.get("order"),
        "customer": order.get("customer"),
        "total": round(total, 2),
    }


def process_order(delivery: Delivery, invoices: Queue) -> str:
    """Invoice one delivered order; return the invoice's msg_id."""
    invoice = invoice_for(delivery.payload)
    return invoices.put(
        invoice,
        to=[ACCOUNTING],
        parents=[delivery.msg_id],
        ordering_key=delivery.ordering_key,
        correlation_id=delivery.correlation_id,
    )


def order_handler(invoices: Queue) -> Callable[[Delivery], None]:
    """A handler for ``iqbridge.worker.Worker`` (or a plain get) that invoices orders."""

    def handle(delivery: Delivery) -> None:
        process_order(delivery, invoices)

    return handle
