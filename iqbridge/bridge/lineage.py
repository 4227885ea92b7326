"""Lineage across queues and brokers: a message's ancestors and descendants.

Every child a bridge puts records its parents (``MessageRecord.parents``), and its
msg_id is derived from the route and its parent (:func:`~iqbridge.bridge.translate.child_id`),
so the tree is found from the indexes alone: up through ``parents`` on any of the hubs
given, down by deriving the ids each route would have given the children (and, for an
aggregation, following the staging input to the aggregate it was folded into), and by
searching each hub's index for messages an application put with ``parents=``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from iqbridge.bridge.config import Route
from iqbridge.bridge.translate import child_id
from iqbridge.errors import IQError, MessageNotFound
from iqbridge.hub import Hub
from iqbridge.model import Filter, MessageRecord
from iqbridge.registry import redact

__all__ = ["Lineage", "Node"]

_MAX_CHILDREN = 1000
_MAX_DEPTH = 64


@dataclass(slots=True)
class Node:
    """One message in a lineage tree."""

    msg_id: str
    queue: str
    where: str
    publisher_state: str
    subscribers: dict[str, str]
    parents: tuple[str, ...]
    children: list[Node] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Place:
    hub: Hub
    url: str


class Lineage:
    """Finds messages on several hubs and follows their parents and children."""

    def __init__(
        self,
        hubs: Sequence[tuple[str, Hub]],
        routes: Sequence[Route] = (),
        bridge: str = "bridge",
        state: Hub | None = None,
    ) -> None:
        self.places = [_Place(h, url) for url, h in hubs]
        self.routes = list(routes)
        self.bridge = bridge
        self.state = state

    def find(self, msg_id: str) -> tuple[MessageRecord, _Place] | None:
        """The record of ``msg_id`` on the first hub that has it."""
        for place in self.places:
            try:
                return place.hub.store.load(msg_id), place
            except MessageNotFound:
                continue
            except IQError:
                continue
        return None

    def node(self, msg_id: str) -> Node | None:
        """``msg_id`` as a node without children, or None if no hub knows it."""
        got = self.located(msg_id)
        return None if got is None else got[0]

    def located(self, msg_id: str) -> tuple[Node, MessageRecord] | None:
        """``msg_id`` as a node, with the record it was read from (one read), or None."""
        got = self.find(msg_id)
        if got is None:
            return None
        rec, place = got
        subs = {
            name: (m.state.value if m.state is not None else "not yet")
            for name, m in sorted(rec.members.items())
        }
        pub = rec.publisher_state.value if rec.publisher_state is not None else "-"
        return Node(msg_id, rec.queue, redact(place.url), pub, subs, tuple(rec.parents)), rec

    def roots(self, msg_id: str) -> list[str]:
        """The oldest ancestors of ``msg_id`` (itself if it has no parents)."""
        out: list[str] = []
        seen: set[str] = set()
        todo = [(msg_id, 0)]
        while todo:
            mid, depth = todo.pop()
            if mid in seen:
                continue
            seen.add(mid)
            node = self.node(mid)
            if node is None or not node.parents or depth >= _MAX_DEPTH:
                out.append(mid)
                continue
            todo.extend((p, depth + 1) for p in node.parents)
        return sorted(set(out))

    def children_of(self, node: Node) -> list[str]:
        """The msg_ids of ``node``'s children: those a route put (derived ids), then those
        any application put with ``parents=`` naming it, on any hub (the index's search
        by parent, at most 1000 per queue)."""
        out: list[str] = self._route_children(node)
        for place in self.places:
            try:
                for queue in sorted(place.hub.store.queues()):
                    flt = Filter(parent=node.msg_id, limit=_MAX_CHILDREN)
                    for hit in place.hub.store.search(queue, flt):
                        if hit.msg_id not in out:
                            out.append(hit.msg_id)
            except IQError:
                continue
        return out

    def _route_children(self, node: Node) -> list[str]:
        """The children a route put: ids derived from the route and the parent."""
        out: list[str] = []
        for route in self.routes:
            if route.source.queue != node.queue:
                continue
            for n in range(_MAX_CHILDREN):
                cid = child_id(route.name, (node.msg_id,), n)
                if route.correlate is not None:
                    agg = self._aggregate_of(route, cid)
                    if agg is None:
                        break
                    if agg and agg not in out:
                        out.append(agg)
                    continue
                if self.find(cid) is None:
                    break
                out.append(cid)
        return out

    def _aggregate_of(self, route: Route, staged: str) -> str | None:
        """The aggregate a staged input went into ('' while pending; None: no input)."""
        if self.state is None:
            return None
        try:
            history = self.state.store.history(staged)
        except MessageNotFound:
            return None
        for entry in history:
            detail = entry.detail or ""
            if detail.startswith("aggregated into "):
                return detail[len("aggregated into ") :]
        return ""

    def tree(self, msg_id: str) -> list[Node]:
        """The trees holding ``msg_id``: from each of its roots down."""
        return [n for r in self.roots(msg_id) if (n := self._down(r, 0, set())) is not None]

    def _down(self, msg_id: str, depth: int, seen: set[str]) -> Node | None:
        node = self.node(msg_id)
        if node is None or msg_id in seen:
            return node
        seen.add(msg_id)
        if depth < _MAX_DEPTH:
            for cid in self.children_of(node):
                child = self._down(cid, depth + 1, seen)
                if child is not None:
                    node.children.append(child)
        return node
