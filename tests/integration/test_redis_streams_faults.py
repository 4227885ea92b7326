"""Redis Streams when the server fails (issue 3, point 7), on real Redis servers.

* Unreachable at start: ``connect()`` raises BrokerUnavailable at once (no retrying for
  ``retry_for``), naming the URL with ``***`` for its password, which appears nowhere.
* Restart mid-stream: a redis-server of the test's own (AOF, ``appendfsync always``) is
  SIGKILLed and started again on the same directory while a producer puts and consumer
  threads get and finish messages; the hub, connected with ``retry_for=20``, rides it
  out. Afterwards every put that returned is DONE exactly once for each subscriber (two
  pubsub subscribers and one member of a pool of two), according to the index journal,
  and was handed to each exactly once; nothing raised.
* Lost replies, made by a proxy that resets the connection after Redis answered: an
  ``XADD`` whose reply is lost is not added again by the retry (it reads the stream back
  first) and is delivered once per member; an index commit (claim, done) followed by
  another writer's move on the same message before the retry is still recognised as
  applied.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import redis

import iqbridge
from iqbridge import Pool, PublisherState
from iqbridge.adapters.redis_streams import RedisStreamsAdapter
from iqbridge.errors import BrokerUnavailable, ConnectionError
from iqbridge.states import ActorKind, SubscriberState
from iqbridge.testing.proxy import FaultProxy
from tests.conftest import need_server
from tests.redis_index_helpers import REDIS_URL, drop_streams, fresh_prefix

pytestmark = [pytest.mark.redis, pytest.mark.slow]

SUBSCRIBERS = ("a", "b", "p1", "p2")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server of the test's own on a free loopback port, AOF on, fsync always."""

    def __init__(self, directory: Path) -> None:
        self.binary = shutil.which("redis-server")
        self.dir = directory
        self.port = _free_port()
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.procs[-1]

    def start(self) -> None:
        assert self.binary is not None
        # The AOF has to be in place before the server answers; wait for that (ping).
        self.procs.append(
            subprocess.Popen(
                [
                    self.binary,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                    "--dir",
                    str(self.dir),
                    "--save",
                    "",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            deadline = time.monotonic() + 15
            while True:
                try:
                    client.ping()
                    return
                except redis.exceptions.BusyLoadingError:
                    pass
                except redis.ConnectionError as exc:
                    if self.proc.poll() is not None:
                        raise RuntimeError(
                            f"redis-server exited with {self.proc.returncode}"
                        ) from exc
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not answer within 15 s")
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final write."""
        self.proc.kill()
        self.proc.wait(10)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path)
    need_server("redis-server (the binary, to start a test instance)", srv.binary is not None)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop_all()


@pytest.fixture
def proxied() -> Iterator[tuple[FaultProxy, str, str]]:
    """A proxy to the shared Redis; URLs through it and direct, on a fresh prefix."""
    parts = redis.connection.parse_url(REDIS_URL)
    with fresh_prefix("faults") as prefix:
        proxy = FaultProxy(parts.get("host", "127.0.0.1"), int(parts.get("port", 6379)))
        query = f"?prefix={prefix}&stream_prefix={prefix}:&retry_for=5"
        try:
            yield proxy, f"redis://127.0.0.1:{proxy.port}/0{query}", f"{REDIS_URL}{query}"
        finally:
            proxy.close()
            drop_streams(f"{prefix}:")


@pytest.mark.parametrize("move", ["claim", "done"])
def test_a_lost_index_reply_then_another_writer_is_still_recognised_as_applied(
    proxied: tuple[FaultProxy, str, str], move: str
) -> None:
    """The reply to subscriber a's claim (or DONE) is lost after Redis ran it, and b's DONE
    on the same message lands before a's retry: a's move applied once and is reported so
    (before the fix: the retry saw another write id on the record, called it a lost race,
    and the claim was held by nobody until its lease ran out, or done() raised
    IllegalTransition "JOURNALLED -> DONE" and left the broker entry unacknowledged)."""
    proxy, via_proxy, direct = proxied
    with iqbridge.connect(via_proxy) as hub, iqbridge.connect(direct) as other:
        q, q_other = hub.queue("orders"), other.queue("orders")
        q.subscribe("a", "b")
        msg_id = q.put("payload")
        b = q_other.get("b")
        assert b is not None
        proxy.on_cut = b.done
        if move == "claim":
            proxy.arm(b"EVALSHA", msg_id.encode(), b"FETCHED")
            a = q.get("a")
            assert a is not None, "the claim applied but was reported lost"
        else:
            a = q.get("a")
            assert a is not None
            proxy.arm(b"EVALSHA", msg_id.encode(), b"DONE")
        a.done()
        assert proxy.cuts == 1
        assert proxy.on_cut is None  # b's DONE landed in between
        st = q.state(msg_id)
        assert st.publisher_state is PublisherState.JOURNALLED
        for name in ("a", "b"):
            assert [s for s, _ in st.subscribers[name].history] == [
                SubscriberState.AVAILABLE,
                SubscriberState.GET,
                SubscriberState.FETCHED,
                SubscriberState.DONE,
                SubscriberState.JOURNALLED,
            ], name
        adapter = hub.adapter
        assert isinstance(adapter, RedisStreamsAdapter)
        adapter.flush()
        assert adapter.pending("orders", "a") == {}


def test_a_colocated_put_whose_reply_is_lost_is_applied_once(
    proxied: tuple[FaultProxy, str, str],
) -> None:
    """With the index on the broker's server, a put is one script (records and entries
    together). Its reply is lost after Redis ran it: the retry finds the record under its
    write id and takes the entry id from it, so there is one entry and one record."""
    proxy, via_proxy, direct = proxied
    with iqbridge.connect(via_proxy) as hub, iqbridge.connect(direct) as other:
        assert hub.colocated is not None
        q, q_other = hub.queue("orders"), other.queue("orders")
        q.subscribe("a")
        proxy.arm(b"EVALSHA", b"iq-id")
        msg_id = q.put({"n": 1})
        assert proxy.cuts == 1
        adapter = hub.adapter
        assert isinstance(adapter, RedisStreamsAdapter)
        with redis.Redis.from_url(REDIS_URL) as raw:
            entries = raw.xrange(adapter.key("orders"))
        assert len(entries) == 1
        assert entries[0][1][b"iq-id"] == msg_id.encode()
        st = q_other.state(msg_id)
        assert [s for s, _ in st.publisher_history] == [
            PublisherState.PUT,
            PublisherState.REVEALED,
        ]
        d = q_other.get("a")
        assert d is not None and d.msg_id == msg_id and d.payload == {"n": 1}
        d.done()
        assert q_other.get("a") is None


def test_a_put_whose_xadd_reply_is_lost_adds_one_entry_and_is_delivered_once(
    proxied: tuple[FaultProxy, str, str],
) -> None:
    """The index elsewhere (not co-located: record first, then XADD). Redis added the
    entry, the reply was lost: the retry reads the stream back from the put's time, finds
    the entry by its iq-id and adds nothing (before the fix: a second entry of the one
    message, which a plain Redis consumer reads twice); each member gets it once."""
    proxy, via_proxy, direct = proxied
    prefix = parse_qs(urlsplit(direct).query)["prefix"][0]
    index = f"{REDIS_URL}?prefix={prefix}"
    with iqbridge.connect(via_proxy, index=index) as hub, iqbridge.connect(direct) as other:
        assert hub.colocated is None  # the index is reached directly, the broker by proxy
        q, q_other = hub.queue("orders"), other.queue("orders")
        q.subscribe("a", "b")
        q.subscribe_pool("p", ["p1", "p2"])
        proxy.arm(b"XADD", b"iq-id")
        msg_id = q.put({"n": 1})
        assert proxy.cuts == 1
        adapter = hub.adapter
        assert isinstance(adapter, RedisStreamsAdapter)
        key = adapter.key("orders")
        with redis.Redis.from_url(REDIS_URL) as raw:
            entries = raw.xrange(key)
        assert [f[b"iq-id"] for _, f in entries] == [msg_id.encode()]
        assert hub.store.load(msg_id).native_ref == entries[0][0].decode()
        got: list[tuple[str, str]] = []
        for name, queue in (("a", q), ("b", q_other), ("p2", q), ("p1", q_other)):
            while (d := queue.get(name)) is not None:
                got.append((name, d.msg_id))
                d.done()
        assert got == [("a", msg_id), ("b", msg_id), ("p2", msg_id)]
        st = q.state(msg_id)
        assert st.publisher_state is PublisherState.JOURNALLED
        for queue_hub in (hub, other):
            streams = queue_hub.adapter
            assert isinstance(streams, RedisStreamsAdapter)
            streams.flush()
        for group in ("a", "b", "p"):
            assert adapter.pending("orders", group) == {}, group


@pytest.mark.parametrize("auth", [":s3cret", "app:s3cret"])
def test_unreachable_at_start_is_a_typed_error_without_the_password(
    auth: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = _free_port()  # closed: nothing listens there
    url = f"redis://{auth}@127.0.0.1:{port}/0"
    caplog.set_level(logging.DEBUG)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable) as err:
        iqbridge.connect(url)
    elapsed = time.monotonic() - started
    user = auth.split(":", maxsplit=1)[0]
    text = str(err.value)
    assert f"redis://{user}:***@127.0.0.1:{port}/0" in text
    assert "s3cret" not in text
    assert "check that Redis is running" in text
    assert "s3cret" not in repr(err.value.__cause__)
    assert all("s3cret" not in r.getMessage() for r in caplog.records)
    # Failing fast at start: the default retry_for (30 s) is for connections that broke.
    assert elapsed < 5, elapsed


def test_restart_mid_stream_loses_no_acknowledged_message(server: RedisServer) -> None:
    url = f"redis://127.0.0.1:{server.port}/0?retry_for=20&prefix=restart"
    total = 300
    acknowledged: list[str] = []
    put_errors: list[BaseException] = []
    got: Counter[tuple[str, str]] = Counter()
    get_errors: list[tuple[str, BaseException]] = []
    lock = threading.Lock()
    stop = threading.Event()
    restarts = 0
    waited = 0.0  # the longest put: it rode out an outage
    handled_at_restart: list[int] = []
    restarter: threading.Timer | None = None

    with iqbridge.connect(url, publisher="shop") as hub:
        q = hub.queue("orders", lease=5.0)
        q.subscribe("a", "b")
        q.subscribe_pool("p", ["p1", "p2"])

        def consume(subscriber: str) -> None:
            while not stop.is_set():
                try:
                    d = q.get(subscriber, timeout=0.2)
                    if d is None:
                        continue
                    d.done()
                except Exception as exc:
                    with lock:
                        get_errors.append((subscriber, exc))
                    time.sleep(0.1)
                    continue
                with lock:
                    got[(d.msg_id, subscriber)] += 1

        threads = [threading.Thread(target=consume, args=(s,), daemon=True) for s in SUBSCRIBERS]
        for t in threads:
            t.start()
        try:
            for i in range(total):
                if i in (total // 3, 2 * total // 3):
                    # Kill while consumers are busy; start again on the same AOF a moment
                    # later, while this thread goes on putting (its puts wait and retry).
                    server.kill()
                    restarter = threading.Timer(1.0, server.start)
                    restarter.start()
                    restarts += 1
                began = time.monotonic()
                try:
                    acknowledged.append(q.put({"n": i}, to=["a", "b", Pool("p")]))
                except ConnectionError as exc:
                    put_errors.append(exc)
                waited = max(waited, time.monotonic() - began)
                if restarter is not None:
                    restarter.join()
                    restarter = None
                    with lock:
                        handled_at_restart.append(sum(got.values()))
                time.sleep(0.005)

            # Wait until every acknowledged put is finished for every subscriber.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with lock:
                    finished = {m for m in acknowledged if got[(m, "a")] and got[(m, "b")]} & {
                        m for m in acknowledged if got[(m, "p1")] or got[(m, "p2")]
                    }
                if len(finished) == len(acknowledged):
                    break
                time.sleep(0.1)
        finally:
            if restarter is not None:
                restarter.join()  # so that teardown kills the server it starts
            stop.set()
            for t in threads:
                t.join(10)

        assert restarts == 2
        # The kills came mid-stream: puts waited for the server, consumers were at work.
        assert waited >= 0.5, waited
        assert 0 < handled_at_restart[0] < handled_at_restart[1] < 3 * total, handled_at_restart
        assert put_errors == [], put_errors
        assert get_errors == [], get_errors
        assert len(acknowledged) == total

        # The index journal: one DONE per (message, subscriber): a and b, one pool member.
        done = Counter(
            (e.msg_id, e.actor)
            for e in hub.journal(limit=100_000)
            if e.actor_kind is ActorKind.SUBSCRIBER and e.dst == SubscriberState.DONE.value
        )
        assert set(done.values()) == {1}, [k for k, v in done.items() if v > 1]
        for msg_id in acknowledged:
            assert done[(msg_id, "a")] == 1, msg_id
            assert done[(msg_id, "b")] == 1, msg_id
            assert done[(msg_id, "p1")] + done[(msg_id, "p2")] == 1, msg_id
            assert q.state(msg_id).publisher_state is PublisherState.JOURNALLED
        # Handed to each subscriber exactly once (nothing was in doubt: nothing raised).
        assert set(got.values()) == {1}
        assert {m for m, _ in got} == set(acknowledged)
        assert sum(got.values()) == 3 * total
        # A put whose XADD reply was lost may leave a second entry; none was delivered twice.
        with redis.Redis(port=server.port) as raw:
            second_entries = raw.xlen("orders") - total
        print(f"longest put {waited:.2f} s; second broker entries: {second_entries}")
