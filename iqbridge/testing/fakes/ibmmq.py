"""A faithful in-process fake of IBM's MQ client for Python (``ibmmq``, the successor of
``pymqi``), for tests on machines without an MQ client or server.

Written from the client's own code (github.com/ibm-messaging/mq-mqi-python:
``QueueManager``, ``Queue``, ``MD``, ``GMO``, ``PMO``, ``OD``, ``CD``, ``SCO``,
``MessageHandle`` and its ``properties``, ``PCFExecute``, ``MQMIError`` with ``comp`` and
``reason``) and IBM's documentation of the MQI (MQCONNX, MQOPEN, MQPUT, MQGET, MQCMIT,
MQBACK, MQINQ, MQSETMP/MQINQMP). A test installs it as the client module::

    monkeypatch.setitem(sys.modules, "ibmmq", iqbridge.testing.fakes.ibmmq)

and then sets up a queue manager with :func:`queue_manager`. What it implements, as the
real queue manager does:

* client connections to ``host(port)`` over a server-connection channel, with a user and
  password: a host nobody listens on fails with 2538 MQRC_HOST_NOT_AVAILABLE, a stopped
  queue manager with 2059 MQRC_Q_MGR_NOT_AVAILABLE, another queue manager's name with 2058,
  an unknown channel with 2540, a wrong password or a user without authority with 2035
  MQRC_NOT_AUTHORIZED; a broken connection (:meth:`FakeQueueManager.break_connections`)
  fails every later call with 2009 MQRC_CONNECTION_BROKEN and backs out its unit of work;
  :meth:`FakeQueueManager.break_at` breaks the connection that makes a chosen call next,
  before the call reaches the queue manager or after it took effect (its reply lost: a
  client's MQCMIT may fail with 2009 and yet have committed, as IBM documents for 2009);
* local queues (2085 MQRC_UNKNOWN_OBJECT_NAME for others, 2152 for a bad name), created by
  :meth:`FakeQueueManager.define` or by PCF ``MQCMD_CREATE_Q`` (4001 when it exists) and
  removed by ``MQCMD_DELETE_Q``; ``MSGDLVSQ`` PRIORITY (the default: highest priority first,
  FIFO within one) or FIFO; ``MAXMSGL`` (2030), ``MAXDEPTH`` (2053), ``BOTHRESH``,
  ``BOQNAME``; ``Queue.inquire`` of the current depth and those attributes;
* MQPUT with an MD (MsgId, CorrelId, Priority, Expiry in tenths of a second, Persistence,
  Format; a MsgId of MQMI_NONE or MQPMO_NEW_MSG_ID gets a new unique one) and a PMO
  (MQPMO_SYNCPOINT: visible only after commit; ``OriginalMsgHandle``: the properties);
* MQGET with an MD and a GMO: destructive or MQGMO_BROWSE_FIRST / MQGMO_BROWSE_NEXT (a
  browse cursor per open handle) with MQGMO_LOCK / MQGMO_UNLOCK (a locked message is
  hidden from every other handle; MQGMO_UNLOCK without a lock is the warning 2209
  MQRC_NO_MSG_LOCKED), MQGMO_MSG_UNDER_CURSOR, MQGMO_WAIT with WaitInterval,
  2033 MQRC_NO_MSG_AVAILABLE; matching by MsgId and CorrelId (``MatchOptions``; an
  all-zero field matches anything); expired messages are discarded, never returned; the
  returned MD carries the remaining Expiry and the BackoutCount; ``MsgHandle`` with
  MQGMO_PROPERTIES_IN_HANDLE receives the properties;
* syncpoint: a get under MQGMO_SYNCPOINT hides the message until MQCMIT removes it or
  MQBACK returns it in place with its BackoutCount increased; puts under syncpoint appear
  at commit; MQDISC commits (as on distributed platforms), a broken connection backs out;
* message properties through ``MessageHandle(qmgr).properties.set/get/dlt`` (2471
  MQRC_PROPERTY_NOT_AVAILABLE for a missing one, 2469 when longer than the buffer).

One queue manager state per process and name (two connections see the same queues);
every call is thread-safe. :func:`reset` forgets every queue manager (between tests).
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

__all__ = [
    "CD",
    "CMQC",
    "CMQCFC",
    "CMQXC",
    "CSP",
    "GMO",
    "MD",
    "OD",
    "PMO",
    "SCO",
    "Error",
    "FakeQueueManager",
    "MQMIError",
    "MessageHandle",
    "PCFExecute",
    "PYIFError",
    "Queue",
    "QueueManager",
    "connect",
    "queue_manager",
    "reset",
]

__version__ = "2.0.0-fake"


from iqbridge.testing.fakes.ibmmq_defs import (
    CD,
    CMQC,
    CMQCFC,
    CMQXC,
    CSP,
    GMO,
    MD,
    OD,
    PMO,
    SCO,
    Error,
    MQMIError,
    PYIFError,
    _fail,
    _text,
)
from iqbridge.testing.fakes.ibmmq_qmgr import (
    FakeQueueManager,
    _LocalQueue,
    _Msg,
    _registry,
    _registry_lock,
    queue_manager,
    reset,
)


def _parse_conn_name(conn_name: str) -> tuple[str, int]:
    host, _, rest = conn_name.partition("(")
    port = int(rest.rstrip(")") or 1414) if rest else 1414
    return host.strip(), port


# --- the client's classes --------------------------------------------------------------


class QueueManager:
    """A connection (hconn) to a queue manager."""

    def __init__(self, name: str | bytes | None = "", disconnect_on_exit: bool = True) -> None:
        self._qm: FakeQueueManager | None = None
        self._hconn = 0
        self.user = ""
        if name is not None:
            raise PYIFError("the fake connects only as a client: use connect_with_options")

    def connect_with_options(self, name: str | bytes, *args: Any, **kwargs: Any) -> None:
        """MQCONNX as a client: ``cd`` names the channel and ``host(port)``; ``user`` and
        ``password`` (or ``csp``) authenticate; ``sco`` configures TLS."""
        cd = kwargs.get("cd") or (args[0] if args else None)
        if cd is None:
            raise _fail(CMQC.MQRC_Q_MGR_NOT_AVAILABLE)
        csp = kwargs.get("csp")
        user = _text(kwargs.get("user") or (csp.CSPUserId if csp else "") or "")
        password = _text(kwargs.get("password") or (csp.CSPPassword if csp else "") or "")
        host, port = _parse_conn_name(_text(cd.ConnectionName))
        with _registry_lock:
            at = [qm for qm in _registry.values() if qm.endpoint == (host, port)]
        if not at:
            raise _fail(CMQC.MQRC_HOST_NOT_AVAILABLE)
        qm = at[0]
        wanted = _text(name)
        with qm.cond:
            if not qm.running:
                raise _fail(CMQC.MQRC_Q_MGR_NOT_AVAILABLE)
            if wanted and wanted != qm.name:
                raise _fail(CMQC.MQRC_Q_MGR_NAME_ERROR)
            if _text(cd.ChannelName) not in qm.channels:
                raise _fail(CMQC.MQRC_UNKNOWN_CHANNEL_NAME)
            if _text(getattr(cd, "SSLCipherSpec", b"")):
                sco = kwargs.get("sco")
                if sco is None or not _text(sco.KeyRepository):
                    raise _fail(CMQC.MQRC_SSL_INITIALIZATION_ERROR)
            if qm.users is not None and qm.users.get(user) != password:
                raise _fail(CMQC.MQRC_NOT_AUTHORIZED)
            if (user, "") in qm.denied:
                raise _fail(CMQC.MQRC_NOT_AUTHORIZED)
            self._qm = qm
            self.user = user
            self._hconn = qm.new_hconn()

    connectWithOptions = connect_with_options

    def _state(self) -> FakeQueueManager:
        if self._qm is None:
            raise PYIFError("not connected")
        return self._qm

    def get_handle(self) -> int:
        """The connection handle."""
        self._state()
        return self._hconn

    def get_name(self) -> str:
        """The queue manager's name."""
        return self._state().name

    def commit(self) -> None:
        """MQCMIT."""
        qm = self._state()
        with qm.cond:
            qm.check(self._hconn)
            qm.tripped("commit", self._hconn, lambda: qm.commit(self._hconn))

    def backout(self) -> None:
        """MQBACK: gets return (BackoutCount + 1), puts vanish."""
        qm = self._state()
        with qm.cond:
            qm.check(self._hconn)
            qm.back_out(self._hconn)

    def disconnect(self) -> None:
        """MQDISC: commits the unit of work (distributed platforms), then disconnects."""
        qm = self._state()
        with qm.cond:
            try:
                qm.check(self._hconn)
                qm.commit(self._hconn)
            finally:
                qm.uow.pop(self._hconn, None)
                qm.broken.discard(self._hconn)
                self._qm = None

    def is_connected(self) -> bool:
        """Whether the connection still works."""
        qm = self._qm
        if qm is None:
            return False
        with qm.cond:
            return self._hconn in qm.uow and self._hconn not in qm.broken and qm.running


