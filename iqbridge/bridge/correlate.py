"""Correlation on a route (seed 000, "combining multiple messages into a single
message"): the children sharing a key are combined into one aggregate.

Pending state lives in the index, never only in memory: each input is put, as it
arrives, on the route's staging queue on the bridge's state hub
(``iq.bridge.<bridge>.<route>.groups``) with a msg_id derived from its parent and the
group key as its correlation id, before its source message goes DONE. A group completes
on ``count``, on the ``complete`` predicate, on ``timeout`` seconds after its first
input (the index's put time, so timeouts fire after a restart too) or early when the
route's ``max_groups`` / ``max_bytes`` budget is exceeded (oldest first). Completing
first records the decision in the staging queue (the aggregate's msg_id, derived from
the route, the key and the group's first input, and its inputs), then puts the
aggregate (parents: every input's source message) on the destination, then withdraws the
inputs (journalled "aggregated into <id>") and the decision. A restart reads the
staging queue back and finishes every decision first, with the same inputs and id: the
destination's idempotent put keeps one aggregate whatever the crash interrupted.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from iqbridge.bridge.config import Correlate
from iqbridge.bridge.translate import BridgeMessage, child_id, load_callable
from iqbridge.errors import IllegalTransition, MessageNotFound
from iqbridge.hub import Hub
from iqbridge.model import Filter
from iqbridge.payload import decode
from iqbridge.putting import Outgoing
from iqbridge.queue import Queue
from iqbridge.redaction import get_logger
from iqbridge.states import PublisherState

__all__ = ["Correlator", "Group"]

log = get_logger("iqbridge.bridge")

_AGGREGATOR = "aggregator"
#: The header that marks a decision record (see Correlator._finish).
_DECISION = "iq-decision"


@dataclass(slots=True)
class Group:
    """One pending group: its inputs in arrival order."""

    key: str
    started: float  # epoch seconds of its first input's put
    members: list[BridgeMessage] = field(default_factory=list)
    size: int = 0


class Correlator:
    """The aggregation of one route (see the module documentation). Thread-safe."""

    def __init__(
        self,
        spec: Correlate,
        route: str,
        state: Hub,
        bridge: str,
        emit: Callable[[list[Outgoing]], None],
        publisher: str,
    ) -> None:
        self.spec = spec
        self.route = route
        self.emit = emit
        self.publisher = publisher
        self.staging: Queue = state.queue(f"iq.bridge.{bridge}.{route}.groups")
        self._store = state.store
        self._groups: dict[str, Group] = {}
        self._bytes = 0
        self._lock = threading.RLock()
        where = f"route {route!r}, field correlate"
        self._key_fn = load_callable(spec.key, f"{where}.key") if ":" in spec.key else None
        self._complete = (
            load_callable(spec.complete, f"{where}.complete") if spec.complete else None
        )
        self._combine = load_callable(spec.combine, f"{where}.combine") if spec.combine else None
        self.completed = 0

    # --- keys and inputs --------------------------------------------------------------

    def key_of(self, msg: BridgeMessage) -> str:
        """The group key of one input."""
        k = self.spec.key
        if self._key_fn is not None:
            got = self._key_fn(msg)
        elif k == "correlation_id":
            got = msg.correlation_id
        elif k == "ordering_key":
            got = msg.ordering_key
        else:
            got = msg.headers.get(k[len("header:") :])
        if not isinstance(got, str) or not got:
            raise ValueError(f"message {msg.msg_id} has no group key ({k})")
        return got

    def stage(self, children: Sequence[Outgoing], parents: Sequence[str]) -> None:
        """Record inputs in the index (idempotent by msg_id), then add them to their
        groups; completes what they complete. ``parents[i]`` is children[i]'s source."""
        if not children:
            return
        msgs: list[tuple[Outgoing, BridgeMessage]] = []
        for out, parent in zip(children, parents, strict=True):
            body = out.payload if isinstance(out.payload, bytes) else None
            view = BridgeMessage(
                out.msg_id or "",
                self.staging.name,
                body if body is not None else json.dumps(out.payload).encode(),
                out.content_type or "application/octet-stream",
                dict(out.headers or {}),
                out.correlation_id,
                out.priority,
                out.ordering_key or "",
                out.publisher or self.publisher,
                (parent,),
            )
            key = self.key_of(view)
            msgs.append(
                (
                    Outgoing(
                        view.body,
                        msg_id=out.msg_id,
                        correlation_id=key,
                        priority=out.priority,
                        ordering_key=out.ordering_key,
                        parents=(parent,),
                        headers=out.headers,
                        content_type=view.content_type,
                        publisher=self.publisher,
                    ),
                    view,
                )
            )
        self.staging.put_each([m for m, _ in msgs], to=[_AGGREGATOR])
        # Staged again after a crash (the source message came back): an input already
        # withdrawn went into an aggregate before the crash; it must not go into another.
        recs = self._store.load_many([str(m.msg_id) for m, _ in msgs])
        now = time.time()
        with self._lock:
            for out, view in msgs:
                rec = recs.get(str(out.msg_id))
                if rec is None or rec.withdrawn:
                    continue
                self._add(str(out.correlation_id), view, now)
            self._enforce_budget()

    def _add(self, key: str, view: BridgeMessage, started: float) -> None:
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = Group(key, started)
        if all(m.msg_id != view.msg_id for m in group.members):  # else staged again
            group.members.append(view)
            group.size += len(view.body)
            self._bytes += len(view.body)
        if self._is_complete(group):
            self._finish(group, "complete")

    def _is_complete(self, group: Group) -> bool:
        if self.spec.count is not None and len(group.members) >= self.spec.count:
            return True
        return self._complete is not None and bool(self._complete(list(group.members)))

    def _enforce_budget(self) -> None:
        while self._groups and (
            len(self._groups) > self.spec.max_groups or self._bytes > self.spec.max_bytes
        ):
            oldest = min(self._groups.values(), key=lambda g: g.started)
            log.warning(
                "route %s: aggregation budget reached (%d groups, %d bytes): completing "
                "group %r early",
                self.route,
                len(self._groups),
                self._bytes,
                oldest.key,
            )
            self._finish(oldest, "budget")

    # --- completing -------------------------------------------------------------------

    def aggregate_id(self, key: str, members: Sequence[BridgeMessage]) -> str:
        """The aggregate's msg_id: the route, the key and the group's first input."""
        return child_id(self.route + "#aggregate", (key, members[0].msg_id))

    def _aggregate(
        self, key: str, members: Sequence[BridgeMessage], why: str, agg_id: str
    ) -> Outgoing:
        payload: Any
        if self._combine is not None:
            payload = self._combine(list(members))
        else:
            payload = [_value(m) for m in members]
        as_list = isinstance(payload, list)
        return Outgoing(
            json.dumps(payload).encode() if as_list else payload,
            msg_id=agg_id,
            correlation_id=key,
            priority=max(m.priority for m in members),
            ordering_key=members[0].ordering_key or key,
            parents=tuple(m.parents[0] for m in members),
            headers={"iq-aggregate": why, "iq-aggregate-size": str(len(members))},
            content_type="application/json" if as_list else None,
            publisher=self.publisher,
        )

    def _finish(self, group: Group, why: str) -> None:
        """Decide (a write-ahead record in the staging queue naming the aggregate and
        its inputs), put the aggregate, withdraw the inputs, then the decision. A crash
        anywhere is finished by :meth:`load` from the decision: the same inputs, the same
        id, so the destination gets the aggregate once."""
        members = group.members
        if self.spec.count is not None and len(members) > self.spec.count:
            members = members[: self.spec.count]
        agg_id = self.aggregate_id(group.key, members)
        agg = self._aggregate(group.key, members, why, agg_id)
        decision = Outgoing(
            b"",
            msg_id=agg_id,
            correlation_id=group.key,
            parents=tuple(m.msg_id for m in members),
            headers={_DECISION: why},
            publisher=self.publisher,
        )
        self.staging.put_each([decision], to=[_AGGREGATOR])
        self.emit([agg])
        self._retire(group, members, agg_id)
        self.completed += 1

    def _withdraw(self, msg_ids: Sequence[str], why: str) -> None:
        for mid in msg_ids:
            with contextlib.suppress(MessageNotFound, IllegalTransition):  # before a crash
                self.staging.withdraw(mid, reason=why)

    def _retire(self, group: Group, members: Sequence[BridgeMessage], agg_id: str) -> None:
        self._withdraw([m.msg_id for m in members], f"aggregated into {agg_id}")
        self._withdraw([agg_id], "aggregate put")
        done = {m.msg_id for m in members}
        rest = [m for m in group.members if m.msg_id not in done]
        self._bytes -= sum(len(m.body) for m in members)
        self._groups.pop(group.key, None)
        for m in rest:  # past the count: they start the next group of the key
            self._add(group.key, m, time.time())

    def expire(self, now: float | None = None) -> int:
        """Complete the groups whose timeout passed; returns how many."""
        if self.spec.timeout is None:
            return 0
        t = time.time() if now is None else now
        with self._lock:
            due = [g for g in self._groups.values() if g.started + self.spec.timeout <= t]
            for g in due:
                self._finish(g, "timeout")
        return len(due)

    # --- after a restart --------------------------------------------------------------

    def load(self) -> int:
        """Read the pending inputs back from the staging queue, finish every decided
        aggregate a crash interrupted, and rebuild the open groups (their timeouts count
        from their first input's put). Returns the inputs pending."""
        found: list[tuple[float, BridgeMessage]] = []
        seen: set[str] = set()
        since = None
        while True:
            hits = self.staging.search(
                Filter(state=PublisherState.REVEALED, since=since, limit=1000)
            )
            fresh = [h for h in hits if h.msg_id not in seen]
            for h in fresh:
                seen.add(h.msg_id)
                env = self.staging.peek(h.msg_id)
                view = BridgeMessage(
                    h.msg_id,
                    self.staging.name,
                    env.body,
                    env.content_type,
                    dict(env.headers),
                    h.correlation_id,
                    env.priority,
                    env.ordering_key,
                    env.publisher,
                    tuple(h.parents),
                )
                found.append((h.created_at.timestamp(), view))
            if len(hits) < 1000 or not fresh:
                break
            since = hits[-1].created_at
        found.sort(key=lambda p: p[0])
        decisions = [v for _, v in found if _DECISION in v.headers]
        inputs = {v.msg_id: (t, v) for t, v in found if _DECISION not in v.headers}
        with self._lock:
            self._groups.clear()
            self._bytes = 0
            for d in decisions:
                members = [inputs.pop(m)[1] for m in d.parents if m in inputs]
                if len(members) == len(d.parents):  # nothing withdrawn yet: put it again
                    key = d.correlation_id or ""
                    self.emit([self._aggregate(key, members, d.headers[_DECISION], d.msg_id)])
                log.info("route %s: aggregate %s finished after a restart", self.route, d.msg_id)
                self._withdraw([m.msg_id for m in members], f"aggregated into {d.msg_id}")
                self._withdraw([d.msg_id], "aggregate put")
            for started, view in sorted(inputs.values(), key=lambda p: p[0]):
                key = view.correlation_id or ""
                group = self._groups.get(key)
                if group is None:
                    group = self._groups[key] = Group(key, started)
                group.members.append(view)
                group.size += len(view.body)
                self._bytes += len(view.body)
            for group in list(self._groups.values()):
                if self._groups.get(group.key) is group and self._is_complete(group):
                    self._finish(group, "complete")
        return self.pending

    @property
    def pending(self) -> int:
        """Inputs waiting in open groups."""
        with self._lock:
            return sum(len(g.members) for g in self._groups.values())

    @property
    def groups(self) -> int:
        """Open groups."""
        with self._lock:
            return len(self._groups)


def _value(m: BridgeMessage) -> Any:
    """An input's payload as a JSON value for the default aggregate."""
    try:
        value = decode(m.body, m.content_type)
    except Exception:
        value = m.body
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.hex()
    return value
