"""Kafka when the broker fails or the input is wrong, on Tansu brokers of the test's own.

* Unreachable at start (a closed port): ``connect()`` raises BrokerUnavailable within
  ``connect_timeout`` (no endless librdkafka retry loop), naming the URL with ``***`` for
  its password, which appears nowhere (message, log).
* Broker gone mid-run: a put fails with BrokerUnavailable within ``retry_for`` (the
  bound is an option); a consumer logs the outage once, clearly, its gets fail with
  BrokerUnavailable once the outage is older than ``retry_for``; the broker restarted (an
  empty one: Tansu keeps nothing), puts and gets go on in the same hub and the log says
  the broker is reachable again.
* librdkafka's own log lines go through Python logging (``iqbridge.librdkafka``), never
  to stderr: checked in a child process whose stderr is captured. ``iq`` against an
  unreachable broker prints one line, naming the broker and the bound it waited
  (``connect_timeout``), within that bound; Ctrl-C (SIGINT) during the wait ends it at
  once.
* Bad input: an unknown option, a bad number, a librdkafka property librdkafka does not
  know, a queue name Kafka cannot take as a topic, a payload over the broker's limit:
  each a typed error naming what was wrong.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import iqbridge
from iqbridge.errors import (
    BrokerUnavailable,
    ConfigurationError,
    InvalidArgument,
    MessageTooLarge,
)
from tests.kafka_helpers import FAST_GROUPS, Tansu, free_port, kafka_url, tansu_binary

pytestmark = pytest.mark.kafka


def _url(bootstrap: str, **options: str) -> str:
    opts = {**FAST_GROUPS, **options}
    return f"kafka://{bootstrap}?" + "&".join(f"{k}={v}" for k, v in opts.items())


@pytest.fixture
def own_broker() -> Iterator[Tansu]:
    """A Tansu of this test's own (it gets stopped and started)."""
    if tansu_binary() is None:
        kafka_url()  # skips, or fails under CI=true, with the reason
    broker = Tansu().start()
    try:
        yield broker
    finally:
        broker.stop()


def test_unreachable_broker_fails_within_connect_timeout(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    started = time.monotonic()
    with (
        caplog.at_level(logging.DEBUG),
        pytest.raises(BrokerUnavailable, match=r"cannot reach Kafka") as err,
    ):
        iqbridge.connect(
            f"kafka://app:s3cret@127.0.0.1:{port}?connect_timeout=1.5",
            index="memory://",
        )
    took = time.monotonic() - started
    assert took < 6, f"connect took {took:.1f} s with connect_timeout=1.5"
    assert f"127.0.0.1:{port}" in str(err.value)
    assert "***" in str(err.value)
    assert "s3cret" not in str(err.value)
    assert "s3cret" not in caplog.text


def test_put_fails_within_retry_for_and_goes_on_after_a_restart(
    own_broker: Tansu, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hub = iqbridge.connect(
        _url(own_broker.bootstrap, retry_for="2"), index=f"sqlite:///{tmp_path / 'i.db'}"
    )
    try:
        q = hub.queue("orders")
        q.subscribe("a")
        first = q.put(b"before")
        got = q.get("a", timeout=10)
        assert got is not None and got.msg_id == first
        got.done()

        own_broker.stop()
        started = time.monotonic()
        with caplog.at_level(logging.WARNING), pytest.raises(BrokerUnavailable) as err:
            q.put(b"while down")
        took = time.monotonic() - started
        assert took < 12, f"the put hung {took:.1f} s with retry_for=2"
        assert own_broker.bootstrap in str(err.value)
        # The consumer side: the outage is reported, gets fail once it outlasts retry_for.
        deadline = time.monotonic() + 15
        with caplog.at_level(logging.WARNING):
            while time.monotonic() < deadline:
                try:
                    q.get("a", timeout=0.5)
                except BrokerUnavailable as exc:
                    assert "cannot reach Kafka" in str(exc)
                    break
            else:
                pytest.fail("gets went on without an error for 15 s with the broker down")
        assert "is unreachable" in caplog.text

        own_broker.start()  # same port, empty (Tansu keeps nothing)
        after: str | None = None
        deadline = time.monotonic() + 30
        while after is None and time.monotonic() < deadline:
            try:
                after = q.put(b"after")
            except BrokerUnavailable:
                time.sleep(0.5)
        assert after is not None, "puts did not resume within 30 s of the restart"
        seen: list[str] = []
        deadline = time.monotonic() + 30
        while after not in seen and time.monotonic() < deadline:
            try:
                d = q.get("a", timeout=1)
            except BrokerUnavailable:
                continue
            if d is not None:
                seen.append(d.msg_id)
                d.done()
        assert after in seen, f"the consumer did not go on after the restart (saw {seen})"
        assert "reachable again" in caplog.text
    finally:
        hub.close()


def test_librdkafka_logs_go_through_python_logging(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import logging, sys, time
        import iqbridge
        from iqbridge.adapters.kafka import KafkaAdapter
        from iqbridge.errors import BrokerUnavailable
        logging.basicConfig(stream=sys.stdout, level=logging.DEBUG,
                            format="%(name)s %(levelname)s %(message)s")
        try:
            KafkaAdapter.from_url("kafka://127.0.0.1:{free_port()}?connect_timeout=1")
        except BrokerUnavailable as exc:
            print("raised", type(exc).__name__)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert "raised BrokerUnavailable" in out.stdout, out.stdout + out.stderr
    assert "|FAIL|" not in out.stderr and "rdkafka" not in out.stderr, out.stderr
    assert "iqbridge.librdkafka" in out.stdout, out.stdout


def _iq_put_to(port: int, connect_timeout: float, cwd: Path) -> subprocess.Popen[str]:
    """``iq put`` to a Kafka URL whose port nothing listens on, as a child process."""
    if not Path("/proc/self/task").is_dir():
        pytest.skip("watching a child's threads needs /proc (Linux)")
    url = f"kafka://127.0.0.1:{port}?connect_timeout={connect_timeout:g}"
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("iq")), "--url", url, "put", "q", "hi", "--to", "a"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,  # the default index file goes there
    )


def _await_librdkafka(proc: subprocess.Popen[str], within: float = 60.0) -> None:
    """Return once the child runs librdkafka's threads (its wait for the broker began):
    its imports alone take seconds on a loaded machine."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        names = []
        for comm in Path(f"/proc/{proc.pid}/task").glob("*/comm"):
            with contextlib.suppress(OSError):
                names.append(comm.read_text().strip())
        if any(name.startswith("rdk:") for name in names):
            return
        if proc.poll() is not None:
            pytest.fail(f"iq ended before it reached librdkafka: {proc.communicate()}")
        time.sleep(0.02)
    proc.kill()
    pytest.fail(f"iq did not start librdkafka within {within:g} s")


def _finish(proc: subprocess.Popen[str], within: float) -> tuple[str, float]:
    """The child's stderr and how long it took to end (killed after ``within``)."""
    started = time.monotonic()
    try:
        _out, err = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"iq still ran {within:g} s later")
    return err, time.monotonic() - started


