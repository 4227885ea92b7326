"""The bridge daemon: every route of a configuration, with a health record.

::

    bridge = Bridge(load_config("bridge.yaml"))
    bridge.run()                     # until SIGTERM / Ctrl-C / bridge.stop()

Stopping (SIGTERM, Ctrl-C, :meth:`Bridge.stop`) stops reading, lets every lane finish
what it holds (put, settle), gives back what waits for a retry, and releases the route
leases, so nothing is left in doubt and a standby can take over at once.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from types import TracebackType

from iqbridge.bridge.config import BridgeConfig
from iqbridge.bridge.route import RouteRunner, RouteStats
from iqbridge.durations import seconds, to_seconds
from iqbridge.errors import IQError
from iqbridge.hub import Hub, connect
from iqbridge.redaction import get_logger, scrub
from iqbridge.registry import open_store
from iqbridge.signals import StopSignals

__all__ = ["Bridge", "check_health"]

log = get_logger("iqbridge.bridge")


class Bridge:
    """Runs every route of ``config`` (see the module documentation)."""

    def __init__(self, config: BridgeConfig) -> None:
        self.config = config
        self._hubs: dict[tuple[str, str | None], Hub] = {}
        self._stop = threading.Event()
        self._started = False
        try:
            self.state = self._hub(config.bridge.state, None, "field bridge.state")
            self.routes = [
                RouteRunner(
                    r,
                    config.bridge,
                    self._hub(r.source.url, r.source.index, f"route {r.name!r}, field source."),
                    self._hub(
                        r.destination.url,
                        r.destination.index,
                        f"route {r.name!r}, field destination.",
                    ),
                    self.state,
                )
                for r in config.routes
            ]
        except BaseException:
            self.close()
            raise
        self.health_file = Path(config.bridge.health_file) if config.bridge.health_file else None

    def _hub(self, url: str, index: str | None, where: str) -> Hub:
        """The hub of ``url`` and ``index`` (one per pair). An error opening it names
        the route and field, as the configuration's own errors do: ``where`` is the field,
        or its prefix (ending in ``.``) that ``url`` and ``index`` complete."""
        key = (url, index)
        hub = self._hubs.get(key)
        if hub is not None:
            return hub
        fields = (where + "url", where + "index") if where.endswith(".") else (where, where)
        store = None
        if index is not None:
            try:
                store = open_store(index)
            except IQError as exc:
                raise _located(exc, fields[1]) from exc
        try:
            hub = connect(url, store, publisher=f"bridge.{self.config.bridge.name}")
        except IQError as exc:
            if store is not None:
                store.close()
            raise _located(exc, fields[0]) from exc
        self._hubs[key] = hub
        return hub

    def start(self) -> None:
        """Start every route (returns at once)."""
        if self._started:
            return
        self._started = True
        for r in self.routes:
            r.start()

    def stop(self) -> None:
        """Ask every route to stop (returns at once; :meth:`join` waits)."""
        self._stop.set()
        for r in self.routes:
            r.stop()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every route to stop; True if all did within ``timeout``."""
        timeout = to_seconds(timeout, "timeout")
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = True
        for r in self.routes:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ok = r.join(left) and ok
        return ok

    def stats(self) -> list[RouteStats]:
        """Every route's counters."""
        return [r.stats() for r in self.routes]

    def run(self, *, duration: float | None = None, handle_signals: bool = True) -> None:
        """Run until stopped (SIGTERM or Ctrl-C when ``handle_signals``), or for
        ``duration`` seconds (more than 0); then stop cleanly and close.

        A signal only records itself (see :mod:`iqbridge.signals`); the bridge logs it
        and stops from a thread of its own, so a second signal close behind the first
        changes nothing."""
        if duration is not None:
            duration = seconds(duration, "duration", positive=True)
        with StopSignals(then=self._on_signal) if handle_signals else nullcontext():
            self.start()
            end = None if duration is None else time.monotonic() + duration
            try:
                while not self._stop.is_set():
                    self._record()
                    if all(not r._reader.is_alive() for r in self.routes):
                        break  # every route failed
                    wait = self.config.bridge.heartbeat
                    if end is not None:
                        wait = min(wait, max(0.0, end - time.monotonic()))
                        if wait == 0.0:
                            break
                    self._stop.wait(wait)
            finally:
                self.stop()
                self.join()
                self._record()
                self.close()

    def _on_signal(self, signum: int) -> None:
        if not self._stop.is_set():
            log.info("%s: stopping the bridge", _signal_name(signum))
        self.stop()

    def _record(self) -> None:
        if self.health_file is None:
            return
        secrets = self.config.secrets()
        body = {
            "time": time.time(),
            "pid": os.getpid(),
            "bridge": self.config.bridge.name,
            "stopping": self._stop.is_set(),
            "routes": {
                s.name: {
                    "active": s.active,
                    "read": s.read,
                    "bridged": s.bridged,
                    "children": s.children,
                    "unusable": s.unusable,
                    "retried": s.retried,
                    "held": s.held,
                    "groups": s.groups,
                    "recovered": s.recovered,
                    "failed": _scrub(r.failed, secrets),
                    "last_error": _scrub(s.last_error, secrets),
                }
                for s, r in zip(self.stats(), self.routes, strict=True)
            },
        }
        tmp = self.health_file.with_suffix(self.health_file.suffix + ".tmp")
        tmp.write_text(json.dumps(body, indent=1))
        tmp.replace(self.health_file)

    def close(self) -> None:
        """Close every hub the bridge opened."""
        for hub in self._hubs.values():
            try:
                hub.close()
            except IQError as exc:
                log.warning("closing a hub: %s", exc)
        self._hubs.clear()

    def __enter__(self) -> Bridge:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self.join()
        self.close()


