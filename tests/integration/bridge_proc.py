"""A fork server for the bridge kill tests: imports iqbridge and every broker client
once, then forks a bridge process per request, so 50 restarts cost milliseconds each
instead of a Python start-up each.

Protocol (one line each way): the test writes ``start <config.yaml>``; the server forks
a child that runs ``Bridge(load_config(...)).run()`` and answers with the child's pid.
Children are reaped by the kernel (SIGCHLD ignored). The server runs no thread, so
forking it is safe; each child opens its own connections after the fork.
"""

from __future__ import annotations

import os
import signal
import sys


def _child(config: str) -> None:
    import logging

    from iqbridge.bridge import Bridge, load_config

    logging.basicConfig(
        level=logging.INFO if os.environ.get("IQ_BK_VERBOSE") else logging.WARNING,
        stream=sys.stderr,
        format=(
            f"%(created).3f [bridge {os.getpid()}] %(threadName)s %(levelname)s %(name)s: "
            "%(message)s"
        ),
    )
    try:
        Bridge(load_config(config)).run()
    except BaseException as exc:  # report, then exit non-zero
        print(f"[bridge {os.getpid()}] died: {type(exc).__name__}: {exc}", file=sys.stderr)
        os._exit(3)
    os._exit(0)


def main() -> None:
    import iqbridge.adapters.kafka
    import iqbridge.adapters.rabbitmq
    import iqbridge.adapters.redis_streams
    import iqbridge.bridge
    import iqbridge.stores.redis  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd != "start":
            continue
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            sys.stdin.close()
            _child(arg)
        print(pid, flush=True)


if __name__ == "__main__":
    main()
