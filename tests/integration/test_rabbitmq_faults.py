"""RabbitMQ when the broker fails, on the real broker of this machine.

* Unreachable at start (a closed port) and a login the broker refuses: ``connect()``
  raises BrokerUnavailable at once (no retrying for ``retry_for``), naming the URL with
  ``***`` for its password, which appears nowhere (message, cause, log). A bad URL
  option is a ConfigurationError naming the option.
* Server-side connection close mid-stream: a publisher thread puts 2,000 messages (single
  puts and ``put_many`` windows) to two subscribers and a pool of two, on its own hub,
  while consumer threads on another hub get and finish them; twice in the middle the
  broker closes this process's connections (``rabbitmqctl close_connection``, the
  server's ``connection.close`` as ``close_all_connections`` sends it, aimed at our own
  connections only so that other tests on the same broker are left alone).
* Broker restart mid-stream: ``rabbitmqctl stop_app``, ~2 s, ``start_app`` and
  ``await_startup`` (under the lock file :data:`RESTART_LOCK`, which other tests that
  restart the shared broker take too; ``start_app`` always runs). Durable queues,
  persistent messages and publisher confirms: nothing confirmed is lost.

  In both, afterwards: no put raised (``retry_for`` rides it out); every put is
  processed exactly once by each subscriber and by one member of the pool, as counted by
  the application itself (the consumers' own tally of bodies); the index journal has one
  DONE per (message, member). The longest put, get and done and the reconnect times are
  printed (``-s``).
* A publish the broker does not take is an error, never silently dropped: a put to a
  subscriber whose RabbitMQ queue was deleted behind iqbridge's back comes back
  unroutable (``mandatory``), and one to a queue at its ``max-length`` with
  ``overflow: reject-publish`` (a policy) is nacked; both raise BrokerRefused and the
  index withdraws the message (nobody may get it).

Needs ``rabbitmqctl`` (as root or the rabbitmq user; override the command with
``IQ_RABBITMQCTL``, e.g. ``docker exec rabbit rabbitmqctl``) for the close, the restart
and the policy. The connections closed are found by their client ports (``/proc``,
Linux).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pika
import pytest

import iqbridge
from iqbridge import Pool, PublisherState
from iqbridge.adapters.rabbitmq import RabbitMQAdapter
from iqbridge.errors import BrokerRefused, BrokerUnavailable, ConfigurationError
from iqbridge.states import ActorKind, SubscriberState
from tests.conftest import need_server
from tests.rabbitmq_helpers import AMQP_URL, fresh_prefix, need_rabbitmq, remember, url_with

pytestmark = pytest.mark.rabbitmq

#: Held (fcntl, exclusive) by whoever stops the shared broker, for the whole restart.
RESTART_LOCK = "/tmp/iq-rabbit-restart.lock"
RABBITMQCTL = shlex.split(os.environ.get("IQ_RABBITMQCTL", "rabbitmqctl"))
MEMBERS = ("a", "b", "p1", "p2")
SECRET = "s3cret"

_parts = urlsplit(AMQP_URL)
HOST = _parts.hostname or "127.0.0.1"
PORT = _parts.port or 5672
USER = _parts.username or "guest"
VHOST = _parts.path or "/%2F"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- rabbitmqctl -------------------------------------------------------------------------


def _ctl(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [*RABBITMQCTL, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode:
        raise AssertionError(
            f"rabbitmqctl {' '.join(args)} exited with {done.returncode}: "
            f"{done.stderr.strip() or done.stdout.strip()}"
        )
    return done.stdout


@pytest.fixture
def rabbitmqctl() -> None:
    """The broker answers and ``rabbitmqctl`` may manage it (skip, or fail under CI)."""
    need_rabbitmq()
    why = ""
    if shutil.which(RABBITMQCTL[0]) is None:
        why = f"{RABBITMQCTL[0]} not found"
    else:
        try:
            _ctl("list_connections", "pid", "--no-table-headers", "-q", timeout=30)
        except (AssertionError, OSError, subprocess.TimeoutExpired) as exc:
            why = str(exc)
    need_server("rabbitmqctl (to close connections, restart the broker)", not why, why)


@contextlib.contextmanager
def _restart_lock(timeout: float = 180.0) -> Iterator[None]:
    """Nobody else restarts the shared broker while this is held (and we wait for one
    who is mid-restart to finish)."""
    # Read-only is enough for flock, and works on a lock file another user created.
    fd = os.open(RESTART_LOCK, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{RESTART_LOCK} held by someone else for {timeout:g} s"
                    ) from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _broker_steady() -> Iterator[None]:
    """The broker runs, and no other test (that takes the lock) restarts it meanwhile."""
    with _restart_lock():
        if shutil.which(RABBITMQCTL[0]) is not None:
            with contextlib.suppress(AssertionError, OSError, subprocess.TimeoutExpired):
                _ctl("await_startup", timeout=60)
        yield


def _restart_broker(down: float = 2.0) -> dict[str, float]:
    """``stop_app``, ``down`` seconds, ``start_app``, ``await_startup``; timings."""
    with _restart_lock():
        began = time.monotonic()
        try:
            _ctl("stop_app")
            stopped = time.monotonic()
            time.sleep(down)
        finally:
            restarting = time.monotonic()
            _ctl("start_app")
            _ctl("await_startup")
        up = time.monotonic()
    return {
        "stop_app": stopped - began,
        "down": up - began,
        "start_app": up - restarting,
        "began": began,
        "up": up,
    }


def _own_ports() -> set[int]:
    """Local ports of this process's TCP connections to the broker's port."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = str(fd.readlink())
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                local, remote, inode = cols[1], cols[2], cols[9]
                if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == PORT:
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def _close_own_connections(reason: str = "test") -> int:
    """Have the broker close every connection of this process (its ``connection.close``,
    as ``close_all_connections`` does); how many it closed."""
    mine = _own_ports()
    closed = 0
    listing = _ctl("list_connections", "pid", "peer_port", "--no-table-headers", "-q")
    for line in listing.splitlines():
        pid, _, peer = line.strip().partition("\t")
        if peer.strip().isdigit() and int(peer) in mine:
            _ctl("close_connection", pid, reason)
            closed += 1
    return closed


