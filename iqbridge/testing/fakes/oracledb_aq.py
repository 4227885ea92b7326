"""python-oracledb's AQ constants and option classes, as the fake
(:mod:`iqbridge.testing.fakes.oracledb`) has them: ``src/oracledb/constants.py`` and
``aq.py``'s ``MessageProperties``, ``DeqOptions`` and ``EnqOptions``."""

from __future__ import annotations

import datetime
from typing import Any

__all__ = [
    "MSG_PERSISTENT",
    "DEQ_BROWSE",
    "DEQ_LOCKED",
    "DEQ_REMOVE",
    "DEQ_REMOVE_NODATA",
    "DEQ_FIRST_MSG",
    "DEQ_NEXT_TRANSACTION",
    "DEQ_NEXT_MSG",
    "DEQ_IMMEDIATE",
    "DEQ_ON_COMMIT",
    "DEQ_NO_WAIT",
    "DEQ_WAIT_FOREVER",
    "ENQ_IMMEDIATE",
    "ENQ_ON_COMMIT",
    "MSG_READY",
    "MSG_WAITING",
    "MSG_PROCESSED",
    "MSG_EXPIRED",
    "MSG_NO_DELAY",
    "MSG_NO_EXPIRATION",
    "DeqOptions",
    "EnqOptions",
    "MessageProperties",
]

# --- constants, as src/oracledb/constants.py -------------------------------------------

MSG_PERSISTENT = 1
DEQ_BROWSE = 1
DEQ_LOCKED = 2
DEQ_REMOVE = 3
DEQ_REMOVE_NODATA = 4
DEQ_FIRST_MSG = 1
DEQ_NEXT_TRANSACTION = 2
DEQ_NEXT_MSG = 3
DEQ_IMMEDIATE = 1
DEQ_ON_COMMIT = 2
DEQ_NO_WAIT = 0
DEQ_WAIT_FOREVER = 2**32 - 1
ENQ_IMMEDIATE = 1
ENQ_ON_COMMIT = 2
MSG_READY = 0
MSG_WAITING = 1
MSG_PROCESSED = 2
MSG_EXPIRED = 3
MSG_NO_DELAY = 0
MSG_NO_EXPIRATION = -1

_STATE_NAMES = {MSG_READY: "READY", MSG_WAITING: "WAIT", MSG_PROCESSED: "PROCESSED"}
_STATE_NAMES[MSG_EXPIRED] = "EXPIRED"


class MessageProperties:
    """Message properties, as ``oracledb.MessageProperties``."""

    def __init__(self) -> None:
        self.payload: Any = None
        self.correlation: str | None = None
        self.priority = 0
        self.delay = MSG_NO_DELAY
        self.expiration = MSG_NO_EXPIRATION
        self.exceptionq: str | None = None
        self.recipients: list[str] = []
        self.deliverymode = MSG_PERSISTENT
        self._msgid: bytes | None = None
        self._attempts = 0
        self._enqtime: datetime.datetime | None = None
        self._state = MSG_READY

    @property
    def msgid(self) -> bytes | None:
        """The message id the database gave (16 bytes)."""
        return self._msgid

    @property
    def attempts(self) -> int:
        """How often a dequeue of the message was rolled back."""
        return self._attempts

    @property
    def enqtime(self) -> datetime.datetime | None:
        """When it was enqueued."""
        return self._enqtime

    @property
    def state(self) -> int:
        """MSG_READY, MSG_WAITING, MSG_PROCESSED or MSG_EXPIRED."""
        return self._state


class DeqOptions:
    """Dequeue options, as ``oracledb.DeqOptions``."""

    def __init__(self) -> None:
        self.mode = DEQ_REMOVE
        self.navigation = DEQ_NEXT_MSG
        self.visibility = DEQ_ON_COMMIT
        self.wait = DEQ_WAIT_FOREVER
        self.consumername: str | None = None
        self.msgid: bytes | None = None
        self.correlation: str | None = None
        self.condition: str | None = None
        self.deliverymode = MSG_PERSISTENT
        self.transformation: str | None = None


class EnqOptions:
    """Enqueue options, as ``oracledb.EnqOptions``."""

    def __init__(self) -> None:
        self.visibility = ENQ_ON_COMMIT
        self.deliverymode = MSG_PERSISTENT
        self.transformation: str | None = None
