"""A batch consumer process for the batch kill test (run as a script).

``python batch_consumer.py URL QUEUE SUBSCRIBER LOG --batch N --lease S --pause S``:
claims batches with ``queue.get_many``, "processes" each delivery by appending
``msg_id attempt`` to LOG (flushed before the batch is settled, so the log shows every
processing a kill interrupted), sleeps ``--pause`` seconds (the window in which a kill
lands mid-batch), then settles the batch with ``batch.done()``. It runs until killed, or
for ``--life`` seconds at most.
"""

from __future__ import annotations

import argparse
import time

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
    args = parser.parse_args()
    end = time.monotonic() + args.life
    with iqbridge.connect(args.url) as hub, open(args.log, "a") as log:  # noqa: PTH123
        queue = hub.queue(args.queue, lease=args.lease, sweep_interval=0.2)
        while time.monotonic() < end:
            batch = queue.get_many(args.subscriber, args.batch, timeout=0.2)
            if not batch:
                continue
            for delivery in batch:
                assert delivery.payload["n"] >= 0
                log.write(f"{delivery.msg_id} {delivery.attempt}\n")
            log.flush()
            time.sleep(args.pause)
            batch.done()


if __name__ == "__main__":
    main()