def _located(exc: IQError, where: str) -> IQError:
    """``exc`` with ``where`` before its message, as the nearest class of its own that
    takes a message alone (UnknownSchemeError becomes a ConfigurationError)."""
    text = f"{where}: {exc}"
    for cls in type(exc).__mro__:
        if issubclass(cls, IQError):
            try:
                return cls(text)
            except TypeError:
                continue
    return IQError(text)


def _scrub(text: str | None, secrets: list[str]) -> str | None:
    return None if text is None else scrub(text, secrets)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def check_health(path: str | Path, *, max_age: float = 10.0) -> tuple[bool, str]:
    """Whether the bridge writing ``path`` is alive and every route works, with a
    one-line reason (``iq bridge check`` exits non-zero when not)."""
    max_age = seconds(max_age, "max_age")
    p = Path(path)
    try:
        body = json.loads(p.read_text())
    except FileNotFoundError:
        return False, f"no health record at {p}: the bridge never ran there"
    except (OSError, ValueError) as exc:
        return False, f"unreadable health record at {p}: {exc}"
    age = time.time() - float(body.get("time", 0))
    if age > max_age:
        return (
            False,
            f"health record at {p} is {age:.0f} s old (limit {max_age:.0f} s): "
            "the bridge is not running",
        )
    pid = body.get("pid")
    if isinstance(pid, int) and not _alive(pid):
        return False, f"the bridge process {pid} is gone"
    if body.get("stopping"):
        return False, "the bridge is stopping"
    routes = body.get("routes", {})
    failed = [f"{n} ({r['failed']})" for n, r in routes.items() if r.get("failed")]
    if failed:
        return False, "route(s) failed: " + ", ".join(failed)
    active = sum(1 for r in routes.values() if r.get("active"))
    bridged = sum(int(r.get("bridged", 0)) for r in routes.values())
    return (
        True,
        f"alive: {len(routes)} route(s), {active} active here, {bridged} bridged, "
        f"record {age:.1f} s old",
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
