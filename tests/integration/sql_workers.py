"""Processes for the SQL index tests (started through multiprocessing's forkserver).

:func:`open_at_once` opens a new index together with other processes (schema creation
under concurrency, test_sql_store.py). :func:`work` is a subscriber process for the
exactly-once crash test (test_sql_exactly_once.py): it takes messages of one subscriber
from the embedded SQLite queue whose index is in PostgreSQL, and for each writes a
business row and marks DONE in one transaction of the business database
(``queue.transaction`` + ``delivery.done(transaction=...)``). Given ``kill_after``, it
finishes that many messages, then on the next one SIGKILLs itself
after the business write and before the commit: either before ``done`` or after it.
Before dying it appends ``<msg_id> <attempt> <point>`` to the kill log (an O_APPEND
write, complete before the signal).
"""

from __future__ import annotations

import os
import random
import signal
from typing import Any

import sqlalchemy as sa

import iqbridge
from iqbridge.delivery import Delivery
from iqbridge.errors import LeaseLost

QUEUE = "eo"
SUBSCRIBER = "billing"
LEASE = 2.0
MAX_ATTEMPTS = 100


def business_table(schema: str | None) -> sa.Table:
    """The business rows: deliberately no unique constraint on msg_id, so a second
    commit of one message would show as a second row."""
    return sa.Table(
        "invoices",
        sa.MetaData(schema=schema),
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            sa.Identity(),
            primary_key=True,
        ),
        sa.Column("msg_id", sa.String(64), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
    )


def open_at_once(url: str, barrier: Any, results: Any) -> None:
    """Wait for the others at ``barrier``, then open the index and put one message."""
    from iqbridge.engine import new_message
    from iqbridge.ids import new_id
    from iqbridge.model import Audience
    from iqbridge.stores.sql import SqlStore

    barrier.wait(30)
    store = SqlStore.from_url(url)
    try:
        store.declare_queue("q")
        store.commit(
            new_message(
                msg_id=new_id(),
                queue="q",
                publisher=str(os.getpid()),
                audience=Audience(("a",)),
                now=1,
            )
        )
        results.put(store.instance)
    finally:
        store.close()


def _die(kill_log: str, delivery: Delivery, point: str) -> None:
    fd = os.open(kill_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{delivery.msg_id} {delivery.attempt} {point}\n".encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def work(
    broker_url: str,
    index_url: str,
    app_url: str,
    schema: str,
    kill_after: int | None,
    kill_log: str,
) -> None:
    """Process messages until killed (by itself at ``kill_after``, or by the test)."""
    hub = iqbridge.connect(broker_url, index=index_url)
    queue = hub.queue(QUEUE, lease=LEASE, sweep_interval=0.25)
    app = sa.create_engine(app_url, pool_size=1)
    invoices = business_table(schema)
    rng = random.Random()
    finished = 0
    while True:
        delivery = queue.get(SUBSCRIBER, timeout=1.0)
        if delivery is None:
            continue
        try:
            with queue.transaction(app) as tx:
                tx.connection.execute(
                    invoices.insert().values(
                        msg_id=delivery.msg_id, attempt=delivery.attempt, pid=os.getpid()
                    )
                )
                if finished == kill_after:
                    if rng.random() < 0.5:
                        _die(kill_log, delivery, "before-done")
                    delivery.done(transaction=tx)
                    _die(kill_log, delivery, "after-done")
                delivery.done(transaction=tx)
        except LeaseLost:
            continue  # the transaction rolled back; the message went on to someone else
        finished += 1
