"""Oracle Advanced Queuing: ``oracle+aq://user[:password]@host[:port]/service``.

Features: one multi-consumer RAW queue per iqbridge queue (with its own queue table);
every message carries its recipients (the named subscribers and the pools it is for: a
pool is one AQ consumer name its members share), so a consumer group is an AQ consumer
name. A receive dequeues in LOCKED mode in a session of its own, which holds the lock:
that is the entry "pending" with the consumer. Done is a REMOVE_NODATA by msgid in that
session and a commit; a requeue (the entry is deliverable again) is a rollback of it;
nothing a crashed process held is lost, since Oracle rolls its sessions back. Priority
(iqbridge 9 is AQ 0, served first), correlation and expiration are AQ's own message
properties; the queue's exception queue (``AQ$_<queue table>_E``) takes what AQ gives up
on (expired, or rolled back past ``max_retries``) and UNUSABLE entries are moved to a
dead-letter queue ``<queue>_DL`` in the same queue table (AQ refuses enqueues into an
exception queue). AQ retention keeps dequeued messages in the queue table (read again
by msgid through the ``AQ$<queue table>`` view) until a purge of journalled messages
removes them; with a finite ``retention`` the facade keeps its own retained copy.

Queue tables, queues and subscribers are created by :meth:`OracleAQAdapter.declare`
through ``DBMS_AQADM`` (idempotent): the user needs ``AQ_ADMINISTRATOR_ROLE`` (or create
them beforehand, see ``docs/adapters/oracle-aq.md``) and ``EXECUTE ON DBMS_AQ``.

The payload is a RAW of at most 32,767 bytes: a four-byte mark ``IQB1``, the envelope as
JSON and then the body byte for byte. A RAW message without the mark (put by a plain AQ
client) is adopted with its bytes unchanged.

Options (query parameters): ``password_env`` (default ``IQBRIDGE_ORACLE_PASSWORD``: the
variable holding the password when the URL has none), ``prefix`` (default ``IQ_``: the
prefix of AQ object names), ``max_retries`` (default 100: rollbacks before AQ moves a
message to the exception queue), ``retention`` (seconds dequeued messages stay, default
-1: until purged). The driver is python-oracledb in thin mode (``pip install
'iqbridge[oracle]'``). No default index: pass ``index=`` (the SQL store in the same
database, ``oracle+oracledb://``, in production; ``memory://`` or SQLite in tests).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from iqbridge.adapter import Capabilities
from iqbridge.errors import (
    BrokerUnavailable,
    ConfigurationError,
    IQError,
    MessageTooLarge,
    UnknownQueueError,
)
from iqbridge.ids import adopted_id
from iqbridge.model import Envelope, Received
from iqbridge.redaction import get_logger, remember_secret
from iqbridge.registry import redact

from .oracle_aq_inventory import OracleAQInventory  # noqa: TID251
from .oracle_aq_locks import OracleAQLocks  # noqa: TID251

__all__ = ["OracleAQAdapter", "client_module"]

log = get_logger(__name__)

#: The largest RAW payload AQ takes, in bytes.
RAW_LIMIT = 32767
#: Room kept for the envelope within a RAW payload.
_ENVELOPE_ROOM = 4096
#: msgids per IN list (Oracle refuses more than 1000: ORA-01795).
_IN_CHUNK = 500
_MARK = b"IQB1"
_PASSWORD_ENV = "IQBRIDGE_ORACLE_PASSWORD"
_OPTIONS = {"password_env", "prefix", "max_retries", "retention"}

# Oracle error codes (ORA-nnnnn) the adapter treats apart.
_EXISTS = {24001, 24006, 24034}  # queue table, queue, subscriber already there
_NO_QUEUE = {24010, 24002}
_LOGON = {1017, 28000, 1045}
_PRIVILEGE = {1031, 24047}
_NOTHING = {25228, 25263}
_UNREACHABLE = {12541, 12514, 12170, 12543, 12545, 3113, 3114, 3135, 1033, 1034, 1089}


def client_module() -> Any:
    """The python-oracledb module (imported on first use; tests may put a fake in its
    place in ``sys.modules``)."""
    try:
        module = importlib.import_module("oracledb")
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            "the oracle+aq:// adapter needs the python-oracledb driver: "
            "pip install 'iqbridge[oracle]'"
        ) from exc
    found = str(getattr(module, "__version__", "0"))
    if tuple(int(n) for n in re.findall(r"\d+", found)[:2]) < (3, 1):
        raise ConfigurationError(
            f"the oracle+aq:// adapter needs python-oracledb 3.1 or later (thin-mode AQ "
            f"with array enqueue and dequeue), not {found}: pip install -U 'oracledb>=3.1'"
        )
    return module


def _codes(exc: BaseException) -> tuple[int, str]:
    err = exc.args[0] if exc.args else None
    return int(getattr(err, "code", 0) or 0), str(getattr(err, "full_code", "") or "")


def ident(name: str, *, prefix: str = "", size: int = 24) -> str:
    """An Oracle identifier for an iqbridge name: upper case, ``[A-Z0-9_]``, at most
    ``size`` characters, a hash of the name keeping different names apart."""
    digest = hashlib.sha1(name.encode()).hexdigest()[:6].upper()
    base = re.sub(r"[^A-Z0-9_]", "_", name.upper())
    if not prefix and not base[:1].isalpha():
        prefix = "C_"  # an identifier starts with a letter
    room = size - len(prefix) - len(digest) - 1
    return f"{prefix}{base[:room]}_{digest}"


@dataclass(frozen=True)
class _Settings:
    user: str
    password: str
    host: str
    port: int
    service: str
    prefix: str
    max_retries: int
    retention: int
    url: str
    password_env: str

    @property
    def dsn(self) -> str:
        return f"{self.host}:{self.port}/{self.service}"


def _redact(url: str) -> str:
    """:func:`redact`, also for a URL whose port does not parse."""
    try:
        return redact(url)
    except ValueError:
        return re.sub(r"//([^:/@]*):[^@/]*@", r"//\1:***@", url)


def _parse(url: str) -> _Settings:
    safe = _redact(url)
    try:
        parts = urlsplit(url)
        port = parts.port or 1521
    except ValueError as exc:
        raise ConfigurationError(f"{safe}: bad host or port ({exc})") from None
    opts = dict(parse_qsl(parts.query, keep_blank_values=True))
    service = parts.path.strip("/")
    if parts.scheme.lower() != "oracle+aq" or not parts.hostname or not parts.username:
        raise ConfigurationError(
            f"write an Oracle AQ URL as oracle+aq://user@host:1521/service, not {safe!r}"
        )
    if not service or "/" in service:
        raise ConfigurationError(f"{safe}: name the database service: .../FREEPDB1")
    unknown = set(opts) - _OPTIONS
    if unknown:
        raise ConfigurationError(
            f"{safe}: unknown option(s) {sorted(unknown)}; known: {sorted(_OPTIONS)}"
        )
    env = opts.get("password_env", _PASSWORD_ENV)
    password = unquote(parts.password) if parts.password is not None else os.environ.get(env)
    remember_secret(password)  # one from the environment too: kept out of every log line
    if not password:
        raise ConfigurationError(
            f"{safe}: no password for {parts.username!r}: put it in the URL or in ${env}"
        )
    numbers: dict[str, int] = {}
    for name, default, low in (("max_retries", 100, 0), ("retention", -1, -1)):
        try:
            numbers[name] = int(opts.get(name, default))
        except ValueError:
            numbers[name] = low - 1
        if numbers[name] < low:
            raise ConfigurationError(f"{safe}: {name} must be an integer >= {low}")
    prefix = opts.get("prefix", "IQ_").upper()
    if not re.fullmatch(r"[A-Z][A-Z0-9_]{0,9}", prefix):
        raise ConfigurationError(f"{safe}: prefix must be a letter then up to 9 of A-Z 0-9 _")
    clean = parts._replace(netloc=f"{parts.username}@{parts.hostname}:{port}", query="")
    return _Settings(
        unquote(parts.username), password, parts.hostname, port, service, prefix,
        numbers["max_retries"], numbers["retention"], clean.geturl(), env,
    )  # fmt: skip


def _encode(env: Envelope) -> bytes:
    head = {
        "msg_id": env.msg_id, "content_type": env.content_type, "headers": env.headers,
        "publisher": env.publisher, "correlation_id": env.correlation_id,
        "priority": env.priority, "ordering_key": env.ordering_key,
        "parents": list(env.parents), "put_at": env.put_at, "groups": list(env.groups),
        "expires_at": env.expires_at,
    }  # fmt: skip
    raw = json.dumps(head, separators=(",", ":")).encode()
    return _MARK + len(raw).to_bytes(4, "big") + raw + env.body


def _decode(
    payload: bytes, correlation: str | None, priority: int, adopted_as: str
) -> tuple[Envelope, bool]:
    """The envelope of a RAW payload, and whether it was adopted (no iqbridge mark: its
    msg_id is then ``adopted_as``)."""
    if payload[:4] == _MARK and len(payload) >= 8:
        size = int.from_bytes(payload[4:8], "big")
        try:
            head = json.loads(payload[8 : 8 + size])
        except ValueError:
            head = None
        if isinstance(head, dict):
            return Envelope(
                msg_id=head["msg_id"], body=payload[8 + size :],
                content_type=head["content_type"], headers=dict(head["headers"]),
                publisher=head["publisher"], correlation_id=head["correlation_id"],
                priority=head["priority"], ordering_key=head["ordering_key"],
                parents=tuple(head["parents"]), put_at=head["put_at"],
                groups=tuple(head["groups"]), expires_at=head["expires_at"],
            ), False  # fmt: skip
    prio = 9 - min(max(priority, 0), 9)
    env = Envelope(adopted_as, payload, correlation_id=correlation, priority=prio)
    return env, True


def _from_row(row: Sequence[Any], adopted: Callable[[str], str]) -> tuple[str, Envelope, bool]:
    """The msgid (hex), envelope and whether it was adopted, of an ``AQ$<queue table>``
    view row of msg_id, user_data, corr_id, priority; ``adopted`` maps a msgid to the
    msg_id of a plain producer's message."""
    msgid, data, corr, priority = row
    raw = data.read() if hasattr(data, "read") else data
    ref = bytes(msgid).hex()
    env, stranger = _decode(bytes(raw), corr, int(priority), adopted(ref))
    return ref, env, stranger


