"""A secret given as a URL option (``kafka://...?sasl.password=...``) never shows, end to
end: not in the ``iq`` command's output and log lines, not in the admin API or the
dashboard (read-only token included) or the server's log, not in the metrics' log lines
or labels, not in a bridge's health record."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from iqbridge.bridge import Bridge, parse_config
from iqbridge.observability.metrics import IQCollector, render
from tests.integration.admin_helpers import VIEW, VIEWER_TOKEN, admin_client, login

SECRET = "S3CRETXYZ"
IQ = Path(sys.executable).with_name("iq")
#: The issue's URL, with the adapter's own bound on the unreachable wait.
KAFKA_URL = (
    f"kafka://127.0.0.1:1?sasl.password={SECRET}&sasl.username=u"
    "&security.protocol=SASL_PLAINTEXT&sasl.mechanism=PLAIN&connect_timeout=0.5"
)
KAFKA_SHOWN = KAFKA_URL.replace(SECRET, "***")


@pytest.mark.parametrize("debug", [[], ["--debug"]], ids=["plain", "debug"])
def test_iq_put_to_an_unreachable_kafka_never_prints_the_password(
    tmp_path: Path, debug: list[str]
) -> None:
    proc = subprocess.run(
        [str(IQ), *debug, "--url", KAFKA_URL, "put", "q", "hi", "--to", "a"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    # The error line names the URL, with the password masked and every other option
    # readable (and an unreachable Kafka says so once: no librdkafka lines besides).
    assert f"iq: error: cannot reach Kafka at {KAFKA_SHOWN} (" in proc.stderr
    assert SECRET not in proc.stdout + proc.stderr


def test_admin_hubs_dashboard_and_server_log_never_show_the_password(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with admin_client(tmp_path, {"stream": KAFKA_URL}) as client:
        r = client.get("/api/hubs", headers=VIEW)  # a read-only token
        assert r.status_code == 200, r.text
        [hub] = r.json()
        assert hub["name"] == "stream" and hub["available"] is False
        assert hub["url"] == KAFKA_SHOWN
        assert SECRET not in r.text
        login(client, VIEWER_TOKEN)
        page = client.get("/ui/")
        assert page.status_code == 200
        assert "sasl.password=***" in page.text and SECRET not in page.text
    lines = [rec.getMessage() for rec in caplog.records]
    assert any(f"cannot reach Kafka at {KAFKA_SHOWN}" in m for m in lines), lines
    assert not [m for m in lines if SECRET in m]
    assert SECRET not in caplog.text


def test_metrics_log_lines_and_labels_never_show_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="iqbridge.metrics")
    # Opening it fails at once (Redis takes no password= option), naming the URL twice.
    collector = IQCollector({"down": f"redis://127.0.0.1:1/0?password={SECRET}"})
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        body, _ = render(registry)
    finally:
        collector.close()
    assert b'iqbridge_hub_up{hub="down"} 0.0' in body
    assert SECRET.encode() not in body
    assert "(redis://127.0.0.1:1/0?password=***) not scraped" in caplog.text
    assert SECRET not in caplog.text


def _bridge_config(tmp: Path) -> dict[str, Any]:
    return {
        "bridge": {
            "name": "t",
            "state": f"sqlite:///{tmp}/state.db",
            "health_file": str(tmp / "health.json"),
            "heartbeat": 0.05,
        },
        "routes": [
            {
                "name": "r",
                "source": {"url": f"sqlite:///{tmp}/in.db", "queue": "orders"},
                "destination": {"url": f"sqlite:///{tmp}/out.db", "queue": "orders"},
            }
        ],
    }


def test_health_record_never_quotes_the_password(tmp_path: Path) -> None:
    bridge = Bridge(parse_config(_bridge_config(tmp_path)))
    # A route stopped by an error that quotes a URL (a driver echoing its connection
    # string, or an adapter naming its broker).
    bridge.routes[0].fail(f"lane 0: BrokerUnavailable: cannot reach Kafka at {KAFKA_URL}")
    bridge.run(duration=0.3, handle_signals=False)
    text = (tmp_path / "health.json").read_text()
    route = json.loads(text)["routes"]["r"]
    assert route["failed"] == f"lane 0: BrokerUnavailable: cannot reach Kafka at {KAFKA_SHOWN}"
    assert route["last_error"] == route["failed"]
    assert SECRET not in text
