"""Consumer processes for the multi-process tests, and the test side's handle on them.

Run as a script (``python mp_consumers.py MODE ...``), each consumer opens its own hub on
the SQLite file, so processes share nothing but the database. They report to the test
only through files written whole and renamed into place, so a report is never read half
written:

* ``drain``: get and finish messages until the queue stays empty; report every msg_id
  processed with its attempt. With ``--go`` it first announces itself (``OUT.ready``) and
  waits for the go file, so several consumers start competing at the same moment.
* ``hold``: get ``--take`` messages under a lease, finish the first ``--done`` of them,
  put the rest IN_PROCESS, report them all, then wait to be killed (it never finishes).

:class:`Consumer` starts one such process from a test and waits for its files with a
deadline; :func:`consumers` kills whatever is still running when a test ends.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: A consumer left behind by a broken test still exits on its own after this long.
_MAX_LIFE = 120.0
_SCRIPT = Path(__file__).resolve()


# --- the consumer process ------------------------------------------------------------


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Write ``report`` as JSON to ``path`` atomically (temp file, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as fh:
        json.dump(report, fh)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def _wait_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"gave up waiting for {path}")
        time.sleep(0.005)


def _drain(args: argparse.Namespace) -> None:
    import iqbridge

    out = Path(args.out)
    with iqbridge.connect(args.url, index=args.index) as hub:
        queue = hub.queue(args.queue)
        if args.go:
            write_report(out.with_name(out.name + ".ready"), {"pid": os.getpid()})
            _wait_file(Path(args.go), 60.0)
        processed: list[list[Any]] = []
        first = last = None
        idle = 0
        stop_at = time.monotonic() + _MAX_LIFE
        while idle < args.idle and time.monotonic() < stop_at:
            delivery = queue.get(args.subscriber, timeout=args.timeout)
            if delivery is None:
                idle += 1
                continue
            idle = 0
            first = first or time.time()
            with delivery:  # IN_PROCESS, then DONE on a clean exit
                processed.append([delivery.msg_id, delivery.attempt])
            last = time.time()
    write_report(out, {"pid": os.getpid(), "processed": processed, "first": first, "last": last})


def _hold(args: argparse.Namespace) -> None:
    import iqbridge

    out = Path(args.out)
    with iqbridge.connect(args.url, index=args.index) as hub:
        queue = hub.queue(args.queue)
        done: list[list[Any]] = []
        held: list[list[Any]] = []
        for i in range(args.take):
            delivery = queue.get(args.subscriber, timeout=10.0, lease=args.lease)
            if delivery is None:
                sys.exit(f"hold: only {i} of {args.take} messages arrived")
            delivery.in_process()
            if i < args.done:
                delivery.done()
                done.append([delivery.msg_id, delivery.attempt])
            else:
                held.append([delivery.msg_id, delivery.attempt])
        write_report(out, {"pid": os.getpid(), "done": done, "held": held})
        # Mid-processing: the test kills us here. The held messages are never finished.
        time.sleep(_MAX_LIFE)
    sys.exit("hold: nobody killed me")


def main(argv: list[str] | None = None) -> None:
    """Entry point of a consumer process."""
    parser = argparse.ArgumentParser(description="iqbridge test consumer")
    parser.add_argument("mode", choices=["drain", "hold"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--index", help="index store URL (default: the broker's own)")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--subscriber", required=True)
    parser.add_argument("--out", required=True, help="report file (JSON)")
    parser.add_argument("--go", help="drain: wait for this file before the first get")
    parser.add_argument("--idle", type=int, default=3, help="drain: empty gets before exit")
    parser.add_argument("--timeout", type=float, default=0.2, help="drain: get timeout")
    parser.add_argument("--lease", type=float, default=1.5, help="hold: lease seconds")
    parser.add_argument("--take", type=int, default=1, help="hold: messages to get")
    parser.add_argument("--done", type=int, default=0, help="hold: of those, finish first N")
    args = parser.parse_args(argv)
    if args.mode == "drain":
        _drain(args)
    else:
        _hold(args)


# --- the test's side -----------------------------------------------------------------


class Consumer:
    """One consumer process started by a test; see the module docstring for the modes."""

    def __init__(self, workdir: Path, name: str, mode: str, **options: object) -> None:
        self.name = name
        self.out = workdir / f"{name}.json"
        self.ready = workdir / f"{name}.json.ready"
        self._stderr_path = workdir / f"{name}.stderr"
        cmd = [sys.executable, str(_SCRIPT), mode, "--out", str(self.out)]
        for key, value in options.items():
            cmd += [f"--{key}", str(value)]
        with self._stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)

    @property
    def pid(self) -> int:
        """The consumer's process id."""
        return self.proc.pid

    def stderr(self) -> str:
        """What the process wrote to stderr so far."""
        return self._stderr_path.read_text(errors="replace")

    def wait_file(self, path: Path, timeout: float) -> None:
        """Wait until the process has written ``path``; fail if it dies or time runs out."""
        deadline = time.monotonic() + timeout
        while not path.exists():
            code = self.proc.poll()
            if code is not None and not path.exists():
                raise AssertionError(
                    f"consumer {self.name} exited with {code} before writing {path.name}:\n"
                    f"{self.stderr()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"consumer {self.name} wrote no {path.name} in {timeout}s")
            time.sleep(0.01)

    def report(self, timeout: float) -> dict[str, Any]:
        """The consumer's report, once written."""
        self.wait_file(self.out, timeout)
        data: dict[str, Any] = json.loads(self.out.read_text())
        return data

    def finish(self, timeout: float) -> dict[str, Any]:
        """Wait for a clean exit; return the report."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"consumer {self.name} still running after {timeout}s") from None
        assert code == 0, f"consumer {self.name} exited with {code}:\n{self.stderr()}"
        return self.report(0)

    def kill(self) -> int:
        """SIGKILL the process (no cleanup of any kind can run); return its exit status."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(10)


@contextlib.contextmanager
def consumers() -> Iterator[list[Consumer]]:
    """Collects the consumers a test starts and SIGKILLs the ones still alive at the end."""
    started: list[Consumer] = []
    try:
        yield started
    finally:
        for c in started:
            with contextlib.suppress(Exception):
                c.kill()


if __name__ == "__main__":
    main()
