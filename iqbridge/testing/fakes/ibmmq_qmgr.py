"""The queue manager's side of the IBM MQ fake (:mod:`iqbridge.testing.fakes.ibmmq`):
its queues, messages, units of work and connections' states, one per process and name."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

from iqbridge.testing.fakes.ibmmq_defs import CMQC, _fail

__all__ = ["FakeQueueManager", "queue_manager", "reset"]

# --- the queue manager's state -----------------------------------------------------------

_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/%")


@dataclass
class _Msg:
    seq: int
    body: bytes
    msg_id: bytes
    correl_id: bytes
    priority: int
    persistence: int
    fmt: bytes
    expires: float | None
    put_appl: bytes
    put_date: bytes
    put_time: bytes
    props: dict[str, Any]
    backout: int = 0
    #: Who hides it: ("uow", hconn) for an uncommitted get or put, ("lock", handle id).
    held: tuple[str, int] | None = None


@dataclass
class _LocalQueue:
    name: str
    backout_threshold: int = 0
    boqname: str = ""
    max_depth: int = 5000
    max_msg_length: int = 4 * 1024 * 1024
    fifo: bool = False
    default_priority: int = 0
    default_persistence: int = 1
    msgs: list[_Msg] = field(default_factory=list)

    def order(self) -> list[_Msg]:
        if self.fifo:
            return sorted(self.msgs, key=lambda m: m.seq)
        return sorted(self.msgs, key=lambda m: (-m.priority, m.seq))


class FakeQueueManager:
    """One queue manager of the fake: its listener, users, authorities and queues.

    For tests: :meth:`define` queues, :meth:`deny` authority, :meth:`stop` it,
    :meth:`break_connections` or :meth:`break_at` a call, and look at :meth:`messages`."""

    def __init__(self, name: str, host: str, port: int) -> None:
        self.name = name
        self.endpoint = (host, port)
        self.cond = threading.Condition(threading.RLock())
        self.running = True
        self.channels = {"DEV.APP.SVRCONN", "DEV.ADMIN.SVRCONN", "SYSTEM.DEF.SVRCONN"}
        #: user -> password; None: any user and password are accepted.
        self.users: dict[str, str] | None = None
        #: Users that may run PCF commands (create and delete queues).
        self.admins: set[str] = {"admin", "mqm"}
        #: (user, queue) pairs refused (queue "" refuses the connection itself).
        self.denied: set[tuple[str, str]] = set()
        self.queues: dict[str, _LocalQueue] = {}
        self.uow: dict[int, list[tuple[str, _LocalQueue, _Msg]]] = {}
        self.broken: set[int] = set()
        #: Calls ("put", "commit") that break their connection next: call -> applied.
        self.breaks: dict[str, bool] = {}
        self._seq = itertools.count(1)
        self._ids = itertools.count(1)

    # --- set-up for tests ---

    def define(self, name: str, **attrs: Any) -> None:
        """DEFINE QLOCAL(name) with attributes of :class:`_LocalQueue` (``backout_threshold``,
        ``boqname``, ``max_depth``, ``max_msg_length``, ``fifo``); idempotent."""
        with self.cond:
            if name not in self.queues:
                self.queues[name] = _LocalQueue(name, **attrs)

    def deny(self, user: str, queue: str = "") -> None:
        """Refuse ``user`` the queue (2035 at MQOPEN), or every connection (``queue=""``)."""
        with self.cond:
            self.denied.add((user, queue))

    def stop(self) -> None:
        """endmqm: connections fail with 2059 (new) or 2009 (open ones)."""
        with self.cond:
            self.running = False
            self.broken.update(self.uow)
            for hconn in list(self.uow):
                self._back_out(hconn)
            self.cond.notify_all()

    def start(self) -> None:
        """strmqm."""
        with self.cond:
            self.running = True

    def break_connections(self) -> None:
        """Every open connection breaks (a network cut or a killed client): their units of
        work are backed out, and each later call on them fails with 2009."""
        with self.cond:
            for hconn in list(self.uow):
                self._back_out(hconn)
                self.broken.add(hconn)
            self.cond.notify_all()

    def break_at(self, call: str, *, applied: bool) -> None:
        """The next ``call`` (``"put"`` or ``"commit"``) on any connection breaks it: the
        call fails with 2009 MQRC_CONNECTION_BROKEN and the unit of work left is backed
        out. ``applied``: the call took effect first (the network lost its reply; a
        commit is then committed); else it never reached the queue manager."""
        if call not in ("put", "commit"):
            raise ValueError(f"break_at knows put and commit, not {call!r}")
        with self.cond:
            self.breaks[call] = applied

    def tripped(self, call: str, hconn: int, run: Any) -> None:
        """Run ``run()`` (the call's effect), unless ``call`` is set to break: then break
        the connection (after running it when ``applied``) and raise 2009."""
        applied = self.breaks.pop(call, None)
        if applied is None:
            run()
            return
        if applied:
            run()
        self._back_out(hconn)
        self.broken.add(hconn)
        raise _fail(CMQC.MQRC_CONNECTION_BROKEN)

    def messages(self, queue: str) -> list[tuple[bytes, dict[str, Any], int]]:
        """(body, properties, backout count) of every committed message of a queue, in
        delivery order (for tests)."""
        with self.cond:
            q = self.queues[queue]
            return [(m.body, dict(m.props), m.backout) for m in q.order() if m.held is None]

    # --- the MQI, inside ---

    def new_hconn(self) -> int:
        with self.cond:
            hconn = next(self._ids)
            self.uow[hconn] = []
            return hconn

    def check(self, hconn: int) -> None:
        if hconn in self.broken:
            raise _fail(CMQC.MQRC_CONNECTION_BROKEN)
        if hconn not in self.uow:
            raise _fail(CMQC.MQRC_HCONN_ERROR)
        if not self.running:
            raise _fail(CMQC.MQRC_CONNECTION_BROKEN)

    def queue(self, name: str) -> _LocalQueue:
        if not name or len(name) > 48 or not set(name) <= _NAME_CHARS:
            raise _fail(CMQC.MQRC_OBJECT_NAME_ERROR)
        q = self.queues.get(name)
        if q is None:
            raise _fail(CMQC.MQRC_UNKNOWN_OBJECT_NAME)
        return q

    def new_msg_id(self) -> bytes:
        return (b"AMQ " + self.name.encode()[:12].ljust(12) + next(self._seq).to_bytes(8, "big"))[
            :24
        ]

    def next_seq(self) -> int:
        return next(self._seq)

    def commit(self, hconn: int) -> None:
        for kind, q, msg in self.uow.get(hconn, []):
            if kind == "get":
                if msg in q.msgs:
                    q.msgs.remove(msg)
            else:
                msg.held = None
        if hconn in self.uow:
            self.uow[hconn] = []
        self.cond.notify_all()

    def _back_out(self, hconn: int) -> None:
        for kind, q, msg in self.uow.get(hconn, []):
            if kind == "get":
                msg.held = None
                msg.backout += 1
            elif msg in q.msgs:
                q.msgs.remove(msg)
        if hconn in self.uow:
            self.uow[hconn] = []
        self.cond.notify_all()

    def back_out(self, hconn: int) -> None:
        self._back_out(hconn)


_registry: dict[str, FakeQueueManager] = {}
_registry_lock = threading.Lock()


def queue_manager(name: str = "QM1", host: str = "localhost", port: int = 1414) -> FakeQueueManager:
    """The process's fake queue manager of that name, listening on ``host(port)`` (created
    on first use)."""
    with _registry_lock:
        qm = _registry.get(name)
        if qm is None:
            qm = _registry[name] = FakeQueueManager(name, host, port)
        return qm


def reset() -> None:
    """Forget every fake queue manager."""
    with _registry_lock:
        _registry.clear()
