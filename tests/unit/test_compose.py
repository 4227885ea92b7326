"""compose/: every file parses as YAML, every service has a healthcheck and published
ports, all.yaml includes them all, and scripts/compose prints the plugin's URLs (no
Docker engine is needed for any of this)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from iqbridge.testing.servers import COMPOSE_URLS, ENV_VARS, address

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
NAMES = ("redis", "rabbitmq", "kafka", "postgres", "mariadb", "ibmmq", "oracle")


@pytest.mark.parametrize("name", NAMES)
def test_service_file(name: str) -> None:
    doc = yaml.safe_load((COMPOSE / f"{name}.yaml").read_text())
    assert doc["name"] == f"iqbridge-{name}"
    [service] = doc["services"].values()
    assert service["image"]
    assert service["healthcheck"]["test"]
    published = {int(str(p).split(":")[0]) for p in service["ports"]}
    _host, host_port = address(name, COMPOSE_URLS[name])
    assert host_port in published, (host_port, published)


def test_all_includes_every_file() -> None:
    doc = yaml.safe_load((COMPOSE / "all.yaml").read_text())
    assert sorted(doc["include"]) == sorted(f"{n}.yaml" for n in NAMES)
    assert {p.name for p in COMPOSE.glob("*.yaml")} == {"all.yaml", *doc["include"]}


def test_script_env_prints_the_plugin_urls() -> None:
    out = subprocess.run(
        [str(ROOT / "scripts" / "compose"), "env"], capture_output=True, text=True, check=True
    ).stdout
    exports = dict(
        shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in out.splitlines()
    )
    assert exports == {ENV_VARS[n]: COMPOSE_URLS[n] for n in NAMES}


def test_script_rejects_an_unknown_server() -> None:
    proc = subprocess.run(
        [str(ROOT / "scripts" / "compose"), "env", "nosuch"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "unknown server" in proc.stderr
