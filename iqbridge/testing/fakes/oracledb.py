"""An in-process fake of the part of python-oracledb (thin mode) that Oracle AQ uses.

Written from python-oracledb's own code (``src/oracledb/aq.py``, ``constants.py``,
``errors.py``, ``exceptions.py`` and the AQ samples) and Oracle's ``DBMS_AQ`` /
``DBMS_AQADM`` documentation, with the real package's names: put it in
``sys.modules["oracledb"]`` (or hand it to whatever resolves the client module) and code
written for python-oracledb runs against it unchanged.

What it models, in one process-wide "database" (:func:`database`) shared by every
connection, each connection with its own uncommitted work, thread-safe:

* ``connect(user=, password=, dsn="host:port/service")`` (or ``dsn=makedsn(host, port,
  service_name=)``): the listener must be known (:meth:`Database.listen`; otherwise
  ``OperationalError`` DPY-6005), the service too (ORA-12514) and the user's password
  (ORA-01017).
* ``DBMS_AQADM`` through ``cursor().callproc``: ``CREATE_QUEUE_TABLE`` (RAW payloads,
  ``multiple_consumers``), ``CREATE_QUEUE`` (``max_retries``, ``retention_time``,
  ``queue_type`` 0 normal / 1 exception), ``START_QUEUE``, ``DROP_QUEUE``; and through
  ``cursor().execute`` three statements: a block calling ``DBMS_AQADM.ADD_SUBSCRIBER``
  with a ``SYS.AQ$_AGENT`` (binds: the queue name, then the agent name), a block calling
  ``DBMS_AQADM.PURGE_QUEUE_TABLE`` (binds ``queue_table`` and ``condition``, a
  ``qtview.msg_id IN (HEXTORAW('...'), ...)`` condition), and a ``SELECT`` of some of the
  columns msg_id, queue, msg_state, consumer_name, user_data, corr_id, priority,
  enq_time ``FROM AQ$<queue table> WHERE [queue = :q AND] msg_id IN (...)`` or ``WHERE
  queue = :q``, either optionally ``ORDER BY enq_time`` (the queue-table view, one row
  per consumer; dequeued messages appear while retention keeps them). An IN list of
  more than 1000 items fails with ORA-01795, as on a real server.
* ``Database.stop()`` / ``start()``: the instance goes down (sessions gone, their
  uncommitted work rolled back: DPY-4011 on their next call, DPY-6005 on connect) and
  comes back. ``Database.break_at("commit", applied=...)``: the next commit of any
  session loses its connection (DPY-4011, the session dead), before the database got it
  (rolled back) or after it committed (the reply lost).
  AQ calls it does not model raise ``NotImplementedError``; other statements are SQL.
* SQL, in the same database and transaction as the AQ work (exactly-once needs the
  index there): :mod:`~iqbridge.testing.fakes.oracledb_sql` says what (SQLite runs it
  after rewriting). ``commit``/``rollback``/``close`` end a session's SQL and AQ work
  together; ``Database.stop`` drops uncommitted SQL work; :func:`reset` empties the SQL
  database too. The DB-API names (exceptions, ``DB_TYPE_*``, ``makedsn``, ``Var`` ...)
  are in :mod:`~iqbridge.testing.fakes.oracledb_types`, re-exported here.
* ``Connection.queue(name)``: ``enqone``/``enqmany`` (visibility ON_COMMIT or
  IMMEDIATE; per-message ``recipients`` or the queue's subscribers; ORA-24033 when a
  multi-consumer message has neither), ``deqone``/``deqmany`` with ``deqoptions``:
  mode BROWSE, LOCKED, REMOVE; navigation FIRST_MSG / NEXT_MSG; visibility; wait
  (NO_WAIT returns None, as the driver does when the server answers ORA-25228);
  ``consumername`` (required on a multi-consumer queue: ORA-25231), ``msgid``,
  ``correlation`` (with ``%`` and ``_`` wildcards). ``condition`` is not modelled.
* Delivery order: priority (lower number first), then enqueue order. Messages locked by
  another connection are skipped. A REMOVE that is rolled back returns the message with
  ``attempts + 1``; past the queue's ``max_retries`` it moves to the exception queue
  (the message's ``exceptionq`` or ``AQ$_<queue table>_E``). A message past its
  ``expiration`` (seconds after it became ready) moves there too.
* Retention: a message every recipient processed stays in the queue table for the
  queue's ``retention_time`` (-1: for ever), visible in the ``AQ$`` view, until purged.
"""

