"""The Spark jobs on a journal of real traffic with known anomalies (analytics_traffic.py).

One local[2] session for every test (the ``spark`` fixture); the traffic is generated
and exported once per module. Each test asserts the exact findings.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from typer.testing import CliRunner

import iqbridge
from iqbridge.analytics.audit import audit
from iqbridge.analytics.latency import latency
from iqbridge.analytics.lineage import lineage
from iqbridge.analytics.retention import retention
from iqbridge.cli.app import app
from iqbridge.errors import MessageNotFound
from iqbridge.states import PublisherState
from tests.integration.analytics_traffic import Traffic, make_traffic

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Traffic:
    return make_traffic(tmp_path_factory.mktemp("analytics"))


def _later() -> datetime:
    return datetime.now(UTC) + timedelta(seconds=1)


def _pairs(rows: list[dict[str, Any]], ids: dict[str, str]) -> set[tuple[str, str]]:
    name = {v: k for k, v in ids.items()}
    return {(name.get(str(r["msg_id"]), str(r["msg_id"])), str(r["actor"])) for r in rows}


def test_audit_finds_exactly_the_injected_anomalies(
    spark: Any, traffic: Traffic, tmp_path: Path
) -> None:
    zero = timedelta(0)
    result = audit(
        spark,
        traffic.journal,
        tmp_path,
        as_of=_later(),
        stuck_after=zero,
        lost_after=zero,
        collect=50,
    )
    ids = traffic.ids
    assert _pairs(result.rows["duplicate_done"], ids) == {("o2", "billing")}
    assert result.rows["duplicate_done"][0]["dones"] == 2
    # In doubt: ledger's held p1, the approver's c2 (crashed after putting k2) and c4.
    assert _pairs(result.rows["stuck"], ids) == {
        ("p1", "ledger"),
        ("c2", "approver"),
        ("c4", "approver"),
    }
    assert {r["state"] for r in result.rows["stuck"]} == {"FETCHED"}
    # p0 never reached the broker: ledger took p1 and p2 revealed after it.
    assert _pairs(result.rows["lost"], ids) == {("p0", "ledger")}
    # The injected second DONE came after billing's JOURNALLED of o2.
    assert _pairs(result.rows["inconsistent"], ids) == {("o2", "billing")}
    assert result.violations == 1
    assert [(f.finding, f.count) for f in result.findings] == [
        ("duplicate_done", 1),
        ("stuck", 3),
        ("lost", 1),
        ("inconsistent", 1),
    ]
    summary = ds.dataset(str(tmp_path / "audit" / "summary")).to_table().to_pylist()
    assert {r["finding"]: r["count"] for r in summary} == {
        "duplicate_done": 1,
        "stuck": 3,
        "lost": 1,
        "inconsistent": 1,
    }
    assert next(r for r in summary if r["finding"] == "duplicate_done")["msg_ids"] == [ids["o2"]]
    findings = ds.dataset(str(tmp_path / "audit" / "findings")).to_table()
    assert findings.num_rows == 6


def test_audit_ages_decide_what_is_stuck_or_lost(
    spark: Any, traffic: Traffic, tmp_path: Path
) -> None:
    result = audit(spark, traffic.journal, tmp_path, stuck_after=timedelta(hours=1))
    assert result.count("stuck") == 0
    assert result.count("lost") == 0
    assert result.count("duplicate_done") == 1  # a violation has no age


def test_audit_cli_exits_3_on_a_once_only_violation(traffic: Traffic, tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app,
        [
            "analytics",
            "audit",
            "--journal",
            str(traffic.journal),
            "--out",
            str(tmp_path),
            "--stuck-after",
            "0s",
            "--lost-after",
            "0s",
        ],
    )
    assert res.exit_code == 3, res.output
    assert "duplicate_done" in res.output
    assert traffic.ids["o2"][:8] in res.output


def test_latency_per_queue_and_subscriber(spark: Any, traffic: Traffic, tmp_path: Path) -> None:
    result = latency(spark, traffic.journal, tmp_path)
    done = {(r["queue"], r["actor"]): r["done"] for r in result.percentiles}
    assert done == {
        ("orders", "billing"): 5,
        ("orders", "shipping"): 5,
        ("payments", "ledger"): 1,
        ("credit", "approver"): 2,
        ("customers", "crm"): 1,
    }
    for r in result.percentiles:
        assert 0 <= r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] <= r["max_ms"]
    per_hour: dict[tuple[str, str], int] = {}
    for r in result.throughput:
        per_hour[(r["queue"], r["actor"])] = per_hour.get((r["queue"], r["actor"]), 0) + r["done"]
    assert per_hour == done
    states = {(r["queue"], r["actor"], r["state"]) for r in result.states}
    # Time went into waiting (AVAILABLE) and processing (FETCHED); DONE turns JOURNALLED
    # in the same step, so no time is spent in it.
    assert {s for q, a, s in states if (q, a) == ("orders", "billing")} == {"AVAILABLE", "FETCHED"}
    assert result.report is not None
    html = Path(result.report).read_text()
    assert html.count("<svg") == 3
    assert "orders / billing" in html
    for name in ("percentiles", "states", "throughput"):
        assert ds.dataset(str(tmp_path / "latency" / name)).count_rows() > 0


def test_latency_report_goes_where_a_uri_says(spark: Any, traffic: Traffic, tmp_path: Path) -> None:
    result = latency(spark, traffic.journal, f"file://{tmp_path}/remote")
    assert result.report == f"file://{tmp_path}/remote/latency/report.html"
    html = (tmp_path / "remote" / "latency" / "report.html").read_text()
    assert html.count("<svg") == 3


def test_lineage_orphans_and_the_recovery_plan(
    spark: Any, traffic: Traffic, tmp_path: Path
) -> None:
    ids = traffic.ids
    name = {v: k for k, v in ids.items()}
    result = lineage(spark, traffic.journal, tmp_path)
    assert result.edges == 3
    assert result.trees == 3
    assert [name[str(r["msg_id"])] for r in result.orphans] == ["k2"]
    assert result.orphans[0]["parents"] == [ids["c2"]]
    plan = {
        (r["step"], r["action"], r["queue"], name[str(r["msg_id"])], r["actor"])
        for r in result.plan
    }
    assert plan == {
        (3, "withdraw", "customers", "k2", None),
        (3, "release", "credit", "c2", "approver"),
        (3, "reveal", "customers", "k3", None),
        (5, "release", "credit", "c4", "approver"),
    }
    trees = ds.dataset(str(tmp_path / "lineage" / "trees")).to_table().to_pylist()
    assert {(name[r["root"]], name[r["msg_id"]], r["depth"]) for r in trees} == {
        ("c1", "k1", 1),
        ("c2", "k2", 1),
        ("c3", "k3", 1),
    }
    only = lineage(spark, traffic.journal, tmp_path / "b", outbound="orders")
    assert only.plan == []


def test_retention_archives_and_plans_per_rule(
    spark: Any, traffic: Traffic, tmp_path: Path
) -> None:
    ids = traffic.ids
    name = {v: k for k, v in ids.items()}
    # Everything journalled, at once.
    every = retention(spark, traffic.journal, tmp_path / "all", keep=timedelta(0), as_of=_later())
    assert every.per_queue == {"orders": 5, "payments": 1, "credit": 2, "customers": 1}
    # A pattern names several queues; an exact name wins over it; the first pattern wins.
    week = timedelta(days=7)
    by_pattern = retention(
        spark, traffic.journal, tmp_path / "c", rules={"c*": timedelta(0)}, as_of=_later()
    )
    assert by_pattern.per_queue == {"credit": 2, "customers": 1}
    exact = retention(
        spark,
        traffic.journal,
        tmp_path / "e",
        rules={"c*": timedelta(0), "customers": week, "cu?tomers": timedelta(0)},
        as_of=_later(),
    )
    assert exact.per_queue == {"credit": 2}
    first = retention(
        spark,
        traffic.journal,
        tmp_path / "f",
        rules={"cr*": week, "c*": timedelta(0)},
        as_of=_later(),
    )
    assert first.per_queue == {"customers": 1}
    # A week by default, but orders at once: only orders go.
    result = retention(
        spark, traffic.journal, tmp_path, rules={"orders": timedelta(0)}, as_of=_later()
    )
    assert result.per_queue == {"orders": 5}
    assert result.with_payload == 5  # orders retains a copy of each payload
    archive = ds.dataset(str(tmp_path / "retention" / "archive"), partitioning="hive")
    rows = archive.to_table().to_pylist()
    assert {name[r["msg_id"]]: r["payload"] for r in rows} == {
        f"o{i}": f"order {i}".encode() for i in range(1, 6)
    }
    plan = ds.dataset(result.plan).to_table().to_pylist()
    assert sorted(name[r["msg_id"]] for r in plan) == [f"o{i}" for i in range(1, 6)]
    assert {r["store"] for r in plan} == {traffic.url}

    # The plan applied: exactly the archived messages leave the index, the rest stay.
    res = CliRunner().invoke(app, ["--url", traffic.url, "purge", "--from-plan", result.plan])
    assert res.exit_code == 0, res.output
    assert "purged 5 message(s)" in res.output
    with iqbridge.connect(traffic.url) as hub:
        for key in ("o1", "o5"):
            with pytest.raises(MessageNotFound):
                hub.store.load(ids[key])
        assert hub.store.load(ids["p2"]).publisher_state is PublisherState.JOURNALLED
        assert any(e.msg_id == ids["o1"] for e in hub.store.journal(0, 10_000))


def test_spark_submit_runs_a_job(traffic: Traffic, tmp_path: Path) -> None:
    """The entry script runs under spark-submit on its own session."""
    bindir = Path(sys.executable).parent
    entry = Path(__file__).parents[2] / "iqbridge" / "analytics" / "__main__.py"
    proc = subprocess.run(
        [
            str(bindir / "spark-submit"),
            "--master",
            "local[1]",
            str(entry),
            "lineage",
            "--journal",
            str(traffic.journal),
            "--out",
            str(tmp_path),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
        env={
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        },
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "3 parent link(s)" in proc.stdout
    assert (tmp_path / "lineage" / "plan").is_dir()


def test_a_missing_export_is_a_clear_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["analytics", "latency", "--journal", str(tmp_path)])
    assert res.exit_code == 1
    assert "iq journal export" in res.output
