"""Browse with lock on IBM MQ: the facade's lock, also taken with MQGMO_LOCK.

``queue.browse(lock=True)`` locks messages in the index on every broker: iqbridge's gets,
in any process, pass them by until the lock ends (``unlock``, a get under the lock, or
``lock_for``). On IBM MQ the adapter also locks each of them on the queue manager, so a
plain MQ application reading the same queues skips them too: for every (group queue,
message) it opens a browse handle on a connection kept for the lock and browses the
message by MsgId with ``MQGMO_BROWSE_FIRST | MQGMO_LOCK``. MQ locks one message per open
handle, hence a handle each, up to :data:`MAX_NATIVE_LOCKS` per browse (a queue manager
allows 256 handles per connection by default); the rest are locked in the index only.
The lock ends with the index's: :meth:`unlock_natively` (``MQGMO_UNLOCK`` and
``MQCLOSE``), a timer at ``lock_for``, or the process's end (the queue manager drops a
closed connection's locks).

What it does not do: a get under the lock made in *another* process cannot take the
message from the queue manager while this process's handle locks it; the facade hands
it over through the index (the retained copy) all the same, and the queue's copy is
committed away once the native lock ends, as any message finished elsewhere. A message a
consumer holds under syncpoint is not browsable and is left unlocked natively (the index
lock still hides it from iqbridge's gets once it comes back).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from iqbridge.redaction import get_logger

from .ibmmq_wire import msg_id_bytes  # noqa: TID251

if TYPE_CHECKING:
    from .ibmmq import IbmMqAdapter  # noqa: TID251
    from .ibmmq_link import Conn  # noqa: TID251

__all__ = ["IbmMqLocks", "mq_msg_id"]

log = get_logger(__name__)

#: Native locks one browse takes at most: each is an open handle on the lock's
#: connection, and a queue manager allows 256 per connection by default (MAXHANDS).
#: Messages past it are locked in the index only.
MAX_NATIVE_LOCKS = 200
#: MQRC_HANDLE_NOT_AVAILABLE: the connection may open no more handles.
_NO_HANDLE = 2017

_HEX_ID = re.compile(r"[0-9a-f]{48}")


def mq_msg_id(ref: str) -> bytes:
    """The MQMD MsgId of a native reference: an iqbridge message's reference is its
    msg_id; an adopted plain message's, its MsgId in hex."""
    return bytes.fromhex(ref) if _HEX_ID.fullmatch(ref) else msg_id_bytes(ref)


@dataclass
class _Native:
    """The queue manager's side of one lock: a connection and a browse handle per locked
    (group, reference)."""

    conn: Conn
    handles: dict[tuple[str, str], Any] = field(default_factory=dict)
    timer: threading.Timer | None = None


class IbmMqLocks:
    """Mixed into :class:`~iqbridge.adapters.ibmmq.IbmMqAdapter`: ``MQGMO_LOCK`` for the
    facade's browse with lock (:class:`~iqbridge.adapter.LocksNatively`)."""

    _native_locks: dict[tuple[str, str], _Native]

    def lock_natively(
        self,
        queue: str,
        entries: Sequence[tuple[str, str]],
        lock_id: str,
        lock_for: float | None,
    ) -> int:
        """Lock each ``(group, reference)`` on its group queue under ``lock_id``; returns
        how many are locked on the queue manager (a message held under syncpoint, gone
        or already locked by someone else is not)."""
        a = _me(self)
        c, mod = a._c, a._mod
        key = (queue, lock_id)
        with a._lock:
            native = self._native_locks.get(key)
        if native is None:
            native = _Native(a._connect())
        count = 0
        try:
            for group, ref in entries:
                if (group, ref) in native.handles:
                    continue
                if len(native.handles) >= MAX_NATIVE_LOCKS:
                    log.info(
                        "queue %s: browse lock %s holds %d messages on the queue manager; "
                        "the rest are locked in the index only", queue, lock_id, MAX_NATIVE_LOCKS
                    )  # fmt: skip
                    break
                name = a.queue_name(queue, group)
                try:
                    q = mod.Queue(native.conn.qmgr, name, c.MQOO_BROWSE | c.MQOO_FAIL_IF_QUIESCING)
                except mod.MQMIError as exc:
                    if int(exc.reason) == c.MQRC_UNKNOWN_OBJECT_NAME:
                        continue
                    if int(exc.reason) == _NO_HANDLE:
                        log.info("queue %s: no more MQ handles; the rest of browse lock %s is "
                                 "in the index only", queue, lock_id)  # fmt: skip
                        break
                    raise
                md, gmo = mod.MD(), mod.GMO()
                md.MsgId = mq_msg_id(ref)
                gmo.Options = (
                    c.MQGMO_BROWSE_FIRST
                    | c.MQGMO_LOCK
                    | c.MQGMO_NO_WAIT
                    | c.MQGMO_FAIL_IF_QUIESCING
                )
                gmo.MatchOptions = c.MQMO_MATCH_MSG_ID
                gmo.Version = c.MQGMO_VERSION_4
                try:
                    q.get(None, md, gmo)
                except mod.MQMIError as exc:
                    with contextlib.suppress(mod.Error):
                        q.close()
                    if int(exc.reason) == c.MQRC_NO_MSG_AVAILABLE:
                        continue  # held under syncpoint, locked elsewhere, or gone
                    raise
                native.handles[(group, ref)] = q
                count += 1
        except mod.Error as exc:
            self._end(native)
            with a._lock:
                self._native_locks.pop(key, None)
            raise a._error(exc, "locking browsed messages", None) from exc
        with a._lock:
            if not native.handles:
                self._end(native)
                return 0
            self._native_locks[key] = native
        if lock_for is not None and native.timer is None:
            native.timer = threading.Timer(lock_for, self.unlock_natively, (queue, lock_id))
            native.timer.daemon = True
            native.timer.start()
        return count

    def unlock_natively(self, queue: str, lock_id: str, refs: Sequence[str] | None = None) -> int:
        """Release the queue manager's locks of ``lock_id`` (of ``refs`` only, in every
        group, when given); returns how many were released."""
        a = _me(self)
        c, mod = a._c, a._mod
        key = (queue, lock_id)
        with a._lock:
            native = self._native_locks.get(key)
            if native is None:
                return 0
            wanted = set(refs) if refs is not None else None
            gone = [k for k in native.handles if wanted is None or k[1] in wanted]
            handles = [native.handles.pop(k) for k in gone]
            whole = not native.handles
            if whole:
                self._native_locks.pop(key, None)
        for q in handles:
            md, gmo = mod.MD(), mod.GMO()
            gmo.Options = c.MQGMO_UNLOCK | c.MQGMO_NO_WAIT
            with contextlib.suppress(mod.Error):
                q.get(None, md, gmo)
            with contextlib.suppress(mod.Error):
                q.close()
        if whole:
            self._end(native)
        return len(handles)

    def _end(self, native: _Native) -> None:
        if native.timer is not None:
            native.timer.cancel()
        for q in native.handles.values():
            with contextlib.suppress(Exception):
                q.close()
        native.handles.clear()
        native.conn.close(back_out=True)

    def _unlock_all_natively(self) -> None:
        """Drop every lock (the adapter closes)."""
        with _me(self)._lock:
            natives = list(self._native_locks.values())
            self._native_locks.clear()
        for native in natives:
            self._end(native)


def _me(mixin: IbmMqLocks) -> IbmMqAdapter:
    """The adapter this mixin is part of."""
    return cast("IbmMqAdapter", mixin)
