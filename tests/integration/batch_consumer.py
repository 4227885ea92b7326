"""A batch consumer process for the batch kill test (run as a script).

``python batch_consumer.py URL QUEUE SUBSCRIBER LOG --batch N --lease S --pause S``:
claims batches with ``queue.get_many``, "processes" each delivery by appending
``msg_id attempt`` to LOG (flushed before the batch is settled, so the log shows every
processing a kill interrupted), sleeps ``--pause`` seconds (the window in which a kill
lands mid-batch), then settles the batch with ``batch.done()``. It runs until killed, or
for ``--life`` seconds at most.

``--hold-after K --hold-at STAGE``: after settling K batches, the next batch that is
full and new (every delivery on attempt 1) is held: at ``claimed`` (just claimed, not
processed yet) or ``processed`` (logged, not settled), the process prints ``held STAGE
<its size>`` on stdout and waits to be killed. A kill then lands mid-batch for sure.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sized

import iqbridge


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("queue")
    parser.add_argument("subscriber")
    parser.add_argument("log")
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--pause", type=float, default=0.02)
    parser.add_argument("--life", type=float, default=120.0)
    parser.add_argument("--hold-after", type=int, default=-1, help="hold a batch after K")
    parser.add_argument("--hold-at", choices=["claimed", "processed"], default="processed")
    args = parser.parse_args()
    end = time.monotonic() + args.life
    settled = 0

    def hold(stage: str, batch: Sized) -> None:
        """Report the batch held and wait for the kill."""
        print(f"held {stage} {len(batch)}", flush=True)
        time.sleep(max(0.0, end - time.monotonic()))
        raise SystemExit("held past --life")

    with iqbridge.connect(args.url) as hub, open(args.log, "a") as log:  # noqa: PTH123
        queue = hub.queue(args.queue, lease=args.lease, sweep_interval=0.2)
        while time.monotonic() < end:
            batch = queue.get_many(args.subscriber, args.batch, timeout=0.2)
            if not batch:
                continue
            holding = (
                0 <= args.hold_after <= settled
                and len(batch) == args.batch
                and all(d.attempt == 1 for d in batch)
            )
            if holding and args.hold_at == "claimed":
                hold("claimed", batch)
            for delivery in batch:
                assert delivery.payload["n"] >= 0
                log.write(f"{delivery.msg_id} {delivery.attempt}\n")
            log.flush()
            if holding:
                hold("processed", batch)
            time.sleep(args.pause)
            batch.done()
            settled += 1


if __name__ == "__main__":
    main()
