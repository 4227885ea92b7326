"""Where a message's time goes on the batch path: microseconds per message per component.

The work, on each backend: N messages (``--messages``) of 100 bytes, one subscriber,
``queue.put_many`` in chunks of ``--batch``, then ``queue.get_many`` and ``batch.done()``
until every message is DONE. Each round runs it twice on fresh queues: once plain, for the
wall time per message, and once under cProfile, whose own time per function is put into
the components below by the file the function lives in (C functions by their name). The
profiled shares are scaled to the plain run's wall time, so the table adds up to what a
message costs without the profiler; cProfile's overhead falls on Python calls, so the
Python rows are, if anything, overstated against the I/O rows.

Components:

* ``facade``: the Queue's parts, Batch, Delivery, the hub, tracing hooks;
* ``engine``: the state engines (per message and batch), the transition table, the
  record model, the writes' templates;
* ``envelope``: payload and wire formats (``iqbridge.payload``, ``adapters/*_wire.py``);
* ``store Python``: the index stores' own code (``iqbridge/stores``) and codecs;
* ``adapter Python``: the adapters' own code (``adapters/``);
* ``SQLite statements``: sqlite3's ``execute``/``executemany`` other than ``COMMIT``;
* ``SQLite COMMIT``: the commits (each waits for the fsync with ``synchronous=full``);
* ``Redis round trips``: waiting on the Redis socket (the server's scripts and commands);
* ``Kafka client``: confluent-kafka's produce, poll, flush, consume and commit;
* ``waiting on threads``: lock waits (a consumer thread's hand-over, sleeps);
* ``other``: the standard library and everything else. A builtin (``dict.update``,
  ``orjson.dumps``...) is charged to the component of the functions that called it.

Backends: ``sqlite`` (the embedded default), ``redis`` (Redis Streams with the Redis
index, ``--redis``), ``kafka`` (Tansu started for the run, SQLite index). Rounds alternate
between backends; the table gives each component's median over the rounds.

The last line is ``ratio=<redis total / sqlite total>`` when both ran, as every benchmark
here ends with a ratio line; the table is the point.

Usage: python benchmarks/components.py [--backends sqlite,redis,kafka] [--messages N]
       [--batch B] [--rounds R] [--redis URL]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import iqbridge

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = (
    "facade",
    "engine",
    "envelope",
    "store Python",
    "adapter Python",
    "SQLite statements",
    "SQLite COMMIT",
    "Redis round trips",
    "Kafka client",
    "waiting on threads",
    "other",
)
_FACADE = {
    "queue.py",
    "queue_core.py",
    "putting.py",
    "getting.py",
    "receiving.py",
    "put_paths.py",
    "holding.py",
    "settling.py",
    "looking.py",
    "subscribing.py",
    "housekeeping.py",
    "batch.py",
    "delivery.py",
    "hub.py",
    "transaction.py",
    "retry.py",
    "durations.py",
    "moves.py",
    "inventory.py",
}
_ENGINE = {"engine.py", "engine_batch.py", "states.py", "model.py", "writes.py", "ids.py"}


def component(path: str, name: str) -> str:
    """The component a profiled function belongs to, by its file (or C name)."""
    if path == "~":
        if "sqlite3.Connection" in name or "sqlite3.Cursor" in name or "Timed.execute" in name:
            return "SQLite statements"
        if "confluent_kafka" in name or "cimpl" in name:
            return "Kafka client"
        if "recv" in name or "sendall" in name or "select" in name or "poll" in name:
            return "Redis round trips"
        if "lock' objects" in name or "sleep" in name:
            return "waiting on threads"
        return "builtin"
    p = Path(path)
    try:
        # A virtual environment inside the checkout holds third-party code, not ours.
        if "site-packages" in p.parts:
            raise ValueError(path)
        rel = p.resolve().relative_to(ROOT)
    except ValueError:
        if "redis" in p.parts and ("connection.py" in p.name or "_parsers" in path):
            return "Redis round trips"
        if "confluent_kafka" in path:
            return "Kafka client"
        return "other"
    parts = rel.parts
    if parts[0] == "adapters":
        return "envelope" if p.name.endswith("_wire.py") else "adapter Python"
    if parts[0] != "iqbridge":
        return "other"
    if len(parts) > 2 and parts[1] == "stores":
        return "store Python"
    if len(parts) > 2 and parts[1] == "observability":
        return "facade"
    if p.name in ("payload.py",):
        return "envelope"
    if p.name in _ENGINE:
        return "engine"
    if p.name in _FACADE:
        return "facade"
    return "other"


class Commits:
    """Times sqlite3 COMMITs: a connection factory whose execute notes them."""

    seconds = 0.0


def _commit_timing() -> Callable[[], None]:
    """Make every new SQLite connection time its COMMITs into ``Commits.seconds``;
    returns the undo."""
    import sqlite3

    from iqbridge.stores import sqlite_database

    real_connect = sqlite3.connect

    class Timed(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
            if sql == "COMMIT":
                t = time.perf_counter()
                try:
                    return super().execute(sql, *args)
                finally:
                    Commits.seconds += time.perf_counter() - t
            return super().execute(sql, *args)

    def connect(*a: Any, **kw: Any) -> sqlite3.Connection:
        kw.setdefault("factory", Timed)
        return real_connect(*a, **kw)

    sqlite_database.sqlite3.connect = connect  # type: ignore[assignment]

    def undo() -> None:
        sqlite_database.sqlite3.connect = real_connect  # type: ignore[assignment]

    return undo


@contextlib.contextmanager
def hub_for(backend: str, tmp: Path, redis_url: str, bootstrap: str | None) -> Iterator[Any]:
    name = uuid.uuid4().hex[:10]
    if backend == "sqlite":
        with iqbridge.connect(f"sqlite:///{tmp / (name + '.db')}") as hub:
            yield hub
    elif backend == "redis":
        prefix = f"bench-{name}"
        try:
            with iqbridge.connect(f"{redis_url}?prefix={prefix}&stream_prefix={prefix}:") as hub:
                yield hub
        finally:
            import redis

            r = redis.Redis.from_url(redis_url)
            keys = list(r.scan_iter(match=f"*{prefix}*", count=1000))
            for i in range(0, len(keys), 1000):
                r.delete(*keys[i : i + 1000])
    elif backend == "kafka":
        assert bootstrap is not None
        groups = "session.timeout.ms=2000&heartbeat.interval.ms=300"
        url = f"kafka://{bootstrap}?prefix=bench-{name}-&{groups}"
        with iqbridge.connect(url, index=f"sqlite:///{tmp / (name + '.db')}") as hub:
            yield hub
    else:
        raise SystemExit(f"unknown backend {backend!r}")


def work(hub: Any, n: int, batch: int) -> None:
    """put_many in chunks, then get_many and batch.done until all are DONE."""
    queue = hub.queue("bench")
    queue.subscribe("s1")
    body = b"x" * 100
    for _ in range(n // batch):
        queue.put_many([body] * batch)
    done = 0
    while done < n:
        got = queue.get_many("s1", batch, timeout=60.0 if done == 0 else 15.0)
        if got is None or len(got) == 0:
            raise SystemExit(f"get_many found nothing after {done} of {n}")
        done += len(got)
        got.done()


def one_round(
    backend: str, n: int, batch: int, redis_url: str, bootstrap: str | None
) -> tuple[float, dict[str, float]]:
    """(wall µs per message, µs per message per component)."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with hub_for(backend, tmp, redis_url, bootstrap) as hub:
            work(hub, batch, batch)  # warm: connections, scripts, group join
            t = time.perf_counter()
            work(hub, n, batch)
            wall = (time.perf_counter() - t) / n * 1e6
        Commits.seconds = 0.0
        with hub_for(backend, tmp, redis_url, bootstrap) as hub:
            work(hub, batch, batch)
            Commits.seconds = 0.0
            prof = cProfile.Profile()
            prof.enable()
            work(hub, n, batch)
            prof.disable()
        commits = Commits.seconds
    stats = pstats.Stats(prof)
    spent = dict.fromkeys(COMPONENTS, 0.0)
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (path, _line, name), (_cc, _nc, tt, _ct, callers) in table.items():
        where = component(path, name)
        if where != "builtin":
            spent[where] += tt
            continue
        # A builtin (dict.update, orjson.dumps, ...) is charged to whoever called it.
        edges = {c: e[2] for c, e in callers.items()}
        weight = sum(edges.values())
        if not weight:
            spent["other"] += tt
            continue
        for (cpath, _cl, cname), part in edges.items():
            owner = component(cpath, cname)
            spent["other" if owner == "builtin" else owner] += tt * part / weight
    if os.environ.get("IQ_COMPONENTS_DEBUG"):
        rows = sorted(
            (
                (tt, path, name)
                for (path, _l, name), (_c, _n, tt, _t, _x) in table.items()
                if component(path, name) in ("other", "builtin")
            ),
            reverse=True,
        )
        for tt, path, name in rows[:12]:
            print(f"  {backend} other: {tt / n * 1e6:7.1f} us/msg {path}:{name}")
    spent["SQLite statements"] = max(0.0, spent["SQLite statements"] - commits)
    spent["SQLite COMMIT"] = commits
    total = sum(spent.values()) or 1.0
    return wall, {k: v / total * wall for k, v in spent.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="sqlite,redis")
    parser.add_argument("--messages", type=int, default=10_000, metavar="N")
    parser.add_argument("--batch", type=int, default=500, metavar="B")
    parser.add_argument("--rounds", type=int, default=3, metavar="R")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0", metavar="URL")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    undo = _commit_timing()
    tansu: Any = None
    bootstrap: str | None = None
    if "kafka" in backends:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from kafka import start_tansu

        tansu, why = start_tansu()
        if tansu is None:
            print(f"kafka: no Tansu could be started ({why}); left out")
            backends.remove("kafka")
        else:
            bootstrap = tansu.bootstrap
    walls: dict[str, list[float]] = {b: [] for b in backends}
    parts: dict[str, dict[str, list[float]]] = {b: {c: [] for c in COMPONENTS} for b in backends}
    try:
        for r in range(args.rounds):
            for b in backends:
                wall, split = one_round(b, args.messages, args.batch, args.redis, bootstrap)
                walls[b].append(wall)
                for c, v in split.items():
                    parts[b][c].append(v)
                print(f"round {r + 1} {b}: {wall:.1f} us/msg ({1e6 / wall:,.0f} msg/s)")
    finally:
        undo()
        if tansu is not None:
            with contextlib.suppress(Exception):
                tansu.stop()
    print(
        f"\nmicroseconds per message, batch path, {args.messages} messages, batches of "
        f"{args.batch}, medians of {args.rounds} rounds"
    )
    print("| component | " + " | ".join(backends) + " |")
    print("|---|" + "---|" * len(backends))
    for c in COMPONENTS:
        cells = [f"{statistics.median(parts[b][c]):.1f}" for b in backends]
        print(f"| {c} | " + " | ".join(cells) + " |")
    totals = [f"**{statistics.median(walls[b]):.1f}**" for b in backends]
    print("| **total (wall)** | " + " | ".join(totals) + " |")
    if "sqlite" in walls and "redis" in walls:
        ratio = statistics.median(walls["redis"]) / statistics.median(walls["sqlite"])
        print(f"ratio={ratio:.2f}")
    else:
        print("ratio=none (needs sqlite and redis)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
