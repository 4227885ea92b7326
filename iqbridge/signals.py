"""Stopping a daemon on SIGTERM and SIGINT without doing anything inside the handler.

A Python signal handler runs in the main thread between two bytecodes of whatever that
thread was doing: while it holds a lock the handler would take (``threading.Event.set``
takes one), half-way through an import (rich imports its emoji table on first use), or
inside the handler itself when a second signal follows the first by a few milliseconds.
So the handler here only records the signal (one ``list.append``: no lock, no I/O, no
import). Whatever the daemon does about it (log a line, stop) happens outside the
handler: in the main loop, which reads :attr:`StopSignals.received`, or in a small
watcher thread that calls ``then(signum)`` for each signal::

    with StopSignals(then=lambda signum: daemon.stop()):
        daemon.run()

Handlers are installed only in the main thread (Python delivers signals there); in
another thread a :class:`StopSignals` records nothing and calls nothing.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType, TracebackType
from typing import Any

from iqbridge.redaction import get_logger

__all__ = ["StopSignals"]

log = get_logger("iqbridge")

#: Signals that arrive this close together count as one request (GNU ``timeout`` sends
#: its signal to the command and again to its process group: two within microseconds).
REPEAT_AFTER = 0.25


class StopSignals:
    """While inside, SIGTERM and SIGINT (or ``signums``) are recorded instead of handled
    by their previous handlers; see the module documentation.

    ``then(signum)``, when given, is called once per signal from a watcher thread,
    within ``tick`` seconds of its arrival; on leaving, the previous handlers are back.
    """

    def __init__(
        self,
        then: Callable[[int], object] | None = None,
        signums: Sequence[int] = (signal.SIGTERM, signal.SIGINT),
        *,
        tick: float = 0.05,
    ) -> None:
        self.then = then
        self.signums = tuple(signums)
        self.tick = tick
        #: (signal number, monotonic time) per signal, appended by the handler only.
        self._hits: list[tuple[int, float]] = []
        self._previous: dict[int, Any] = {}
        self._done = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def received(self) -> int:
        """How many signals arrived so far."""
        return len(self._hits)

    @property
    def last(self) -> int | None:
        """The number of the latest signal, or None."""
        hits = self._hits
        return hits[-1][0] if hits else None

    @property
    def again(self) -> bool:
        """True once a signal arrived more than :data:`REPEAT_AFTER` seconds after the
        first: a deliberate second request (a second Ctrl-C), not an echo of the first."""
        hits = self._hits
        return len(hits) > 1 and hits[-1][1] - hits[0][1] > REPEAT_AFTER

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self._hits.append((signum, time.monotonic()))

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._previous = {s: signal.signal(s, self._record) for s in self.signums}
        if self.then is not None:
            self._watcher = threading.Thread(
                target=self._watch, name="iqbridge-signals", daemon=True
            )
            self._watcher.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}
        self._done.set()
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None

    def _watch(self) -> None:
        seen = 0
        while True:
            stopping = self._done.wait(self.tick)
            hits = self._hits[seen:]
            seen += len(hits)
            for signum, _ in hits:
                assert self.then is not None
                try:
                    self.then(signum)
                except Exception:
                    log.exception("acting on signal %d failed", signum)
            if stopping:
                return