def connect(
    queue_manager: str,
    channel: str | None = None,
    conn_info: str | None = None,
    user: str | None = None,
    password: str | None = None,
    **kwargs: Any,
) -> QueueManager:
    """``ibmmq.connect``: a client connection over ``channel`` to ``conn_info``."""
    qmgr = QueueManager(None)
    cd = kwargs.get("cd") or CD()
    cd.ChannelName = (channel or "").encode()
    cd.ConnectionName = (conn_info or "").encode()
    qmgr.connect_with_options(queue_manager, user=user, password=password, cd=cd, **kwargs)
    return qmgr


_handles: dict[int, dict[str, Any]] = {}
_handle_ids = itertools.count(1)
_handles_lock = threading.Lock()


class MessageHandle:
    """MQCRTMH: a message handle whose properties are set before a put or filled by a get."""

    class _Properties:
        def __init__(self, handle: int) -> None:
            self.msg_handle = handle
            self.default_value_length = 64

        def _props(self) -> dict[str, Any]:
            with _handles_lock:
                props = _handles.get(self.msg_handle)
            if props is None:
                raise _fail(CMQC.MQRC_HMSG_ERROR)
            return props

        def set(
            self,
            name: str | bytes,
            value: Any,
            property_type: int = CMQC.MQTYPE_STRING,
            value_length: int = -1,
            pd: Any = None,
            smpo: Any = None,
        ) -> None:
            """MQSETMP."""
            self._props()[_text(name)] = value

        def get(
            self,
            name: str | bytes,
            default: Any = None,
            max_value_length: int | None = None,
            impo_options: int = 0,
            impo: Any = None,
            pd: Any = None,
            property_type: int = CMQC.MQTYPE_AS_SET,
        ) -> Any:
            """MQINQMP: 2471 when the message has no such property, 2469 when the value is
            longer than ``max_value_length`` (default 64)."""
            props = self._props()
            key = _text(name)
            if key not in props:
                raise MQMIError(CMQC.MQCC_FAILED, CMQC.MQRC_PROPERTY_NOT_AVAILABLE, value=default)
            value = props[key]
            limit = max_value_length or self.default_value_length
            size = len(value.encode() if isinstance(value, str) else value)
            if isinstance(value, str | bytes) and size > limit:
                raise MQMIError(
                    CMQC.MQCC_WARNING,
                    CMQC.MQRC_PROPERTY_VALUE_TOO_BIG,
                    value=default,
                    data_length=size,
                )
            return value

        def dlt(self, name: str | bytes, dmpo: Any = None) -> None:
            """MQDLTMP."""
            self._props().pop(_text(name), None)

    def __init__(self, qmgr: QueueManager | None = None, cmho: Any = None) -> None:
        if qmgr is not None:
            qmgr.get_handle()
        with _handles_lock:
            self.msg_handle = next(_handle_ids)
            _handles[self.msg_handle] = {}
        self.properties = self._Properties(self.msg_handle)

    def get_handle(self) -> int:
        """The handle's integer value (for GMO.MsgHandle and PMO.OriginalMsgHandle)."""
        return self.msg_handle

    def dlt(self, dmho: Any = None) -> None:
        """MQDLTMH."""
        with _handles_lock:
            _handles.pop(self.msg_handle, None)


