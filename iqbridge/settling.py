"""Settling deliveries: a delivery's moves (in process, done, unusable, release, renew),
one at a time or a whole batch in one index commit, confirm_get, undo, and transactions
of the application's database."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from iqbridge import engine, engine_batch
from iqbridge.adapter import AcksInTransaction
from iqbridge.durations import seconds, to_seconds
from iqbridge.engine import Change
from iqbridge.errors import BatchLeaseLost, IllegalTransition, InvalidArgument, IQError
from iqbridge.holding import Hold
from iqbridge.model import MessageRecord
from iqbridge.moves import DONE, Move
from iqbridge.observability import tracing
from iqbridge.queue_core import Part, QueueCore
from iqbridge.redaction import get_logger
from iqbridge.states import IN_DOUBT, PublisherState
from iqbridge.stores.base import SettlesHeld
from iqbridge.transaction import Binding, Transaction, driver_connection, join
from iqbridge.writes import Writes

__all__ = ["Move", "Settled", "Settling"]

log = get_logger("iqbridge")


@dataclass(frozen=True, slots=True)
class Settled:
    """What settling a batch did, by msg_id: ``done``, ``unusable`` and ``released``
    moved as asked; ``lost`` (msg_id -> why) could not move because their lease was taken
    over (the message went back, or to another holder); nothing changed for them.
    Deliveries moved alone before are left as they are and are in none of the lists."""

    done: list[str] = field(default_factory=list)
    unusable: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    lost: dict[str, str] = field(default_factory=dict)


class Settling(Part):
    """A delivery's moves (in process, done, unusable, release, renew), one by one or
    for a batch at once, confirm_get, undo, and transactions of the application's
    database.

    One part of :class:`~iqbridge.queue.Queue`."""

    def __init__(self, core: QueueCore) -> None:
        super().__init__(core)
        #: Where a batch settles outside the application's transactions, chosen once:
        #: on the broker's server with its acknowledgements (the index co-located with a
        #: native-group broker), else in the index store.
        self._colocated = self.hub.colocated if self._native else None
        #: Whether a batch's done and in-process moves are settled in place, by a plan
        #: from the transition table and no record per message (:meth:`_in_place`),
        #: chosen once: on the broker's server with its acknowledgements (the co-located
        #: index above), or in an index store that can (SettlesHeld); else the batch
        #: engine decides them on the holds' records.
        store = self._store
        self._settler: SettlesHeld | None = store if isinstance(store, SettlesHeld) else None
        self._in_place_ok = self._colocated is not None or self._settler is not None
        self._settle_plans: dict[tuple[str, str], engine_batch.SettlePlan] = {}

    def _op(
        self, move: Move, subscriber: str, token: str | None
    ) -> Callable[[MessageRecord], Change]:
        """The engine operation of ``move`` for one subscriber's hold."""
        kind = move.kind
        if kind == "done":
            return lambda r: engine.done(
                r, subscriber, token, self._now(), auto_journal=self.auto_journal
            )
        if kind == "unusable":
            return lambda r: engine.unusable(
                r, subscriber, token, self._now(), move.reason, auto_journal=self.auto_journal
            )
        if kind == "release":
            delay_us = int(max(move.delay, 0.0) * 1_000_000)
            return lambda r: engine.release(
                r, subscriber, token, self._now(), reason=move.reason, delay_us=delay_us
            )
        if kind == "process":
            return lambda r: engine.process(r, subscriber, token, self._now())
        if kind == "renew":
            secs = to_seconds(move.lease, "lease", positive=True)
            secs = self.lease if secs is None else secs

            def renew(r: MessageRecord) -> Change:
                now = self._now()
                return engine.renew(r, subscriber, token or "", now, now + int(secs * 1e6))

            return renew
        raise InvalidArgument(f"unknown move {kind!r}")

    def _move(
        self,
        msg_id: str,
        subscriber: str,
        token: str | None,
        move: Move,
        hint: MessageRecord | None = None,
    ) -> Change:
        """One move, committed (retrying a lost race on a fresh read), then told to the
        broker."""
        change = self._apply(msg_id, self._op(move, subscriber, token), hint)
        assert change is not None
        if self._native or move.kind == "release":
            self._tell_broker([(change.record, subscriber, move)])
        return change

    def _tell_broker(
        self, moved: Sequence[tuple[MessageRecord, str, Move]], acked: frozenset[str] = frozenset()
    ) -> None:
        """What the broker hears once the index holds the outcomes: one acknowledgement
        per group for what is DONE (but the msg_ids ``acked`` with the commit already), a
        dead letter per UNUSABLE; given-back messages wake this process's getters."""
        acks: dict[str, list[str]] = {}
        wake = False
        for rec, subscriber, move in moved:
            if move.kind == "release":
                wake = True
            elif move.kind == "done" and rec.msg_id in acked:
                continue
            elif move.kind in ("done", "unusable") and self._native and rec.native_ref:
                group = self._group_of(rec, subscriber)
                if move.kind == "done":
                    acks.setdefault(group, []).append(rec.native_ref)
                else:
                    self._broker_call(
                        functools.partial(
                            self._adapter.dead_letter, self.name, group, rec.native_ref, move.reason
                        )
                    )
        for group, refs in acks.items():
            self._broker_call(functools.partial(self._adapter.ack, self.name, group, refs))
        if wake:
            self.hub.notify()

    def _tell_after_commit(
        self,
        binding: Binding,
        transaction: object,
        told: Sequence[tuple[MessageRecord, str, Move]],
    ) -> None:
        """What the broker must hear of moves made in the application's transaction.
        An acknowledgement the broker can make in that same transaction
        (:class:`~iqbridge.adapter.AcksInTransaction`: Oracle AQ, the application's
        connection on its database) is made now and commits or rolls back with it; the
        rest is told after the commit."""
        adapter = self._adapter
        joined: set[tuple[str, str]] = set()
        conn = driver_connection(transaction) if self._native else None
        if conn is not None and isinstance(adapter, AcksInTransaction):
            acks: dict[str, list[str]] = {}
            for rec, subscriber, move in told:
                if move.kind == "done" and rec.native_ref:
                    group = self._group_of(rec, subscriber)
                    acks.setdefault(group, []).append(rec.native_ref)
            for group, refs in acks.items():
                done = adapter.ack_in(conn, self.name, group, refs)
                joined.update((group, ref) for ref in done)
                if done:
                    binding.on_rollback(
                        functools.partial(adapter.ack_rolled_back, self.name, group, done)
                    )
        rest = [
            (r, s, m)
            for r, s, m in told
            if not (m.kind == "done" and (self._group_of(r, s), r.native_ref) in joined)
        ]
        if rest:
            binding.after_commit(lambda: self._tell_broker(rest))

    def settle_many(
        self,
        moves: Sequence[tuple[Hold, Move]],
        transaction: object = None,
        partial: bool = False,
    ) -> Settled:
        """Move many held deliveries (their holds) in one index commit and one broker
        acknowledgement per group. A move whose compare-and-set fails (another move of
        the message came first) is made again on a fresh read; one that cannot be made
        (its lease was taken over) is reported in ``Settled.lost`` and changes nothing.
        Deliveries no longer held (moved alone already) are skipped. In the
        application's ``transaction``, a lost one raises BatchLeaseLost (before any
        delivery or the broker is told of the moves, which the caller's rollback undoes)
        unless ``partial``."""
        result = Settled()
        held = [(d, move) for d, move in moves if d.state in IN_DOUBT]
        writes = Writes(self.name)
        # Per position in writes.moved / writes.changes: the delivery and its move.
        batched: list[tuple[Hold, Move]] = []
        single: list[tuple[Hold, Move]] = []
        retry: list[tuple[Hold, Move]] = []
        if self._in_place_ok and transaction is None:
            held = self._settle_where_held(held, result, retry)
        self._read_unknown(held)
        self._plan_settles(held, writes, batched, single, retry)
        store = self._store
        moved: list[tuple[Hold, Move, MessageRecord]] = []
        binding: Binding | None = None
        with contextlib.ExitStack() as stack:
            if transaction is not None:
                binding = stack.enter_context(join(store, transaction))
            records = [a for _, a in writes.moved] + [c.record for c in writes.changes]
            colocated = self._colocated if binding is None else None
            acks: list[tuple[int, str, str]] = []
            if colocated is not None:
                # One server: each DONE and its acknowledgement in one atomic step.
                for n, ((d, move), rec) in enumerate(zip(batched + single, records, strict=True)):
                    if move.kind == "done" and rec.native_ref:
                        acks.append((n, self._group_of(rec, d.subscriber), rec.native_ref))
                flags = (
                    colocated.settle_indexed(self.name, writes, acks, store) if len(writes) else []
                )
            else:
                flags = store.commit_writes(writes) if len(writes) else []
            acked = frozenset(records[n].msg_id for n, _, _ in acks if flags[n])
            for (d, move), rec, ok in zip(batched + single, records, flags, strict=True):
                if ok:
                    moved.append((d, move, rec))
                else:
                    retry.append((d, move))
            for d, move in retry:
                try:
                    again = self._apply(d.msg_id, self._op(move, d.subscriber, d.token))
                except IQError as exc:
                    result.lost[d.msg_id] = str(exc)
                    continue
                assert again is not None
                moved.append((d, move, again.record))
            if binding is not None:
                self._undo_on_rollback(binding, [d for d, _, _ in moved])
        if result.lost and transaction is not None and not partial:
            raise BatchLeaseLost(moves[0][0].subscriber, result.lost)
        for d, move, rec in moved:
            self._note_redeliveries(rec)
            d.settled(rec)
            if move.kind == "done":
                result.done.append(d.msg_id)
            elif move.kind == "unusable":
                result.unusable.append(d.msg_id)
            elif move.kind == "release":
                result.released.append(d.msg_id)
        told = [(rec, d.subscriber, m) for d, m, rec in moved]
        if binding is None:
            self._tell_broker(told, acked)
        else:
            self._tell_after_commit(binding, transaction, told)
        return result

    def _settle_where_held(
        self,
        held: Sequence[tuple[Hold, Move]],
        result: Settled,
        retry: list[tuple[Hold, Move]],
    ) -> list[tuple[Hold, Move]]:
        """Done and in-process moves settled where the index lives (with the broker's
        acknowledgements when the index is co-located with the broker): one plan per
        subscriber and kind from the transition table, then one call that compares and
        sets each message's member there, no record on either side. A message off the
        common path goes to ``retry`` (moved on a fresh read by the per-message engine,
        which raises the right error). Returns the other moves, for the index's usual
        path."""
        rest: list[tuple[Hold, Move]] = []
        groups: dict[tuple[str, str], list[tuple[Hold, Move, tuple[str, str, str, str]]]] = {}
        for d, move in held:
            item = self._held_item(d) if move.kind in ("done", "process") else None
            if item is None:
                rest.append((d, move))
            else:
                groups.setdefault((d.subscriber, move.kind), []).append((d, move, item))
        for (subscriber, kind), group in groups.items():
            plan = self._plan(subscriber, kind)
            items = [item for _, _, item in group]
            flags = self._in_place(plan, self._now(), items)
            for (d, move, _), ok in zip(group, flags, strict=True):
                if not ok:
                    retry.append((d, move))
                    continue
                dst, last, _ = plan.moves.get(d.state) or next(iter(plan.moves.values()))
                d.moved(last or dst, held=kind == "process")
                if kind == "done":
                    result.done.append(d.msg_id)
            if kind == "done" and self._native and self._colocated is None:
                # The index holds each outcome: now the broker hears of it, one
                # acknowledgement per group, as after a commit (_tell_broker).
                acks: dict[str, list[str]] = {}
                for (_, _, group_name, ref), ok in zip(items, flags, strict=True):
                    if ok and ref:
                        acks.setdefault(group_name, []).append(ref)
                for group_name, refs in acks.items():
                    self._broker_call(
                        functools.partial(self._adapter.ack, self.name, group_name, refs)
                    )
        return rest

    def _in_place(
        self, plan: engine_batch.SettlePlan, at: int, held: Sequence[tuple[str, str, str, str]]
    ) -> list[bool]:
        """Settle ``held`` (msg_id, token, consumer group, entry id) by ``plan`` where the
        index keeps them: on the broker's server with their acknowledgements (the
        co-located index), else in the index store. One flag per message."""
        if self._colocated is not None:
            return self._colocated.settle_held(self.name, plan, at, held, self._store)
        settler = self._settler
        assert settler is not None  # chosen once, in __init__ (a protocol check costs µs)
        return settler.settle_held(self.name, plan, at, [(m, token) for m, token, _, _ in held])

    def _read_unknown(self, held: Sequence[tuple[Hold, Move]]) -> None:
        """The records of holds that know none (moved where the index lives before, say
        in process and now given back), read in one call instead of one each; a hold
        whose message is gone keeps none (its move is retried on a fresh read and
        reported)."""
        unknown = [d for d, _ in held if d.unknown]
        if not unknown:
            return
        records = self._store.load_many([d.msg_id for d in unknown])
        for d in unknown:
            rec = records.get(d.msg_id)
            if rec is not None:
                d.record = rec

    @staticmethod
    def _held_item(d: Hold) -> tuple[str, str, str, str] | None:
        """(msg_id, token, consumer group, entry id) of a hold, or None if unknown."""
        if d.group is not None and d.ref is not None:
            return (d.msg_id, d.token, d.group, d.ref)
        rec = d.record
        member = rec.members.get(d.subscriber) if rec is not None else None
        if rec is None or member is None:
            return None
        # Kept: a later settle of this hold (done after in process) needs no record.
        d.group, d.ref = member.pool or d.subscriber, rec.native_ref or ""
        return (d.msg_id, d.token, d.group, d.ref)

    def _plan_settles(
        self,
        held: Sequence[tuple[Hold, Move]],
        writes: Writes,
        batched: list[tuple[Hold, Move]],
        single: list[tuple[Hold, Move]],
        retry: list[tuple[Hold, Move]],
    ) -> None:
        """Decide the moves of held deliveries into ``writes``: done and process of each
        subscriber's deliveries in one pass of the batch engine (``batched``, in the
        order of ``writes.moved``), the others one at a time (``single``, in the order of
        ``writes.changes``); a delivery whose record is stale or missing goes to
        ``retry``, to be moved on a fresh read."""
        common: dict[tuple[str, str], list[tuple[Hold, Move, MessageRecord]]] = {}
        rest: list[tuple[Hold, Move]] = []
        for d, move in held:
            rec = d.record
            if rec is None:
                retry.append((d, move))
            elif move.kind in ("done", "process"):
                common.setdefault((d.subscriber, move.kind), []).append((d, move, rec))
            else:
                rest.append((d, move))
        now = self._now()
        for (subscriber, kind), group in common.items():
            moved, journal, off = engine_batch.settle(
                [rec for _, _, rec in group],
                subscriber,
                [d.token for d, _, _ in group],
                kind,
                now,
                auto_journal=self.auto_journal,
            )
            writes.moved += moved
            writes.journal += journal
            skip = set(off)
            batched += [(d, m) for i, (d, m, _) in enumerate(group) if i not in skip]
            rest += [(group[i][0], group[i][1]) for i in off]
        for d, move in rest:
            if d.record is None:
                retry.append((d, move))
                continue
            try:
                change = self._op(move, d.subscriber, d.token)(d.record)
            except IQError:
                retry.append((d, move))  # the delivery's record is stale: read it anew
                continue
            writes.changes.append(change)
            single.append((d, move))

    def move(self, hold: Hold, move: Move, transaction: object = None) -> None:
        """Make one move of a held delivery, committed (retrying a lost race on a fresh
        read), then told to the broker; the hold follows. A DONE may be made in the
        application's ``transaction``: it commits (or not) with the application's rows,
        and the broker hears of it only after the commit."""
        kind = move.kind
        if kind == "release":
            seconds(move.delay, "delay")
        elif kind == "renew":
            to_seconds(move.lease, "lease", positive=True)
        if kind == "renew":
            change = self._move(hold.msg_id, hold.subscriber, hold.token, move, hold.record)
        elif kind == "process":
            if self._settled_where_held(hold, move):
                return
            change = self._move(hold.msg_id, hold.subscriber, hold.token, move, hold.record)
        else:
            with tracing.settle(kind, self, hold.msg_id, hold.subscriber, hold.known):
                if transaction is None and kind == "done" and self._settled_where_held(hold, move):
                    return
                if transaction is None or kind != "done":
                    change = self._move(hold.msg_id, hold.subscriber, hold.token, move, hold.record)
                else:
                    change = self._done_in(hold, transaction)
        hold.settled(change.record)

    def _settled_where_held(self, hold: Hold, move: Move) -> bool:
        """A done or in process of one hold settled in place, as a batch of one
        (:meth:`_settle_where_held`), when the queue settles so: True if it moved; False
        if it did not (nothing changed: off the common path, for the per-message
        engine, which raises the right error)."""
        if not self._in_place_ok:
            return False
        retry: list[tuple[Hold, Move]] = []
        return not self._settle_where_held([(hold, move)], Settled(), retry) and not retry

    def _plan(self, subscriber: str, kind: str) -> engine_batch.SettlePlan:
        """The settle plan of ``subscriber``'s ``kind`` moves, looked up once."""
        plan = self._settle_plans.get((subscriber, kind))
        if plan is None:
            plan = engine_batch.settle_plan(subscriber, kind, auto_journal=self.auto_journal)
            self._settle_plans[(subscriber, kind)] = plan
        return plan

    def _done_in(self, hold: Hold, transaction: object) -> Change:
        with join(self._store, transaction) as binding:
            change = self._apply(
                hold.msg_id, self._op(DONE, hold.subscriber, hold.token), hold.record
            )
            assert change is not None
            self._undo_on_rollback(binding, [hold])
        self._tell_after_commit(binding, transaction, [(change.record, hold.subscriber, DONE)])
        return change

    def _undo_on_rollback(self, binding: Binding, deliveries: Sequence[Hold]) -> None:
        """If the application's transaction rolls back, ``deliveries`` (about to be moved
        in it) take back their state from before: still held. If it rolled back because
        its commit failed, a commit cut short may have taken effect all the same: then
        they take what the index holds."""
        before = [(d, d.record, d.state) for d in deliveries]
        tx = binding.tx

        def undo() -> None:
            for d, rec, state in before:
                d.record, d.state = rec, state
            if tx is not None and tx.commit_failed:
                self._resync(deliveries)

        binding.on_rollback(undo)

    def _resync(self, deliveries: Sequence[Hold]) -> None:
        """Each delivery takes its subscriber's state from the index (when it answers)."""
        try:
            records = self._store.load_many([d.msg_id for d in deliveries])
        except IQError as exc:
            log.warning("cannot read the index again after a failed commit: %s", exc)
            return
        for d in deliveries:
            rec = records.get(d.msg_id)
            member = rec.members.get(d.subscriber) if rec is not None else None
            if (
                rec is not None
                and member is not None
                and member.state is not None
                and (member.state not in IN_DOUBT or member.lease_token == d.token)
            ):
                d.record, d.state = rec, member.state

    def transaction(self, connection: object) -> Transaction:
        """A transaction of your own database for :meth:`Delivery.done(transaction=...)
        <iqbridge.Delivery.done>`: DONE commits together with your rows (exactly-once).

        ``connection`` is a SQLAlchemy ``Engine`` or ``Connection`` on the database that
        holds this hub's SQL index. Use it as a context manager: it begins, commits on a
        clean exit (then acknowledges finished deliveries on the broker) and rolls back
        on an exception. Raises ConfigurationError if the index is not a SQL store and
        InvalidArgument if the connection does not reach the index's tables.
        """
        return Transaction(self._store, connection)

    @staticmethod
    def _parse_confirm(confirm_id: str) -> tuple[str, str, str]:
        parts = confirm_id.split("/")
        if len(parts) != 3 or not all(parts):
            raise InvalidArgument(
                f"{confirm_id!r} is not a confirm id; use delivery.confirm_id from get()"
            )
        return parts[0], parts[1], parts[2]

    def confirm_get(self, confirm_id: str) -> None:
        """Finish a held get (``delivery.confirm_id``): -> DONE, from any process."""
        msg_id, subscriber, token = self._parse_confirm(confirm_id)
        self.move(Hold(msg_id, subscriber, token), DONE)

    def undo(self, confirm_id: str) -> None:
        """Undo an unconfirmed put (its msg_id) or a held get (its delivery's confirm_id)."""
        if "/" in confirm_id:
            msg_id, subscriber, token = self._parse_confirm(confirm_id)
            self.move(Hold(msg_id, subscriber, token), Move("release", reason="undo"))
            return

        def undo_put(rec: MessageRecord) -> Change:
            if rec.publisher_state is not PublisherState.PUT:
                raise IllegalTransition(
                    rec.msg_id,
                    rec.publisher,
                    rec.publisher_state,
                    PublisherState.UNAVAILABLE,
                    "undo",
                    "the put is not awaiting confirmation; use withdraw()",
                )
            return engine.withdraw(rec, self._now(), "put undone")

        self._apply(confirm_id, undo_put)
