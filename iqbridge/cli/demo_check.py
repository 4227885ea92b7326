"""The demo's verdict, computed from the index: was anything lost, or processed twice?

A *delivery* is one message for one consumer group: each named subscriber of a message,
and each pool (whose members share one delivery). For every delivery the index journal
must show exactly one DONE, the handlers must have run to completion exactly once
(``effects``, recorded by the demo's handlers), and the publisher must be JOURNALLED.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from iqbridge.model import MessageState
from iqbridge.states import ActorKind, PublisherState, SubscriberState

__all__ = ["Verdict", "deliveries", "final_states", "outcome", "verify"]

_DONE = SubscriberState.DONE.value
_JOURNALLED = SubscriberState.JOURNALLED.value


def deliveries(state: MessageState) -> dict[str, tuple[str, ...]]:
    """Consumer group -> its members: named subscribers are their own group."""
    out: dict[str, list[str]] = {}
    for name, view in state.subscribers.items():
        out.setdefault(view.pool or name, []).append(name)
    return {group: tuple(members) for group, members in out.items()}


def outcome(state: MessageState, subscriber: str) -> str | None:
    """What the subscriber's last finished move was (DONE, UNUSABLE, EXPIRED), or its
    current state if it is not journalled."""
    moves = [
        e.dst
        for e in state.journal
        if e.actor_kind is ActorKind.SUBSCRIBER and e.actor == subscriber
    ]
    if not moves:
        return None
    if moves[-1] != _JOURNALLED:
        return moves[-1]
    rest = [m for m in moves if m != _JOURNALLED]
    return rest[-1] if rest else _JOURNALLED


def final_states(states: Sequence[MessageState]) -> tuple[Counter[str], Counter[str]]:
    """Counts of final states: publishers, and subscribers (JOURNALLED split by outcome)."""
    pubs: Counter[str] = Counter()
    subs: Counter[str] = Counter()
    for st in states:
        pubs[st.publisher_state.value if st.publisher_state else "-"] += 1
        for name, view in st.subscribers.items():
            current = view.state.value if view.state else "-"
            if current == _JOURNALLED:
                current = f"JOURNALLED after {outcome(st, name)}"
            subs[current] += 1
    return pubs, subs


def _dones(state: MessageState, members: Sequence[str]) -> int:
    return sum(
        1
        for e in state.journal
        if e.actor_kind is ActorKind.SUBSCRIBER and e.actor in members and e.dst == _DONE
    )


@dataclass
class Verdict:
    """Deliveries expected and how they ended; ``problems`` empty means all is well."""

    expected: int = 0
    done_once: int = 0
    effects: int = 0
    lost: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing lost, nothing processed twice."""
        return not self.lost and not self.twice

    @property
    def problems(self) -> list[str]:
        """Every finding, one line each."""
        return [*(f"lost: {x}" for x in self.lost), *(f"twice: {x}" for x in self.twice)]


def verify(
    states: Sequence[MessageState],
    effects: Mapping[tuple[str, str], int],
    planned: Mapping[str, frozenset[str]],
    labels: Mapping[str, str],
) -> Verdict:
    """Check every planned delivery against the index journal and the handlers' effects.

    ``planned`` maps msg_id -> the consumer groups the demo addressed it to; ``effects``
    counts completed handler runs per (msg_id, group).
    """
    verdict = Verdict()
    by_id = {st.msg_id: st for st in states}
    for msg_id, groups in planned.items():
        label = labels.get(msg_id, msg_id)
        st = by_id.get(msg_id)
        if st is None:
            verdict.lost.extend(f"{label} for {g}: no record in the index" for g in sorted(groups))
            continue
        indexed = deliveries(st)
        if set(indexed) != groups:
            verdict.lost.append(
                f"{label}: audience in the index is {sorted(indexed)}, expected {sorted(groups)}"
            )
        if st.publisher_state is not PublisherState.JOURNALLED:
            state = st.publisher_state.value if st.publisher_state else "-"
            verdict.lost.append(f"{label}: publisher is {state}, not JOURNALLED")
        for group in sorted(groups):
            verdict.expected += 1
            dones = _dones(st, indexed.get(group, ()))
            ran = effects.get((msg_id, group), 0)
            verdict.effects += ran
            if dones == 1 and ran == 1:
                verdict.done_once += 1
            if dones == 0 or ran == 0:
                verdict.lost.append(f"{label} for {group}: DONE {dones}x in the index, ran {ran}x")
            elif dones > 1 or ran > 1:
                verdict.twice.append(f"{label} for {group}: DONE {dones}x in the index, ran {ran}x")
    return verdict
