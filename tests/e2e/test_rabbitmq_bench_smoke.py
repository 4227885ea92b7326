"""benchmarks/rabbitmq.py runs, prints every side's rate and ends with the ratio line.

No figure is checked: timed assertions have no place in the suite. Without a reachable
RabbitMQ the script says so and ends with ``ratio=none`` and exit code 0.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need_server

from tests.rabbitmq_helpers import AMQP_URL, rabbitmq_reachable

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "rabbitmq.py"
RATE = r"\s+\d+ msg/s  \(publish \d+\.\d\d s, consume \d+\.\d\d s\)"
SERIES = (
    "raw pika, confirms per 8",
    "raw pika, a confirm per publish",
    "iqbridge put+get+done",
    "iqbridge put_many+get_many+done (10)",
)


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.rabbitmq
def test_rabbitmq_benchmark_prints_rates_and_ratio_last() -> None:
    need_server(f"RabbitMQ at {AMQP_URL}", *rabbitmq_reachable())
    proc = run_bench(
        "--url", AMQP_URL, "--messages", "30", "--runs", "1", "--window", "8", "--batch", "10"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    for label in SERIES:
        rate = rf"  {re.escape(label)}{RATE}"
        assert any(re.fullmatch(rate, line) for line in lines), (
            f"no rate for {label}:\n{proc.stdout}"
        )
    assert not any("FAILED" in line for line in lines), proc.stdout
    match = re.fullmatch(r"ratio=(\d+\.\d\d)", lines[-1])
    assert match, proc.stdout
    assert float(match.group(1)) > 0


def test_unreachable_rabbitmq_is_skipped_with_ratio_none() -> None:
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = run_bench("--url", f"amqp://guest:guest@127.0.0.1:{port}/%2F", "--runs", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert any(line.startswith("skipped: RabbitMQ at ") for line in lines), proc.stdout
    assert lines[-1] == "ratio=none"
