"""The benchmark script runs and ends with the ratio line the docs quote."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need_server

from tests.redis_index_helpers import REDIS_URL, redis_reachable

ROOT = Path(__file__).resolve().parents[2]


def test_embedded_benchmark_prints_ratio_last() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "embedded.py"),
            "--messages",
            "40",
            "--rounds",
            "1",
            "--sync",
            "normal",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    last = out.strip().splitlines()[-1]
    match = re.fullmatch(r"ratio=(\d+\.\d+)", last)
    assert match, out
    assert float(match.group(1)) > 0
    assert "raw sqlite3" in out and "iqbridge" in out


@pytest.mark.redis
def test_redis_streams_benchmark_prints_ratio_last() -> None:
    need_server(f"Redis at {REDIS_URL}", *redis_reachable())
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "redis_streams.py"),
            "--url",
            REDIS_URL,
            "--messages",
            "30",
            "--rounds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    last = out.strip().splitlines()[-1]
    match = re.fullmatch(r"ratio=(\d+\.\d+)", last)
    assert match, out
    assert float(match.group(1)) > 0
    assert "raw redis-py" in out and "iqbridge" in out
