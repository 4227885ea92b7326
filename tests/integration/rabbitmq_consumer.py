"""Consumer processes for the RabbitMQ crash and order tests (run as a script).

Each process opens its own hub on the RabbitMQ broker, with the index in an SQLite file
(``sql+sqlite://``) that all processes share and that also holds the application's own
record: the table ``processed``, one row per processing, written in the same database
transaction as the DONE it belongs to (``queue.transaction`` +
``done(transaction=...)``). The table has no unique constraint, so a message processed
and committed twice shows as two rows.

* ``record`` (test_rabbitmq_kill.py): claims batches of one subscriber (or pool member)
  with ``get_many``, "processes" them (a short pause: the window in which a SIGKILL lands
  mid-processing), then writes one row per delivery and settles the batch with
  ``batch.done(transaction=tx)`` in one transaction. Runs until killed. Before the work,
  each claim appends ``<pid> <claimed> <of them attempt >= 2>`` to the claims log (an
  O_APPEND write: complete before any SIGKILL), for the test's figures.
* ``ordered`` (test_rabbitmq_order.py): runs an ordered :class:`~iqbridge.worker.Worker`
  of one pool member; its handler writes the row (key, seq, start time, write time) and
  marks DONE in one transaction, so the row's autoincrement id is the commit order
  across every process. It announces itself (``--ready``), waits for the go file, and
  stops once idle.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

#: A process left behind by a broken test still ends on its own after this long.
_MAX_LIFE = 300.0


def processed_table() -> sa.Table:
    """The application's own record (no unique constraint on purpose)."""
    return sa.Table(
        "processed",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("grp", sa.String(64), nullable=False),  # the subscriber or the pool
        sa.Column("member", sa.String(64), nullable=False),  # who processed it
        sa.Column("msg_id", sa.String(64), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("okey", sa.String(64)),  # ordered: the payload's key and sequence
        sa.Column("seq", sa.Integer),
        sa.Column("started", sa.Float),  # ordered: handler entered (time.time())
        sa.Column("written", sa.Float),  # ordered: row written, inside the transaction
        sqlite_autoincrement=True,
    )


def app_engine(path: str | Path) -> sa.Engine:
    """The application's engine on the SQLite file of the index: every transaction
    begins IMMEDIATE (takes the write lock at once, waiting up to 60 s for it), so two
    processes never fail on a read-to-write lock upgrade."""
    engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 60})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _record(args: argparse.Namespace) -> None:
    import iqbridge

    table = processed_table()
    app = app_engine(args.app)
    rng = random.Random()
    pid = os.getpid()
    group = args.group or args.subscriber
    claims = os.open(args.claims, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    end = time.monotonic() + _MAX_LIFE
    with iqbridge.connect(args.url, index=args.index) as hub:
        queue = hub.queue(args.queue, lease=args.lease, sweep_interval=0.2)
        while time.monotonic() < end:
            batch = queue.get_many(args.subscriber, args.batch, timeout=0.5)
            if not batch:
                continue
            again = sum(1 for d in batch if d.attempt > 1)
            os.write(claims, f"{pid} {len(batch)} {again}\n".encode())
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


def _wait_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"gave up waiting for {path}")
        time.sleep(0.01)


def _ordered(args: argparse.Namespace) -> None:
    import iqbridge
    from iqbridge.delivery import Delivery
    from iqbridge.worker import Worker

    table = processed_table()
    app = app_engine(args.app)
    pid = os.getpid()
    with iqbridge.connect(args.url, index=args.index) as hub:
        queue = hub.queue(args.queue, lease=args.lease)

        def handle(delivery: Delivery) -> None:
            started = time.time()
            payload = delivery.payload
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

        worker = Worker(queue, args.subscriber, handle, threads=args.threads, batch=args.batch)
        # Start consuming on the broker before saying we are ready (the test puts
        # nothing before every process is ready: this first look finds nothing).
        if queue.get_many(args.subscriber, 1, timeout=0.0):
            sys.exit("ordered: a message arrived before the test said go")
        Path(args.ready).write_text(str(pid))
        _wait_file(Path(args.go), 60.0)
        stats = worker.run(until_idle=args.idle, max_messages=args.max or None)
    print(f"{args.subscriber}: {stats}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="iqbridge RabbitMQ test consumer")
    parser.add_argument("mode", choices=["record", "ordered"])
    parser.add_argument("--url", required=True, help="the amqp:// URL")
    parser.add_argument("--index", required=True, help="the sql+sqlite:// index URL")
    parser.add_argument("--app", required=True, help="the SQLite file of the index")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--subscriber", required=True, help="subscriber or pool member")
    parser.add_argument("--group", default="", help="the pool's name, for a pool member")
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--work", type=float, default=0.05, help="record: pause per batch")
    parser.add_argument("--claims", help="record: the claims log")
    parser.add_argument("--threads", type=int, default=4, help="ordered: worker threads")
    parser.add_argument("--ready", help="ordered: written once consuming")
    parser.add_argument("--go", help="ordered: start once this file exists")
    parser.add_argument("--idle", type=float, default=3.0, help="ordered: stop when idle")
    parser.add_argument(
        "--max", type=int, default=0, help="ordered: stop (draining) after this many messages"
    )
    args = parser.parse_args(argv)
    if args.mode == "record":
        _record(args)
    else:
        _ordered(args)


if __name__ == "__main__":
    main()