from __future__ import annotations

import datetime
import itertools
import re
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from iqbridge.testing.fakes.oracledb_aq import *  # noqa: F403 - the module's AQ names
from iqbridge.testing.fakes.oracledb_aq import (
    _STATE_NAMES,
    DEQ_BROWSE,
    DEQ_FIRST_MSG,
    DEQ_IMMEDIATE,
    DEQ_LOCKED,
    DEQ_REMOVE_NODATA,
    DEQ_WAIT_FOREVER,
    ENQ_IMMEDIATE,
    MSG_EXPIRED,
    MSG_PROCESSED,
    MSG_READY,
    DeqOptions,
    EnqOptions,
    MessageProperties,
)
from iqbridge.testing.fakes.oracledb_sql import SqlCursor, SqlDatabase, SqlSession
from iqbridge.testing.fakes.oracledb_types import *  # noqa: F403 - the module's DB-API names
from iqbridge.testing.fakes.oracledb_types import (
    DatabaseError,
    Error,
    InterfaceError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    _Error,
    _ora,
    parse_dsn,
)

#: The python-oracledb release whose API the fake models (thin-mode AQ with array
#: enqueue and dequeue came in 3.1).
__version__ = version = "3.1.0"

__all__ = [
    "Connection",
    "Database",
    "DatabaseError",
    "Error",
    "MessageProperties",
    "OperationalError",
    "connect",
    "database",
    "reset",
]

# --- the database ----------------------------------------------------------------------


@dataclass
class _Consumer:
    state: int = MSG_READY
    attempts: int = 0
    locked_by: int | None = None
    removing: bool = False  # locked by a REMOVE not yet committed
    processed_at: float | None = None


@dataclass
class _Message:
    msgid: bytes
    seq: int
    payload: bytes
    correlation: str | None
    priority: int
    enqtime: datetime.datetime
    ready_at: float
    expiration: int
    exceptionq: str | None
    consumers: dict[str, _Consumer]
    owner: int | None  # connection id while the enqueue is uncommitted


@dataclass
class _Queue:
    name: str
    table: str
    queue_type: int = 0
    max_retries: int = 5
    retention: int = 0
    enqueue: bool = False
    dequeue: bool = False
    subscribers: list[str] = field(default_factory=list)
    messages: list[_Message] = field(default_factory=list)


@dataclass
class _Table:
    name: str
    payload_type: str
    multiple: bool


