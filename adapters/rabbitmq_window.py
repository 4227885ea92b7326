"""One window of publishes that rides out lost connections without sending twice what
the broker took, for :mod:`iqbridge.adapters.rabbitmq`.

When the connection goes in the middle of a window (:class:`PublishCut`), each message
is one of:

* confirmed (``basic.ack`` came): done, never published again;
* refused (``basic.nack``, or returned unroutable): final; the put fails with
  BrokerRefused once the rest is settled, as without a lost connection;
* never handed to the connection: published again on the next connection;
* in doubt (written, no confirm before the connection went): the broker may hold it.
  With the ledger (``ledger=true``) the next attempt first reads the ledger stream, which
  records every publish routed to the queue, and publishes again only what it lacks.
  Without one the broker cannot tell, and the message is published again: a second copy
  on the broker is possible. iqbridge's consumers recognise it by its msg_id (the
  ``message_id`` property) and process the message once; a plain AMQP consumer sees both.

The ledger is read on a connection of its own; if that read fails (the broker is still
going away) the attempt fails as a lost connection does and is retried, never turned
into a blind resend. It is read up to a marker published there first, on a connection
opened after the lost one was gone: a publish the lost connection's channel had read
but routes only after that marker (a broker lagging by a whole reconnect) would be
missed, and sent again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from iqbridge.redaction import get_logger

from .rabbitmq_link import Link, LinkLost, Outcome, Outgoing, PublishCut, Sent  # noqa: TID251
from .rabbitmq_wire import as_int  # noqa: TID251

__all__ = ["Window"]

log = get_logger("iqbridge.adapters.rabbitmq")

#: Probes the ledger: (msg_id, put time in µs) pairs -> the msg_ids it holds.
Probe = Callable[[list[tuple[str, int]]], dict[str, str]]


class Window:
    """The messages of one publish and what became of each so far (None: confirmed,
    Unconfirmed: refused, :class:`Sent`: to publish, or to look up first)."""

    def __init__(self, items: Sequence[Outgoing], *, probe: Probe | None, url: str) -> None:
        self.items = list(items)
        self.outcomes: list[Outcome] = [Sent.UNSENT] * len(self.items)
        self._probe = probe
        self._url = url
        #: Messages published again while in doubt, without a ledger to ask.
        self.resent_in_doubt = 0

    def attempt(self, link: Link, timeout: float) -> None:
        """Publish what is still to publish on ``link`` (after settling what is in doubt)
        and record the outcomes; LinkLost if the connection goes (the caller retries)."""
        self._settle_doubt()
        todo = [i for i, o in enumerate(self.outcomes) if o is Sent.UNSENT]
        if not todo:
            return
        try:
            results = link.publish([self.items[i] for i in todo], timeout=timeout)
        except PublishCut as cut:
            self._record(todo, cut.outcomes)
            raise
        self._record(todo, results)

    def _record(self, todo: list[int], results: list[Outcome]) -> None:
        for i, outcome in zip(todo, results, strict=True):
            self.outcomes[i] = outcome

    def _settle_doubt(self) -> None:
        doubt = [i for i, o in enumerate(self.outcomes) if o is Sent.IN_DOUBT]
        if not doubt:
            return
        held: dict[str, str] = {}
        if self._probe is not None:
            sent = [
                (
                    self.items[i].properties.message_id or "",
                    as_int((self.items[i].properties.headers or {}).get("x-iq-at")),
                )
                for i in doubt
            ]
            try:
                held = self._probe(sent)
            except Exception as exc:  # the broker is still going away: try again later
                raise LinkLost(f"the ledger could not be read ({exc})") from exc
        again = 0
        for i in doubt:
            if self.items[i].properties.message_id in held:
                self.outcomes[i] = None  # routed before the connection went
            else:
                self.outcomes[i] = Sent.UNSENT
                again += 1
        if self._probe is None:
            self.resent_in_doubt += again
            log.warning(
                "RabbitMQ at %s: %d message(s) in doubt after a lost connection are "
                "published again; without ledger=true the broker cannot say whether it "
                "took them, so it may hold a second copy (iqbridge's consumers skip it)",
                self._url,
                again,
            )
        else:
            log.info(
                "RabbitMQ at %s: of %d message(s) in doubt after a lost connection the "
                "ledger holds %d; publishing the other %d again",
                self._url,
                len(doubt),
                len(doubt) - again,
                again,
            )

    def refused(self) -> list[tuple[Outgoing, BaseException]]:
        """The messages the broker refused, with why."""
        return [
            (item, o)
            for item, o in zip(self.items, self.outcomes, strict=True)
            if isinstance(o, BaseException)
        ]