# --- 1. unreachable, refused, misconfigured ----------------------------------------------


def _assert_secret_free(err: BaseException, caplog: pytest.LogCaptureFixture) -> None:
    assert SECRET not in str(err)
    assert SECRET not in repr(err.__cause__)
    assert all(SECRET not in r.getMessage() for r in caplog.records)


def test_unreachable_at_start_is_a_typed_error_without_the_password(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = _free_port()  # closed: nothing listens there
    url = f"amqp://guest:{SECRET}@127.0.0.1:{port}/%2F?prefix=nowhere-"
    caplog.set_level(logging.DEBUG)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable) as err:
        iqbridge.connect(url, index=f"sqlite:///{tmp_path / 'index.db'}")
    elapsed = time.monotonic() - started
    text = str(err.value)
    assert f"amqp://guest:***@127.0.0.1:{port}/%2F" in text, text
    assert "cannot reach RabbitMQ" in text, text
    _assert_secret_free(err.value, caplog)
    # Failing fast at start: the default retry_for (30 s) is for connections that broke.
    assert elapsed < 5, elapsed


def test_a_refused_login_is_a_typed_error_without_the_password(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    need_rabbitmq()
    url = f"amqp://{USER}:{SECRET}-not-it@{HOST}:{PORT}{VHOST}?prefix=refused-"
    caplog.set_level(logging.DEBUG)
    # Not in someone else's restart: the refusal is the login's.
    with _broker_steady(), pytest.raises(BrokerUnavailable) as err:
        started = time.monotonic()
        iqbridge.connect(url, index=f"sqlite:///{tmp_path / 'index.db'}")
    elapsed = time.monotonic() - started
    text = str(err.value)
    assert f"amqp://{USER}:***@{HOST}:{PORT}{VHOST}" in text, text
    assert "refused the login" in text, text
    _assert_secret_free(err.value, caplog)
    assert elapsed < 5, elapsed


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("bogus=1", "bogus"),
        ("prefetch=0", "prefetch"),
        ("retry_for=soon", "retry_for"),
        ("queue_type=stream", "queue_type"),
        ("max_priority=12", "max_priority"),
        ("confirm_timeout=-1", "confirm_timeout"),
    ],
)
def test_a_bad_option_is_a_configuration_error_naming_it(
    tmp_path: Path, query: str, named: str
) -> None:
    url = f"amqp://guest:{SECRET}@127.0.0.1:{_free_port()}/%2F?{query}"
    with pytest.raises(ConfigurationError) as err:
        iqbridge.connect(url, index=f"sqlite:///{tmp_path / 'index.db'}")
    text = str(err.value)
    assert named in text, text
    assert SECRET not in text and "***" in text, text


