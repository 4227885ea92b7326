"""``iq relay``: the outbox relay from the command line, on SQLite files."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner, Result

import iqbridge
from iqbridge.cli import app
from iqbridge.outbox import Outbox, OutboxCounts

IQ = Path(sys.executable).with_name("iq")


@pytest.fixture
def app_db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'app.db'}"


@pytest.fixture
def broker(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'broker.db'}"


def fill(url: str, count: int, *, queue: str = "orders") -> list[str]:
    with Outbox(url) as outbox, outbox.engine.begin() as conn:
        return [outbox.put(conn, queue, {"n": n}, to=["billing"]) for n in range(count)]


def relay(*args: str) -> Result:
    return CliRunner().invoke(app, ["relay", *args])


def test_once_relays_everything_pending(app_db: str, broker: str) -> None:
    ids = fill(app_db, 250)
    result = relay("--outbox", app_db, "--url", broker, "--batch", "40", "--once")
    assert result.exit_code == 0, result.output
    assert "relayed 250 row(s), parked 0" in result.stdout
    with iqbridge.connect(broker) as hub:
        assert [m.msg_id for m in hub.queue("orders").search(limit=1000)] == ids
    with Outbox(app_db) as outbox:
        assert outbox.counts() == OutboxCounts(pending=0, relayed=250, parked=0)


def test_the_global_url_is_the_default_broker(app_db: str, broker: str) -> None:
    fill(app_db, 3)
    result = CliRunner().invoke(app, ["--url", broker, "relay", "--outbox", app_db, "--once"])
    assert result.exit_code == 0, result.output
    with iqbridge.connect(broker) as hub:
        assert len(hub.queue("orders").search()) == 3


def test_parked_rows_are_one_line_each_and_retried(app_db: str, broker: str) -> None:
    [msg_id] = fill(app_db, 1, queue="nobody")  # nobody subscribed: to= names billing
    with Outbox(app_db) as outbox, outbox.engine.begin() as conn:
        conn.execute(sa.update(outbox.table).values(audience=None))
    result = relay("--outbox", app_db, "--url", broker, "--once")
    assert result.exit_code == 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith(f"iq: parked: outbox row 1 (msg_id {msg_id})")
    assert "AudienceError" in lines[0] and "--retry-parked" in lines[0]
    assert lines[1] == "1 row(s) parked (see above): fix them, then iq relay --retry-parked"
    with iqbridge.connect(broker) as hub:
        hub.queue("nobody").subscribe("late")
    result = relay("--outbox", app_db, "--url", broker, "--once", "--retry-parked")
    assert result.exit_code == 0, result.output
    assert "relayed 1 row(s), parked 0" in result.stdout
    with iqbridge.connect(broker) as hub:
        assert hub.queue("nobody").get("late") is not None


def test_an_unreachable_outbox_is_one_line_without_the_password(broker: str) -> None:
    result = relay("--outbox", "postgresql://app:s3cret@127.0.0.1:1/shop", "--url", broker)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("iq: error: outbox database postgresql+psycopg://app:***@")
    assert "s3cret" not in result.output and "Traceback" not in result.output


def test_bad_usage_exits_2(app_db: str) -> None:
    assert relay("--outbox", app_db, "--batch", "0").exit_code == 2
    assert relay("--outbox", app_db, "--poll", "soon").exit_code == 2
    assert relay().exit_code == 2  # --outbox is required


@pytest.mark.skipif(not IQ.exists(), reason="the iq entry point is not installed")
def test_sigterm_stops_after_the_round(app_db: str, broker: str, tmp_path: Path) -> None:
    fill(app_db, 20)
    proc = subprocess.Popen(
        [str(IQ), "relay", "--outbox", app_db, "--url", broker, "--poll", "50ms"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        with Outbox(app_db) as outbox:
            deadline = time.monotonic() + 30
            while outbox.counts().relayed < 20 and time.monotonic() < deadline:
                time.sleep(0.05)
            fill(app_db, 5)  # the running relay picks these up too
            while outbox.counts().relayed < 25 and time.monotonic() < deadline:
                time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "relayed 25 row(s), parked 0" in out


def test_until_idle_exits_after_relaying(app_db: str, broker: str) -> None:
    fill(app_db, 7)
    result = relay("--outbox", app_db, "--url", broker, "--until-idle", "100ms", "--poll", "10ms")
    assert result.exit_code == 0, result.output
    assert "relayed 7 row(s), parked 0" in result.stdout
