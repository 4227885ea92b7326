"""The user example examples/orders, run as a user would (``pytest examples/orders``) in a
subprocess, on every broker this machine has: the embedded ones, Redis, RabbitMQ,
PostgreSQL and MariaDB through the plugin's IQ_TEST_*_URL variables, Kafka through the
Tansu the plugin starts. It must pass with nothing skipped. CI is passed through, so an
unreachable server fails there; locally an unreachable one is left out, with a warning."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

from conftest import IN_CI, need_server

from tests import sql_helpers
from tests.rabbitmq_helpers import AMQP_URL, rabbitmq_reachable
from tests.redis_index_helpers import REDIS_URL, redis_reachable

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "orders"


def _servers() -> tuple[dict[str, str], list[str]]:
    """The IQ_TEST_*_URL variables of the reachable servers, and the brokers to run."""
    env: dict[str, str] = {}
    brokers = ["sqlite", "memory", "kafka"]
    checks = {
        "redis": ("IQ_TEST_REDIS_URL", REDIS_URL, redis_reachable),
        "rabbitmq": ("IQ_TEST_RABBITMQ_URL", AMQP_URL, rabbitmq_reachable),
        "postgres": (
            "IQ_TEST_POSTGRES_URL",
            sql_helpers.PG_URL,
            lambda: sql_helpers.reachable(sql_helpers.PG_URL),
        ),
        "mariadb": (
            "IQ_TEST_MARIADB_URL",
            sql_helpers.MARIADB_URL,
            lambda: sql_helpers.reachable(sql_helpers.MARIADB_URL),
        ),
    }
    for broker, (var, url, check) in checks.items():
        ok, why = check()
        if not ok:
            if IN_CI:
                need_server(f"{broker} at {url}", ok, why)
            warnings.warn(f"examples/orders runs without {broker}: {why}", stacklevel=1)
            continue
        env[var] = url
        brokers.append(broker)
    if os.environ.get("IQ_KAFKA_URL"):
        env["IQ_TEST_KAFKA_URL"] = os.environ["IQ_KAFKA_URL"]
    return env, brokers


def test_orders_example_passes_on_every_broker_here() -> None:
    env, brokers = _servers()
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("IQ_TEST_")}
    run_env |= env
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rs",
            str(EXAMPLE),
            "--iq-broker",
            ",".join(brokers),
        ],
        cwd=ROOT,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    summary = out.strip().splitlines()[-1]
    assert "skipped" not in summary and "deselected" not in summary, out[-4000:]
    passed = re.search(r"(\d+) passed", summary)
    # One broker-free test, and three tests on each broker.
    assert passed is not None and int(passed.group(1)) == 1 + 3 * len(brokers), out[-4000:]
