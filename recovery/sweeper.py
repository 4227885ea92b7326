"""In-doubt recovery as a daemon: apply what time has made due, on every queue.

Consumers already do this as they poll (``queue.get`` runs ``queue.recover()`` about once
a second). When nobody polls a queue, nothing would notice that a crashed consumer's
lease ran out, that a time limit passed or that a browse lock lapsed; a :class:`Sweeper`
does, on an interval: in-doubt members go back to AVAILABLE with attempt + 1 (or
UNUSABLE once ``max_attempts`` is used up), members past their time limit go EXPIRED,
lapsed locks are released. Every change goes through the state engine, like any other.

Liveness: each pass writes a small JSON health record (time, queues, changes) to a file;
:func:`check_health` reads it and says whether the sweeper is alive (``iq recover
--check`` exits non-zero when it is not), in the manner of arq's worker health check.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from iqbridge.durations import seconds, to_seconds
from iqbridge.errors import IQError
from iqbridge.hub import Hub
from iqbridge.redaction import get_logger

__all__ = ["SweepResult", "Sweeper", "check_health"]

log = get_logger("iqbridge.recovery")


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one pass did."""

    at: float
    queues: int
    changed: int
    errors: int


class Sweeper:
    """Runs ``queue.recover()`` for every queue of a hub every ``interval`` seconds."""

    def __init__(
        self, hub: Hub, *, interval: float = 1.0, health_file: Path | str | None = None
    ) -> None:
        self.hub = hub
        self.interval = seconds(interval, "interval", positive=True)
        self.health_file = Path(health_file) if health_file is not None else None
        self.passes = 0
        self.changed = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep(self) -> SweepResult:
        """One pass over every queue the index knows."""
        names = self.hub.queues()
        changed = errors = 0
        for name in names:
            try:
                changed += self.hub.queue(name).recover()
            except IQError as exc:
                errors += 1
                log.warning("sweep of queue %s failed: %s", name, exc)
        result = SweepResult(time.time(), len(names), changed, errors)
        self.passes += 1
        self.changed += changed
        if self.health_file is not None:
            self._record(result)
        return result

    def _record(self, result: SweepResult) -> None:
        assert self.health_file is not None
        tmp = self.health_file.with_suffix(self.health_file.suffix + ".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "at": result.at,
                    "interval": self.interval,
                    "queues": result.queues,
                    "changed": result.changed,
                    "errors": result.errors,
                    "passes": self.passes,
                }
            )
        )
        tmp.replace(self.health_file)

    def run(self, *, passes: int | None = None) -> None:
        """Sweep until :meth:`stop` (or ``passes`` passes); blocks."""
        done = 0
        while not self._stop.is_set():
            self.sweep()
            done += 1
            if passes is not None and done >= passes:
                return
            self._stop.wait(self.interval)

    def start(self) -> None:
        """Sweep in a background thread."""
        if self._thread is not None:
            raise RuntimeError("sweeper already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="iqbridge-sweeper", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the background thread after its current pass."""
        timeout = to_seconds(timeout, "timeout")
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


def check_health(health_file: Path | str, *, max_age: float | None = None) -> tuple[bool, str]:
    """Whether the sweeper writing ``health_file`` is alive, and a one-line reason.

    Alive means its last pass is younger than ``max_age`` seconds (default three of its
    intervals) and that pass had no errors.
    """
    max_age = to_seconds(max_age, "max_age")
    path = Path(health_file)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return False, f"no health record at {path}: the sweeper never ran there"
    except (OSError, ValueError) as exc:
        return False, f"unreadable health record at {path}: {exc}"
    age = time.time() - float(data["at"])
    limit = max_age if max_age is not None else 3 * float(data.get("interval", 1.0))
    if age > limit:
        return False, f"last sweep {age:.1f}s ago (limit {limit:.1f}s): the sweeper is not running"
    if data.get("errors"):
        return False, f"last sweep had {data['errors']} failing queue(s)"
    return True, (
        f"alive: last sweep {age:.1f}s ago over {data['queues']} queue(s), {data['passes']} passes"
    )