def test_cli_says_once_that_kafka_is_unreachable_within_connect_timeout(tmp_path: Path) -> None:
    port = free_port()
    proc = _iq_put_to(port, 2, tmp_path)
    _await_librdkafka(proc)
    err, took = _finish(proc, 30)
    assert proc.returncode == 1, err
    lines = err.splitlines()
    assert len(lines) == 1, f"{len(lines)} lines on stderr:\n{err[:3000]}"
    assert lines[0].startswith("iq: error: cannot reach Kafka at"), lines[0]
    assert f"127.0.0.1:{port}" in lines[0] and "connect_timeout=2 s" in lines[0], lines[0]
    assert "FAIL" not in err and "rdkafka" not in err
    assert took < 2 + 1.5, f"iq ended {took:.1f} s after its wait began (connect_timeout=2)"


def test_ctrl_c_ends_the_wait_for_an_unreachable_kafka_at_once(tmp_path: Path) -> None:
    proc = _iq_put_to(free_port(), 30, tmp_path)
    _await_librdkafka(proc)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    err, took = _finish(proc, 15)
    assert took < 2.0, f"iq ended {took:.1f} s after SIGINT"
    assert proc.returncode == 130, err
    assert "FAIL" not in err and "rdkafka" not in err


@pytest.mark.parametrize(
    ("query", "error", "names"),
    [
        ("bogus=1", ConfigurationError, "bogus"),
        ("partitions=0", ConfigurationError, "partitions"),
        ("retry_for=soon", ConfigurationError, "retry_for"),
        ("no.such.property=1", ConfigurationError, "no.such.property"),
    ],
)
def test_bad_options_are_configuration_errors(
    query: str, error: type[Exception], names: str
) -> None:
    base = kafka_url()
    with pytest.raises(error, match=names.replace(".", r"\.")):
        iqbridge.connect(f"{base}&{query}", index="memory://")


def test_bad_queue_names_and_oversized_payloads_are_refused_by_name() -> None:
    hub = iqbridge.connect(kafka_url(), index="memory://")
    try:
        with pytest.raises(InvalidArgument, match=r"Kafka topic names hold letters"):
            hub.queue("orders:eu").subscribe("a")
        q = hub.queue("big-ones")
        q.subscribe("a")
        limit = hub.adapter.capabilities.max_payload_bytes
        with pytest.raises(MessageTooLarge, match="exceeds the limit"):
            q.put(b"x" * (limit + 1))
        assert q.put(b"x" * 1000)
    finally:
        hub.close()