class Database:
    """The process-wide database behind every fake connection."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.RLock())
        self.clear()

    def clear(self) -> None:
        """Forget every queue, user and listener."""
        self.listeners: set[tuple[str, int]] = set()
        self.services: set[str] = set()
        self.users: dict[str, str] = {}
        self.tables: dict[str, _Table] = {}
        self.queues: dict[str, _Queue] = {}
        self._seq = itertools.count(1)
        self._conn_ids = itertools.count(1)
        old: SqlDatabase | None = getattr(self, "sql", None)
        if old is not None:
            old.close()
        self.sql: SqlDatabase = SqlDatabase()  # the tables (SQLite: oracledb_sql)
        self.up = True
        self.generation = 0
        #: Calls that lose their connection next: call -> whether it took effect.
        self.breaks: dict[str, bool] = {}

    def listen(self, host: str, port: int, service: str) -> None:
        """Accept connections to ``host:port/service``."""
        with self.cond:
            self.listeners.add((host.lower(), port))
            self.services.add(service.upper())

    def stop(self) -> None:
        """The instance goes down: every session is gone (its uncommitted work rolled
        back, as instance recovery does) and new connections are refused until
        :meth:`start`."""
        with self.cond:
            self.up = False
            self.generation += 1
            self.sql.drop_sessions()
            for q in list(self.queues.values()):
                q.messages = [m for m in q.messages if m.owner is None]
                for m in list(q.messages):
                    for name, c in m.consumers.items():
                        was_removing = c.locked_by is not None and c.removing
                        c.locked_by, c.removing = None, False
                        if was_removing:
                            c.attempts += 1
                            if c.attempts > q.max_retries:
                                self._to_exception(q, m, name)
            self.cond.notify_all()

    def break_at(self, call: str, *, applied: bool) -> None:
        """The next ``call`` (``"commit"``) of any session loses the connection: DPY-4011,
        the session is dead; ``applied``: the commit took effect first (its reply lost),
        else its work is rolled back."""
        if call != "commit":
            raise ValueError(f"break_at knows commit, not {call!r}")
        with self.cond:
            self.breaks[call] = applied

    def start(self) -> None:
        """The instance is up again (with everything committed before the stop)."""
        with self.cond:
            self.up = True

    def add_user(self, user: str, password: str) -> None:
        """Create a database user (names are case-insensitive, passwords are not)."""
        with self.cond:
            self.users[user.upper()] = password

    def queue(self, name: str) -> _Queue:
        """A queue by (case-insensitive) name; ORA-24010 if there is none."""
        q = self.queues.get(name.upper())
        if q is None:
            raise _ora(24010, f"QUEUE {name.upper()} does not exist")
        return q

    def reset_consumer(self, queue: str, msgid: bytes, consumer: str) -> None:
        """Test hook: the consumer's copy is READY again, as if its REMOVE had been rolled
        back after a crash before the commit (attempts + 1)."""
        with self.cond:
            for m in self.queue(queue).messages:
                if m.msgid == msgid:
                    c = m.consumers.setdefault(consumer.upper(), _Consumer())
                    c.state, c.processed_at, c.attempts = MSG_READY, None, c.attempts + 1
                    c.locked_by, c.removing = None, False
            self.cond.notify_all()

    def _expire(self, q: _Queue, now: float) -> None:
        """Move what has expired or is past retention out of the queue."""
        keep: list[_Message] = []
        for m in q.messages:
            if m.expiration >= 0 and m.owner is None and now >= m.ready_at + m.expiration:
                for name, c in m.consumers.items():
                    if c.state == MSG_READY and c.locked_by is None:
                        self._to_exception(q, m, name)
            done = all(c.state != MSG_READY for c in m.consumers.values())
            if done and q.retention >= 0:
                last = max((c.processed_at or 0.0) for c in m.consumers.values())
                if now >= last + q.retention:
                    continue
            keep.append(m)
        q.messages = keep

    def _to_exception(self, q: _Queue, m: _Message, consumer: str) -> None:
        c = m.consumers[consumer]
        c.state, c.processed_at = MSG_EXPIRED, time.monotonic()
        name = (m.exceptionq or f"AQ$_{q.table}_E").upper()
        eq = self.queues.get(name)
        if eq is None:  # the default exception queue exists with every queue table
            eq = self.queues[name] = _Queue(name, q.table, queue_type=1, dequeue=True)
        copy = _Message(
            m.msgid, m.seq, m.payload, m.correlation, m.priority, m.enqtime, m.ready_at, -1,
            None, {consumer: _Consumer(attempts=c.attempts)}, None,
        )  # fmt: skip
        eq.messages.append(copy)

    def release(self, conn_id: int, commit: bool) -> None:
        """End a connection's transaction."""
        with self.cond:
            now = time.monotonic()
            for q in list(self.queues.values()):
                kept: list[_Message] = []
                for m in q.messages:
                    if m.owner == conn_id:
                        if not commit:
                            continue
                        m.owner = None
                    for name, c in m.consumers.items():
                        if c.locked_by != conn_id:
                            continue
                        if c.removing and commit:
                            c.state, c.processed_at = MSG_PROCESSED, now
                        elif c.removing:
                            c.attempts += 1
                            if c.attempts > q.max_retries:
                                self._to_exception(q, m, name)
                        c.locked_by, c.removing = None, False
                    kept.append(m)
                q.messages = kept
                self._expire(q, now)
            self.cond.notify_all()


_DB = Database()


def database() -> Database:
    """The process-wide fake database."""
    return _DB


def reset() -> Database:
    """Forget every queue, user and listener (a fresh database); returns it."""
    with _DB.cond:
        _DB.clear()
    return _DB


# --- connections -----------------------------------------------------------------------