def _chunks(refs: Sequence[str]) -> list[Sequence[str]]:
    """``refs`` in slices of at most :data:`_IN_CHUNK`."""
    return [refs[i : i + _IN_CHUNK] for i in range(0, len(refs), _IN_CHUNK)]


@dataclass
class _Held:
    """A session holding LOCKED entries of one group for one consumer."""

    conn: Any
    queue: str
    group: str
    consumer: str
    since: float
    refs: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)


class OracleAQAdapter(OracleAQInventory, OracleAQLocks):
    """Adapter over Oracle AQ through python-oracledb (thin mode); lists its queues for
    reconciliation (:mod:`iqbridge.adapters.oracle_aq_inventory`) and locks browsed
    messages in LOCKED mode (:mod:`iqbridge.adapters.oracle_aq_locks`)."""

    def __init__(self, settings: _Settings, client: Any | None = None) -> None:
        self.settings = settings
        self.url = settings.url
        self.client = client if client is not None else client_module()
        self.capabilities = Capabilities(
            native_groups=True,
            native_priority=True,
            max_payload_bytes=RAW_LIMIT - _ENVELOPE_ROOM,
            retains_after_ack=settings.retention < 0,
        )
        self._lock = threading.RLock()
        self._idle: list[Any] = []
        self._held: dict[tuple[str, str, str], _Held] = {}
        self._declared: set[tuple[str, str]] = set()
        self._native_locks = {}
        self._main: Any = self._connect()

    @classmethod
    def from_url(cls, url: str) -> OracleAQAdapter:
        """Parse the URL, import the driver and open the first session."""
        return cls(_parse(url))

    # --- names and errors ------------------------------------------------------------------

    def queue_name(self, queue: str) -> str:
        """The AQ queue of an iqbridge queue (its queue table is this name + ``_QT``)."""
        return ident(queue, prefix=self.settings.prefix)

    def consumer_name(self, group: str) -> str:
        """The AQ consumer name of a consumer group (a subscriber or a pool)."""
        return ident(group, size=30)

    def _adopted(self, queue: str, ref: str) -> str:
        """The msg_id of a plain AQ producer's message."""
        return adopted_id("oracle-aq", self.queue_name(queue), ref)

    def _error(self, exc: BaseException, what: str, queue: str | None = None) -> IQError:
        code, full = _codes(exc)
        where = f"{self.url}" + (f" (queue {queue!r})" if queue else "")
        s = self.settings
        if code in _LOGON:
            return ConfigurationError(
                f"Oracle refused the login of {s.user!r} at {self.url} ({full}): check the "
                f"user name and the password (in the URL or in ${s.password_env})"
            )
        if code in _NO_QUEUE:
            with self._lock:  # declare() creates it again from now on
                self._declared = {d for d in self._declared if d[0] != queue}
            return UnknownQueueError(
                f"the AQ queue behind {queue!r} does not exist at {self.url} ({full}): "
                f"declare it (hub.queue({queue!r}) creates it through DBMS_AQADM) or run the "
                f"setup in docs/adapters/oracle-aq.md"
            )
        if code in _PRIVILEGE:
            return ConfigurationError(
                f"{what} at {where} needs privileges {s.user!r} lacks ({full}): grant "
                f"AQ_ADMINISTRATOR_ROLE and EXECUTE ON DBMS_AQ, or create the queues beforehand"
            )
        if code in _UNREACHABLE or full.startswith("DPY-6") or full.startswith("DPY-4011"):
            return BrokerUnavailable(
                f"cannot reach Oracle at {self.url} ({full}): is the database up and the "
                f"host, port and service name right?"
            )
        return BrokerUnavailable(f"Oracle AQ could not {what} at {where} ({full or type(exc)})")

    def _connect(self) -> Any:
        s = self.settings
        try:
            return self.client.connect(user=s.user, password=s.password, dsn=s.dsn)
        except self.client.Error as exc:
            raise self._error(exc, "connect") from exc

    def _db(self) -> Any:
        """The session for enqueues, reads, purges and removals of entries no session
        holds; a new one after the last one broke."""
        if self._main is None:
            self._main = self._connect()
        return self._main

    def _rollback(self, conn: Any, exc: BaseException | None = None) -> None:
        """Roll back after a failure; a session the failure broke is closed and, for the
        main one, replaced on next use."""
        if conn is None:
            return
        err = exc.args[0] if exc is not None and exc.args else None
        code, full = _codes(exc) if exc is not None else (0, "")
        if getattr(err, "is_session_dead", False) or code in _UNREACHABLE or full == "DPY-4011":
            self._close(conn)
            if conn is self._main:
                self._main = None
            return
        try:
            conn.rollback()
        except self.client.Error:
            log.warning("rollback on %s failed", self.url, exc_info=True)

    def _session(self) -> Any:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def _give_back(self, conn: Any) -> None:
        with self._lock:
            self._idle.append(conn)

    def _deq(self, conn: Any, queue: str, group: str, mode: int, msgid: bytes | None = None) -> Any:
        c = self.client
        q = conn.queue(self.queue_name(queue))
        opts = q.deqoptions
        opts.mode, opts.wait, opts.navigation = mode, c.DEQ_NO_WAIT, c.DEQ_FIRST_MSG
        opts.visibility, opts.consumername = c.DEQ_ON_COMMIT, self.consumer_name(group)
        if msgid is not None:
            opts.msgid = msgid
        return q

    def _pull(self, q: Any, count: int) -> list[Any]:
        """``deqmany``; nothing when AQ says there is nothing: ORA-25228 (the driver
        turns it into an empty answer, thick mode in some paths does not) or ORA-25263 (no
        message with that msgid: removed already, or purged)."""
        try:
            return list(q.deqmany(count))
        except self.client.DatabaseError as exc:
            if _codes(exc)[0] in _NOTHING:
                return []
            raise

    # --- Adapter -----------------------------------------------------------------------------

    def declare(self, queue: str, groups: Sequence[str]) -> None:
        """Create the queue table, the queue, its dead-letter queue and the groups as
        subscribers, where missing (DBMS_AQADM; idempotent)."""
        wanted = [(queue, "")] + [(queue, g) for g in groups]
        with self._lock:
            if all(w in self._declared for w in wanted):
                return
            name = self.queue_name(queue)
            table, s = f"{name}_QT", self.settings
            calls: list[tuple[str, dict[str, Any]]] = []
            if (queue, "") not in self._declared:
                calls += [
                    ("DBMS_AQADM.CREATE_QUEUE_TABLE", {"queue_table": table,
                     "queue_payload_type": "RAW", "multiple_consumers": True}),
                    ("DBMS_AQADM.CREATE_QUEUE", {"queue_name": name, "queue_table": table,
                     "max_retries": s.max_retries, "retention_time": s.retention}),
                    ("DBMS_AQADM.START_QUEUE", {"queue_name": name}),
                    ("DBMS_AQADM.CREATE_QUEUE", {"queue_name": f"{name}_DL",
                     "queue_table": table, "retention_time": s.retention}),
                    ("DBMS_AQADM.START_QUEUE", {"queue_name": f"{name}_DL"}),
                ]  # fmt: skip
            try:
                with self._db().cursor() as cur:
                    for proc, kw in calls:
                        self._ignore_exists(cur.callproc, proc, keyword_parameters=kw)
                    for _, group in wanted[1:]:
                        if (queue, group) not in self._declared:
                            self._ignore_exists(
                                cur.execute,
                                "BEGIN DBMS_AQADM.ADD_SUBSCRIBER(queue_name => :qname, "
                                "subscriber => SYS.AQ$_AGENT(:agent_name, NULL, NULL)); END;",
                                {"qname": name, "agent_name": self.consumer_name(group)},
                            )
            except self.client.Error as exc:
                self._rollback(self._main, exc)
                raise self._error(exc, "declare the queue", queue) from exc
            self._declared.update(wanted)

    def _ignore_exists(self, call: Any, *args: Any, **kwargs: Any) -> None:
        try:
            call(*args, **kwargs)
        except self.client.Error as exc:
            if _codes(exc)[0] not in _EXISTS:
                raise

    def _props(self, queue: str, env: Envelope, recipients: Sequence[str] | None = None) -> Any:
        raw = _encode(env)
        if len(raw) > RAW_LIMIT:
            raise MessageTooLarge(len(raw), RAW_LIMIT, queue)
        props = self._db().msgproperties(
            payload=raw,
            correlation=env.correlation_id,
            priority=9 - env.priority,
            recipients=[self.consumer_name(g) for g in (recipients or env.groups)],
        )
        if env.expires_at is not None:
            props.expiration = max(1, -(-(env.expires_at - env.put_at) // 1_000_000))
        return props

    def send(self, queue: str, envelopes: Sequence[Envelope]) -> list[str]:
        """Enqueue in order (one ``enqmany``) and commit; the refs are the AQ msgids.

        A connection lost in the commit leaves it in doubt: the messages are looked up
        by msgid in the queue table (on a new session) and, if there, the put stands."""
        with self._lock:
            props: list[Any] = []
            try:
                props = [self._props(queue, env) for env in envelopes]
                self._db().queue(self.queue_name(queue)).enqmany(props)
                refs = [p.msgid.hex() for p in props]
                self._db().commit()
            except self.client.Error as exc:
                self._rollback(self._main, exc)
                if props and all(p.msgid for p in props) and self._enqueued(queue, refs):
                    log.info("Oracle at %s: a commit in doubt had committed", self.url)
                    return refs
                raise self._error(exc, "enqueue", queue) from exc
            return refs

    def _enqueued(self, queue: str, refs: list[str]) -> bool:
        """Whether the queue table holds any of ``refs`` (one enqueue commits all or none;
        a message dequeued since is seen while retention keeps it)."""
        try:
            return any(env is not None for env in self.read_many(queue, refs))
        except IQError:
            return False

    def receive(
        self,
        queue: str,
        group: str,
        consumer: str,
        *,
        count: int,
        timeout: float,
        min_idle: float | None = None,
    ) -> list[Received]:
        """Dequeue up to ``count`` entries in LOCKED mode in a session that keeps them;
        with ``min_idle``, first give back entries other consumers held that long."""
        if min_idle is not None:
            self._give_back_idle(queue, group, consumer, min_idle)
        conn = self._session()
        deadline = time.monotonic() + max(timeout, 0.0)
        try:
            q = self._deq(conn, queue, group, self.client.DEQ_LOCKED)
            while True:
                got = self._pull(q, count)
                if got or time.monotonic() >= deadline:
                    break
                time.sleep(min(0.05, max(deadline - time.monotonic(), 0.0)))
        except self.client.Error as exc:
            self._close(conn)  # never reuse a session that failed
            raise self._error(exc, "dequeue", queue) from exc
        if not got:
            self._give_back(conn)
            return []
        held = _Held(conn, queue, group, consumer, time.monotonic())
        out = []
        with self._lock:
            for props in got:
                ref = props.msgid.hex()
                held.refs.add(ref)
                self._held[(queue, group, ref)] = held
                env, adopted = _decode(
                    bytes(props.payload),
                    props.correlation,
                    props.priority,
                    self._adopted(queue, ref),
                )
                out.append(Received(ref, group, env, adopted, props.attempts + 1))
        return out

    def _give_back_idle(self, queue: str, group: str, consumer: str, min_idle: float) -> None:
        now = time.monotonic()
        with self._lock:
            stale = {
                id(h): h
                for (qn, g, _), h in self._held.items()
                if qn == queue and g == group and h.consumer != consumer
                and now - h.since >= min_idle
            }  # fmt: skip
            for held in stale.values():
                self._reshuffle(held, set(held.refs))

    def ack(self, queue: str, group: str, refs: Sequence[str]) -> None:
        """REMOVE each entry by msgid in the session that holds it; commit a session once
        all its entries are settled. Entries held elsewhere are removed in a new session."""
        with self._lock:
            loose: list[str] = []
            for ref in refs:
                held = self._held.pop((queue, group, ref), None)
                if held is None:
                    loose.append(ref)
                    continue
                try:
                    remove = self.client.DEQ_REMOVE_NODATA
                    self._pull(self._deq(held.conn, queue, group, remove, bytes.fromhex(ref)), 1)
                except self.client.Error as exc:
                    self._drop(held)
                    raise self._error(exc, "remove a message", queue) from exc
                held.refs.discard(ref)
                held.done.add(ref)
                self._settle(held)
            if loose:
                self._remove(queue, group, loose)

    def ack_in(self, connection: object, queue: str, group: str, refs: Sequence[str]) -> list[str]:
        """REMOVE entries in the application's session ``connection`` (visibility ON_COMMIT,
        uncommitted): they leave the queue when its transaction commits, with the rows
        and the DONE written in it, and are ready again if it rolls back. The locks this
        process holds on them are let go first (two sessions cannot share one), one
        rollback per holding session. Returns the refs removed so; none when
        ``connection`` is not a session on this queue's database (its browse by msgid
        finds nothing) or fails: those are acknowledged after the commit instead."""
        if not callable(getattr(connection, "queue", None)) or not refs:
            return []
        joined: list[str] = []
        with self._lock:
            try:
                first = bytes.fromhex(refs[0])
                if not self._pull(
                    self._deq(connection, queue, group, self.client.DEQ_BROWSE, first), 1
                ):
                    return []  # another database, or no longer the group's to remove
                holders: dict[int, tuple[_Held, set[str]]] = {}
                for ref in refs:
                    held = self._held.get((queue, group, ref))
                    if held is not None:
                        holders.setdefault(id(held), (held, set()))[1].add(ref)
                for held, back in holders.values():
                    self._reshuffle(held, back)
                remove = self.client.DEQ_REMOVE_NODATA
                for ref in refs:
                    q = self._deq(connection, queue, group, remove, bytes.fromhex(ref))
                    if self._pull(q, 1):
                        joined.append(ref)
            except self.client.Error as exc:  # the session is on another database
                log.debug("queue %s: no acknowledgement in the transaction (%s)", queue,
                          _codes(exc)[1] or type(exc).__name__)  # fmt: skip
            except IQError as exc:
                log.warning("queue %s: acknowledgement left until the commit: %s", queue, exc)
        return joined

    def ack_rolled_back(self, queue: str, group: str, refs: Sequence[str]) -> None:
        """The application's transaction rolled back the REMOVEs of :meth:`ack_in`: lock
        the entries again in a session of this process, as they were held before (an
        entry another session took meanwhile stays theirs)."""
        with self._lock:
            for ref in refs:
                conn = self._session()
                try:
                    q = self._deq(conn, queue, group, self.client.DEQ_LOCKED, bytes.fromhex(ref))
                    if not self._pull(q, 1):
                        self._give_back(conn)
                        continue
                except self.client.Error as exc:
                    self._close(conn)
                    log.warning(
                        "queue %s: could not hold a message again: %s",
                        queue,
                        self._error(exc, "lock a message", queue),
                    )
                    continue
                # Held for no consumer in particular: any consumer of the group may take
                # it over once it has been idle long enough, as with every held entry.
                held = _Held(conn, queue, group, "", time.monotonic(), {ref})
                self._held[(queue, group, ref)] = held

    def _remove(self, queue: str, group: str, refs: Sequence[str]) -> None:
        """REMOVE entries no session of ours holds (a redelivery, another process's)."""
        try:
            remove = self.client.DEQ_REMOVE_NODATA
            for ref in refs:
                self._pull(self._deq(self._db(), queue, group, remove, bytes.fromhex(ref)), 1)
            self._db().commit()
        except self.client.Error as exc:
            self._rollback(self._main, exc)
            raise self._error(exc, "remove a message", queue) from exc

    def _settle(self, held: _Held) -> None:
        if held.refs:
            return
        try:
            held.conn.commit()
        except self.client.Error as exc:
            self._drop(held)
            raise self._error(exc, "commit", held.queue) from exc
        self._idle.append(held.conn)

    def _drop(self, held: _Held) -> None:
        """Forget a session that failed: Oracle rolls back what it held, which is then
        ready for its group again."""
        for ref in held.refs | held.done:
            self._held.pop((held.queue, held.group, ref), None)
        held.refs.clear()
        self._close(held.conn)

    def _close(self, conn: Any) -> None:
        try:
            conn.close()
        except self.client.Error:
            log.debug("closing a session on %s failed", self.url, exc_info=True)

    def _reshuffle(self, held: _Held, back: set[str]) -> None:
        """Give ``back`` to the queue: roll the session back, then lock again what it
        still holds and remove again what is settled (one transaction cannot commit
        part of its work)."""
        try:
            held.conn.rollback()
            for ref in back:
                self._held.pop((held.queue, held.group, ref), None)
            held.refs -= back
            for ref in sorted(held.refs):
                mode = self.client.DEQ_LOCKED
                q = self._deq(held.conn, held.queue, held.group, mode, bytes.fromhex(ref))
                if not self._pull(q, 1):  # another session took it meanwhile: it is theirs
                    held.refs.discard(ref)
                    self._held.pop((held.queue, held.group, ref), None)
            for ref in sorted(held.done):
                mode = self.client.DEQ_REMOVE_NODATA
                q = self._deq(held.conn, held.queue, held.group, mode, bytes.fromhex(ref))
                self._pull(q, 1)
        except self.client.Error as exc:
            self._drop(held)
            raise self._error(exc, "give a message back", held.queue) from exc
        if not held.refs:
            self._settle(held)

    def requeue(self, queue: str, group: str, ref: str) -> None:
        """Make a held entry deliverable to the group again (a rollback of its lock)."""
        with self._lock:
            held = self._held.get((queue, group, ref))
            if held is not None:
                self._reshuffle(held, {ref})

    def dead_letter(self, queue: str, group: str, ref: str, reason: str) -> None:
        """Remove the entry for the group and put a copy, for that group, on the
        dead-letter queue ``<queue>_DL`` with the reason as its correlation."""
        env = self.read(queue, ref)
        with self._lock:
            if env is not None:
                try:
                    props = self._props(queue, replace(env, correlation_id=reason[:128]), [group])
                    dl = self._db().queue(f"{self.queue_name(queue)}_DL")
                    dl.enqone(props)
                    self._db().commit()
                except self.client.Error as exc:
                    self._rollback(self._main, exc)
                    raise self._error(exc, "dead-letter a message", queue) from exc
            self.ack(queue, group, [ref])

    def redeliver(self, queue: str, group: str, ref: str) -> bool:
        """Make the group get an entry again, even if it removed it: a held entry is
        rolled back; a removed one cannot be made ready again in AQ, so a copy of its
        envelope (same iqbridge msg_id) is enqueued for that group alone, which the
        facade recognises as a second entry of the same message. False when the queue
        table no longer has the payload."""
        with self._lock:
            if (queue, group, ref) in self._held:
                self.requeue(queue, group, ref)
                return True
        env = self.read(queue, ref)
        if env is None:
            return False
        with self._lock:
            try:
                self._db().queue(self.queue_name(queue)).enqone(self._props(queue, env, [group]))
                self._db().commit()
            except self.client.Error as exc:
                self._rollback(self._main, exc)
                raise self._error(exc, "enqueue", queue) from exc
        return True

    def read(self, queue: str, ref: str) -> Envelope | None:
        """The envelope with this AQ msgid, if the queue table still has it."""
        return self.read_many(queue, [ref])[0]

    def read_many(self, queue: str, refs: Sequence[str]) -> list[Envelope | None]:
        """Envelopes by msgid from the ``AQ$<queue table>`` view (ready, held, or
        dequeued and kept by retention), one query per :data:`_IN_CHUNK` msgids (Oracle
        takes at most 1000 items in an IN list: ORA-01795)."""
        if not refs:
            return []
        name = self.queue_name(queue)
        rows: list[Any] = []
        with self._lock:
            try:
                with self._db().cursor() as cur:
                    for chunk in _chunks(refs):
                        binds = ", ".join(f":m{i}" for i in range(len(chunk)))
                        sql = (
                            f"SELECT msg_id, user_data, corr_id, priority FROM AQ${name}_QT "
                            f"WHERE queue = :q AND msg_id IN ({binds})"
                        )
                        params: dict[str, Any] = {"q": name}
                        params.update({f"m{i}": bytes.fromhex(r) for i, r in enumerate(chunk)})
                        cur.execute(sql, params)
                        rows.extend(cur.fetchall())
            except self.client.Error as exc:
                self._rollback(self._main, exc)
                raise self._error(exc, "read messages", queue) from exc
        found: dict[str, Envelope] = {}
        for row in rows:
            ref, env, _ = _from_row(row, lambda r: self._adopted(queue, r))
            found[ref] = env
        return [found.get(ref) for ref in refs]

    def delete(self, queue: str, refs: Sequence[str]) -> None:
        """Purge the messages from the queue table (DBMS_AQADM.PURGE_QUEUE_TABLE), one
        call per :data:`_IN_CHUNK` msgids (an IN list takes at most 1000: ORA-01795)."""
        if not refs:
            return
        name = self.queue_name(queue)
        with self._lock:
            try:
                with self._db().cursor() as cur:
                    for chunk in _chunks(refs):
                        ids = ", ".join(
                            f"HEXTORAW('{bytes.fromhex(r).hex().upper()}')" for r in chunk
                        )
                        cur.execute(
                            "DECLARE po DBMS_AQADM.AQ$_PURGE_OPTIONS_T; BEGIN po.block := FALSE; "
                            "DBMS_AQADM.PURGE_QUEUE_TABLE(queue_table => :queue_table, "
                            "purge_condition => :condition, purge_options => po); END;",
                            {"queue_table": f"{name}_QT", "condition": f"qtview.msg_id IN ({ids})"},
                        )
            except self.client.Error as exc:
                self._rollback(self._main, exc)
                raise self._error(exc, "purge messages", queue) from exc

    def close(self) -> None:
        """Roll back what sessions still hold (it goes back to the queue) and close."""
        with self._lock:
            conns = {id(h.conn): h.conn for h in self._held.values()}
            conns.update({id(c): c for c in self._idle})
            conns.update({id(c): c for c in self._unlock_all_natively()})
            if self._main is not None:
                conns[id(self._main)] = self._main
            self._held.clear()
            self._idle.clear()
            self._main = None
            for conn in conns.values():
                self._close(conn)