# --- 2 and 3. faults mid-stream ----------------------------------------------------------


@dataclass
class Stream:
    """What the publisher and the consumers saw: the application's own record."""

    total: int
    ids: dict[int, str] = field(default_factory=dict)
    put_errors: list[tuple[int, BaseException]] = field(default_factory=list)
    processed: Counter[tuple[int, str]] = field(default_factory=Counter)
    finished: Counter[tuple[int, str]] = field(default_factory=Counter)
    get_errors: list[tuple[str, BaseException]] = field(default_factory=list)
    done_errors: list[tuple[str, int, BaseException]] = field(default_factory=list)
    longest_put: float = 0.0
    longest_get: float = 0.0  # beyond the get's own timeout
    longest_done: float = 0.0
    put_ends: list[float] = field(default_factory=list)
    processed_at: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def complete(self) -> bool:
        with self.lock:
            return all(
                self.processed[(n, "a")]
                and self.processed[(n, "b")]
                and (self.processed[(n, "p1")] or self.processed[(n, "p2")])
                for n in self.ids
            )

    def first_after(self, times: list[float], at: float) -> float:
        with self.lock:
            return min((t for t in times if t >= at), default=float("nan")) - at


BATCH = 10
GET_TIMEOUT = 0.2


def _stream(
    tmp_path: Path,
    prefix: str,
    total: int,
    faults: list[tuple[float, Callable[[], dict[str, float]]]],
) -> tuple[Stream, list[dict[str, float]]]:
    """Put ``total`` messages (batches of ten: single puts and put_many windows in
    turn) from one hub while consumers on another get and finish them; run each fault
    when that fraction of the puts has returned. Returns the record, each fault's
    figures (with the number of puts returned and deliveries processed when it came)."""
    url = url_with(prefix, retry_for="30")
    index = f"sqlite:///{tmp_path / 'index.db'}"
    st = Stream(total)
    stop = threading.Event()
    figures: list[dict[str, float]] = []
    pub_hub = iqbridge.connect(url, index=index, publisher="shop")
    sub_hub = iqbridge.connect(url, index=index)
    try:
        q_pub = pub_hub.queue("orders")
        q_pub.subscribe("a", "b")
        q_pub.subscribe_pool("p", ["p1", "p2"])
        q_sub = sub_hub.queue("orders")
        audience: list[str | Pool] = ["a", "b", Pool("p")]

        def publish() -> None:
            for start in range(0, total, BATCH):
                ns = list(range(start, min(start + BATCH, total)))
                began = time.monotonic()
                try:
                    if (start // BATCH) % 2:
                        ids = q_pub.put_many([{"n": n} for n in ns], to=audience)
                    else:
                        ids = [q_pub.put({"n": n}, to=audience) for n in ns]
                except Exception as exc:
                    with st.lock:
                        st.put_errors += [(n, exc) for n in ns]
                    continue
                ended = time.monotonic()
                with st.lock:
                    st.ids.update(zip(ns, ids, strict=True))
                    st.longest_put = max(st.longest_put, ended - began)
                    st.put_ends.append(ended)

        def consume(member: str) -> None:
            while not stop.is_set():
                began = time.monotonic()
                try:
                    d = q_sub.get(member, timeout=GET_TIMEOUT)
                except Exception as exc:
                    with st.lock:
                        st.get_errors.append((member, exc))
                    time.sleep(0.1)
                    continue
                got = time.monotonic()
                with st.lock:
                    st.longest_get = max(st.longest_get, got - began - GET_TIMEOUT)
                if d is None:
                    continue
                n = d.payload["n"]
                with st.lock:  # processed: the application's own record
                    st.processed[(n, member)] += 1
                    st.processed_at.append(got)
                try:
                    d.done()
                except Exception as exc:
                    with st.lock:
                        st.done_errors.append((member, n, exc))
                    continue
                with st.lock:
                    st.finished[(n, member)] += 1
                    st.longest_done = max(st.longest_done, time.monotonic() - got)

        threads = [threading.Thread(target=consume, args=(m,), daemon=True) for m in MEMBERS]
        publisher = threading.Thread(target=publish, daemon=True)
        for t in threads:
            t.start()
        publisher.start()
        try:
            # The faults run here, on the main thread: a restart's start_app always runs.
            for fraction, fault in faults:
                while publisher.is_alive():
                    with st.lock:
                        if len(st.ids) + len(st.put_errors) >= fraction * total:
                            break
                    time.sleep(0.005)
                with st.lock:
                    puts, handled = len(st.ids), sum(st.processed.values())
                fig = fault()
                fig.update(puts_before=puts, processed_before=handled)
                figures.append(fig)
            publisher.join(120)
            assert not publisher.is_alive(), "the publisher did not finish within 120 s"
            deadline = time.monotonic() + 60
            while not st.complete() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # a second delivery of something, if any, has its chance
        finally:
            stop.set()
            for t in threads:
                t.join(30)
    finally:
        for hub in (pub_hub, sub_hub):
            remember(hub.adapter)
        sub_hub.close()
        pub_hub.close()
    return st, figures


def _assert_exactly_once(st: Stream, tmp_path: Path) -> dict[str, int]:
    """Nothing raised; every put processed and finished exactly once per subscriber and
    once by the pool (the application's record and the index journal agree)."""
    assert st.put_errors == [], st.put_errors[:5]
    assert st.get_errors == [], st.get_errors[:5]
    assert st.done_errors == [], st.done_errors[:5]
    assert len(st.ids) == st.total
    twice = {k: v for k, v in st.processed.items() if v > 1}
    assert not twice, f"processed more than once: {sorted(twice.items())[:10]}"
    missing = [
        n
        for n in st.ids
        if not (
            st.processed[(n, "a")] == 1
            and st.processed[(n, "b")] == 1
            and st.processed[(n, "p1")] + st.processed[(n, "p2")] == 1
        )
    ]
    assert not missing, f"{len(missing)} puts not processed by each: {missing[:10]}"
    assert {n for n, _ in st.processed} == set(st.ids)
    assert sum(st.processed.values()) == 3 * st.total
    assert st.finished == st.processed

    # The index agrees: one DONE per (message, member), each message journalled.
    with iqbridge.connect("memory://", index=f"sqlite:///{tmp_path / 'index.db'}") as hub:
        done: Counter[tuple[str, str]] = Counter()
        after = 0
        while batch := hub.journal(after=after, limit=10_000):
            after = batch[-1].seq or after
            done.update(
                (e.msg_id, e.actor)
                for e in batch
                if e.actor_kind is ActorKind.SUBSCRIBER and e.dst == SubscriberState.DONE.value
            )
        assert set(done.values()) == {1}, [k for k, v in done.items() if v > 1][:10]
        by_id = {msg_id: n for n, msg_id in st.ids.items()}
        assert sorted((by_id[m], a) for m, a in done) == sorted(st.processed)
        q = hub.queue("orders")
        journalled = q.search(state=PublisherState.JOURNALLED, limit=st.total + 100)
        assert len(journalled) == st.total
    return {"deliveries": sum(st.processed.values())}


def _queue_depths(prefix: str) -> dict[str, int]:
    """Messages left in the groups' RabbitMQ queues (second copies nobody consumed)."""
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        ch = conn.channel()
        return {
            g: ch.queue_declare(f"{prefix}orders.{g}", passive=True).method.message_count
            for g in ("a", "b", "p")
        }
    finally:
        conn.close()


def _report(what: str, st: Stream, figures: list[dict[str, float]], depths: dict[str, int]) -> None:
    print(
        f"\n{what}: {len(st.ids)} puts, {sum(st.processed.values())} deliveries processed; "
        f"longest put {st.longest_put:.2f} s, get {st.longest_get:.2f} s (beyond its "
        f"{GET_TIMEOUT} s timeout), done {st.longest_done:.3f} s; left in the broker's "
        f"queues: {depths}"
    )
    for i, fig in enumerate(figures, 1):
        shown = {k: round(v, 2) for k, v in fig.items() if k not in ("began", "up", "at")}
        print(f"  fault {i}: {shown}")


@pytest.mark.slow
def test_connections_closed_by_the_broker_mid_stream_lose_and_repeat_nothing(
    tmp_path: Path, rabbitmqctl: None
) -> None:
    def close() -> dict[str, float]:
        at = time.monotonic()
        closed = _close_own_connections("test")
        fig = {"closed": float(closed), "at": at, "took": time.monotonic() - at}
        assert closed >= 2, "both hubs' connections were to be closed"
        return fig

    with fresh_prefix("faults") as prefix:
        st, figures = _stream(tmp_path, prefix, 2000, [(1 / 3, close), (2 / 3, close)])
        depths = _queue_depths(prefix)
    for fig in figures:
        fig["first put after"] = st.first_after(st.put_ends, fig["at"] + fig["took"])
        fig["first delivery after"] = st.first_after(st.processed_at, fig["at"] + fig["took"])
    _report("connections closed twice", st, figures, depths)
    # The closes came mid-stream: puts done before and after, consumers at work.
    assert 0 < figures[0]["puts_before"] < figures[1]["puts_before"] < st.total
    assert 0 < figures[0]["processed_before"] < figures[1]["processed_before"] < 3 * st.total
    _assert_exactly_once(st, tmp_path)


@pytest.mark.slow
def test_a_broker_restart_mid_stream_loses_no_confirmed_message(
    tmp_path: Path, rabbitmqctl: None
) -> None:
    with fresh_prefix("restart") as prefix:
        st, figures = _stream(tmp_path, prefix, 1500, [(0.4, _restart_broker)])
        depths = _queue_depths(prefix)
    fig = figures[0]
    fig["first put after"] = st.first_after(st.put_ends, fig["up"])
    fig["first delivery after"] = st.first_after(st.processed_at, fig["up"])
    _report("broker restarted", st, figures, depths)
    assert 0 < fig["puts_before"] < st.total
    assert 0 < fig["processed_before"] < 3 * st.total
    # The puts waited for the broker (and rode it out): stop_app + ~2 s + start_app.
    assert st.longest_put >= 2.0, st.longest_put
    _assert_exactly_once(st, tmp_path)


# --- 4. a publish the broker does not take -----------------------------------------------


@pytest.fixture
def refusing(tmp_path: Path) -> Iterator[tuple[iqbridge.Hub, iqbridge.Queue, str]]:
    with fresh_prefix("refused") as prefix:
        hub = iqbridge.connect(url_with(prefix), index=f"sqlite:///{tmp_path / 'index.db'}")
        try:
            q = hub.queue("orders")
            q.subscribe("a", "b")
            yield hub, q, prefix
        finally:
            remember(hub.adapter)
            hub.close()


def _assert_withdrawn(q: iqbridge.Queue, correlation_id: str, member: str) -> None:
    """The index withdrew the refused put: nobody may get it, nor will."""
    [hit] = q.search(correlation_id=correlation_id)
    state = q.state(hit.msg_id)
    assert state.publisher_state in (PublisherState.UNAVAILABLE, PublisherState.JOURNALLED)
    view = state.subscribers[member]
    assert view.state is SubscriberState.JOURNALLED, view
    assert SubscriberState.EXPIRED in [s for s, _ in view.history], view.history
    assert "refused" in (view.reason or "") or any(
        "refused" in (e.detail or "") for e in state.journal
    ), state.journal
    waiting = q.search(state=SubscriberState.AVAILABLE, subscriber=member)
    assert hit.msg_id not in {m.msg_id for m in waiting}


def test_an_unroutable_publish_raises_and_is_withdrawn(
    refusing: tuple[iqbridge.Hub, iqbridge.Queue, str],
) -> None:
    hub, q, _prefix = refusing
    warm = q.put("warm-up")  # declares a's and b's queues (cached per process after)
    adapter = hub.adapter
    assert isinstance(adapter, RabbitMQAdapter)
    name = adapter.queue_name("orders", "b")
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        conn.channel().queue_delete(name)  # behind iqbridge's back
    finally:
        conn.close()

    with pytest.raises(BrokerRefused) as err:
        q.put("lost", to=["b"], correlation_id="unroutable")
    text = str(err.value)
    assert "returned" in text and "NO_ROUTE" in text, text
    assert "'b'" in text, text  # the routing key: the subscriber's group
    _assert_withdrawn(q, "unroutable", "b")

    # The rest of the queue goes on: a still gets what it was sent.
    d = q.get("a", timeout=2)
    assert d is not None and d.msg_id == warm
    d.done()


def test_a_nacked_publish_raises_and_is_withdrawn(
    refusing: tuple[iqbridge.Hub, iqbridge.Queue, str], rabbitmqctl: None
) -> None:
    """A queue full under ``overflow: reject-publish`` nacks the publish (a policy, so the
    queue's declared arguments stay the adapter's own)."""
    _hub, q, prefix = refusing
    kept = q.put("fills it", to=["b"])  # declares b's queue; the policy then caps it at 1
    policy = f"{prefix}full"
    pattern = f"^{re.escape(prefix)}orders\\.b$"
    _ctl(
        "set_policy",
        "--apply-to",
        "queues",
        "--priority",
        "100",
        policy,
        pattern,
        '{"max-length": 1, "overflow": "reject-publish"}',
    )
    try:
        deadline = time.monotonic() + 10
        while policy not in _ctl("list_queues", "name", "policy", "--no-table-headers", "-q"):
            assert time.monotonic() < deadline, "the policy did not apply within 10 s"
            time.sleep(0.1)
        with pytest.raises(BrokerRefused) as err:
            q.put("one too many", to=["b"], correlation_id="nacked")
        assert "nacked" in str(err.value), str(err.value)
        _assert_withdrawn(q, "nacked", "b")
    finally:
        _ctl("clear_policy", policy)
    d = q.get("b", timeout=2)
    assert d is not None and d.msg_id == kept
    d.done()
    assert q.get("b", timeout=0.5) is None


def test_a_queue_declared_before_with_other_arguments_is_used_as_it_is(
    refusing: tuple[iqbridge.Hub, iqbridge.Queue, str], caplog: pytest.LogCaptureFixture
) -> None:
    """An application declared the group's queue before iqbridge, without x-max-priority
    or a dead-letter exchange: RabbitMQ refuses iqbridge's declaration (406); iqbridge
    warns, binds the queue as it is and works on it."""
    hub, q, _prefix = refusing
    adapter = hub.adapter
    assert isinstance(adapter, RabbitMQAdapter)
    name = adapter.queue_name("orders", "c")
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        conn.channel().queue_declare(name, durable=True)
        with caplog.at_level(logging.WARNING):
            msg_id = q.put("onto the old queue", to=["c"])
        assert any("exists with other arguments" in r.getMessage() for r in caplog.records)
        d = q.get("c", timeout=2)
        assert d is not None and (d.msg_id, d.body) == (msg_id, b"onto the old queue")
        d.done()
    finally:
        conn.channel().queue_delete(name)
        conn.close()


def test_a_group_queue_deleted_behind_iqbridges_back_is_declared_again(
    refusing: tuple[iqbridge.Hub, iqbridge.Queue, str],
) -> None:
    """Whether its consumer was running (the broker cancels it) or not (the next consume
    finds no queue), the next get declares the queue again and reads on: no driver
    error, no consumer left reading nothing."""
    hub, q, _prefix = refusing
    adapter = hub.adapter
    assert isinstance(adapter, RabbitMQAdapter)
    first = q.put("before", to=["b"])
    d = q.get("b", timeout=2)
    assert d is not None and d.msg_id == first
    d.done()
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        conn.channel().queue_delete(adapter.queue_name("orders", "b"))
    finally:
        conn.close()
    assert q.get("b", timeout=0.5) is None  # declares it again
    after = q.put("after", to=["b"])
    d = q.get("b", timeout=2)
    assert d is not None and d.msg_id == after
    d.done()


def test_an_acknowledgement_never_covers_a_delivery_still_held(
    refusing: tuple[iqbridge.Hub, iqbridge.Queue, str],
) -> None:
    """Batches are acknowledged with ``multiple`` where the delivery tags allow: one held
    delivery between two finished batches stays unacknowledged, so when the process goes
    without finishing it, RabbitMQ still has it (and only it)."""
    hub, q, _prefix = refusing
    adapter = hub.adapter
    assert isinstance(adapter, RabbitMQAdapter)
    ids = q.put_many([f"m{i}".encode() for i in range(5)], to=["a"])
    first = q.get_many("a", 2)
    held = q.get("a")
    last = q.get_many("a", 2)
    assert held is not None
    assert [*first.msg_ids, held.msg_id, *last.msg_ids] == ids
    last.done()
    first.done()
    adapter.close()  # gone without finishing `held`: the broker takes it back
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        ch = conn.channel()
        name = adapter.queue_name("orders", "a")
        for _ in range(100):  # the broker requeues it once it sees the connection close
            waiting = ch.queue_declare(name, passive=True).method.message_count
            if waiting:
                break
            time.sleep(0.02)
        assert waiting == 1
        method, _props, body = ch.basic_get(name, auto_ack=True)
        assert method is not None and body == b"m2"
    finally:
        conn.close()