def _handle_props(handle: int) -> dict[str, Any] | None:
    if not handle:
        return None
    with _handles_lock:
        props = _handles.get(handle)
    if props is None:
        raise _fail(CMQC.MQRC_HMSG_ERROR)
    return props


_objects = itertools.count(1)


class Queue:
    """An open queue (hobj): put, get, browse, inquire."""

    def __init__(
        self, qmgr: QueueManager, q_desc: str | bytes | OD | None = None, open_opts: int = 0
    ) -> None:
        self._qmgr = qmgr
        self._name = ""
        self._opts = 0
        self._open = False
        self._hobj = 0
        self._cursor: _Msg | None = None
        if q_desc is not None:
            self.open(q_desc, open_opts or CMQC.MQOO_INPUT_AS_Q_DEF | CMQC.MQOO_OUTPUT)

    def open(self, q_desc: str | bytes | OD, open_opts: int) -> None:
        """MQOPEN: 2085 for an unknown queue, 2035 when the user may not open it."""
        name = _text(q_desc.ObjectName if isinstance(q_desc, OD) else q_desc)
        qm = self._qmgr._state()
        with qm.cond:
            qm.check(self._qmgr.get_handle())
            qm.queue(name)
            if (self._qmgr.user, name) in qm.denied:
                raise _fail(CMQC.MQRC_NOT_AUTHORIZED)
        self._name = name
        self._opts = open_opts
        self._open = True
        self._hobj = next(_objects)

    def _enter(self, need: int, reason: int) -> tuple[FakeQueueManager, _LocalQueue, int]:
        if not self._open:
            raise _fail(CMQC.MQRC_HOBJ_ERROR)
        if need and not self._opts & need:
            raise _fail(reason)
        qm = self._qmgr._state()
        hconn = self._qmgr.get_handle()
        qm.check(hconn)
        return qm, qm.queue(self._name), hconn

    def put(self, msg: bytes, *opts: Any) -> None:
        """MQPUT with an MD and a PMO."""
        md = next((o for o in opts if isinstance(o, MD)), None) or MD()
        pmo = next((o for o in opts if isinstance(o, PMO)), None) or PMO()
        qm = self._qmgr._state()
        with qm.cond:
            _qm, q, hconn = self._enter(CMQC.MQOO_OUTPUT, CMQC.MQRC_NOT_OPEN_FOR_OUTPUT)
            props = _handle_props(pmo.OriginalMsgHandle) or {}
            # Properties count towards a message's length.
            size = len(msg) + sum(len(k) + len(str(v)) for k, v in props.items())
            if size > q.max_msg_length:
                raise _fail(CMQC.MQRC_MSG_TOO_BIG_FOR_Q)
            if len(q.msgs) >= q.max_depth:
                raise _fail(CMQC.MQRC_Q_FULL)
            if pmo.Options & CMQC.MQPMO_NEW_MSG_ID or bytes(md.MsgId) == CMQC.MQMI_NONE:
                md.MsgId = qm.new_msg_id()
            priority = md.Priority if md.Priority >= 0 else q.default_priority
            expiry = md.Expiry
            now = time.time()
            m = _Msg(
                seq=qm.next_seq(),
                body=bytes(msg),
                msg_id=bytes(md.MsgId).ljust(24, b"\0")[:24],
                correl_id=bytes(md.CorrelId).ljust(24, b"\0")[:24],
                priority=min(priority, 9),
                persistence=md.Persistence if md.Persistence in (0, 1) else q.default_persistence,
                fmt=bytes(md.Format),
                expires=time.monotonic() + expiry / 10 if expiry >= 0 else None,
                put_appl=bytes(md.PutApplName or b"fake-client"),
                put_date=time.strftime("%Y%m%d", time.gmtime(now)).encode(),
                put_time=(
                    time.strftime("%H%M%S", time.gmtime(now)) + f"{int(now * 100) % 100:02d}"
                ).encode(),
                props=dict(props),
            )

            def store() -> None:
                if pmo.Options & CMQC.MQPMO_SYNCPOINT:
                    m.held = ("uow", hconn)
                    qm.uow[hconn].append(("put", q, m))
                q.msgs.append(m)
                qm.cond.notify_all()

            qm.tripped("put", hconn, store)

    def _visible(self, q: _LocalQueue, m: _Msg, now: float) -> bool:
        if m.expires is not None and m.expires <= now:
            if m.held is None:
                q.msgs.remove(m)  # expired messages are discarded when found
            return False
        return m.held is None or m.held == ("lock", self._hobj)

    @staticmethod
    def _matches(m: _Msg, md: MD, gmo: GMO) -> bool:
        match = gmo.MatchOptions
        want_id = bytes(md.MsgId)
        want_correl = bytes(md.CorrelId)
        if match & CMQC.MQMO_MATCH_MSG_ID and want_id not in (CMQC.MQMI_NONE, m.msg_id):
            return False
        return not (
            match & CMQC.MQMO_MATCH_CORREL_ID and want_correl not in (CMQC.MQCI_NONE, m.correl_id)
        )

    def _find(self, q: _LocalQueue, md: MD, gmo: GMO, browse_next: bool) -> _Msg | None:
        now = time.monotonic()
        ordered = q.order()
        if browse_next and self._cursor is not None:
            cur = self._cursor
            key = (
                (cur.seq,) if q.fifo else (-cur.priority, cur.seq)
            )  # the position after the cursor in delivery order
            ordered = [m for m in ordered if ((m.seq,) if q.fifo else (-m.priority, m.seq)) > key]
        for m in ordered:
            if m in q.msgs and self._visible(q, m, now) and self._matches(m, md, gmo):
                return m
        return None

    def get(self, max_length: int | None = None, *opts: Any) -> bytes:
        """MQGET with an MD and a GMO: destructive (under syncpoint or not) or browse."""
        md = next((o for o in opts if isinstance(o, MD)), None) or MD()
        gmo = next((o for o in opts if isinstance(o, GMO)), None) or GMO()
        options = gmo.Options
        browse = options & (CMQC.MQGMO_BROWSE_FIRST | CMQC.MQGMO_BROWSE_NEXT)
        if options & CMQC.MQGMO_SYNCPOINT and (options & CMQC.MQGMO_NO_SYNCPOINT or browse):
            raise _fail(CMQC.MQRC_OPTIONS_ERROR)
        qm = self._qmgr._state()
        wait = gmo.WaitInterval / 1000 if options & CMQC.MQGMO_WAIT else 0.0
        deadline = time.monotonic() + (1e9 if gmo.WaitInterval == CMQC.MQWI_UNLIMITED else wait)
        with qm.cond:
            if options & CMQC.MQGMO_UNLOCK and not browse:
                if not self._unlock(qm):  # a warning, raised as the client raises those
                    raise MQMIError(CMQC.MQCC_WARNING, CMQC.MQRC_NO_MSG_LOCKED)
                return b""
            need, reason = (
                (CMQC.MQOO_BROWSE, CMQC.MQRC_NOT_OPEN_FOR_BROWSE)
                if browse
                else (
                    CMQC.MQOO_INPUT_SHARED | CMQC.MQOO_INPUT_AS_Q_DEF,
                    CMQC.MQRC_NOT_OPEN_FOR_INPUT,
                )
            )
            while True:
                _qm, q, hconn = self._enter(need, reason)
                if options & CMQC.MQGMO_MSG_UNDER_CURSOR:
                    m = self._cursor
                    if m is None or m not in q.msgs or not self._visible(q, m, time.monotonic()):
                        raise _fail(CMQC.MQRC_NO_MSG_UNDER_CURSOR)
                else:
                    m = self._find(q, md, gmo, bool(options & CMQC.MQGMO_BROWSE_NEXT))
                if m is not None:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _fail(CMQC.MQRC_NO_MSG_AVAILABLE)
                qm.cond.wait(left)
            if (
                max_length is not None
                and len(m.body) > max_length
                and not options & CMQC.MQGMO_ACCEPT_TRUNCATED_MSG
            ):
                raise _fail(CMQC.MQRC_TRUNCATED_MSG_FAILED)
            self._describe(m, md, gmo)
            if browse:
                self._cursor = m
                if options & CMQC.MQGMO_LOCK:
                    self._unlock(qm)
                    m.held = ("lock", self._hobj)
            else:
                if m.held == ("lock", self._hobj):
                    m.held = None
                if self._cursor is m:
                    self._cursor = None
                if options & CMQC.MQGMO_SYNCPOINT:
                    m.held = ("uow", hconn)
                    qm.uow[hconn].append(("get", q, m))
                else:
                    q.msgs.remove(m)
            return m.body if max_length is None else m.body[:max_length]

    def _unlock(self, qm: FakeQueueManager) -> bool:
        """Release this handle's browse lock; whether it held one."""
        q = qm.queues.get(self._name)
        found = False
        for m in q.msgs if q else ():
            if m.held == ("lock", self._hobj):
                m.held = None
                found = True
                qm.cond.notify_all()
        return found

    @staticmethod
    def _describe(m: _Msg, md: MD, gmo: GMO) -> None:
        md.MsgId = m.msg_id
        md.CorrelId = m.correl_id
        md.Priority = m.priority
        md.Persistence = m.persistence
        md.Format = m.fmt
        md.BackoutCount = m.backout
        md.PutApplName = m.put_appl
        md.PutDate = m.put_date
        md.PutTime = m.put_time
        left = None if m.expires is None else m.expires - time.monotonic()
        md.Expiry = CMQC.MQEI_UNLIMITED if left is None else max(int(left * 10), 1)
        gmo.ReturnedLength = len(m.body)
        props = _handle_props(gmo.MsgHandle)
        if props is not None:
            props.clear()
            props.update(m.props)

    def inquire(self, selector: int) -> Any:
        """MQINQ of one attribute."""
        qm = self._qmgr._state()
        with qm.cond:
            _qm, q, _hconn = self._enter(0, 0)
            if selector == CMQC.MQIA_CURRENT_Q_DEPTH:
                return len(q.msgs)
            if selector == CMQC.MQIA_BACKOUT_THRESHOLD:
                return q.backout_threshold
            if selector == CMQC.MQCA_BACKOUT_REQ_Q_NAME:
                return q.boqname.encode().ljust(48)
            if selector == CMQC.MQIA_MAX_MSG_LENGTH:
                return q.max_msg_length
            if selector == CMQC.MQIA_MAX_Q_DEPTH:
                return q.max_depth
            raise _fail(2067)  # MQRC_SELECTOR_ERROR

    def close(self, options: int = CMQC.MQCO_NONE) -> None:
        """MQCLOSE (a browse lock is released)."""
        qm = self._qmgr._qm
        if qm is not None:
            with qm.cond:
                self._unlock(qm)
        self._open = False


