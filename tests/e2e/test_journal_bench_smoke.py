"""benchmarks/journal.py runs at a tiny size, its engines agree, and it ends with the ratio.

No figure is checked: timed assertions have no place in the suite. It needs PySpark,
DuckDB and Java 17+ (the ``spark`` extra): skipped without them, failed under ``CI=true``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import need_server

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "journal.py"


def test_journal_benchmark_checks_both_engines_and_prints_ratio_last(tmp_path: Path) -> None:
    missing = [m for m in ("pyspark", "duckdb", "pyarrow") if importlib.util.find_spec(m) is None]
    need_server("PySpark and DuckDB", not missing, f"missing {', '.join(missing)}")
    need_server("Java", shutil.which("java") is not None or "JAVA_HOME" in os.environ)
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--rows",
            "20000",
            "--repeat",
            "1",
            "--warmup",
            "0",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert re.fullmatch(r"ratio=\d+\.\d\d", lines[-1]), lines
    assert float(lines[-1].split("=")[1]) > 0
    checks = [line for line in lines if line.startswith("check 20k: ")]
    assert len(checks) == 1, lines
    assert checks[0].startswith("check 20k: ok: findings spark = duckdb = planted"), checks
    assert any(re.match(r"20k run 1: spark +\d+\.\d\d s", line) for line in lines), lines
    assert any(re.match(r"20k run 1: duckdb +\d+\.\d\d s", line) for line in lines), lines
    assert (tmp_path / "20000" / "_iqbench.json").is_file()