def connect(
    dsn: str | None = None, *, user: str | None = None, password: str | None = None, **_: Any
) -> Connection:
    """Open a connection (thin mode): ``dsn`` is ``host:port/service_name`` or what
    :func:`makedsn` builds with a ``service_name``."""
    db = _DB
    parsed = parse_dsn(dsn or "")
    if parsed is None:
        raise DatabaseError(_Error(f'DPY-4017: invalid connect descriptor "{dsn}"'))
    host, port, service = parsed
    with db.cond:
        if (host, port) not in db.listeners or not db.up:
            raise OperationalError(
                _Error(
                    "DPY-6005: cannot connect to database (CONNECTION_ID=fake).\n"
                    "[Errno 111] Connection refused"
                )
            )
        if service.upper() not in db.services:
            raise _ora(12514, "Cannot connect to database. Service is not registered")
        if not user or db.users.get(user.upper()) != password:
            raise _ora(1017, "invalid credential or not authorized; logon denied")
        return Connection(db, next(db._conn_ids), user.upper(), db.generation)


def _like(pattern: str, value: str | None) -> bool:
    if value is None:
        return False
    regex = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern)
    return re.fullmatch(regex, value, re.S) is not None


class Queue:
    """A queue handle, as ``oracledb.Queue`` (RAW payloads only)."""

    def __init__(self, conn: Connection, name: str, payload_type: Any = None) -> None:
        if payload_type not in (None, "RAW"):
            raise NotImplementedError("the fake models RAW queues only")
        self.connection = conn
        self.name = name
        self.payload_type = None
        self.deqoptions = DeqOptions()
        self.enqoptions = EnqOptions()
        self._last: tuple[int, int] | None = None

    def enqone(self, message: MessageProperties) -> None:
        """Enqueue one message."""
        self.enqmany([message])

    def enqmany(self, messages: Sequence[MessageProperties]) -> None:
        """Enqueue messages in order (one round trip)."""
        conn = self.connection
        db = conn._live()
        with db.cond:
            q = db.queue(self.name)
            if not q.enqueue:
                raise _ora(25207, f"enqueue failed, queue {conn.user}.{q.name} is disabled")
            table = db.tables[q.table]
            if len(messages) > 1 and self.enqoptions.visibility == ENQ_IMMEDIATE:
                raise NotSupportedError(
                    _Error("DPY-3000: ENQ_IMMEDIATE with enqmany() is supported in Thick mode only")
                )
            for props in messages:
                if not isinstance(props.payload, bytes | bytearray | str):
                    raise ProgrammingError(_Error("DPY-2062: payload must be bytes or str"))
                payload = (
                    props.payload.encode() if isinstance(props.payload, str) else props.payload
                )
                if len(payload) > 32767:
                    raise _ora(25323, "payload too large for a RAW queue (32767 bytes)")
                names = [r.upper() for r in props.recipients] or list(q.subscribers)
                if table.multiple and not names:
                    raise _ora(24033, "no recipients for message")
                if not table.multiple:
                    names = [""]
                now = time.monotonic()
                m = _Message(
                    uuid.uuid4().bytes, next(db._seq), bytes(payload), props.correlation,
                    props.priority, datetime.datetime.now(datetime.UTC),
                    now + max(props.delay, 0), props.expiration, props.exceptionq,
                    {n: _Consumer() for n in dict.fromkeys(names)},
                    None if self.enqoptions.visibility == ENQ_IMMEDIATE else conn._id,
                )  # fmt: skip
                q.messages.append(m)
                props._msgid, props._enqtime = m.msgid, m.enqtime
                conn._aq_work += 1
            db.cond.notify_all()

    def deqone(self) -> MessageProperties | None:
        """Dequeue one message, or None when none is there (DEQ_NO_WAIT or wait over)."""
        got = self.deqmany(1)
        return got[0] if got else None

    def deqmany(self, max_num_messages: int) -> list[MessageProperties]:
        """Dequeue up to ``max_num_messages`` messages."""
        opts = self.deqoptions
        if opts.condition:
            raise NotImplementedError("the fake does not model dequeue conditions")
        wait = opts.wait
        deadline = time.monotonic() + (60.0 if wait == DEQ_WAIT_FOREVER else float(wait))
        db = self.connection._live()
        with db.cond:
            while True:
                out = self._take(db, max_num_messages)
                remaining = deadline - time.monotonic()
                if out or remaining <= 0:
                    return out
                db.cond.wait(min(remaining, 0.05))

    def _take(self, db: Database, count: int) -> list[MessageProperties]:
        opts = self.deqoptions
        q = db.queue(self.name)
        if not q.dequeue:
            raise _ora(25226, f"dequeue failed, queue {q.name} is not enabled for dequeue")
        multiple = db.tables[q.table].multiple and q.queue_type == 0
        consumer = (opts.consumername or "").upper()
        if multiple and not consumer:
            raise _ora(25231, "cannot dequeue because CONSUMER_NAME not specified")
        now = time.monotonic()
        db._expire(q, now)
        me = self.connection._id
        if opts.navigation == DEQ_FIRST_MSG:
            self._last = None
        if opts.msgid is not None and not any(m.msgid == opts.msgid for m in q.messages):
            raise _ora(25263, f"no message in queue {q.name} with message ID {opts.msgid.hex()}")
        order = sorted(q.messages, key=lambda m: (m.priority, m.seq))
        out: list[MessageProperties] = []
        for m in order:
            if len(out) >= count:
                break
            key = (m.priority, m.seq)
            if opts.mode == DEQ_BROWSE and self._last is not None and key <= self._last:
                continue
            if m.owner not in (None, me) or m.ready_at > now:
                continue
            if opts.msgid is not None and m.msgid != opts.msgid:
                continue
            if opts.correlation and not _like(opts.correlation, m.correlation):
                continue
            name = consumer if multiple else next(iter(m.consumers), "")
            if not multiple and consumer and name not in m.consumers:
                name = next(iter(m.consumers))
            c = m.consumers.get(name)
            if c is None or c.state != MSG_READY:
                continue
            if opts.mode != DEQ_BROWSE:
                if c.locked_by not in (None, me) or (c.locked_by == me and c.removing):
                    continue
                if opts.mode == DEQ_LOCKED:
                    c.locked_by = me
                elif opts.visibility == DEQ_IMMEDIATE:
                    c.state, c.processed_at, c.locked_by = MSG_PROCESSED, now, None
                else:
                    c.locked_by, c.removing = me, True
            self._last = key
            self.connection._aq_work += opts.mode != DEQ_BROWSE
            props = self._props(m, c)
            if opts.mode == DEQ_REMOVE_NODATA:
                props.payload = None
            out.append(props)
        return out

    @staticmethod
    def _props(m: _Message, c: _Consumer) -> MessageProperties:
        props = MessageProperties()
        props.payload, props.correlation, props.priority = m.payload, m.correlation, m.priority
        props.expiration, props.exceptionq = m.expiration, m.exceptionq
        props.recipients = list(m.consumers)
        props._msgid, props._attempts, props._enqtime = m.msgid, c.attempts, m.enqtime
        props._state = c.state
        return props


