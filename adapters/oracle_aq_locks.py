"""Browse with lock on Oracle AQ: the facade's lock, also taken in AQ's LOCKED mode.

``queue.browse(lock=True)`` locks messages in the index on every broker, so iqbridge's
gets in any process pass them by. On Oracle AQ the adapter also dequeues each of them in
``DEQ_LOCKED`` mode by msgid, for every consumer name still to get it, in a session kept
for the lock: the session's row locks make every other session's dequeue (a plain AQ
consumer's too) skip the message, which stays in the queue, unchanged. The lock ends
with the index's: :meth:`unlock_natively` (a rollback of the session), a timer at
``lock_for``, a get under the lock (for those messages), or the process's end (Oracle
rolls a dead session back).

As on IBM MQ, a get under the lock made in another process takes the message through the
index; its AQ entry is removed once this process's lock ends.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from iqbridge.redaction import get_logger

if TYPE_CHECKING:
    from .oracle_aq import OracleAQAdapter  # noqa: TID251

__all__ = ["OracleAQLocks"]

log = get_logger(__name__)


@dataclass
class _Native:
    """One lock's session and the (group, msgid) entries it holds."""

    conn: Any
    entries: set[tuple[str, str]] = field(default_factory=set)
    timer: threading.Timer | None = None


class OracleAQLocks:
    """Mixed into :class:`~iqbridge.adapters.oracle_aq.OracleAQAdapter`: AQ's LOCKED
    mode for the facade's browse with lock (:class:`~iqbridge.adapter.LocksNatively`)."""

    _native_locks: dict[tuple[str, str], _Native]

    def lock_natively(
        self,
        queue: str,
        entries: Sequence[tuple[str, str]],
        lock_id: str,
        lock_for: float | None,
    ) -> int:
        """Dequeue each ``(group, msgid)`` in LOCKED mode in the lock's session; returns
        how many it locked (one another session holds, or gone, is not)."""
        a = _me(self)
        key = (queue, lock_id)
        with a._lock:
            native = self._native_locks.get(key)
        if native is None:
            native = _Native(a._session())
        count = 0
        try:
            for group, ref in entries:
                if (group, ref) in native.entries:
                    continue
                q = a._deq(native.conn, queue, group, a.client.DEQ_LOCKED, bytes.fromhex(ref))
                if a._pull(q, 1):
                    native.entries.add((group, ref))
                    count += 1
        except a.client.Error as exc:
            a._close(native.conn)
            with a._lock:
                self._native_locks.pop(key, None)
            raise a._error(exc, "lock browsed messages", queue) from exc
        with a._lock:
            if not native.entries:
                a._give_back(native.conn)
                return 0
            self._native_locks[key] = native
        if lock_for is not None and native.timer is None:
            native.timer = threading.Timer(lock_for, self.unlock_natively, (queue, lock_id))
            native.timer.daemon = True
            native.timer.start()
        return count

    def unlock_natively(self, queue: str, lock_id: str, refs: Sequence[str] | None = None) -> int:
        """Release the lock's entries (of ``refs`` only, in every group, when given): the
        session rolls back, and locks again what it still holds."""
        a = _me(self)
        key = (queue, lock_id)
        with a._lock:
            native = self._native_locks.get(key)
            if native is None:
                return 0
            wanted = set(refs) if refs is not None else None
            gone = {e for e in native.entries if wanted is None or e[1] in wanted}
            native.entries -= gone
            if not native.entries:
                self._native_locks.pop(key, None)
            try:
                native.conn.rollback()
                for group, ref in sorted(native.entries):  # what the lock still holds
                    q = a._deq(native.conn, queue, group, a.client.DEQ_LOCKED, bytes.fromhex(ref))
                    if not a._pull(q, 1):
                        native.entries.discard((group, ref))
            except a.client.Error as exc:
                log.warning("queue %s: browse lock %s: %s", queue, lock_id, exc)
                native.entries.clear()
                self._native_locks.pop(key, None)
                a._close(native.conn)
                return len(gone)
            if not native.entries:
                self._native_locks.pop(key, None)
                if native.timer is not None:
                    native.timer.cancel()
                a._give_back(native.conn)
        return len(gone)

    def _unlock_all_natively(self) -> list[Any]:
        """Forget every lock (the adapter closes); their sessions, to close."""
        natives = list(self._native_locks.values())
        self._native_locks.clear()
        for native in natives:
            if native.timer is not None:
                native.timer.cancel()
        return [n.conn for n in natives]


def _me(mixin: OracleAQLocks) -> OracleAQAdapter:
    """The adapter this mixin is part of."""
    return cast("OracleAQAdapter", mixin)
