"""Every duration a public call takes goes through one check (iqbridge.durations): nan,
infinities, negative values and more than a hundred years (and zero, where zero means
nothing, such as a lease) are InvalidArgument naming the parameter, and nothing changed;
the command line refuses the same values through the same check."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import iqbridge
from iqbridge import Outgoing, RetryPolicy
from iqbridge.aio import AsyncQueue
from iqbridge.bridge import Bridge, check_health, parse_config
from iqbridge.cli import app
from iqbridge.cli.parsing import parse_duration
from iqbridge.durations import MAX_SECONDS, seconds, to_seconds
from iqbridge.errors import ConfigurationError, InvalidArgument, IQError
from iqbridge.outbox import Outbox
from iqbridge.registry import url_number
from iqbridge.relay import Relay
from iqbridge.stores.sql_schema import parse_sql_url
from iqbridge.worker import Worker

NAN, INF = math.nan, math.inf

#: Never a duration: not a number, infinite, negative, or past the bound.
BAD = st.one_of(
    st.sampled_from([NAN, INF, -INF, -1.0, -1e-9, MAX_SECONDS * 2, 1e300]),
    st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False),
    st.floats(min_value=MAX_SECONDS * 1.001, allow_nan=False, allow_infinity=False),
    st.timedeltas(max_value=timedelta(microseconds=-1)),
    st.integers(max_value=-1),
)
#: ... and zero, where the parameter needs more than nothing.
BAD_POSITIVE = st.one_of(BAD, st.sampled_from([0, 0.0, -0.0, timedelta(0)]))


def test_the_check_itself() -> None:
    assert seconds(1.5, "x") == 1.5
    assert seconds(timedelta(minutes=2), "x") == 120.0
    assert seconds(0, "x") == 0.0
    assert seconds(MAX_SECONDS, "x") == MAX_SECONDS
    assert to_seconds(None, "x") is None
    for bad in (NAN, INF, -INF, -1, "30", b"1", True, None, object(), 10**400):
        with pytest.raises(InvalidArgument, match=r"^x must be"):
            seconds(bad, "x")
    with pytest.raises(InvalidArgument, match="more than 0"):
        seconds(0, "x", positive=True)
    assert issubclass(InvalidArgument, IQError) and issubclass(InvalidArgument, ValueError)


class World:
    """A hub with two messages, one of them held, and a snapshot of its whole index."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.hub = iqbridge.connect(f"sqlite:///{tmp / 'iq.db'}")
        self.q = self.hub.queue("orders")
        self.ids = self.q.put_many(["a", "b", "c"], to=["s"])
        held = self.q.get("s")
        batch = self.q.get_many("s", 1)
        assert held is not None and len(batch) == 1
        self.held, self.batch = held, batch

    def snapshot(self) -> tuple[object, ...]:
        states = tuple(self.q.state(m.msg_id) for m in self.q.search(limit=100))
        return (states, len(self.hub.store.journal(0, 100_000)), self.q.counts())

    def close(self) -> None:
        self.hub.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(tmp_path_factory.mktemp("durations"))
    yield w
    w.close()


def _worker(w: World, **kw: Any) -> Worker:
    return Worker(w.q, "s", lambda d: None, **kw)


def _aio(w: World, **kw: Any) -> object:
    return asyncio.run(AsyncQueue(w.q).get("s", **kw))


#: (parameter name, needs more than 0, the call with the value).
CALLS: list[tuple[str, bool, Callable[[World, Any], object]]] = [
    ("timeout", False, lambda w, v: w.q.get("s", timeout=v)),
    ("lease", True, lambda w, v: w.q.get("s", lease=v)),
    ("timeout", False, lambda w, v: w.q.get_many("s", 5, timeout=v)),
    ("lease", True, lambda w, v: w.q.get_many("s", 5, lease=v)),
    ("timeout", False, lambda w, v: _aio(w, timeout=v)),
    ("lease", True, lambda w, v: _aio(w, lease=v)),
    ("ttl", False, lambda w, v: w.q.put("x", to=["s"], ttl=v)),
    ("ttl", False, lambda w, v: w.q.put_many(["x", "y"], to=["s"], ttl=v)),
    ("ttl", False, lambda w, v: w.q.put_each([Outgoing("x", ttl=v)], to=["s"])),
    ("lock_for", False, lambda w, v: w.q.browse(lock=True, lock_for=v)),
    ("delay", False, lambda w, v: w.held.release(delay=v)),
    ("lease", True, lambda w, v: w.held.renew(lease=v)),
    ("delay", False, lambda w, v: w.batch.release(w.batch[0], delay=v)),
    ("lease", True, lambda w, v: w.batch.renew(lease=v)),
    ("older_than", False, lambda w, v: w.q.purge(v)),
    ("lease", True, lambda w, v: w.hub.queue("orders", lease=v)),
    ("sweep_interval", False, lambda w, v: w.hub.queue("orders", sweep_interval=v)),
    ("initial_delay", False, lambda w, v: RetryPolicy(initial_delay=v)),
    ("max_delay", False, lambda w, v: RetryPolicy(max_delay=v)),
    ("lease", True, lambda w, v: _worker(w, lease=v)),
    ("poll", True, lambda w, v: _worker(w, poll=v)),
    ("until_idle", False, lambda w, v: _worker(w).run(until_idle=v)),
    ("timeout", False, lambda w, v: _worker(w).stop(timeout=v)),
    ("max_age", False, lambda w, v: check_health(w.tmp / "none.json", max_age=v)),
]


