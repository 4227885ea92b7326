"""The built wheel, installed into a clean virtual environment, is the package users get.

The checkout is copied to a temporary directory first, so the build leaves nothing behind
(no build/ or egg-info in the working tree) and stale build output cannot leak in; pip's
cache lives in the temporary directory too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: What a build needs from the checkout is everything git would track; not these.
_NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
    "*.db",
    "*.db-*",
)

#: Failures of an isolated build that mean the package index cannot be reached.
_NO_INDEX = ("No matching distribution", "Could not find a version", "Failed to establish")

_CHECK = r"""
import importlib.util, json, pathlib, sys
import iqbridge, iqbridge.adapters.sqlite, iqbridge.recovery

pkg = pathlib.Path(iqbridge.__file__).parent
leaked = {}
for name in ("adapters", "recovery"):
    try:
        __import__(name)
    except ModuleNotFoundError:
        continue
    leaked[name] = getattr(sys.modules[name], "__file__", None)

with iqbridge.connect("sqlite:///wheel.db") as hub:
    q = hub.queue("smoke")
    msg_id = q.put({"hello": "wheel"}, to=["s"])
    d = q.get("s", timeout=5)
    payload = d.payload
    d.in_process()
    d.done()
    st = q.state(msg_id)
    again = q.get("s")

print(json.dumps({
    "package": str(pkg),
    "prefix": sys.prefix,
    "py_typed": (pkg / "py.typed").is_file(),
    "adapters_module": iqbridge.adapters.sqlite.__file__,
    "leaked": leaked,
    "payload": payload,
    "subscriber": [h[0].value for h in st.subscribers["s"].history],
    "publisher": st.publisher_state.value,
    "again": again is not None,
}))
"""


def _run(
    cmd: list[str | Path], *, cwd: Path, env: dict[str, str], timeout: float, both: bool = False
) -> str:
    """The command's stdout (and stderr after it with ``both``); AssertionError if it fails."""
    proc = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, cmd))} exited with {proc.returncode}:\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc.stdout + proc.stderr if both else proc.stdout


def _build_wheel(src: Path, outdir: Path, env: dict[str, str]) -> tuple[Path, str, str]:
    """Build with build isolation; without it only if the isolated build cannot reach
    the package index for the build requirements. The wheel, the mode and the output."""
    cmd: list[str | Path] = [sys.executable, "-m", "build", "--wheel", "--outdir", outdir, src]
    try:
        out = _run(cmd, cwd=src, env=env, timeout=240, both=True)
        mode = "isolated"
    except AssertionError as exc:
        if not any(marker in str(exc) for marker in _NO_INDEX):
            raise
        out = _run(
            [*cmd, "--no-isolation", "--skip-dependency-check"],
            cwd=src,
            env=env,
            timeout=240,
            both=True,
        )
        mode = "no-isolation (package index unreachable)"
    wheels = list(outdir.glob("iqbridge-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0], mode, out


def _setuptools_warnings(output: str) -> list[str]:
    """The lines of a build's output where setuptools warns about the project's
    configuration (a deprecated field, a folder it would not ship, ...)."""
    return [
        line.strip()
        for line in output.splitlines()
        if re.search(r"warning|deprecat|would be ignored", line, re.IGNORECASE)
    ]


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_wheel_installs_cleanly_and_works(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=_NOT_SOURCE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PIP_CACHE_DIR"] = str(tmp_path / "pip-cache")

    t0 = time.monotonic()
    wheel, mode, output = _build_wheel(src, tmp_path / "dist", env)
    built = time.monotonic() - t0
    # pip install -e . printed ~100 lines of these (issue 27): the configuration is clean.
    assert _setuptools_warnings(output) == [], output[-6000:]

    # The file list: everything under the one import root, plus the metadata.
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top_level = zf.read(next(n for n in names if n.endswith(".dist-info/top_level.txt")))
    roots = {n.split("/", 1)[0] for n in names} - {"iqbridge"}
    assert len(roots) == 1 and roots.pop().endswith(".dist-info"), f"stray top level: {roots}"
    assert top_level.decode().split() == ["iqbridge"]
    for required in (
        "iqbridge/__init__.py",
        "iqbridge/py.typed",
        "iqbridge/adapters/__init__.py",
        "iqbridge/adapters/sqlite.py",
        "iqbridge/recovery/__init__.py",
        "iqbridge/recovery/crossqueue.py",
        "iqbridge/stores/sqlite.py",
        "iqbridge/admin/templates/message.html",
        "iqbridge/admin/static/admin.css",
    ):
        assert required in names, f"{required} missing from {wheel.name}"
    assert not [n for n in names if n.startswith(("adapters/", "recovery/", "tests/"))]

    # A clean environment: no system site-packages, nothing but the wheel and its deps.
    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(target)
    py = target / "bin" / "python"
    t1 = time.monotonic()
    _run([py, "-m", "pip", "install", "--quiet", wheel], cwd=tmp_path, env=env, timeout=300)
    installed = time.monotonic() - t1
    assert (target / "bin" / "iq").exists(), "the iq console script was not installed"

    # -I: no cwd, no PYTHON* variables, no user site: only what the venv holds.
    work = tmp_path / "run"
    work.mkdir()
    out = _run([py, "-I", "-c", _CHECK], cwd=work, env=env, timeout=60)
    result = json.loads(out.strip().splitlines()[-1])
    assert Path(result["prefix"]) == target
    assert Path(result["package"]).is_relative_to(target), result["package"]
    assert Path(result["adapters_module"]).is_relative_to(Path(result["package"]))
    assert result["py_typed"] is True
    assert result["leaked"] == {}, f"top-level packages leaked into the wheel: {result['leaked']}"
    assert result["payload"] == {"hello": "wheel"}
    assert result["subscriber"] == [
        "AVAILABLE",
        "GET",
        "FETCHED",
        "IN_PROCESS",
        "DONE",
        "JOURNALLED",
    ]
    assert result["publisher"] == "JOURNALLED"
    assert result["again"] is False
    print(
        f"\nwheel {wheel.name} ({wheel.stat().st_size} bytes, {len(names)} files): "
        f"built {mode} in {built:.1f}s, installed into a fresh venv in {installed:.1f}s"
    )
