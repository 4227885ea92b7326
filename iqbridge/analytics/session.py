"""The Spark session the jobs run in, and reading an exported journal.

:func:`spark_session` reuses the active session (``spark-submit`` and tests make one),
otherwise builds one: ``--master`` when given, else whatever ``spark-submit`` configured,
else ``local[*]``. Its settings suit a journal job anywhere, laptop or cluster: shuffles
sized to the cores instead of Spark's 200 partitions, adaptive execution, UTC session time.

:func:`read_journal` and :func:`read_messages` read the datasets of
:mod:`iqbridge.analytics.schema` with their schema given, so Spark neither samples files to
infer one nor turns a queue called ``2024`` into a number.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from iqbridge.errors import IQError

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["AnalyticsError", "read_journal", "read_messages", "spark_session"]


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
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # the JVM failed to start: no Java, bad master URL
        raise AnalyticsError(
            f"could not start Spark ({type(exc).__name__}: {str(exc).splitlines()[0][:200]});"
            " check the --master URL and that Java 17+ is installed (JAVA_HOME or java on PATH)"
        ) from None
    spark.sparkContext.setLogLevel("WARN")
    return spark


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
