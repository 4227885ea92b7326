"""The recovery sweeper applies lapsed leases without any consumer polling."""

from __future__ import annotations

import json
import time
from pathlib import Path

import iqbridge
from iqbridge import SubscriberState
from iqbridge.recovery.sweeper import Sweeper, check_health
from tests.conftest import FakeClock


def test_sweeper_returns_lapsed_leases_on_every_queue(
    sqlite_url: str, clock: FakeClock, tmp_path: Path
) -> None:
    with iqbridge.connect(sqlite_url, clock=clock) as hub:
        ids = {}
        for name in ("a", "b"):
            q = hub.queue(name, lease=5)
            ids[name] = q.put(b"x", to=["s"])
            assert q.get("s") is not None
        health = tmp_path / "sweeper.json"
        sweeper = Sweeper(hub, interval=0.01, health_file=health)
        assert sweeper.sweep().changed == 0  # leases still running
        clock.advance(6)
        result = sweeper.sweep()
        assert (result.queues, result.changed, result.errors) == (2, 2, 0)
        for name, msg_id in ids.items():
            view = hub.queue(name).state(msg_id).subscribers["s"]
            assert view.state is SubscriberState.AVAILABLE
            assert view.attempt == 2
        ok, why = check_health(health)
        assert ok, why
        assert json.loads(health.read_text())["changed"] == 2


def test_background_sweeper_and_health_check(sqlite_url: str, tmp_path: Path) -> None:
    health = tmp_path / "h.json"
    with iqbridge.connect(sqlite_url) as hub:
        hub.queue("q")
        sweeper = Sweeper(hub, interval=0.02, health_file=health)
        sweeper.start()
        deadline = time.monotonic() + 5
        while sweeper.passes < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        sweeper.stop(timeout=5)
        assert sweeper.passes >= 3
    assert check_health(health)[0]
    assert check_health(health, max_age=0.0)[0] is False
    assert check_health(tmp_path / "missing.json") == (
        False,
        f"no health record at {tmp_path / 'missing.json'}: the sweeper never ran there",
    )
