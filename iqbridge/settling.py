"""Settling deliveries: in process, done, unusable, release, renew; confirm and undo."""

from __future__ import annotations

import logging
from collections.abc import Callable

from iqbridge import engine
from iqbridge.engine import Change
from iqbridge.errors import IllegalTransition, InvalidArgument
from iqbridge.model import MessageRecord
from iqbridge.queue_core import QueueCore, to_seconds
from iqbridge.states import PublisherState
from iqbridge.transaction import Transaction, join

__all__ = ["Settling"]

log = logging.getLogger("iqbridge")


class Settling(QueueCore):
    """A delivery's moves (in process, done, unusable, release, renew), confirm_get,
    undo, and transactions of the application's database.

    One part of :class:`~iqbridge.queue.Queue`."""

    def _process(
        self, msg_id: str, subscriber: str, token: str, hint: MessageRecord | None = None
    ) -> Change:
        change = self._apply(
            msg_id, lambda r: engine.process(r, subscriber, token, self._now()), hint
        )
        assert change is not None
        return change

    def _done(
        self,
        msg_id: str,
        subscriber: str,
        token: str | None,
        hint: MessageRecord | None = None,
        transaction: object = None,
        on_rollback: Callable[[], None] | None = None,
    ) -> Change:
        def op(r: MessageRecord) -> Change:
            return engine.done(r, subscriber, token, self._now(), auto_journal=self.auto_journal)

        if transaction is None:
            change = self._apply(msg_id, op, hint)
        else:
            # In the application's transaction: DONE commits (or not) with its rows, and
            # the broker hears of it only after the commit.
            with join(self._store, transaction) as binding:
                change = self._apply(msg_id, op, hint)
                if on_rollback is not None:
                    binding.on_rollback(on_rollback)
        assert change is not None
        rec = change.record
        if self._native and rec.native_ref:

            def ack() -> None:
                self._broker_call(
                    lambda: self._adapter.ack(
                        self.name, self._group_of(rec, subscriber), [rec.native_ref or ""]
                    )
                )

            if transaction is None:
                ack()
            else:
                binding.after_commit(ack)
        return change

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

    def _unusable(
        self,
        msg_id: str,
        subscriber: str,
        token: str | None,
        reason: str,
        hint: MessageRecord | None = None,
    ) -> Change:
        change = self._apply(
            msg_id,
            lambda r: engine.unusable(
                r, subscriber, token, self._now(), reason, auto_journal=self.auto_journal
            ),
            hint,
        )
        assert change is not None
        rec = change.record
        if self._native and rec.native_ref:
            self._broker_call(
                lambda: self._adapter.dead_letter(
                    self.name, self._group_of(rec, subscriber), rec.native_ref or "", reason
                )
            )
        return change

    def _release(
        self,
        msg_id: str,
        subscriber: str,
        token: str | None,
        reason: str,
        delay: float,
        hint: MessageRecord | None = None,
    ) -> Change:
        delay_us = int(max(delay, 0.0) * 1_000_000)
        change = self._apply(
            msg_id,
            lambda r: engine.release(
                r, subscriber, token, self._now(), reason=reason, delay_us=delay_us
            ),
            hint,
        )
        assert change is not None
        self.hub.notify()
        return change

    def _renew(
        self,
        msg_id: str,
        subscriber: str,
        token: str,
        lease: float | None,
        hint: MessageRecord | None = None,
    ) -> Change:
        secs = to_seconds(lease, "lease")
        secs = self.lease if secs is None else secs

        def op(r: MessageRecord) -> Change:
            now = self._now()
            return engine.renew(r, subscriber, token, now, now + int(secs * 1_000_000))

        change = self._apply(msg_id, op, hint)
        assert change is not None
        return change

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
        self._done(msg_id, subscriber, token)

    def undo(self, confirm_id: str) -> None:
        """Undo an unconfirmed put (its msg_id) or a held get (its delivery's confirm_id)."""
        if "/" in confirm_id:
            msg_id, subscriber, token = self._parse_confirm(confirm_id)
            self._release(msg_id, subscriber, token, "undo", 0.0)
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
