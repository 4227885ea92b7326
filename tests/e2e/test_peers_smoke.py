"""benchmarks/peers.py runs, prints every side's rate and ends with the ratio line.

No figure is checked: timed assertions have no place in the suite. Without the peers
(the ``bench`` extra) only iqbridge's sides run, and the script says there is no peer to
compare with instead of inventing a ratio.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import IN_CI, need_server

from tests.rabbitmq_helpers import AMQP_URL, rabbitmq_reachable
from tests.redis_index_helpers import REDIS_URL, redis_reachable

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "peers.py"
RATE = r"\s+[\d,]+ msg/s  \(publish \d+\.\d\d s, consume \d+\.\d\d s\)"
#: What the bench extra brings (pip install -e '.[bench]').
PEER_MODULES = ("faststream", "kombu", "persistqueue", "aio_pika", "pika")


def need_bench_extra() -> None:
    """Skip (locally) or fail (in CI) when the peers are not installed."""
    missing = [m for m in PEER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        text = f"the bench extra is not installed ({', '.join(missing)}): pip install -e '.[bench]'"
        if IN_CI:
            pytest.fail(f"{text} (CI=true: the peers benchmark may not be skipped)")
        pytest.skip(text)


def run_peers(*args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--messages", "200", "--rounds", "1", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()


def assert_measured(lines: list[str], side: str) -> None:
    assert any(re.fullmatch(rf"  {re.escape(side)}{RATE}", line) for line in lines), (
        f"no rate for {side}:\n" + "\n".join(lines)
    )


def test_iqbridge_sides_without_a_peer_on_sqlite() -> None:
    lines = run_peers("--only", "sqlite:iqbridge,sqlite:iqbridge-batch")
    assert_measured(lines, "sqlite:iqbridge")
    assert_measured(lines, "sqlite:iqbridge-batch")
    assert not any("redis:" in line for line in lines[1:])
    assert "  sqlite no peer measured" in lines
    assert lines[-1] == "ratio=none"


@pytest.mark.redis
def test_iqbridge_sides_without_a_peer_on_both_backends() -> None:
    need_server(f"Redis at {REDIS_URL}", *redis_reachable())
    lines = run_peers(
        "--url",
        REDIS_URL,
        "--only",
        "redis:iqbridge,redis:iqbridge-batch,sqlite:iqbridge,sqlite:iqbridge-batch",
    )
    for side in ("redis:iqbridge", "redis:iqbridge-batch"):
        assert_measured(lines, side)
    for side in ("sqlite:iqbridge", "sqlite:iqbridge-batch"):
        assert_measured(lines, side)
    assert "  redis  no peer measured" in lines
    assert "  sqlite no peer measured" in lines
    assert lines[-1] == "ratio=none"


@pytest.mark.redis
def test_every_side_with_the_bench_extra() -> None:
    need_bench_extra()
    need_server(f"Redis at {REDIS_URL}", *redis_reachable())
    lines = run_peers("--url", REDIS_URL, "--only", "redis,sqlite")
    for side in (
        "redis:iqbridge",
        "redis:iqbridge-batch",
        "redis:faststream",
        "redis:faststream-batch",
        "redis:kombu",
        "redis:kombu-batch",
        "sqlite:iqbridge",
        "sqlite:iqbridge-batch",
        "sqlite:persist-queue",
    ):
        assert_measured(lines, side)
    assert not any("skipped" in line or "FAILED" in line for line in lines)
    per_backend = [line for line in lines if re.match(r"  (redis |sqlite).* = \d+\.\d\d$", line)]
    assert len(per_backend) == 2, lines
    match = re.fullmatch(r"ratio=(\d+\.\d\d)", lines[-1])
    assert match, lines
    smallest = min(float(line.rsplit("= ", 1)[1]) for line in per_backend)
    assert float(match.group(1)) == smallest


@pytest.mark.rabbitmq
def test_iqbridge_sides_without_a_peer_on_rabbitmq() -> None:
    need_server(f"RabbitMQ at {AMQP_URL}", *rabbitmq_reachable())
    lines = run_peers("--amqp-url", AMQP_URL, "--only", "rabbitmq:iqbridge,rabbitmq:iqbridge-batch")
    assert_measured(lines, "rabbitmq:iqbridge")
    assert_measured(lines, "rabbitmq:iqbridge-batch")
    assert not any(re.match(r"  (redis|sqlite):", line) for line in lines)
    assert "  rabbitmq no peer measured" in lines
    assert lines[-1] == "ratio=none"


@pytest.mark.rabbitmq
def test_every_rabbitmq_side_with_the_bench_extra() -> None:
    need_bench_extra()
    need_server(f"RabbitMQ at {AMQP_URL}", *rabbitmq_reachable())
    lines = run_peers("--amqp-url", AMQP_URL, "--only", "rabbitmq")
    for side in (
        "rabbitmq:iqbridge",
        "rabbitmq:iqbridge-batch",
        "rabbitmq:faststream",
        "rabbitmq:kombu",
    ):
        assert_measured(lines, side)
    assert not any("skipped" in line or "FAILED" in line for line in lines)
    per_backend = [line for line in lines if re.match(r"  rabbitmq .* = \d+\.\d\d$", line)]
    assert len(per_backend) == 1, lines
    assert lines[-1] == f"ratio={per_backend[0].rsplit('= ', 1)[1]}"
