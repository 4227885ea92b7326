"""The consumer process ``iq demo`` kills: it gets messages and holds them until SIGKILL.

Run as ``python -m iqbridge.cli._demo_consumer URL QUEUE SUBSCRIBER COUNT LEASE``. For
each message it gets (with a short lease) it marks IN_PROCESS and prints
``HELD <msg_id> <attempt>``; then ``READY`` and it sleeps, as a consumer stuck in its
work would, until it is killed (or gives up after ``_MAX_LIFE`` seconds so that it can
never outlive a parent that died first).
"""

from __future__ import annotations

import sys
import time

import iqbridge

_MAX_LIFE = 60.0
_GET_TIMEOUT = 10.0


def main(argv: list[str]) -> int:
    """Hold up to COUNT messages of SUBSCRIBER, report them, then wait to be killed."""
    url, queue, subscriber, count, lease = argv
    with iqbridge.connect(url, publisher="demo-consumer") as hub:
        q = hub.queue(queue, create=False)
        held = []
        for _ in range(int(count)):
            delivery = q.get(subscriber, timeout=_GET_TIMEOUT, lease=float(lease))
            if delivery is None:
                break
            delivery.in_process()
            held.append(delivery)
            print(f"HELD {delivery.msg_id} {delivery.attempt}", flush=True)
        print("READY", flush=True)
        time.sleep(_MAX_LIFE)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
