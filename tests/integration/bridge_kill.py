"""What the bridge kill tests share: a fork server of bridge processes, the kill loop,
and reading a destination back with the broker's own client."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import iqbridge

SERVER = Path(__file__).with_name("bridge_proc.py")


class ForkServer:
    """``bridge_proc.py`` as a child of the test: starts bridge processes on request."""

    def __init__(self, logs: Path) -> None:
        self.stderr = (logs / "bridges.stderr").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            cwd=logs,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"
        self.logs = logs

    def start(self, config: Path) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"start {config}\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(10)
        self.stderr.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"bridge process {pid} did not exit"
        time.sleep(0.01)


def health(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def wait_active(path: Path, pid: int, timeout: float = 30.0) -> bool:
    """Until the bridge ``pid`` holds every route (its health record says so)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = health(path)
        routes = h.get("routes", {})
        if h.get("pid") == pid and routes and all(r.get("active") for r in routes.values()):
            return True
        if not alive(pid):
            return False
        time.sleep(0.01)
    return False


def write_config(path: Path, body: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(body))
    return path


@dataclass
class KillRun:
    """The kill loop of one bridge: ``kills`` SIGKILLs at random points, each after
    ``feed()`` put the next slice of the source's messages, then one last process that
    bridges the rest and is stopped with SIGTERM once ``done()`` says so."""

    server: ForkServer
    config: Path
    health_file: Path
    feed: Callable[[int], None]
    done: Callable[[], bool]
    kills: int = 50
    rng: random.Random = field(default_factory=lambda: random.Random(20261124))
    killed_at: list[str] = field(default_factory=list)

    def run(self, timeout: float = 120.0) -> float:
        t0 = time.monotonic()
        for n in range(self.kills):
            self.feed(n)
            pid = self.server.start(self.config)
            if self.rng.random() < 0.15:
                time.sleep(self.rng.uniform(0.0, 0.15))  # during start-up and recovery
                self.killed_at.append("start-up")
            else:
                assert wait_active(self.health_file, pid), self._why(pid)
                time.sleep(self.rng.uniform(0.0, 0.4))
                self.killed_at.append("running")
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid)
        self.feed(self.kills)
        pid = self.server.start(self.config)
        deadline = time.monotonic() + timeout
        while not self.done():
            assert alive(pid), self._why(pid)
            assert time.monotonic() < deadline, "the last bridge did not finish in time"
            time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        wait_gone(pid)
        return time.monotonic() - t0

    def _why(self, pid: int) -> str:
        text = (self.server.logs / "bridges.stderr").read_text(errors="replace")
        return f"bridge {pid} did not come up or died:\n{text[-3000:]}"


def check_order(items: list[tuple[str, int]]) -> tuple[int, int, int]:
    """Lost, duplicated and key inversions of (key, n) pairs read at the destination in
    its order, where n counts each key's messages from 0 in put order."""
    seen = Counter(n for _, n in items)
    dup = sum(c - 1 for c in seen.values() if c > 1)
    last: dict[str, int] = defaultdict(lambda: -1)
    inversions = 0
    for key, n in items:
        if n < last[key]:
            inversions += 1
        last[key] = max(last[key], n)
    return len(seen), dup, inversions


def source_done(queue: iqbridge.Queue, subscriber: str, want: int) -> int:
    """How many of the source's messages the bridge's subscriber has DONE."""
    hits = queue.search(
        iqbridge.Filter(
            state=iqbridge.SubscriberState.JOURNALLED, subscriber=subscriber, limit=want + 10
        )
    )
    return len(hits)
