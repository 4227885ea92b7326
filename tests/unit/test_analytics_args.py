"""``iq analytics``: every argument is checked before Spark starts (a JVM start costs
seconds), and Spark's own output (log4j lines, Java stack traces) goes to its log file,
never to the terminal: one clean line on stderr."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import need_server

IQ = Path(sys.executable).with_name("iq")


def _iq(
    tmp: Path, *args: str, timeout: float = 60
) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if k not in ("HADOOP_CONF_DIR", "YARN_CONF_DIR")}
    env["IQ_SPARK_LOG"] = str(tmp / "spark.log")
    env.pop("IQ_SPARK_MASTER", None)
    start = time.monotonic()
    proc = subprocess.run(
        [str(IQ), "analytics", *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc, time.monotonic() - start


@pytest.fixture
def export(tmp_path: Path) -> Path:
    """A directory shaped like an export (the datasets' directories, empty)."""
    for name in ("journal", "messages"):
        (tmp_path / "exp" / name).mkdir(parents=True)
    return tmp_path / "exp"


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (("latency", "--journal", "nope"), 1, "iq journal export"),
        (("audit", "--journal", "s4a://bucket/journal"), 1, "not a file system Spark reads"),
        (("lineage", "--journal", "EXP_NO_MESSAGES"), 1, "no exported messages"),
        (("audit", "--journal", "EXP", "--as-of", "yesterday"), 2, "--as-of"),
        (("latency", "--journal", "EXP", "--master", "bogus://x"), 2, "not a Spark master URL"),
        (("latency", "--journal", "EXP", "--master", "mesos://h:5050"), 2, "no Mesos support"),
        (("latency", "--journal", "EXP", "--master", "local[0]"), 2, "--master"),
        (("latency", "--journal", "EXP", "--conf", "spark.x"), 2, "KEY=VALUE"),
        (("audit", "--journal", "EXP", "--stuck-after", "-1"), 2, "--stuck-after"),
        (("retention", "--journal", "EXP", "--keep", "forever"), 2, "--keep"),
        (("retention", "--journal", "EXP", "--rule", "orders=soon"), 2, "--rule"),
    ],
)
def test_a_bad_argument_fails_at_once_without_starting_spark(
    tmp_path: Path, export: Path, args: tuple[str, ...], code: int, says: str
) -> None:
    if "EXP_NO_MESSAGES" in args:
        shutil.rmtree(export / "messages")
    args = tuple(str(export) if a.startswith("EXP") else a for a in args)
    proc, took = _iq(tmp_path, *args)
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("iq: error: "), proc.stderr
    assert says in lines[0]
    assert not (tmp_path / "spark.log").exists(), "Spark was started"
    assert took < 4.0, f"took {took:.1f} s: Spark started before the arguments were checked?"


def test_spark_failing_to_start_is_one_clean_line_and_its_log_goes_to_a_file(
    tmp_path: Path, export: Path
) -> None:
    """The one test here that starts a JVM: ``yarn`` without HADOOP_CONF_DIR is refused
    by spark-submit itself, after its log lines and a Java stack trace."""
    need_server("Java 17+", shutil.which("java") is not None, "install a JRE")
    pytest.importorskip("pyspark")
    proc, _ = _iq(tmp_path, "latency", "--journal", str(export), "--master", "yarn")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith("iq: error: could not start Spark (When running with master")
    assert "HADOOP_CONF_DIR" in proc.stderr and str(tmp_path / "spark.log") in proc.stderr
    log = (tmp_path / "spark.log").read_text()
    assert "\tat org.apache.spark" in log  # the stack trace went here, not to the terminal
