"""Daemons stopped by signals, as real processes: ``iq worker``, ``iq bridge run``,
``iq relay``.

``iq worker`` on SIGTERM or Ctrl-C finishes the messages in process, gives every other
message it fetched back at once (AVAILABLE, not left to the lease) and exits within
seconds; a second signal exits at once, leaving only what the lease brings back. Signal
handlers only record the signal, so two signals a few milliseconds apart (GNU
``timeout`` sends two) stop a daemon cleanly instead of re-entering a half-done import.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

import iqbridge
from iqbridge import SubscriberState
from iqbridge.outbox import Outbox
from tests.redis_index_helpers import REDIS_URL, drop_streams, fresh_prefix

S = SubscriberState
IQ = Path(sys.executable).with_name("iq")
MESSAGES = 200

#: A handler that logs when it starts and ends a message and sleeps in between.
HANDLER = """
import os, time

def handle(d):
    with open(os.environ["IQ_TEST_LOG"], "a") as f:
        f.write(f"start {d.msg_id}\\n")
    time.sleep(float(os.environ["IQ_TEST_SLOW"]))
    with open(os.environ["IQ_TEST_LOG"], "a") as f:
        f.write(f"end {d.msg_id}\\n")
"""


class WorkerProc:
    """``iq worker orders s`` with the slow handler, and what its handler logged."""

    def __init__(self, tmp: Path, url: str, slow: float, *args: str, wrap: tuple[str, ...] = ()):
        (tmp / "slow_handler.py").write_text(HANDLER)
        self.log = tmp / "handled.log"
        self.log.write_text("")
        self.url = url
        env = {**os.environ, "IQ_TEST_LOG": str(self.log), "IQ_TEST_SLOW": str(slow)}
        cmd = [*wrap, str(IQ), "--url", url, "worker", "orders", "s"]
        self.proc = subprocess.Popen(
            [*cmd, "--handler", "slow_handler:handle", *args],
            cwd=tmp,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def handled(self, what: str) -> set[str]:
        return {
            line.split()[1] for line in self.log.read_text().splitlines() if line.startswith(what)
        }

    def wait_until_all_fetched(self) -> None:
        """Every message claimed (prefetched) and one of them in the handler."""
        deadline = time.monotonic() + 60
        with iqbridge.connect(self.url) as hub:
            q = hub.queue("orders")
            while time.monotonic() < deadline:
                assert self.proc.poll() is None, self.proc.communicate()
                left = q.counts().subscribers["s"].get(S.AVAILABLE, 0)
                if left == 0 and self.handled("start"):
                    return
                time.sleep(0.05)
        pytest.fail("the worker did not fetch every message within 60 s")

    def stop(self, *signums: int, gap: float = 0.0, within: float = 10.0) -> tuple[str, str, float]:
        """Send the signals ``gap`` seconds apart; the output and how long the process
        took to exit after the first."""
        start = time.monotonic()
        for i, signum in enumerate(signums):
            if i:
                time.sleep(gap)
            self.proc.send_signal(signum)
        out, err = self.proc.communicate(timeout=within)
        return out, err, time.monotonic() - start

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def workers() -> Iterator[list[WorkerProc]]:
    started: list[WorkerProc] = []
    yield started
    for w in started:
        w.kill()


def _fill(url: str) -> set[str]:
    with iqbridge.connect(url) as hub:
        return set(hub.queue("orders").put_many([f"m{i}" for i in range(MESSAGES)], to=["s"]))


def _states(url: str) -> dict[S, int]:
    with iqbridge.connect(url) as hub:
        return {s: n for s, n in hub.queue("orders").counts().subscribers["s"].items() if n}


def _stops_and_gives_back(
    tmp: Path,
    url: str,
    workers: list[WorkerProc],
    stop: Callable[[WorkerProc], tuple[str, str, float]],
) -> None:
    ids = _fill(url)
    w = WorkerProc(tmp, url, 0.5)
    workers.append(w)
    w.wait_until_all_fetched()
    out, err, took = stop(w)
    assert w.proc.returncode == 0, err
    assert "Traceback" not in out + err
    assert took < 8.0, f"took {took:.1f} s to stop"
    started, ended = w.handled("start"), w.handled("end")
    # What was in process finished; nothing else was started after the signal.
    assert started == ended and 1 <= len(started) < 40
    back = MESSAGES - len(started)
    assert _states(url) == {S.JOURNALLED: len(started), S.AVAILABLE: back}
    assert f"gave back {back} unstarted message(s)" in out
    # The next consumer gets them at once, not after the 30 s lease.
    with iqbridge.connect(url) as hub:
        batch = hub.queue("orders").get_many("s", MESSAGES)
        assert {d.msg_id for d in batch} == ids - started
        assert {d.attempt for d in batch} == {2}
        batch.done()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_finishes_what_is_in_process_and_gives_back_the_rest(
    tmp_path: Path, sqlite_url: str, workers: list[WorkerProc], signum: int
) -> None:
    _stops_and_gives_back(tmp_path, sqlite_url, workers, lambda w: w.stop(signum))


def test_the_same_on_redis_streams(tmp_path: Path, workers: list[WorkerProc]) -> None:
    with fresh_prefix("stop") as prefix:
        url = f"{REDIS_URL}?prefix={prefix}&stream_prefix={prefix}:"
        try:
            _stops_and_gives_back(tmp_path, url, workers, lambda w: w.stop(signal.SIGTERM))
        finally:
            drop_streams(f"{prefix}:")


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs GNU timeout")
def test_two_signals_at_once_are_one_stop(
    tmp_path: Path, sqlite_url: str, workers: list[WorkerProc]
) -> None:
    """GNU timeout signals the command and then its process group: two SIGTERMs within
    microseconds are one request to stop, not a stop and then a forced exit."""
    _fill(sqlite_url)
    w = WorkerProc(
        tmp_path, sqlite_url, 0.5, wrap=("timeout", "--preserve-status", "-s", "TERM", "6")
    )
    workers.append(w)
    out, err = w.proc.communicate(timeout=30)
    assert w.proc.returncode == 0, err
    assert "Traceback" not in out + err
    assert re.search(r"gave back \d+ unstarted message", out), out
    states = _states(sqlite_url)
    assert set(states) <= {S.JOURNALLED, S.AVAILABLE}, states


def test_a_second_signal_exits_at_once_and_the_lease_brings_the_rest_back(
    tmp_path: Path, sqlite_url: str, workers: list[WorkerProc]
) -> None:
    ids = _fill(sqlite_url)
    w = WorkerProc(tmp_path, sqlite_url, 60, "--lease", "1")
    workers.append(w)
    w.wait_until_all_fetched()
    out, err, took = w.stop(signal.SIGTERM, signal.SIGTERM, gap=0.6)
    assert w.proc.returncode == 130, err
    assert took < 5.0, f"took {took:.1f} s to exit"
    assert "Traceback" not in out + err
    assert "come back when their lease runs out" in err
    assert set(_states(sqlite_url)) <= {S.FETCHED, S.IN_PROCESS}  # nothing lost, nothing done
    time.sleep(1.2)
    with iqbridge.connect(sqlite_url) as hub:
        q = hub.queue("orders")
        q.recover()
        assert {d.msg_id for d in q.get_many("s", MESSAGES)} == ids


# --- two signals close together -----------------------------------------------------


def _bridge_config(tmp: Path) -> Path:
    route = {
        "name": "r",
        "source": {"url": f"sqlite:///{tmp}/in.db", "queue": "orders"},
        "destination": {"url": f"sqlite:///{tmp}/out.db", "queue": "orders", "to": ["billing"]},
    }
    conf = {
        "bridge": {
            "name": "t",
            "state": f"sqlite:///{tmp}/state.db",
            "health_file": str(tmp / "health.json"),
            "heartbeat": 0.1,
        },
        "routes": [route],
    }
    path = tmp / "bridge.yaml"
    path.write_text(yaml.safe_dump(conf))
    with iqbridge.connect(f"sqlite:///{tmp}/in.db") as hub:
        hub.queue("orders").put_many(["x"] * 5, to=["bridge"])
    return path


def _started(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the daemon did not start within 60 s"
        time.sleep(0.02)


def _twice(proc: subprocess.Popen[str], gap: float = 0.002) -> tuple[str, str]:
    proc.send_signal(signal.SIGINT)
    time.sleep(gap)
    proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=30)


def test_two_sigints_close_together_stop_the_bridge_cleanly(tmp_path: Path) -> None:
    """Before, the handler logged through rich, and the second signal re-entered it
    half-way through rich's first import: an ImportError in most runs."""
    path = _bridge_config(tmp_path)
    health = tmp_path / "health.json"
    runs: list[tuple[int | None, str, str]] = []
    for _ in range(5):
        health.unlink(missing_ok=True)
        proc = subprocess.Popen(
            [str(IQ), "bridge", "run", str(path), "--no-live"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _started(health, proc)
            out, err = _twice(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        runs.append((proc.returncode, out, err))
    assert [code for code, _, _ in runs] == [0] * 5, [err for _, _, err in runs]
    for _, out, err in runs:
        assert "Traceback" not in err and "Error" not in err, err
        assert "stopped:" in out
        assert "SIGINT: stopping the bridge" in err


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs GNU timeout")
def test_the_bridge_under_gnu_timeout_stops_cleanly(tmp_path: Path) -> None:
    path = _bridge_config(tmp_path)
    proc = subprocess.run(
        ["timeout", "--preserve-status", "-s", "INT", "4", str(IQ), "bridge", "run", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr
    assert "stopped:" in proc.stdout


def test_two_sigints_close_together_stop_the_relay_cleanly(tmp_path: Path) -> None:
    app_db, broker = f"sqlite:///{tmp_path}/app.db", f"sqlite:///{tmp_path}/broker.db"
    with Outbox(app_db) as outbox, outbox.engine.begin() as conn:
        outbox.put(conn, "orders", {"n": 1}, to=["billing"])
    proc = subprocess.Popen(
        [str(IQ), "relay", "--outbox", app_db, "--url", broker, "--poll", "50ms"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        with Outbox(app_db) as outbox:
            deadline = time.monotonic() + 60
            while outbox.counts().relayed < 1:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
        out, err = _twice(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "relayed 1 row(s)" in out
