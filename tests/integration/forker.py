"""Processes started through a fork server (``forker_proc.py``), with the part of
:class:`subprocess.Popen`'s interface the kill tests use: ``pid``, ``poll``, ``wait``,
``send_signal`` and ``kill``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

SERVER = Path(__file__).with_name("forker_proc.py")


class Forker:
    """A fork server that imports ``preload`` once; :meth:`start` forks a process from it
    that runs a script (``[path, *args]``) or the ``iq`` command line (``["iq", *args]``)."""

    def __init__(self, preload: list[str], log: Path) -> None:
        self._log = log.open("ab")
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self._ask(None) == "ready", f"the fork server did not start (see {log})"

    def _ask(self, line: str | None) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            if line is not None:
                self.proc.stdin.write(line + "\n")
                self.proc.stdin.flush()
            return self.proc.stdout.readline().strip()

    def start(self, argv: list[str], stderr: Path, stdout: Path | None = None) -> Forked:
        """A new process running ``argv``, its output appended to the files given."""
        spec = {"argv": argv, "stderr": str(stderr), "stdout": str(stdout) if stdout else None}
        return Forked(self, int(self._ask(f"start {json.dumps(spec)}")))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(10)
        self._log.close()


class Forked:
    """One process of a :class:`Forker`."""

    def __init__(self, server: Forker, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None

    def _status(self, answer: str) -> int | None:
        if answer != "running":
            self.returncode = int(answer)
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            self._status(self._server._ask(f"poll {self.pid}"))
        return self.returncode

    def wait(self, timeout: float) -> int:
        if self.returncode is None:
            code = self._status(self._server._ask(f"wait {self.pid} {timeout}"))
            if code is None:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
