"""Connections, units of work and held messages of :mod:`iqbridge.adapters.ibmmq`, and
the lazy import of IBM's client module."""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from iqbridge.errors import ConfigurationError
from iqbridge.model import Envelope

from .ibmmq_wire import ENV_PROPERTY, INSTALL_HINT  # noqa: TID251

__all__ = ["CLIENTS", "Conn", "Held", "Unit", "browsed", "client_module"]

#: The client modules tried, in order.
CLIENTS = ("ibmmq", "pymqi")


def client_module() -> ModuleType:
    """IBM's client module (``ibmmq``, else ``pymqi``), imported now; ConfigurationError
    with the install hint when neither imports (or the MQ C client is missing)."""
    errors = []
    for name in CLIENTS:
        try:
            return importlib.import_module(name)
        except ImportError as exc:  # not installed, or its C library is missing
            errors.append(f"{name}: {exc}")
    raise ConfigurationError(f"{INSTALL_HINT} ({'; '.join(errors)})")


class Conn:
    """One connection (hconn) with its open queue handles; used by one caller at a time."""

    def __init__(self, mod: Any, qmgr: Any) -> None:
        self.mod = mod
        self.qmgr = qmgr
        self.opened: dict[tuple[str, int], Any] = {}
        self.get_handle: Any = None
        self.put_handle: Any = None

    def queue(self, name: str, options: int) -> Any:
        key = (name, options)
        q = self.opened.get(key)
        if q is None:
            q = self.opened[key] = self.mod.Queue(self.qmgr, name, options)
        return q

    def props(self) -> Any:
        """A message handle of this connection, reused for every get (each get replaces
        its properties)."""
        if self.get_handle is None:
            self.get_handle = self.mod.MessageHandle(self.qmgr)
        return self.get_handle

    def envelope_handle(self, env_json: str) -> Any:
        """This connection's message handle for puts, holding ``env_json`` as the envelope
        property and nothing else."""
        if self.put_handle is None:
            self.put_handle = self.mod.MessageHandle(self.qmgr)
        self.put_handle.properties.set(ENV_PROPERTY, env_json)
        return self.put_handle

    def close(self, *, back_out: bool) -> None:
        """Back out what is uncommitted (when asked), close handles and disconnect; every
        error is swallowed: the connection is being dropped."""
        with contextlib.suppress(Exception):
            if back_out:
                self.qmgr.backout()
        for q in self.opened.values():
            with contextlib.suppress(Exception):
                q.close()
        self.opened.clear()
        for handle in (self.get_handle, self.put_handle):
            if handle is not None:
                with contextlib.suppress(Exception):
                    handle.dlt()
        self.get_handle = self.put_handle = None
        with contextlib.suppress(Exception):
            self.qmgr.disconnect()


@dataclass(eq=False)
class Unit:
    """The gets of one receive, in one unit of work on its own connection."""

    conn: Conn
    entries: list[Held] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    finished: bool = False


@dataclass(eq=False)
class Held:
    """A message got under syncpoint and not settled yet."""

    queue: str
    group: str
    ref: str
    unit: Unit
    mq_queue: str
    body: bytes
    md: Any
    env_json: str | None
    envelope: Envelope
    adopted: bool
    consumer: str
    since: float
    count: int
    #: held, done (commit), dead (put to the backout queue, commit), back (back out or
    #: put again at the end of the unit), moved (put again already, commit).
    state: str = "held"


def browsed(mod: Any, q: Any, mh: Any, *, lock: bool = False) -> Iterator[tuple[Any, bytes]]:
    """Each message on the browse handle ``q``, in delivery order, left where it is: its
    MD and body, its properties in the message handle ``mh`` (MQGMO_BROWSE_FIRST, then
    MQGMO_BROWSE_NEXT, no wait, no syncpoint). With ``lock``, the message under the
    cursor is locked (MQGMO_LOCK) so no get removes it while it is read; the lock moves
    on with the cursor (drop the last one with MQGMO_UNLOCK)."""
    c = mod.CMQC
    browse = c.MQGMO_BROWSE_FIRST
    while True:
        md, gmo = mod.MD(), mod.GMO()
        gmo.Options = (
            browse
            | c.MQGMO_NO_SYNCPOINT
            | c.MQGMO_NO_WAIT
            | c.MQGMO_PROPERTIES_IN_HANDLE
            | c.MQGMO_FAIL_IF_QUIESCING
            | (c.MQGMO_LOCK if lock else 0)
        )
        gmo.MatchOptions = c.MQMO_NONE
        gmo.Version = c.MQGMO_VERSION_4
        gmo.MsgHandle = mh.msg_handle
        browse = c.MQGMO_BROWSE_NEXT
        try:
            body = q.get(None, md, gmo)
        except mod.MQMIError as exc:
            if int(exc.reason) == c.MQRC_NO_MSG_AVAILABLE:
                return
            raise
        yield md, body
