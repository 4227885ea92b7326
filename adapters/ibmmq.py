"""IBM MQ: ``ibmmq://user[:password]@host[:port]/QMGR[?options]``.

A client connection over a server-connection channel through IBM's Python client
(``ibmmq``, or ``pymqi`` when that is what is installed; both need the IBM MQ C client,
installed separately). The client is imported when the first URL is opened, so iqbridge
imports without it. The password comes from the URL or, when the URL has none, from the
environment variable ``IQBRIDGE_IBMMQ_PASSWORD`` (``password_env=NAME`` names another); it
never appears in a message or a log line.

Native mapping (see docs/adapters/ibmmq.md):

* every consumer group (a subscriber, or a pool: one queue its members share) has a local
  queue ``<prefix><queue>.<group>``; each iqbridge queue has a backout queue
  ``<prefix><queue>/BACKOUT`` that every group queue names as its BOQNAME. Names that are
  not valid MQ names (48 characters of ``A-Z a-z 0-9 . _ / %``) get a digest suffix
  (:func:`~iqbridge.adapters.ibmmq_wire.mq_name`). Queues rather than topics and durable
  subscriptions: a subscription's queue is the same object with less control, and a pool
  needs one queue anyway; so the adapter fans a put out itself, one copy per group of the
  message's audience, every copy of a batch under one syncpoint (all or none);
* gets run under syncpoint, a batch of gets under one: DONE commits, a group giving a
  message up (UNUSABLE) puts it to the backout queue with the reason in the same unit of
  work and commits; a message made deliverable again is backed out (its BackoutCount
  goes up) when nothing else of its unit of work is settled, else put back as a copy and
  the original committed away. A consumer that dies leaves its unit of work uncommitted:
  the queue manager backs it out and the messages return, BackoutCount + 1;
* MsgId (the msg_id's 16 UUID bytes and ``iqbridge``), CorrelId, Priority (0-9, as
  iqbridge's; queues deliver by priority, MSGDLVSQ PRIORITY) and Expiry (the put's ttl)
  travel in the MQMD; the rest of the envelope in the message property ``iqEnv`` (JSON).
  The body stays byte for byte, so a plain MQ consumer reads it unchanged; a message a
  plain producer put on a group queue (no ``iqEnv``) is adopted;
* IBM MQ forgets a message once its get is committed (``read_by_ref=False``,
  ``retains_after_ack=False``): the facade keeps a retained copy of each payload beside the
  index for journalled retention, peek, browse, re-reveal and redelivery.

Options: ``channel`` (default DEV.APP.SVRCONN), ``tls`` (a CipherSpec such as
``ANY_TLS12_OR_HIGHER``, or ``true`` for that one) with ``key_repository`` (the key
database's path without ``.kdb``) and ``cert_label``, ``prefix`` (prepended to queue
names), ``create`` (create missing queues with PCF; the user needs authority to; default
false: define them with MQSC), ``backout_threshold`` (BOTHRESH of created queues, default
5), ``max_payload`` (bytes, default 4 MiB less 64 KiB: MQ's default MAXMSGL, with room
for the envelope property), ``persistent`` (default
true), ``password_env``. The default index is the SQLite file ``iqbridge-index.db`` in the
working directory; pass ``index=`` for processes on several hosts.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from iqbridge.adapter import Capabilities
from iqbridge.errors import BrokerUnavailable, IQError
from iqbridge.model import Envelope, Received
from iqbridge.redaction import get_logger
from iqbridge.stores.sqlite import SqliteStore

from .ibmmq_inventory import IbmMqInventory  # noqa: TID251
from .ibmmq_link import Conn, Held, Unit, browsed, client_module  # noqa: TID251
from .ibmmq_locks import IbmMqLocks  # noqa: TID251
from .ibmmq_wire import (  # noqa: TID251
    DEFAULT_MAX_PAYLOAD,
    ENV_PROPERTY,
    Settings,
    correl_id,
    decode,
    encode_props,
    expiry_tenths,
    mq_name,
    msg_id_bytes,
    parse_url,
    translate,
)

__all__ = ["IbmMqAdapter", "client_module"]

log = get_logger(__name__)

T = TypeVar("T")

#: Largest envelope property read back (bytes); a longer one is read again at its size.
_PROP_BUFFER = 64 * 1024
#: Seconds a receive does not look again for a group queue it found missing.
_MISSING_FOR = 1.0


class IbmMqAdapter(IbmMqInventory, IbmMqLocks):
    """Adapter over an IBM MQ queue manager (client connection); lists its queues for
    reconciliation through :class:`~iqbridge.adapters.ibmmq_inventory.IbmMqInventory`
    and locks browsed messages with MQGMO_LOCK (:mod:`iqbridge.adapters.ibmmq_locks`)."""

    def __init__(self, mod: Any, settings: Settings, *, url: str) -> None:
        from iqbridge.registry import redact

        self._mod = mod
        self._c = mod.CMQC
        self.settings = settings
        self.url = redact(url)
        self.capabilities = Capabilities(
            native_groups=True,
            read_by_ref=False,
            retains_after_ack=False,
            native_priority=True,
            max_payload_bytes=settings.max_payload,
        )
        self._lock = threading.RLock()
        self._idle: list[Conn] = []
        self._units: set[Unit] = set()
        self._held: dict[tuple[str, str], dict[str, list[Held]]] = {}
        self._declared: set[str] = set()
        #: Group queues found missing by a receive, until when not to look again.
        self._missing: dict[str, float] = {}
        self._tracked = {}
        self._closed = False
        self._native_locks = {}

    @classmethod
    def from_url(cls, url: str) -> IbmMqAdapter:
        """Parse the URL, import the client and connect once (fail fast at start)."""
        from iqbridge.registry import redact

        settings = parse_url(url, redact(url))
        adapter = cls(client_module(), settings, url=url)
        adapter._give_back(adapter._connect())
        return adapter

    def default_index(self) -> SqliteStore:
        """The SQLite index file ``iqbridge-index.db`` in the working directory: right
        for processes on one host; pass ``index=`` (Redis, PostgreSQL, ...) for more."""
        return SqliteStore.from_url("sqlite:///iqbridge-index.db")

    # --- names ---------------------------------------------------------------------

    def queue_name(self, queue: str, group: str) -> str:
        """The local queue of a consumer group (a subscriber or a pool)."""
        return mq_name(f"{self.settings.prefix}{queue}.{group}")

    def backout_name(self, queue: str) -> str:
        """The backout queue of an iqbridge queue (``/`` keeps it apart from every group's
        queue: group names cannot hold one)."""
        return mq_name(f"{self.settings.prefix}{queue}/BACKOUT")

    # --- connections ---------------------------------------------------------------

    def _error(self, exc: Any, doing: str, mq_queue: str | None = None) -> IQError:
        return translate(exc, self.settings, self.url, doing, mq_queue)

    def _connect(self) -> Conn:
        mod, s = self._mod, self.settings
        cd = mod.CD()
        cd.ChannelName = s.channel.encode()
        cd.ConnectionName = s.conn_name.encode()
        cd.ChannelType = mod.CMQXC.MQCHT_CLNTCONN
        cd.TransportType = mod.CMQXC.MQXPT_TCP
        kwargs: dict[str, Any] = {"cd": cd, "opts": mod.CMQC.MQCNO_CLIENT_BINDING}
        if s.tls:
            cd.SSLCipherSpec = s.tls.encode()
            sco = mod.SCO()
            sco.KeyRepository = s.key_repository.encode()
            if s.cert_label:
                sco.CertificateLabel = s.cert_label.encode()
            kwargs["sco"] = sco
        if s.user:
            kwargs["user"] = s.user
            kwargs["password"] = s.password or ""
        try:
            # Never disconnect on garbage collection: MQDISC commits, and a unit of work
            # left open must be backed out (close() does), or end with the process.
            qmgr = mod.QueueManager(None, disconnect_on_exit=False)
            qmgr.connect_with_options(s.qmgr, **kwargs)
        except mod.Error as exc:
            raise self._error(exc, "connecting") from exc
        return Conn(mod, qmgr)

    def _borrow(self) -> Conn:
        with self._lock:
            if self._closed:
                raise BrokerUnavailable(f"the IBM MQ adapter for {self.url} is closed")
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def _give_back(self, conn: Conn) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < 8:
                self._idle.append(conn)
                return
        conn.close(back_out=True)

    def _with(self, doing: str, op: Callable[[Conn], T], mq_queue: Callable[[], str]) -> T:
        """``op`` on a pooled connection, its unit of work committed by ``op`` or backed
        out on failure; a connection that broke is dropped and the call tried once more
        on a new one."""
        for attempt in (1, 2):
            conn = self._borrow()
            try:
                result = op(conn)
            except self._mod.Error as exc:
                conn.close(back_out=True)
                reason = int(getattr(exc, "reason", 0))
                if attempt == 1 and reason == self._c.MQRC_CONNECTION_BROKEN:
                    self._drop_idle()
                    continue
                raise self._error(exc, doing, mq_queue()) from exc
            except BaseException:
                conn.close(back_out=True)
                raise
            self._give_back(conn)
            return result
        raise AssertionError("unreachable")

    # --- the Adapter protocol ------------------------------------------------------

    def declare(self, queue: str, groups: Sequence[str]) -> None:
        """Make sure the queue's backout queue and every group's local queue exist, and
        create missing ones with PCF under ``?create=true``.

        Without ``create``, a missing backout queue raises UnknownQueueError naming the
        MQSC to run. A missing group queue is only logged: a get on it finds nothing (a
        pool member's own group needs no queue), and a put to it raises
        UnknownQueueError."""
        boq = self.backout_name(queue)
        names = [boq, *(self.queue_name(queue, g) for g in groups)]
        todo = [n for n in names if n not in self._declared]
        if not todo:
            return
        current = [""]
        found: list[str] = []

        def run(conn: Conn) -> None:
            for name in todo:
                current[0] = name
                try:
                    self._ensure(conn, name, boq=boq)
                except self._mod.MQMIError as exc:
                    if int(exc.reason) != self._c.MQRC_UNKNOWN_OBJECT_NAME or name == boq:
                        raise
                    log.info(
                        "IBM MQ at %s: no local queue %r (iqbridge queue %r); gets find "
                        "nothing there and puts to its group fail until it is defined",
                        self.url,
                        name,
                        queue,
                    )
                    continue
                found.append(name)

        self._with("declaring queues", run, lambda: current[0])
        with self._lock:
            self._declared.update(found)
            for name in found:
                self._missing.pop(name, None)

    def _ensure(self, conn: Conn, name: str, *, boq: str) -> None:
        c = self._c
        try:
            conn.queue(name, c.MQOO_INQUIRE | c.MQOO_FAIL_IF_QUIESCING)
            return
        except self._mod.MQMIError as exc:
            if int(exc.reason) != c.MQRC_UNKNOWN_OBJECT_NAME or not self.settings.create:
                raise
        args = {
            c.MQCA_Q_NAME: name.encode(),
            c.MQIA_Q_TYPE: c.MQQT_LOCAL,
            c.MQIA_DEF_PERSISTENCE: c.MQPER_PERSISTENT,
            c.MQIA_MSG_DELIVERY_SEQUENCE: c.MQMDS_PRIORITY,
        }
        if self.settings.max_payload > DEFAULT_MAX_PAYLOAD:
            # Raised by the user: the queue manager's and the channel's MAXMSGL must be
            # raised too (a queue's may not exceed its queue manager's).
            args[c.MQIA_MAX_MSG_LENGTH] = self.settings.max_payload + _PROP_BUFFER
        if name != boq:
            args[c.MQIA_BACKOUT_THRESHOLD] = self.settings.backout_threshold
            args[c.MQCA_BACKOUT_REQ_Q_NAME] = boq.encode()
        try:
            self._mod.PCFExecute(conn.qmgr).MQCMD_CREATE_Q(args)
        except self._mod.MQMIError as exc:
            if int(exc.reason) != 4001:  # MQRCCF_OBJECT_ALREADY_EXISTS: someone was first
                raise
        log.info("IBM MQ at %s: created local queue %s", self.url, name)

    def _put(self, conn: Conn, name: str, body: bytes, md: Any, env_json: str | None) -> None:
        c = self._c
        pmo = self._mod.PMO()
        pmo.Options = c.MQPMO_SYNCPOINT | c.MQPMO_FAIL_IF_QUIESCING
        if env_json is not None:
            pmo.Version = c.MQPMO_VERSION_3
            pmo.OriginalMsgHandle = conn.envelope_handle(env_json).msg_handle
        conn.queue(name, c.MQOO_OUTPUT | c.MQOO_FAIL_IF_QUIESCING).put(body, md, pmo)

    def _md(self, env: Envelope) -> Any:
        c = self._c
        md = self._mod.MD()
        md.MsgId = msg_id_bytes(env.msg_id)
        md.CorrelId = correl_id(env.correlation_id)
        md.Priority = min(max(env.priority, 0), 9)
        md.Expiry = expiry_tenths(env)
        md.Persistence = c.MQPER_PERSISTENT if self.settings.persistent else c.MQPER_NOT_PERSISTENT
        md.Format = c.MQFMT_STRING if env.content_type.startswith("text/") else c.MQFMT_NONE
        return md

    def send(self, queue: str, envelopes: Sequence[Envelope]) -> list[str]:
        """Put one copy of each envelope on the queue of every group it is addressed to,
        all under one syncpoint, then commit; return the msg_ids (the references).

        A connection broken during the puts backed the unit of work out: it is put again
        on a new connection. One broken during MQCMIT leaves it in doubt (the commit may
        have happened, its reply lost): the group queues are browsed for the messages'
        MsgIds first, and the unit is put again only if none of them is there."""
        current = [""]
        committing = [False]

        def run(conn: Conn) -> None:
            if committing[0] and self._committed(conn, queue, envelopes):
                log.info("IBM MQ at %s: a commit in doubt had committed", self.url)
                return
            committing[0] = False
            for env in envelopes:
                env_json = encode_props(env)
                for group in env.groups:
                    current[0] = self.queue_name(queue, group)
                    self._put(conn, current[0], env.body, self._md(env), env_json)
            committing[0] = True
            conn.qmgr.commit()

        self._with("putting messages", run, lambda: current[0])
        return [env.msg_id for env in envelopes]

    def _committed(self, conn: Conn, queue: str, envelopes: Sequence[Envelope]) -> bool:
        """Whether any message of a unit of work is on one of its group queues (browsed
        by MsgId): one is, if the unit committed (all or nothing). A copy every group
        got and committed meanwhile is not seen: then the unit is put again."""
        c, mod = self._c, self._mod
        for env in envelopes:
            for group in env.groups:
                md, gmo = mod.MD(), mod.GMO()
                md.MsgId = msg_id_bytes(env.msg_id)
                gmo.Options = c.MQGMO_BROWSE_FIRST | c.MQGMO_NO_WAIT | c.MQGMO_FAIL_IF_QUIESCING
                gmo.MatchOptions = c.MQMO_MATCH_MSG_ID
                try:
                    name = self.queue_name(queue, group)
                    conn.queue(name, c.MQOO_BROWSE | c.MQOO_FAIL_IF_QUIESCING).get(None, md, gmo)
                    return True
                except mod.MQMIError as exc:
                    if int(exc.reason) != c.MQRC_NO_MSG_AVAILABLE:
                        raise
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
        """Messages this process holds for the group, idle for ``min_idle`` seconds,
        first; then up to ``count`` gets from the group's queue under one syncpoint
        (highest priority first), waiting up to ``timeout`` for the first.

        An idle held message is handed out again to any consumer, its own included: the
        index decides. It claims the message if its lease lapsed, acknowledges it if it
        was finished (elsewhere, say), and leaves it pending while someone holds it. So
        no message stays in an open unit of work for ever because the process that
        finished it was not the one that got it."""
        now = time.monotonic()
        out: list[Received] = []
        if min_idle is not None:
            with self._lock:
                for entries in self._held.get((queue, group), {}).values():
                    for h in entries:
                        if len(out) < count and h.state == "held" and now - h.since >= min_idle:
                            h.consumer, h.since, h.count = consumer, now, h.count + 1
                            out.append(self._received(h))
        if len(out) < count:
            out.extend(self._get(queue, group, consumer, count - len(out), timeout))
        return out

    @staticmethod
    def _received(h: Held) -> Received:
        return Received(h.ref, h.group, h.envelope, h.adopted, delivery_count=h.count)

    def _get(
        self, queue: str, group: str, consumer: str, count: int, timeout: float
    ) -> list[Received]:
        c, mod = self._c, self._mod
        name = self.queue_name(queue, group)
        if name not in self._declared and self._missing.get(name, 0.0) > time.monotonic():
            return []
        opened = self._open_input(name)
        if opened is None:
            return []
        conn, q = opened
        unit = Unit(conn)
        try:
            mh = conn.props()
            while len(unit.entries) < count:
                md = mod.MD()
                gmo = mod.GMO()
                gmo.Options = c.MQGMO_SYNCPOINT | c.MQGMO_FAIL_IF_QUIESCING
                gmo.Options |= c.MQGMO_PROPERTIES_IN_HANDLE
                if not unit.entries and timeout > 0:
                    gmo.Options |= c.MQGMO_WAIT
                    gmo.WaitInterval = max(1, int(timeout * 1000))
                gmo.MatchOptions = c.MQMO_NONE
                gmo.Version = c.MQGMO_VERSION_4
                gmo.MsgHandle = mh.msg_handle
                try:
                    body = q.get(None, md, gmo)
                except mod.MQMIError as exc:
                    if int(exc.reason) == c.MQRC_NO_MSG_AVAILABLE:
                        break
                    raise
                env_json = self._env_property(mh)
                ref, env, adopted = decode(queue, group, md, body, env_json, c.MQFMT_STRING)
                unit.entries.append(
                    Held(
                        queue,
                        group,
                        ref,
                        unit,
                        name,
                        body,
                        md,
                        env_json,
                        env,
                        adopted,
                        consumer,
                        time.monotonic(),
                        int(md.BackoutCount) + 1,
                    )
                )
        except mod.Error as exc:
            conn.close(back_out=True)
            raise self._error(exc, "getting messages", name) from exc
        except BaseException:
            conn.close(back_out=True)
            raise
        if not unit.entries:
            self._give_back(conn)
            return []
        with self._lock:
            self._units.add(unit)
            slot = self._held.setdefault((queue, group), {})
            for h in unit.entries:
                slot.setdefault(h.ref, []).append(h)
        return [self._received(h) for h in unit.entries]

    def _open_input(self, name: str) -> tuple[Conn, Any] | None:
        """A pooled connection with ``name`` open for gets; None when the queue does not
        exist. A broken pooled connection is replaced once."""
        c = self._c
        for attempt in (1, 2):
            conn = self._borrow()
            try:
                return conn, conn.queue(name, c.MQOO_INPUT_SHARED | c.MQOO_FAIL_IF_QUIESCING)
            except self._mod.Error as exc:
                reason = int(getattr(exc, "reason", 0))
                if reason == c.MQRC_UNKNOWN_OBJECT_NAME:
                    # No queue, so nothing was ever put for this group (a put declares
                    # the groups of its audience and fails on a missing queue): a pool
                    # member's own group, say. Nothing to get; looked for again later.
                    self._give_back(conn)
                    with self._lock:
                        self._declared.discard(name)
                        self._missing[name] = time.monotonic() + _MISSING_FOR
                    return None
                conn.close(back_out=True)
                if attempt == 1 and reason == c.MQRC_CONNECTION_BROKEN:
                    self._drop_idle()
                    continue
                raise self._error(exc, "opening a queue for gets", name) from exc
        raise AssertionError("unreachable")

    def _drop_idle(self) -> None:
        """Close every pooled connection (one broke: the others likely did too)."""
        log.warning("IBM MQ at %s: connection broken; reconnecting", self.url)
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close(back_out=True)

    def _env_property(self, mh: Any) -> str | None:
        """The envelope property of the message just got, or None (a plain client's)."""
        c = self._c
        size = _PROP_BUFFER
        for _ in range(2):
            try:
                value = mh.properties.get(
                    ENV_PROPERTY, max_value_length=size, property_type=c.MQTYPE_STRING
                )
            except self._mod.MQMIError as exc:
                if int(exc.reason) == c.MQRC_PROPERTY_NOT_AVAILABLE:
                    return None
                if int(exc.reason) == c.MQRC_PROPERTY_VALUE_TOO_BIG:
                    size = int(getattr(exc, "data_length", 0) or size * 16)
                    continue
                raise
            return value.decode() if isinstance(value, bytes) else str(value)
        return None

    def _take(self, queue: str, group: str, refs: Sequence[str], state: str) -> list[Held]:
        """Mark the group's held messages of ``refs`` settled as ``state``."""
        out: list[Held] = []
        with self._lock:
            slot = self._held.get((queue, group), {})
            for ref in refs:
                for h in slot.pop(ref, ()):
                    if h.state == "held":
                        h.state = state
                        out.append(h)
        return out

    def ack(self, queue: str, group: str, refs: Sequence[str]) -> None:
        """The group is done with these messages: each unit of work whose messages are
        all settled now commits. References this process does not hold are left alone
        (another process holds them; it commits, or they come back and are skipped)."""
        self._finish_all({h.unit for h in self._take(queue, group, refs, "done")})

    def _finish_all(self, units: Iterable[Unit]) -> None:
        """:meth:`_finish` each unit, even after one fails; then raise the first error."""
        first: BaseException | None = None
        for unit in units:
            try:
                self._finish(unit)
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    def requeue(self, queue: str, group: str, ref: str) -> None:
        """Deliverable again: backed out, or put back as a copy if the rest of its unit of
        work stays held."""
        first: BaseException | None = None
        for h in self._take(queue, group, [ref], "back"):
            try:
                with h.unit.lock:
                    busy = any(e.state == "held" for e in h.unit.entries)
                    if busy and not h.unit.finished:
                        try:
                            self._put_copy(h, no_syncpoint=True)
                        except self._mod.Error as exc:
                            self._hold_again(h)
                            raise self._error(exc, "putting a message back", h.mq_queue) from exc
                        h.state = "moved"
                self._finish(h.unit)
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    def _hold_again(self, h: Held) -> None:
        """A settlement failed before it changed anything: the message is held again."""
        with self._lock:
            h.state = "held"
            self._held.setdefault((h.queue, h.group), {}).setdefault(h.ref, []).append(h)

    def dead_letter(self, queue: str, group: str, ref: str, reason: str) -> None:
        """Put the message, with the reason, to the queue's backout queue in its unit of
        work and commit when the unit is settled. Not held here: nothing to park."""
        held = self._take(queue, group, [ref], "done")
        if not held:
            return
        h = held[0]
        with h.unit.lock:
            if not h.unit.finished:
                try:
                    self._put_dead(h, reason)
                except self._mod.Error as exc:
                    for x in held:
                        self._hold_again(x)
                    raise self._error(exc, "parking a message", self.backout_name(queue)) from exc
        self._finish_all({x.unit for x in held})

    def _put_copy(self, h: Held, *, no_syncpoint: bool) -> None:
        c = self._c
        md = self._mod.MD()
        for name in ("MsgId", "CorrelId", "Priority", "Persistence", "Format"):
            setattr(md, name, getattr(h.md, name))
        md.Expiry = h.md.Expiry
        pmo = self._mod.PMO()
        pmo.Options = (
            c.MQPMO_NO_SYNCPOINT if no_syncpoint else c.MQPMO_SYNCPOINT
        ) | c.MQPMO_FAIL_IF_QUIESCING
        conn = h.unit.conn
        if h.env_json is not None:
            pmo.Version = c.MQPMO_VERSION_3
            pmo.OriginalMsgHandle = conn.envelope_handle(h.env_json).msg_handle
        conn.queue(h.mq_queue, c.MQOO_OUTPUT | c.MQOO_FAIL_IF_QUIESCING).put(h.body, md, pmo)

    def _put_dead(self, h: Held, reason: str) -> None:
        c = self._c
        conn = h.unit.conn
        md = self._mod.MD()
        for name in ("MsgId", "CorrelId", "Priority", "Persistence", "Format"):
            setattr(md, name, getattr(h.md, name))
        pmo = self._mod.PMO()
        pmo.Options = c.MQPMO_SYNCPOINT | c.MQPMO_FAIL_IF_QUIESCING
        pmo.Version = c.MQPMO_VERSION_3
        mh = self._mod.MessageHandle(conn.qmgr)  # its own: the reason goes with this one
        try:
            if h.env_json is not None:
                mh.properties.set(ENV_PROPERTY, h.env_json)
            mh.properties.set("iqReason", reason[:4000] or "unusable")
            mh.properties.set("iqGroup", h.group)
            mh.properties.set("iqQueue", h.queue)
            pmo.OriginalMsgHandle = mh.msg_handle
            name = self.backout_name(h.queue)
            conn.queue(name, c.MQOO_OUTPUT | c.MQOO_FAIL_IF_QUIESCING).put(h.body, md, pmo)
        finally:
            with contextlib.suppress(Exception):
                mh.dlt()
        h.state = "dead"

    def _finish(self, unit: Unit) -> None:
        """End a unit of work whose messages are all settled: back it out when every one
        goes back (their BackoutCount rises), else put the ones going back again and
        commit, in that unit of work."""
        with unit.lock:
            with self._lock:
                if unit.finished or any(e.state == "held" for e in unit.entries):
                    return
                unit.finished = True
                self._units.discard(unit)
            conn = unit.conn
            try:
                if all(e.state == "back" for e in unit.entries):
                    conn.qmgr.backout()
                else:
                    for e in unit.entries:
                        if e.state == "back":
                            self._put_copy(e, no_syncpoint=False)
                    conn.qmgr.commit()
            except self._mod.Error as exc:
                conn.close(back_out=True)
                raise self._error(exc, "ending a unit of work", unit.entries[0].mq_queue) from exc
        self._give_back(conn)

    def read(self, queue: str, ref: str) -> Envelope | None:
        """None: IBM MQ cannot read a message again once got (the facade keeps copies)."""
        return None

    def read_many(self, queue: str, refs: Sequence[str]) -> list[Envelope | None]:
        """None for each: see :meth:`read`."""
        return [None] * len(refs)

    def delete(self, queue: str, refs: Sequence[str]) -> None:
        """Nothing to delete: the queue manager dropped each message at its commit."""

    def close(self) -> None:
        """Back out every unit of work still open (its messages return to their queues)
        and disconnect."""
        self._unlock_all_natively()
        with self._lock:
            self._closed = True
            units = list(self._units)
            self._units.clear()
            self._held.clear()
            idle, self._idle = self._idle, []
        for unit in units:
            with unit.lock:
                unit.finished = True
                unit.conn.close(back_out=True)
        for conn in idle:
            conn.close(back_out=True)

    # --- tests, operations ---------------------------------------------------------

    def put_again(self, queue: str, group: str, env: Envelope) -> None:
        """Make the group get a message again after it was committed, as after a commit
        lost with a crashed consumer: the copy this process holds is backed out, else
        ``env`` is put on the group's queue again. For tests and repair."""
        with self._lock:
            holding = bool(self._held.get((queue, group), {}).get(env.msg_id))
        if holding:
            self.requeue(queue, group, env.msg_id)
            return
        name = self.queue_name(queue, group)

        def run(conn: Conn) -> None:
            self._put(conn, name, env.body, self._md(env), encode_props(env))
            conn.qmgr.commit()

        self._with("putting a message again", run, lambda: name)

    def declared_queues(self) -> set[str]:
        """The MQ queues this adapter made sure of (group and backout queues)."""
        with self._lock:
            return set(self._declared)

    def delete_queues(self, names: Sequence[str]) -> None:
        """Delete local queues with PCF (``MQCMD_DELETE_Q``, purging their messages), on a
        connection of its own (also after :meth:`close`, once nothing holds them open):
        for test suites and operators; the user needs administrative authority."""
        c, cfc = self._c, self._mod.CMQCFC
        conn = self._connect()
        try:
            pcf = self._mod.PCFExecute(conn.qmgr)
            for name in names:
                pcf.MQCMD_DELETE_Q({c.MQCA_Q_NAME: name.encode(), cfc.MQIACF_PURGE: cfc.MQPO_YES})
                with self._lock:
                    self._declared.discard(name)
        except self._mod.Error as exc:
            raise self._error(exc, "deleting queues", ", ".join(names)) from exc
        finally:
            conn.close(back_out=True)

    def held(self, queue: str, group: str) -> dict[str, str]:
        """Messages this process holds under syncpoint for a group: reference -> consumer."""
        with self._lock:
            slot = self._held.get((queue, group), {})
            return {ref: hs[0].consumer for ref, hs in slot.items() if hs}

    def browse(
        self, queue: str, group: str = "", limit: int = 100
    ) -> list[tuple[bytes, dict[str, str]]]:
        """The first ``limit`` messages of a group's queue (or of the backout queue when
        ``group`` is empty), left where they are: body and properties (the reason of a
        parked message). Browses with MQGMO_BROWSE_FIRST / MQGMO_BROWSE_NEXT."""
        c, mod = self._c, self._mod
        name = self.queue_name(queue, group) if group else self.backout_name(queue)

        def run(conn: Conn) -> list[tuple[bytes, dict[str, str]]]:
            q = conn.queue(name, c.MQOO_BROWSE | c.MQOO_FAIL_IF_QUIESCING)
            mh = conn.props()
            out: list[tuple[bytes, dict[str, str]]] = []
            for _md, body in browsed(mod, q, mh) if limit > 0 else ():
                props: dict[str, str] = {}
                for prop in (ENV_PROPERTY, "iqReason", "iqGroup", "iqQueue"):
                    with contextlib.suppress(mod.MQMIError):
                        value = mh.properties.get(prop, max_value_length=_PROP_BUFFER)
                        props[prop] = value.decode() if isinstance(value, bytes) else str(value)
                out.append((body, props))
                if len(out) >= limit:
                    break
            return out

        return self._with("browsing a queue", run, lambda: name)

    def __repr__(self) -> str:
        return f"<IbmMqAdapter {self.url}>"