@pytest.mark.parametrize(
    ("name", "positive", "call"), CALLS, ids=[f"{i}-{c[0]}" for i, c in enumerate(CALLS)]
)
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_bad_duration_is_refused_by_name_and_changes_nothing(
    world: World,
    name: str,
    positive: bool,
    call: Callable[[World, Any], object],
    data: st.DataObject,
) -> None:
    value = data.draw(BAD_POSITIVE if positive else BAD)
    before = world.snapshot()
    with pytest.raises(InvalidArgument) as raised:
        call(world, value)
    assert str(raised.value).startswith(f"{name} must be"), raised.value
    assert world.snapshot() == before


def test_the_relay_and_the_bridge_check_their_durations(tmp_path: Path) -> None:
    with (
        Outbox(f"sqlite:///{tmp_path / 'app.db'}") as outbox,
        iqbridge.connect(f"sqlite:///{tmp_path / 'b.db'}") as hub,
    ):
        for kw in ({"poll": NAN}, {"max_backoff": -1}):
            with pytest.raises(InvalidArgument, match=f"^{next(iter(kw))} must be"):
                Relay(outbox, hub, **kw)
        with pytest.raises(InvalidArgument, match=r"^until_idle must be"):
            Relay(outbox, hub).run(until_idle=INF)
    route: dict[str, Any] = {
        "name": "r",
        "source": {"url": f"sqlite:///{tmp_path / 'in.db'}", "queue": "q"},
        "destination": {"url": f"sqlite:///{tmp_path / 'out.db'}", "queue": "q"},
    }
    conf = {"bridge": {"state": f"sqlite:///{tmp_path / 'state.db'}"}, "routes": [route]}
    bridge = Bridge(parse_config(conf))
    for bad in (NAN, -1, 0, INF):
        with pytest.raises(InvalidArgument, match=r"^duration must be"):
            bridge.run(duration=bad)
    bridge.close()
    wrong: list[tuple[str, object]] = [("lease", NAN), ("lease", 0), ("retry", {"max_delay": INF})]
    for field, value in wrong:
        with pytest.raises(ConfigurationError, match=f"field {field}"):
            parse_config({**conf, "routes": [{**route, field: value}]})


@pytest.mark.parametrize(
    "args",
    [
        ("worker", "orders", "s", "--lease", "0"),
        ("worker", "orders", "s", "--lease", "nan"),
        ("worker", "orders", "s", "--until-idle", "-1"),
        ("worker", "orders", "s", "--until-idle", "inf"),
        ("bridge", "run", "bridge.yaml", "--duration", "-1"),
        ("bridge", "run", "bridge.yaml", "--duration", "nan"),
        ("bridge", "run", "bridge.yaml", "--duration", "0"),
        ("bridge", "run", "bridge.yaml", "--duration", "999999999w"),
        ("bridge", "check", "bridge.yaml", "--max-age", "nan"),
    ],
)
def test_the_command_line_refuses_the_same_values(tmp_path: Path, args: tuple[str, ...]) -> None:
    """A usage error (exit 2, one line) before anything starts: ``--duration -1`` used to
    start the bridge and stop it at once."""
    (tmp_path / "bridge.yaml").write_text("routes: []\n")
    url = f"sqlite:///{tmp_path / 'iq.db'}"
    with iqbridge.connect(url) as hub:
        hub.queue("orders").put("x", to=["s"])
    res = CliRunner().invoke(app, ["--url", url, *args])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and args[-2] in lines[0], res.stderr
    assert "Traceback" not in res.output
    with iqbridge.connect(url) as hub:
        assert hub.queue("orders").counts().subscribers["s"] == {
            iqbridge.SubscriberState.AVAILABLE: 1
        }


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
def test_url_options_in_seconds_refuse_what_is_not_a_duration(tmp_path: Path, value: str) -> None:
    """A configuration error naming the option, not a driver's ValueError or
    OverflowError, nor a timeout of nan handed to the driver."""
    with pytest.raises(ConfigurationError, match="busy_timeout"):
        iqbridge.connect(f"sqlite:///{tmp_path / 'x.db'}?busy_timeout={value}")
    with pytest.raises(ConfigurationError, match="pool_size"):
        parse_sql_url(f"postgresql://u@h/db?pool_size={value}")
    with pytest.raises(ConfigurationError, match="confirm_timeout"):
        url_number({"confirm_timeout": value}, "confirm_timeout", 5.0, url="RabbitMQ URL x")


def test_the_command_line_durations() -> None:
    assert [parse_duration(t, "--x") for t in ("30", ".5", "5.", "500ms", "15m", "2h")] == [
        30.0,
        0.5,
        5.0,
        0.5,
        900.0,
        7200.0,
    ]
    for text, positive in (("0", True), ("0s", True), ("999999999w", False), ("-1", False)):
        with pytest.raises(typer.BadParameter, match=r"must be|not a duration") as raised:
            parse_duration(text, "--x", positive=positive)
        assert raised.value.param_hint == "--x"
