"""A fork server for kill tests: imports what its command line names once, then forks a
process per request that runs a Python script or the ``iq`` command line, so each of a
test's many restarts costs a fork instead of a Python start-up (about a second of CPU on
this machine kind, which is what a kill test's restarts were mostly spending).

Protocol, one line each way (see ``forker.py``): ``start <JSON {"argv", "stdout",
"stderr"}>`` answers the child's pid; ``poll <pid>`` answers its exit code (negative:
the signal that ended it) or ``running``; ``wait <pid> <seconds>`` the same, once it
ends or the seconds pass. A child runs ``argv``: ``["iq", ...]`` is the ``iq`` command
line (``iqbridge.cli.main``), anything else a script run as ``__main__``. The server
runs no thread, so forking it is safe; each child opens its own connections.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def _child(spec: dict[str, Any]) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    os.dup2(os.open(spec.get("stdout") or os.devnull, flags), 1)
    os.dup2(os.open(spec["stderr"], flags), 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    code = 0
    try:
        argv = list(spec["argv"])
        sys.argv = argv
        if argv[0] == "iq":
            from iqbridge.cli import main

            main()
        else:
            # As `python script.py` does: the script's folder first on the path.
            sys.path.insert(0, str(Path(argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def main() -> None:
    for name in sys.argv[1:]:
        importlib.import_module(name)
    ended: dict[int, int] = {}

    def status(pid: int) -> str:
        if pid not in ended:
            done, how = os.waitpid(pid, os.WNOHANG)
            if done == 0:
                return "running"
            ended[pid] = os.waitstatus_to_exitcode(how)
        return str(ended[pid])

    print("ready", flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "start":
            spec = json.loads(arg)
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _child(spec)
            print(pid, flush=True)
        elif cmd == "poll":
            print(status(int(arg)), flush=True)
        elif cmd == "wait":
            pid_text, seconds = arg.split()
            deadline = time.monotonic() + float(seconds)
            while (answer := status(int(pid_text))) == "running" and time.monotonic() < deadline:
                time.sleep(0.005)
            print(answer, flush=True)


if __name__ == "__main__":
    main()
