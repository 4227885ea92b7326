"""The Spark session the jobs run in, and reading an exported journal.

:func:`spark_session` reuses the active session (``spark-submit`` and tests make one),
otherwise builds one: ``--master`` when given, else whatever ``spark-submit`` configured,
else ``local[*]``. Its settings suit a journal job anywhere, laptop or cluster: shuffles
sized to the cores instead of Spark's 200 partitions, adaptive execution, UTC session time.

:func:`read_journal` and :func:`read_messages` read the datasets of
:mod:`iqbridge.analytics.schema` with their schema given, so Spark neither samples files to
infer one nor turns a queue called ``2024`` into a number.

:func:`check_master` and :func:`check_journal` refuse what Spark would refuse, before a
JVM starts (that costs seconds). The JVM a new session launches writes its log (log4j
lines, Java stack traces) to :func:`spark_log`, not to the terminal.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from iqbridge.errors import IQError

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "AnalyticsError",
    "check_journal",
    "check_master",
    "read_journal",
    "read_messages",
    "spark_log",
    "spark_session",
]

#: The master URLs Spark 4 takes: local, local[N], local[*], local[N,F], local-cluster[...],
#: spark://host:port[,host:port], yarn, k8s://...
_MASTER = re.compile(
    r"^(local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?"
    r"|local-cluster\[\s*\d+\s*,\s*\d+\s*,\s*\d+\s*\]"
    r"|yarn|spark://[^\s/]+|k8s://\S+)$"
)
#: A Java exception's first line: its class, then its message.
_JAVA_ERROR = re.compile(r"^(?:Exception in thread \S+ )?[\w.$]+(?:Exception|Error): (.+)$", re.M)
#: URI schemes of the file systems Spark reads through Hadoop (and a path's file://).
JOURNAL_SCHEMES = frozenset(
    {
        "abfs",
        "abfss",
        "adl",
        "alluxio",
        "cos",
        "cosn",
        "dbfs",
        "file",
        "gs",
        "hdfs",
        "obs",
        "oss",
        "s3",
        "s3a",
        "s3n",
        "viewfs",
        "wasb",
        "wasbs",
        "webhdfs",
    }
)


class AnalyticsError(IQError):
    """An analytics job cannot run: PySpark or Java missing, no exported journal, bad options."""


def _pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise AnalyticsError(
            "the analytics jobs need PySpark: pip install 'iqbridge[spark]' (and a Java 17+ "
            "runtime, e.g. Debian's openjdk-17-jre-headless)"
        ) from None


def check_master(master: str | None) -> None:
    """Refuse a Spark master URL that Spark would refuse (None is the default)."""
    if master is None or _MASTER.match(master):
        return
    hint = " (Spark 4 has no Mesos support)" if master.startswith("mesos://") else ""
    raise AnalyticsError(
        f"{master!r} is not a Spark master URL{hint}; write local, local[4], local[*], "
        "spark://HOST:7077, yarn or k8s://https://HOST:PORT"
    )


def check_journal(journal: str | Path, *datasets: str) -> None:
    """Refuse a journal location the jobs cannot read: a local directory (or file://
    URI) without the exported ``datasets``, or a URI of a file system Spark does not
    know."""
    root = str(journal).rstrip("/")
    scheme, sep, rest = root.partition("://")
    if sep and scheme.lower() != "file":
        if scheme.lower() not in JOURNAL_SCHEMES:
            raise AnalyticsError(
                f"--journal {journal}: {scheme}:// is not a file system Spark reads; use a "
                f"directory or one of {', '.join(s + '://' for s in sorted(JOURNAL_SCHEMES))}"
            )
        return
    for name in datasets:
        _dataset(rest if sep else root, name)


def spark_log() -> Path:
    """Where the JVM of a session started here writes its log: ``$IQ_SPARK_LOG``, or
    ``iqbridge-spark-<uid>.log`` in the temporary directory."""
    named = os.environ.get("IQ_SPARK_LOG")
    if named:
        return Path(named)
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"iqbridge-spark-{uid}.log"


@contextlib.contextmanager
def _stderr_to(log: Path) -> Iterator[None]:
    """Point this process's standard error (file descriptor 2) at ``log`` for a while:
    the JVM pyspark launches meanwhile inherits it, and writes its log4j lines and
    stack traces there for its whole life instead of onto the terminal."""
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        yield  # no log file to be had: Spark's output stays where it was
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def spark_session(
    master: str | None = None,
    app_name: str = "iqbridge-analytics",
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """The active Spark session, or a new one tuned for journal jobs.

    ``master``: a Spark master URL (``local[2]``, ``spark://host:7077``, ``yarn``, ...);
    None keeps what ``spark-submit`` set, or ``local[*]`` when nothing did.
    ``conf``: extra Spark settings (they win over the defaults here).
    """
    _pyspark()
    check_master(master)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active
    builder = SparkSession.builder.appName(app_name)
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.showConsoleProgress": "false",
    }
    if master is not None:
        builder = builder.master(master)
    elif "spark.master" not in _submitted_conf():
        builder = builder.master("local[*]")
    local = (master or _submitted_conf().get("spark.master", "local[*]")).startswith("local")
    if local:
        # One machine: a shuffle partition per core or two, not Spark's 200, and no UI port.
        cores = os.cpu_count() or 2
        settings["spark.sql.shuffle.partitions"] = str(max(2, 2 * cores))
        settings["spark.ui.enabled"] = "false"
        settings.setdefault("spark.driver.memory", "2g")
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    log = spark_log()
    start = log.stat().st_size if log.exists() else 0
    try:
        with _stderr_to(log):
            spark = builder.getOrCreate()
    except Exception as exc:  # the JVM failed to start: no Java, a master it cannot use
        why = _java_error(log, start) or f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        raise AnalyticsError(
            f"could not start Spark ({why[:300]}); check the --master URL and that Java 17+ "
            f"is installed (JAVA_HOME or java on PATH); Spark's log: {log}"
        ) from None
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _java_error(log: Path, start: int) -> str | None:
    """The message of the last Java exception the JVM logged since ``start``."""
    try:
        with log.open("rb") as f:
            f.seek(start)
            text = f.read(1_000_000).decode("utf-8", "replace")
    except OSError:
        return None
    found = _JAVA_ERROR.findall(text)
    return found[-1].strip() if found else None


def _submitted_conf() -> dict[str, str]:
    """What spark-submit passed to this driver (empty outside spark-submit)."""
    master = os.environ.get("MASTER") or os.environ.get("SPARK_MASTER")
    out: dict[str, str] = {}
    if master:
        out["spark.master"] = master
    if "PYSPARK_GATEWAY_PORT" in os.environ or "SPARK_SUBMIT_OPTS" in os.environ:
        try:
            from pyspark import SparkConf

            out.update(dict(SparkConf().getAll()))
        except Exception:  # pragma: no cover - a broken gateway shows up at getOrCreate
            pass
    return out


def _dataset(journal: str | Path, name: str) -> str:
    root = str(journal).rstrip("/")
    if "://" not in root:
        path = Path(root) / name
        if not path.is_dir():
            raise AnalyticsError(
                f"no exported {name} at {path}: run `iq journal export --to {root}` first"
            )
        return str(path)
    return f"{root}/{name}"


def _spark_schema(arrow: pa.Schema) -> StructType:
    """The Spark schema of a dataset: its Arrow columns plus the ``date`` and ``queue``
    partition keys, both strings."""
    import pyarrow as pa
    from pyspark.sql import types as T

    def convert(t: pa.DataType) -> T.DataType:
        if pa.types.is_string(t):
            return T.StringType()
        if pa.types.is_int64(t):
            return T.LongType()
        if pa.types.is_int32(t):
            return T.IntegerType()
        if pa.types.is_timestamp(t):
            return T.TimestampType()
        if pa.types.is_binary(t):
            return T.BinaryType()
        if pa.types.is_list(t):
            return T.ArrayType(T.StringType())
        raise TypeError(f"no Spark type for {t}")  # pragma: no cover

    fields = [T.StructField(f.name, convert(f.type), f.nullable) for f in arrow]
    fields += [T.StructField("date", T.StringType(), False)]
    fields += [T.StructField("queue", T.StringType(), False)]
    return T.StructType(fields)


def read_journal(spark: SparkSession, journal: str | Path) -> DataFrame:
    """The exported journal: one row per transition, with ``date`` and ``queue``."""
    from iqbridge.analytics.schema import JOURNAL, journal_schema

    path = _dataset(journal, JOURNAL)
    return spark.read.schema(_spark_schema(journal_schema())).parquet(path)


def read_messages(spark: SparkSession, journal: str | Path) -> DataFrame:
    """The exported message records (parents, priority, payload where retained)."""
    from iqbridge.analytics.schema import MESSAGES, messages_schema

    path = _dataset(journal, MESSAGES)
    return spark.read.schema(_spark_schema(messages_schema())).parquet(path)
