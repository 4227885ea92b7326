"""Lineage downward through an application's own children (put with ``parents=``), not
only those a bridge route derived: on any of the hubs given, found by the index's search
by parent; a message with no children has none."""

from __future__ import annotations

from pathlib import Path

import iqbridge
from iqbridge.bridge import Lineage


def test_children_put_with_parents_are_found_downward(tmp_path: Path) -> None:
    with (
        iqbridge.connect(f"sqlite:///{tmp_path}/orders.db") as shop,
        iqbridge.connect("memory://") as billing,
    ):
        order = shop.queue("orders").put(b"order", to=["billing"])
        other = shop.queue("orders").put(b"another order", to=["billing"])
        invoice = billing.queue("invoices").put(b"invoice", to=["mail"], parents=[order])
        receipt = shop.queue("receipts").put(b"receipt", to=["mail"], parents=[invoice])
        finder = Lineage([("shop", shop), ("billing", billing)])
        node = finder.node(order)
        assert node is not None
        assert finder.children_of(node) == [invoice]
        tree = finder.tree(order)
        assert [n.msg_id for n in tree] == [order]
        assert [c.msg_id for c in tree[0].children] == [invoice]
        assert [g.msg_id for g in tree[0].children[0].children] == [receipt]
        lonely = finder.node(other)
        assert lonely is not None and finder.children_of(lonely) == []
