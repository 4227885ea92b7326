"""The bridge over the embedded SQLite queue (no server): order per key with 4 workers,
parents and lineage, a poison message that holds back only its own key, a clean stop
that leaves nothing in doubt, route leases between two bridge processes, aggregation
that survives a restart and fires its timeouts after one, its budget, the health check,
and the ``iq bridge`` / ``iq lineage`` commands."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import iqbridge
from iqbridge import Filter, Outgoing, SubscriberState
from iqbridge.bridge import Bridge, BridgeMessage, Lineage, check_health, child_id, parse_config
from iqbridge.cli import app

S = SubscriberState


def _config(tmp: Path, **route: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "r",
        "source": {"url": f"sqlite:///{tmp}/in.db", "queue": "orders"},
        "destination": {"url": f"sqlite:///{tmp}/out.db", "queue": "orders"},
        "workers": 4,
        "batch": 50,
        "lease": 10,
        "retry": {"max_attempts": 3, "initial_delay": 0.05, "max_delay": 0.2},
    }
    body.update(route)
    return {
        "bridge": {
            "name": "t",
            "state": f"sqlite:///{tmp}/state.db",
            "health_file": str(tmp / "health.json"),
            "heartbeat": 0.1,
        },
        "routes": [body],
    }


@pytest.fixture
def hubs(tmp_path: Path) -> Iterator[tuple[iqbridge.Hub, iqbridge.Hub]]:
    with (
        iqbridge.connect(f"sqlite:///{tmp_path}/in.db") as src,
        iqbridge.connect(f"sqlite:///{tmp_path}/out.db") as dst,
    ):
        src.queue("orders").subscribe("bridge")
        dst.queue("orders").subscribe("sink")
        yield src, dst


def _put(src: iqbridge.Hub, n: int, keys: int = 7, start: int = 0) -> list[str]:
    return src.queue("orders").put_each(
        [
            Outgoing(
                {"i": i, "k": f"k{i % keys}"},
                ordering_key=f"k{i % keys}",
                correlation_id=f"g{i // 3}",
            )
            for i in range(start, start + n)
        ]
    )


def _drain(dst: iqbridge.Hub, want: int, timeout: float = 30.0) -> list[Any]:
    q = dst.queue("orders")
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        batch = q.get_many("sink", 500, timeout=0.5)
        got += list(batch)
        batch.done()
    return got


def _wait(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_four_workers_keep_each_key_in_order_and_record_parents(tmp_path: Path, hubs: Any) -> None:
    src, dst = hubs
    ids = _put(src, 700)
    with Bridge(parse_config(_config(tmp_path))) as bridge:
        got = _drain(dst, 700)
        # The children land before their sources settle: the counter follows the settle.
        _wait(lambda: bridge.stats()[0].bridged == 700)
    last: dict[str, int] = {}
    for d in got:
        k, i = d.payload["k"], d.payload["i"]
        assert last.get(k, -1) < i, f"key {k}: {i} after {last[k]}"
        last[k] = i
        assert d.parents == (ids[i],) and d.msg_id == child_id("r", (ids[i],), 0)
        assert d.publisher == "bridge.r"
    assert len({d.payload["i"] for d in got}) == 700
    done = src.queue("orders").search(Filter(state=S.JOURNALLED, subscriber="bridge", limit=1000))
    assert len(done) == 700


# A transform that fails for one message until told otherwise (see the poison test).
FAIL: set[int] = set()


def poison(msg: BridgeMessage) -> object:
    if msg.payload["i"] in FAIL:
        raise ValueError(f"cannot translate {msg.payload['i']}")
    return msg.payload


def test_a_poison_message_holds_back_only_its_key_and_goes_unusable(
    tmp_path: Path, hubs: Any
) -> None:
    src, dst = hubs
    FAIL.clear()
    FAIL.add(0)  # k0's first message
    ids = _put(src, 70)
    cfg = _config(
        tmp_path,
        transform=f"{__name__}:poison",
        retry={"max_attempts": 4, "initial_delay": 0.3, "multiplier": 1},
    )
    with Bridge(parse_config(cfg)) as bridge:
        early = _drain(dst, 60, timeout=0.9)  # before the poison's retries are used up
        keys_early = {d.payload["k"] for d in early}
        assert "k0" not in keys_early and len(early) == 60  # every other key went on
        late = _drain(dst, 9)
        _wait(lambda: bridge.stats()[0].unusable == 1)  # counted once its source settles
        stats = bridge.stats()[0]
    assert [d.payload["i"] for d in late] == list(range(7, 70, 7))  # k0's rest, in order
    assert stats.unusable == 1 and stats.retried == 3
    state = src.queue("orders").state(ids[0])
    assert state.subscribers["bridge"].state is S.JOURNALLED
    assert state.subscribers["bridge"].history[-2][0] is S.UNUSABLE
    FAIL.clear()


def test_stop_finishes_in_flight_work_and_leaves_nothing_in_doubt(
    tmp_path: Path, hubs: Any
) -> None:
    src, _dst = hubs
    FAIL.clear()
    FAIL.add(3)  # parked for a retry when the stop comes: given back, not left in doubt
    _put(src, 400)
    cfg = _config(
        tmp_path, transform=f"{__name__}:poison", retry={"max_attempts": 9, "initial_delay": 5}
    )
    bridge = Bridge(parse_config(cfg))
    bridge.start()
    _wait(lambda: bridge.stats()[0].retried >= 1)
    bridge.stop()
    assert bridge.join(20)
    bridge.close()
    q = src.queue("orders")
    for state in (S.FETCHED, S.IN_PROCESS):
        assert q.search(Filter(state=state, subscriber="bridge")) == []
    assert len(q.search(Filter(state=S.AVAILABLE, subscriber="bridge", limit=1000))) >= 1
    FAIL.clear()


def test_one_process_holds_a_route_and_a_standby_takes_over(tmp_path: Path, hubs: Any) -> None:
    src, dst = hubs
    cfg = parse_config(_config(tmp_path))
    first, second = Bridge(cfg), Bridge(cfg)
    first.start()
    _wait(lambda: first.stats()[0].active)
    second.start()
    time.sleep(0.5)
    assert not second.stats()[0].active
    _put(src, 50)
    assert len(_drain(dst, 50)) == 50
    first.stop()
    assert first.join(10)
    first.close()
    _wait(lambda: second.stats()[0].active, timeout=5)  # released: no lease to wait out
    _put(src, 50, start=50)
    assert len(_drain(dst, 50)) == 50
    second.stop()
    assert second.join(10)
    second.close()


def test_aggregation_completes_on_count_and_on_timeout_after_a_restart(
    tmp_path: Path, hubs: Any
) -> None:
    src, dst = hubs
    cfg = parse_config(_config(tmp_path, correlate={"count": 3, "timeout": 1.5}))
    ids = _put(src, 8)  # groups g0, g1 complete (3 each); g2 has 2 of 3
    bridge = Bridge(cfg)
    bridge.start()
    first = _drain(dst, 2)
    _wait(lambda: bridge.stats()[0].read == 8)
    bridge.stop()
    assert bridge.join(10)
    bridge.close()
    # Each aggregate holds its group's inputs in the order they reached the bridge.
    groups = sorted(sorted(p["i"] for p in json.loads(d.body)) for d in first)
    assert groups == [[0, 1, 2], [3, 4, 5]]
    for d in first:
        g = json.loads(d.body)[0]["i"] // 3
        assert sorted(d.parents) == sorted(ids[g * 3 : g * 3 + 3]) and d.correlation_id == f"g{g}"
        assert d.headers["iq-aggregate"] == "complete"
    # g2 waits in the index; a new bridge process reads it back and times it out.
    with Bridge(cfg) as again:
        [late] = _drain(dst, 1, timeout=10)
        assert again.stats()[0].groups == 0
    assert sorted(p["i"] for p in json.loads(late.body)) == [6, 7]
    assert late.headers["iq-aggregate"] == "timeout" and sorted(late.parents) == sorted(ids[6:8])


def test_the_aggregation_budget_completes_the_oldest_group_early(tmp_path: Path, hubs: Any) -> None:
    src, dst = hubs
    cfg = parse_config(_config(tmp_path, workers=1, correlate={"count": 3, "max_groups": 2}))
    src.queue("orders").put_each([Outgoing({"i": i}, correlation_id=f"g{i}") for i in range(3)])
    with Bridge(cfg) as bridge:
        [early] = _drain(dst, 1)
        assert bridge.stats()[0].groups == 2
    assert early.correlation_id == "g0" and early.headers["iq-aggregate"] == "budget"


def test_lineage_and_the_commands(tmp_path: Path, hubs: Any) -> None:
    src, dst = hubs
    [root] = _put(src, 1)
    conf = _config(tmp_path)
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(conf))
    runner = CliRunner()
    out = runner.invoke(app, ["bridge", "run", str(path), "--duration", "2", "--no-live"])
    assert out.exit_code == 0, out.output
    assert "1 messages bridged" in out.output
    kid = child_id("r", (root,), 0)
    finder = Lineage([("in", src), ("out", dst)], parse_config(conf).routes)
    [tree] = finder.tree(kid)  # asked from the child: the tree starts at its root
    assert tree.msg_id == root and [c.msg_id for c in tree.children] == [kid]
    assert tree.children[0].queue == "orders" and tree.subscribers == {"bridge": "JOURNALLED"}
    shown = runner.invoke(app, ["lineage", kid, "--config", str(path)])
    assert shown.exit_code == 0, shown.output
    assert root in shown.output and kid in shown.output
    live = runner.invoke(app, ["bridge", "run", str(path), "--duration", "1", "--live"])
    assert live.exit_code == 0, live.output
    assert "bridge t" in live.output and "standby" not in live.output  # the live table
    checked = runner.invoke(app, ["bridge", "check", str(path), "--max-age", "60"])
    assert checked.exit_code == 1 and "stopping" in checked.output  # it stopped cleanly
    (tmp_path / "health.json").unlink()
    gone = runner.invoke(app, ["bridge", "check", str(path)])
    assert gone.exit_code == 1 and "no health record" in gone.output


def test_check_says_alive_while_the_bridge_runs(tmp_path: Path, hubs: Any) -> None:
    with Bridge(parse_config(_config(tmp_path))) as bridge:
        stopper = threading.Thread(target=lambda: bridge.run(duration=3, handle_signals=False))
        stopper.start()
        _wait((tmp_path / "health.json").exists)
        time.sleep(0.3)
        ok, why = check_health(tmp_path / "health.json", max_age=5)
        assert ok, why
        assert "1 route(s), 1 active here" in why
        stopper.join()


def test_a_poison_route_holds_back_no_other_route(tmp_path: Path, hubs: Any) -> None:
    src, dst = hubs
    FAIL.clear()
    FAIL.update(range(20))  # every message of route "bad" fails
    src.queue("other").subscribe("bridge")
    cfg = _config(tmp_path, transform=f"{__name__}:poison", retry={"max_attempts": 50})
    good = dict(cfg["routes"][0], name="good", transform=None)
    good["source"] = dict(good["source"], queue="other")
    cfg["routes"].append(good)
    _put(src, 20)
    src.queue("other").put_each([Outgoing({"i": i, "k": "x"}) for i in range(30)])
    with Bridge(parse_config(cfg)) as bridge:
        got = _drain(dst, 30)
        _wait(lambda: bridge.stats()[1].bridged == 30)  # counted once the sources settle
        by = {s.name: s for s in bridge.stats()}
    assert sorted(d.payload["i"] for d in got) == list(range(30))
    assert by["good"].bridged == 30 and by["r"].bridged == 0 and by["r"].retried >= 7
    FAIL.clear()


def test_sigterm_on_the_command_stops_cleanly_and_leaves_nothing_in_doubt(
    tmp_path: Path, hubs: Any
) -> None:
    import signal
    import subprocess
    import sys

    src, dst = hubs
    _put(src, 3000)
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(_config(tmp_path)))
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("iq")), "bridge", "run", str(path), "--no-live"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait(lambda: len(dst.queue("orders").search(Filter(limit=5))) >= 1, timeout=30)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "stopped:" in out
    q = src.queue("orders")
    for state in (S.FETCHED, S.IN_PROCESS):
        assert q.search(Filter(state=state, subscriber="bridge")) == []
    bridged = int(out.split("stopped:")[1].split()[0])
    assert len(q.search(Filter(state=S.JOURNALLED, subscriber="bridge", limit=5000))) == bridged