_SUBSCRIBER = re.compile(r"DBMS_AQADM\.ADD_SUBSCRIBER\s*\(", re.I)
_PURGE = re.compile(r"DBMS_AQADM\.PURGE_QUEUE_TABLE\s*\(", re.I)
_VIEW = re.compile(r"^\s*SELECT\s+(?P<cols>.+?)\s+FROM\s+\"?AQ\$(?P<table>\w+)\"?\s+WHERE\s+"
                   r"(?:(?:queue\s*=\s*:\w+\s+AND\s+)?msg_id\s+IN\s*\((?P<binds>[^)]*)\)"
                   r"|queue\s*=\s*:\w+)(?P<order>\s+ORDER\s+BY\s+enq_time)?\s*$",
                   re.I | re.S)  # fmt: skip
_HEX = re.compile(r"HEXTORAW\('([0-9A-Fa-f]+)'\)")
_VIEW_COLS = (
    "msg_id", "queue", "msg_state", "consumer_name", "user_data", "corr_id", "priority",
    "enq_time",
)  # fmt: skip


class Cursor(SqlCursor):
    """A cursor: ``callproc`` for DBMS_AQADM, the AQ statements listed in the module, and
    SQL (:class:`~iqbridge.testing.fakes.oracledb_sql.SqlCursor`)."""

    connection: Connection

    def callproc(
        self,
        name: str,
        parameters: Sequence[Any] = (),
        keyword_parameters: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Call a DBMS_AQADM procedure (keyword parameters, as the documentation names them)."""
        kw = {k.lower(): v for k, v in (keyword_parameters or {}).items()}
        db = self.connection._live()
        proc = name.upper()
        with db.cond:
            if proc == "DBMS_AQADM.CREATE_QUEUE_TABLE":
                table = str(kw["queue_table"]).upper()
                if table in db.tables:
                    raise _ora(24001, f"cannot create QUEUE_TABLE, {table} already exists")
                payload = str(kw.get("queue_payload_type", "RAW")).upper()
                if payload != "RAW":
                    raise NotImplementedError("the fake models RAW queue tables only")
                db.tables[table] = _Table(table, payload, bool(kw.get("multiple_consumers")))
                exc = f"AQ$_{table}_E"
                db.queues[exc] = _Queue(exc, table, queue_type=1, dequeue=True)
            elif proc == "DBMS_AQADM.CREATE_QUEUE":
                qname = str(kw["queue_name"]).upper()
                table = str(kw["queue_table"]).upper()
                if table not in db.tables:
                    raise _ora(24002, f"QUEUE_TABLE {table} does not exist")
                if qname in db.queues:
                    raise _ora(24006, f"cannot create QUEUE, {qname} already exists")
                db.queues[qname] = _Queue(
                    qname, table, queue_type=int(kw.get("queue_type", 0)),
                    max_retries=int(kw.get("max_retries", 5)),
                    retention=int(kw.get("retention_time", 0)),
                )  # fmt: skip
            elif proc == "DBMS_AQADM.START_QUEUE":
                q = db.queue(str(kw["queue_name"]))
                q.enqueue = q.queue_type == 0 and bool(kw.get("enqueue", True))
                q.dequeue = bool(kw.get("dequeue", True))
            elif proc == "DBMS_AQADM.DROP_QUEUE":
                db.queues.pop(db.queue(str(kw["queue_name"])).name)
            else:
                raise NotImplementedError(f"the fake does not model {name}")
        return list(parameters)

    def execute(self, statement: str, parameters: Any = None) -> Cursor | None:
        """Run one of the AQ statements the module docstring lists, or SQL."""
        params = parameters or {}
        db = self.connection._live()
        if not (_SUBSCRIBER.search(statement) or _PURGE.search(statement)) and not _VIEW.match(
            statement
        ):
            super().execute(statement, parameters)
            return self if self.description is not None else None
        self._rows, self._pos, self.description = [], 0, None
        with db.cond:
            if _SUBSCRIBER.search(statement):
                values = list(params.values()) if isinstance(params, dict) else list(params)
                q = db.queue(str(values[0]))
                name = str(values[1]).upper()
                if not db.tables[q.table].multiple:
                    raise _ora(24039, f"Queue {q.name} not created for multiple consumers")
                if name in q.subscribers:
                    raise _ora(24034, f"application {name} is already a subscriber for {q.name}")
                q.subscribers.append(name)
            elif _PURGE.search(statement):
                table = str(params["queue_table"]).upper()
                found = _HEX.findall(str(params["condition"]))
                if len(found) > 1000:
                    raise _ora(1795, "maximum number of expressions in a list is 1000")
                ids = {bytes.fromhex(h) for h in found}
                for q in db.queues.values():
                    if q.table == table:
                        q.messages = [m for m in q.messages if m.msgid not in ids]
            elif match := _VIEW.match(statement):
                self._rows = self._view(db, match, params)
        return self

    def _view(self, db: Database, match: re.Match[str], params: Any) -> list[tuple[Any, ...]]:
        cols = [c.strip().lower() for c in match["cols"].split(",")]
        if any(c not in _VIEW_COLS for c in cols):
            raise NotImplementedError(f"the fake's AQ$ view has the columns {_VIEW_COLS}")
        table = match["table"].upper()
        if table not in db.tables:
            raise _ora(942, "table or view does not exist")
        if match["binds"] is not None and match["binds"].count(",") >= 1000:
            raise _ora(1795, "maximum number of expressions in a list is 1000")
        values = params if isinstance(params, list | tuple) else list(params.values())
        wanted = (
            {bytes(v) for v in values if isinstance(v, bytes | bytearray)}
            if match["binds"] is not None
            else None  # every message of the queue
        )
        queue_name = next((str(v).upper() for v in values if isinstance(v, str)), None)
        rows: list[tuple[Any, ...]] = []
        for q in db.queues.values():
            if q.table != table or (queue_name is not None and q.name != queue_name):
                continue
            db._expire(q, time.monotonic())
            msgs = sorted(q.messages, key=lambda m: m.enqtime) if match["order"] else q.messages
            for m in msgs:
                if (wanted is not None and m.msgid not in wanted) or m.owner is not None:
                    continue
                for name, c in m.consumers.items():
                    row = {
                        "msg_id": m.msgid, "queue": q.name, "msg_state": _STATE_NAMES[c.state],
                        "consumer_name": name or None, "user_data": m.payload,
                        "corr_id": m.correlation, "priority": m.priority, "enq_time": m.enqtime,
                    }  # fmt: skip
                    rows.append(tuple(row[c] for c in cols))
        return rows


class Connection:
    """A connection (one session), as ``oracledb.Connection``."""

    def __init__(self, db: Database, conn_id: int, user: str, generation: int = 0) -> None:
        self._db: Database | None = db
        self._id = conn_id
        self._generation = generation
        self.user = user
        self.autocommit = False
        self.version = "23.5.0.24.7"  # Oracle Database 23ai Free
        self.thin, self.max_identifier_length, self.stmtcachesize = True, 128, 20
        self.outputtypehandler: Any = None
        self._sql: SqlSession | None = None  # opened on the first SQL statement
        self._aq_work = 0  # AQ operations so far (a savepoint notes where it was)

    def _sql_session(self) -> SqlSession:
        if self._sql is None:
            self._sql = self._live().sql.session(self.user)
        return self._sql

    def _end(self, commit: bool, close: bool = False) -> None:
        db = self._live()
        if self._sql is not None:
            self._sql.end(commit)
            if close:
                self._sql.close()
        db.release(self._id, commit=commit)

    def _live(self) -> Database:
        if self._db is None:
            raise InterfaceError(_Error("DPY-1001: not connected to database"))
        if self._db.generation != self._generation:
            err = _Error("DPY-4011: the database or network closed the connection")
            err.is_session_dead = err.isrecoverable = True
            raise DatabaseError(err)
        return self._db

    def queue(self, name: str, payload_type: Any = None) -> Queue:
        """A handle on a queue (it need not exist yet: enqueue and dequeue say ORA-24010)."""
        self._live()
        return Queue(self, name, payload_type)

    def msgproperties(
        self,
        payload: Any = None,
        correlation: str | None = None,
        delay: int | None = None,
        exceptionq: str | None = None,
        expiration: int | None = None,
        priority: int | None = None,
        recipients: list[str] | None = None,
    ) -> MessageProperties:
        """New message properties."""
        props = MessageProperties()
        props.payload, props.correlation, props.exceptionq = payload, correlation, exceptionq
        if delay is not None:
            props.delay = delay
        if expiration is not None:
            props.expiration = expiration
        if priority is not None:
            props.priority = priority
        props.recipients = list(recipients or [])
        return props

    def cursor(self) -> Cursor:
        """A cursor on this connection."""
        self._live()
        return Cursor(self)

    def commit(self) -> None:
        """Make this session's SQL work, enqueues and removals permanent; release its
        locks."""
        db = self._live()
        with db.cond:
            applied = db.breaks.pop("commit", None)
        if applied is None:
            self._end(commit=True)
            return
        self._end(commit=applied)
        self._generation = -1  # the session is gone with its connection
        self._live()  # DPY-4011

    def rollback(self) -> None:
        """Undo this session's SQL work and enqueues; give back what it dequeued
        (attempts + 1)."""
        self._end(commit=False)

    def ping(self) -> None:
        """Check the connection."""
        self._live()

    def close(self) -> None:
        """Roll back (SQL and AQ work) and close."""
        self._end(commit=False, close=True)
        self._db = None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        """Leaving a ``with`` block closes the connection (uncommitted work rolled back),
        as python-oracledb's does."""
        if self._db is not None:
            self.close()