class PCFExecute:
    """PCF commands through the command server: ``MQCMD_CREATE_Q`` and ``MQCMD_DELETE_Q``
    (local queues), for users with administrative authority (2035 for others)."""

    def __init__(self, qmgr: QueueManager, **kw: Any) -> None:
        self._qmgr = qmgr

    def __getattr__(self, name: str) -> Any:
        if name == "MQCMD_CREATE_Q":
            return self._create
        if name == "MQCMD_DELETE_Q":
            return self._delete
        raise AttributeError(name)

    def _enter(self) -> FakeQueueManager:
        qm = self._qmgr._state()
        qm.check(self._qmgr.get_handle())
        if self._qmgr.user not in qm.admins:
            raise _fail(CMQC.MQRC_NOT_AUTHORIZED)
        return qm

    def _create(self, args: dict[int, Any], *rest: Any) -> list[Any]:
        qm = self._qmgr._state()
        with qm.cond:
            qm = self._enter()
            name = _text(args[CMQC.MQCA_Q_NAME])
            if name in qm.queues:
                raise MQMIError(CMQC.MQCC_FAILED, CMQCFC.MQRCCF_OBJECT_ALREADY_EXISTS)
            try:
                qm.queue(name)
            except MQMIError as exc:
                if exc.reason != CMQC.MQRC_UNKNOWN_OBJECT_NAME:
                    raise
            qm.define(
                name,
                backout_threshold=int(args.get(CMQC.MQIA_BACKOUT_THRESHOLD, 0)),
                boqname=_text(args.get(CMQC.MQCA_BACKOUT_REQ_Q_NAME, b"")),
                fifo=args.get(CMQC.MQIA_MSG_DELIVERY_SEQUENCE) == CMQC.MQMDS_FIFO,
                max_depth=int(args.get(CMQC.MQIA_MAX_Q_DEPTH, 5000)),
                max_msg_length=int(args.get(CMQC.MQIA_MAX_MSG_LENGTH, 4 * 1024 * 1024)),
            )
            return []

    def _delete(self, args: dict[int, Any], *rest: Any) -> list[Any]:
        qm = self._qmgr._state()
        with qm.cond:
            qm = self._enter()
            name = _text(args[CMQC.MQCA_Q_NAME])
            qm.queue(name)
            del qm.queues[name]
            return []
