"""Exactly once and in order across brokers, under crashes (issue 14, seed 001).

For each pair (embedded SQLite to Redis Streams, Redis Streams to RabbitMQ, RabbitMQ to
Kafka) a bridge with 4 workers moves 20,000 messages of 50 ordering keys while it is
SIGKILLed 50 times at random points (15 % of them during start-up and recovery, the
rest while it bridges); each kill comes after the next 400 messages were put. A last
bridge process finishes and is stopped with SIGTERM. The destination is then read with
the destination broker's own client (redis-py, pika, confluent-kafka), not through
iqbridge: every message exactly once, no key out of put order; and the source's index
has every message JOURNALLED for the bridge.

The correlation route (SQLite to Redis Streams, aggregates of 5) is killed the same
way: every group is aggregated exactly once, with all of its five inputs.

The four scenarios run at once (a module fixture, one thread each, each with its own
names, fork server and bridge), so together they take about as long as the longest.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import redis
from bridge_kill import ForkServer, KillRun, check_order, source_done, write_config
from confluent_kafka import Consumer, TopicPartition
from conftest import need_server
from kafka_helpers import FAST_GROUPS, kafka_bootstrap, kafka_url
from rabbitmq_helpers import AMQP_URL, drop_prefixed, need_rabbitmq, remember, url_with
from redis_index_helpers import REDIS_URL, drop_keys, drop_streams, redis_reachable

import iqbridge

pytestmark = [pytest.mark.slow]

N = int(os.environ.get("IQ_BK_N", "20000"))
KILLS = int(os.environ.get("IQ_BK_KILLS", "50"))
KEYS = 50
WORKERS = 4
PER_KILL = N // KILLS


def _payloads(start: int, count: int) -> list[iqbridge.Outgoing]:
    out = []
    for i in range(start, start + count):
        key = f"k{i % KEYS}"
        body = {"i": i, "k": key, "n": i // KEYS}
        out.append(
            iqbridge.Outgoing(
                json.dumps(body).encode(), ordering_key=key, correlation_id=f"g{i // 5}"
            )
        )
    return out


def _route(src: dict[str, Any], dst: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "name": "r",
        "source": {"queue": "orders", "subscriber": "bridge", **src},
        "destination": {"queue": "orders", "to": ["sink"], **dst},
        "workers": WORKERS,
        "batch": 100,
        "lease": 15,
        **more,
    }


def _run(
    tmp_path: Path,
    route: dict[str, Any],
    src_hub: iqbridge.Hub,
    read: Callable[[], list[bytes]],
    want: int,
) -> tuple[list[bytes], KillRun]:
    health = tmp_path / "health.json"
    config = write_config(
        tmp_path / "bridge.yaml",
        {
            "bridge": {
                "name": "kill",
                "state": f"sqlite:///{tmp_path}/state.db",
                "health_file": str(health),
                "heartbeat": 0.2,
            },
            "routes": [route],
        },
    )
    src = src_hub.queue("orders")
    src.subscribe("bridge")
    server = ForkServer(tmp_path)
    try:

        def feed(n: int) -> None:
            if n < KILLS:
                src.put_each(_payloads(n * PER_KILL, PER_KILL))

        def done() -> bool:
            return len(read()) >= want and source_done(src, "bridge", N) >= N

        run = KillRun(server, config, health, feed, done, kills=KILLS)
        run.run()
    finally:
        server.close()
    return read(), run


def _assert_exact(bodies: list[bytes], run: KillRun) -> None:
    items = [(p["k"], p["n"]) for p in (json.loads(b) for b in bodies)]
    seen = Counter(json.loads(b)["i"] for b in bodies)
    lost = N - len(seen)
    dup = sum(c - 1 for c in seen.values())
    _, _, inversions = check_order(items)
    if os.environ.get("IQ_BK_DUMP"):
        Path(os.environ["IQ_BK_DUMP"]).write_text("\n".join(b.decode() for b in bodies))
    if inversions:
        first: dict[str, list[int]] = {}
        for k, n in items:
            first.setdefault(k, []).append(n)
        bad = next(k for k, ns in first.items() if ns != sorted(ns))
        print("key", bad, "order", first[bad])
    print(
        f"kills={len(run.killed_at)} ({Counter(run.killed_at)}) read={len(bodies)} "
        f"lost={lost} duplicated={dup} inversions={inversions}"
    )
    assert (lost, dup, inversions) == (0, 0, 0)


@contextlib.contextmanager
def _redis_prefix() -> Iterator[str]:
    need_server(f"Redis at {REDIS_URL}", *redis_reachable())
    prefix = f"iqt-bk-{uuid.uuid4().hex[:8]}"
    try:
        yield prefix
    finally:
        drop_streams(prefix)
        drop_keys(prefix)


def _redis_url(prefix: str) -> str:
    return f"{REDIS_URL}?prefix={prefix}&stream_prefix={prefix}:"


def _read_redis(prefix: str) -> Callable[[], list[bytes]]:
    client = redis.Redis.from_url(REDIS_URL)

    def read() -> list[bytes]:
        return [f[b"payload"] for _, f in client.xrange(f"{prefix}:orders")]

    return read


Result = tuple[list[bytes], KillRun]


def sqlite_to_redis(tmp_path: Path) -> Result:
    with (
        _redis_prefix() as prefix,
        iqbridge.connect(f"sqlite:///{tmp_path}/src.db") as src,
        iqbridge.connect(_redis_url(prefix)) as dst,
    ):
        dst.queue("orders").subscribe("sink")
        route = _route({"url": f"sqlite:///{tmp_path}/src.db"}, {"url": _redis_url(prefix)})
        return _run(tmp_path, route, src, _read_redis(prefix), N)


def redis_to_rabbitmq(tmp_path: Path) -> Result:
    need_rabbitmq()
    rprefix = f"iqt-bk-{uuid.uuid4().hex[:8]}-"
    amqp = url_with(rprefix, ledger="true")
    index = f"sqlite:///{tmp_path}/rabbit-index.db"
    try:
        with (
            _redis_prefix() as prefix,
            iqbridge.connect(_redis_url(prefix)) as src,
            iqbridge.connect(amqp, index=index) as dst,
        ):
            dst.queue("orders").subscribe("sink")
            remember(dst.adapter)
            count = _counting_rabbit(f"{rprefix}orders.sink")
            route = _route({"url": _redis_url(prefix)}, {"url": amqp, "index": index})
            return _run(tmp_path, route, src, count, N)
    finally:
        drop_prefixed(rprefix)


def _counting_rabbit(queue: str) -> Callable[[], list[bytes]]:
    """Reads (and acknowledges) what the queue has, keeping everything read so far."""
    got: list[bytes] = []
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    ch = conn.channel()

    def read() -> list[bytes]:
        while True:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return got
            got.append(body)

    return read


def rabbitmq_to_kafka(tmp_path: Path) -> Result:
    need_rabbitmq()
    rprefix = f"iqt-bk-{uuid.uuid4().hex[:8]}-"
    kprefix = f"iqt-bk-{uuid.uuid4().hex[:8]}-"
    amqp = url_with(rprefix)
    kafka = kafka_url(kprefix)
    src_index = f"sqlite:///{tmp_path}/src-index.db"
    dst_index = f"sqlite:///{tmp_path}/kafka-index.db"
    try:
        with (
            iqbridge.connect(amqp, index=src_index) as src,
            iqbridge.connect(kafka, index=dst_index) as dst,
        ):
            dst.queue("orders").subscribe("sink")
            src.queue("orders").subscribe("bridge")
            remember(src.adapter)
            read = _reading_kafka(f"{kprefix}orders")
            route = _route({"url": amqp, "index": src_index}, {"url": kafka, "index": dst_index})
            return _run(tmp_path, route, src, read, N)
    finally:
        drop_prefixed(rprefix)


def _reading_kafka(topic: str) -> Callable[[], list[bytes]]:
    got: list[bytes] = []
    c = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap(),
            "group.id": topic + ".count",
            **FAST_GROUPS,
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])

    def read() -> list[bytes]:
        while True:
            msgs = c.consume(1000, timeout=0.3)
            got.extend(m.value() for m in msgs if m.error() is None)
            if not msgs:
                return got

    return read


def correlation(tmp_path: Path) -> Result:
    with (
        _redis_prefix() as prefix,
        iqbridge.connect(f"sqlite:///{tmp_path}/src.db") as src,
        iqbridge.connect(_redis_url(prefix)) as dst,
    ):
        dst.queue("orders").subscribe("sink")
        route = _route(
            {"url": f"sqlite:///{tmp_path}/src.db"},
            {"url": _redis_url(prefix)},
            correlate={"count": 5, "timeout": 600},
        )
        return _run(tmp_path, route, src, _read_redis(prefix), N // 5)


SCENARIOS: dict[str, Callable[[Path], Result]] = {
    "sqlite_to_redis": sqlite_to_redis,
    "redis_to_rabbitmq": redis_to_rabbitmq,
    "rabbitmq_to_kafka": rabbitmq_to_kafka,
    "correlation": correlation,
}


@pytest.fixture(scope="module")
def results(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Result | BaseException]:
    """Every scenario this session selected, run at once (each its own brokers'
    names, fork server and bridge process), so the four take the time of the longest."""
    wanted = [
        name
        for item in request.session.items
        if getattr(item, "module", None) is request.module
        for name in SCENARIOS
        if item.name.startswith(f"test_{name}")
    ]
    out: dict[str, Result | BaseException] = {}
    # Made here, not in the threads: the first mktemp of a session also makes the
    # session's base directory, and four threads at once would each make one.
    dirs = {name: tmp_path_factory.mktemp(name) for name in dict.fromkeys(wanted)}

    def one(name: str) -> None:
        try:
            out[name] = SCENARIOS[name](dirs[name])
        except BaseException as exc:  # reported by the scenario's own test
            out[name] = exc

    threads = [threading.Thread(target=one, args=(n,)) for n in dirs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _result(results: dict[str, Result | BaseException], name: str) -> Result:
    got = results[name]
    if isinstance(got, BaseException):
        raise got
    return got


@pytest.mark.redis
@pytest.mark.timeout(600)
def test_sqlite_to_redis_streams_killed_50_times(results: dict[str, Any]) -> None:
    _assert_exact(*_result(results, "sqlite_to_redis"))


@pytest.mark.redis
@pytest.mark.rabbitmq
@pytest.mark.timeout(600)
def test_redis_to_rabbitmq_killed_50_times(results: dict[str, Any]) -> None:
    _assert_exact(*_result(results, "redis_to_rabbitmq"))


@pytest.mark.rabbitmq
@pytest.mark.kafka
@pytest.mark.timeout(600)
def test_rabbitmq_to_kafka_killed_50_times(results: dict[str, Any]) -> None:
    _assert_exact(*_result(results, "rabbitmq_to_kafka"))


@pytest.mark.redis
@pytest.mark.timeout(600)
def test_correlation_route_killed_50_times_aggregates_each_group_once(
    results: dict[str, Any],
) -> None:
    bodies, run = _result(results, "correlation")
    groups: Counter[int] = Counter()
    members_ok = 0
    for b in bodies:
        items = [json.loads(x) if isinstance(x, str) else x for x in json.loads(b)]
        ids = sorted(p["i"] for p in items)
        g = ids[0] // 5
        groups[g] += 1
        members_ok += ids == list(range(g * 5, g * 5 + 5))
    dup = sum(c - 1 for c in groups.values())
    print(
        f"kills={len(run.killed_at)} aggregates={len(bodies)} groups={len(groups)} "
        f"duplicated={dup} complete={members_ok}"
    )
    assert len(groups) == N // 5 and dup == 0 and members_ok == len(bodies)
