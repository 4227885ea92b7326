"""The pytest plugin iqbridge ships (iqbridge.testing.plugin), run through pytester on
small generated test files: fixtures, the unreachable-broker skip and its CI=true
failure, iq_broker's parametrization and the markers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from iqbridge.testing import FakeClock, plugin
from iqbridge.testing.plugin import HubFactory
from iqbridge.testing.servers import ENV_VARS, free_port

pytest_plugins = ["pytester"]

SAMPLE = """
import iqbridge

def test_sqlite(iq_hub, iq_fake_clock):
    hub = iq_hub("sqlite", clock=iq_fake_clock)
    q = hub.queue("orders")
    msg_id = q.put({"n": 1}, to=["billing"], ttl=60)
    iq_fake_clock.advance(61)
    assert q.get("billing") is None  # the fake clock expired it
    history = [s.name for s, _ in q.state(msg_id).subscribers["billing"].history]
    assert "EXPIRED" in history

def test_sqlite_names_differ(iq_hub):
    a, b = iq_hub("sqlite"), iq_hub("sqlite")
    a.queue("q").put(1, to=["s"])
    assert b.queue("q").get("s") is None

def test_memory(iq_memory_hub):
    q = iq_memory_hub.queue("q")
    q.put("x", to=["s"])
    with q.get("s") as d:
        assert d.payload == "x"

def test_redis_away(iq_hub):
    iq_hub("redis")
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """pytest in-process on the generated files (iqbridge is imported already here)."""
    return pytester.runpytest(
        "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args
    )


@pytest.fixture
def closed_redis(monkeypatch: pytest.MonkeyPatch) -> str:
    """IQ_TEST_REDIS_URL on a port nothing listens on; no CI, no compose."""
    for var in (*ENV_VARS.values(), "CI", "IQ_TEST_COMPOSE"):
        monkeypatch.delenv(var, raising=False)
    url = f"redis://127.0.0.1:{free_port()}/0"
    monkeypatch.setenv("IQ_TEST_REDIS_URL", url)
    return url


def test_fixtures_pass_and_unreachable_broker_skips(
    pytester: pytest.Pytester, closed_redis: str
) -> None:
    pytester.makepyfile(test_sample=SAMPLE)
    result = run(pytester, "-rs")
    result.assert_outcomes(passed=3, skipped=1)
    port = closed_redis.rsplit(":", 1)[1].split("/", 1)[0]
    result.stdout.fnmatch_lines([f"*redis*not reachable*nothing listens at 127.0.0.1:{port}*"])


def test_unreachable_broker_fails_under_ci(
    pytester: pytest.Pytester, closed_redis: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    del closed_redis
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(test_sample=SAMPLE)
    result = run(pytester)
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*CI=true: broker tests may not be skipped*"])


def test_iq_broker_parametrizes_and_marks(pytester: pytest.Pytester, closed_redis: str) -> None:
    del closed_redis
    pytester.makepyfile(
        test_param="""
import pytest

def test_each(iq_hub, iq_broker):
    hub = iq_hub(iq_broker)
    hub.queue("q").put(1, to=["s"])

@pytest.mark.iq_kafka
def test_kafka_only():
    pass
"""
    )
    result = run(pytester, "--iq-broker", "sqlite,memory")
    result.assert_outcomes(passed=2, deselected=1)
    result = run(pytester, "--iq-broker", "redis", "-rs")
    result.assert_outcomes(passed=0, skipped=1, deselected=1)
    result = run(pytester, "-m", "iq_redis", "--co", "-q")
    result.stdout.fnmatch_lines(["*test_each?redis?*"])
    result = run(pytester, "--iq-broker", "nosuch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_markers_registered(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.iq_redis:*", "@pytest.mark.iq_oracle:*"])


def test_plugin_loads_light_and_names_start_with_iq() -> None:
    code = (
        "import sys, iqbridge.testing.plugin\n"
        "heavy = ['redis', 'pika', 'confluent_kafka', 'sqlalchemy', 'testcontainers', 'docker']\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
    fixtures = [
        name
        for name, obj in vars(plugin).items()
        if hasattr(obj, "_fixture_function_marker")
        or type(obj).__name__ == "FixtureFunctionDefinition"
    ]
    assert fixtures and all(name.startswith("iq_") for name in fixtures), fixtures
    assert all(name.startswith("iq_") for name in plugin.MARKERS)


def test_docs_examples_run_through_the_plugin(pytester: pytest.Pytester, closed_redis: str) -> None:
    """docs/testing.md's python blocks, as a test file: they pass on sqlite and memory."""
    del closed_redis
    from tests.unit.test_docs import ROOT, blocks

    text = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    code = "\n\n".join(b.code for b in blocks(text) if b.lang == "python")
    pytester.makepyfile(test_docs_testing=code)
    result = run(pytester, "--iq-broker", "sqlite,memory")
    result.assert_outcomes(passed=4, deselected=1)


def test_the_plugin_loads_in_this_suite(iq_hub: HubFactory, iq_fake_clock: FakeClock) -> None:
    """iqbridge's own suite has the plugin too (entry point), beside its own fixtures."""
    hub = iq_hub("sqlite", clock=iq_fake_clock, publisher="plugin-test")
    q = hub.queue("q")
    msg_id = q.put("x", to=["s"], ttl=10)
    iq_fake_clock.advance(11)
    assert q.get("s") is None
    assert q.state(msg_id).publisher == "plugin-test"


def test_docker_only_brokers_skip_with_the_reason_even_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    from iqbridge.testing.servers import docker_missing

    if docker_missing() is None:
        pytest.skip("a Docker engine answers here: the containers would start")
    for var in (*ENV_VARS.values(), "IQ_TEST_COMPOSE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(
        test_live="""
def test_ibmmq(iq_hub):
    iq_hub("ibmmq")

def test_oracle(iq_hub):
    iq_hub("oracle")
"""
    )
    result = run(pytester, "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*ibmmq*no Docker engine answers*runs where Docker does*"])
