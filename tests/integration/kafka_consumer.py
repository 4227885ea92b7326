"""Consumer processes for the Kafka crash and order tests (run as a script).

Each process opens its own hub on the Kafka-wire broker (Tansu in the tests), with the
index in an SQLite file (``sql+sqlite://``) that all processes share and that also holds
the application's own record: the table ``processed`` of :mod:`rabbitmq_consumer` (the
same helpers), one row per processing, written in the same database transaction as the
DONE it belongs to (``queue.transaction`` + ``done(transaction=...)``). The table has no
unique constraint, so a message processed and committed twice shows as two rows.

* ``record`` (test_kafka_kill.py): claims batches of one subscriber (or pool member)
  with ``get_many``, "processes" them (a short pause: the window in which a SIGKILL lands
  mid-processing), then writes one row per delivery and settles the batch with
  ``batch.done(transaction=tx)`` in one transaction. Runs until killed. Each claim
  appends ``<pid> <claimed> <of them attempt >= 2>`` to the claims log (an O_APPEND
  write: complete before any SIGKILL), and the first one also ``<pid> start <seconds
  from process start to the first batch>`` (how long a group join takes after a kill).
* ``ordered`` (test_kafka_order.py): runs an ordered :class:`~iqbridge.worker.Worker` of
  one pool member; its handler writes the row (key, seq, start time, write time) and
  marks DONE in one transaction, so the row's autoincrement id is the commit order
  across every process. The member leaves gracefully when the test creates its leave
  file: the Worker stops (``drain`` or not, as told), then the hub closes, which commits
  the group's offsets and leaves the consumer group (its partitions go to the others).
  The adapter's log lines of the group's rebalances go to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import threading
import time
from pathlib import Path

from rabbitmq_consumer import app_engine, processed_table

#: A process left behind by a broken test still ends on its own after this long.
_MAX_LIFE = 300.0


def _record(args: argparse.Namespace) -> None:
    import iqbridge

    born = time.monotonic()
    table = processed_table()
    app = app_engine(args.app)
    rng = random.Random()
    pid = os.getpid()
    group = args.group or args.subscriber
    claims = os.open(args.claims, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    end = time.monotonic() + _MAX_LIFE
    first = True
    with iqbridge.connect(args.url, index=args.index) as hub:
        queue = hub.queue(args.queue, lease=args.lease, sweep_interval=0.2)
        while time.monotonic() < end:
            batch = queue.get_many(args.subscriber, args.batch, timeout=0.5)
            if not batch:
                continue
            again = sum(1 for d in batch if d.attempt > 1)
            line = f"{pid} {len(batch)} {again}\n"
            if first:
                line = f"{pid} start {time.monotonic() - born:.2f}\n" + line
                first = False
            os.write(claims, line.encode())
            time.sleep(rng.uniform(0.0, args.work))  # the processing
            rows = [
                {
                    "grp": group,
                    "member": args.subscriber,
                    "msg_id": d.msg_id,
                    "attempt": d.attempt,
                    "pid": pid,
                }
                for d in batch
            ]
            with queue.transaction(app) as tx:
                tx.connection.execute(table.insert(), rows)
                settled = batch.done(transaction=tx)
                if settled.lost:
                    # Taken over (our lease ran out): not ours to record. Nothing of
                    # them changed in the index; their rows go with this transaction.
                    tx.connection.execute(
                        table.delete().where(
                            table.c.pid == pid, table.c.msg_id.in_(list(settled.lost))
                        )
                    )


def _ordered(args: argparse.Namespace) -> None:
    import iqbridge
    from iqbridge.delivery import Delivery
    from iqbridge.worker import Worker

    # The groups' rebalances (partitions assigned and revoked) go to stderr, timed: the
    # test waits for a joiner's assignment there.
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s", level=logging.WARNING)
    logging.getLogger("iqbridge.adapters.kafka").setLevel(logging.INFO)

    table = processed_table()
    app = app_engine(args.app)
    pid = os.getpid()
    rng = random.Random()
    leave = Path(args.leave)
    with iqbridge.connect(args.url, index=args.index) as hub:
        queue = hub.queue(args.queue, lease=args.lease)

        def handle(delivery: Delivery) -> None:
            started = time.time()
            payload = delivery.payload
            time.sleep(rng.uniform(0.0, args.work))  # the processing
            with queue.transaction(app) as tx:
                tx.connection.execute(
                    table.insert().values(
                        grp=args.group,
                        member=args.subscriber,
                        msg_id=delivery.msg_id,
                        attempt=delivery.attempt,
                        pid=pid,
                        okey=payload["key"],
                        seq=payload["seq"],
                        started=started,
                        written=time.time(),
                    )
                )
                delivery.done(transaction=tx)  # the worker leaves a finished delivery alone

        worker = Worker(
            queue,
            args.subscriber,
            handle,
            threads=args.threads,
            batch=args.batch,
            max_held=args.held,
        )

        def watch() -> None:
            end = time.monotonic() + _MAX_LIFE
            while not leave.exists() and time.monotonic() < end:
                time.sleep(0.02)
            worker.stop(drain=args.drain)

        threading.Thread(target=watch, name="leave-watch", daemon=True).start()
        stats = worker.run()
    # The hub is closed: the group's offsets are committed and this member has left.
    print(f"{args.subscriber} ({pid}) left: {stats}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="iqbridge Kafka test consumer")
    parser.add_argument("mode", choices=["record", "ordered"])
    parser.add_argument("--url", required=True, help="the kafka:// URL")
    parser.add_argument("--index", required=True, help="the sql+sqlite:// index URL")
    parser.add_argument("--app", required=True, help="the SQLite file of the index")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--subscriber", required=True, help="subscriber or pool member")
    parser.add_argument("--group", default="", help="the pool's name, for a pool member")
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument(
        "--work", type=float, default=0.05, help="pause per batch (record) or message (ordered)"
    )
    parser.add_argument("--claims", help="record: the claims log")
    parser.add_argument("--threads", type=int, default=4, help="ordered: worker threads")
    parser.add_argument("--held", type=int, default=200, help="ordered: the Worker's max_held")
    parser.add_argument("--leave", help="ordered: leave the pool once this file exists")
    parser.add_argument(
        "--drain",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ordered: on leaving, finish every held message (else give them back)",
    )
    args = parser.parse_args(argv)
    if args.mode == "record":
        _record(args)
    else:
        _ordered(args)


if __name__ == "__main__":
    main()
