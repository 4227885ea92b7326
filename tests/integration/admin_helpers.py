"""Shared pieces of the admin server's tests: tokens, a config over given hubs, a
TestClient, the dashboard log-in, and the CLI's one-line error check."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import Result

from iqbridge.admin import AdminConfig, create_app, parse_config

ADMIN_TOKEN = "adm1n-T0ken-6f1c9a2b7d3e4f50aa"
VIEWER_TOKEN = "v1ewer-T0ken-0a9b8c7d6e5f4a3bbb"
ADMIN_ENV = "IQ_TEST_ADMIN_TOKEN"
ENVIRON = {ADMIN_ENV: ADMIN_TOKEN}
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
VIEW = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
#: A password-shaped userinfo on a closed port: the unreachable hub.
DOWN_PASSWORD = "s3cr3t-pw"
DOWN_URL = f"redis://:{DOWN_PASSWORD}@127.0.0.1:1/0"


def admin_config(
    tmp_path: Path,
    hubs: Mapping[str, str],
    bridges: Mapping[str, Path] | None = None,
    failed_logins: str = "1000/minute",
    **extra: Any,
) -> AdminConfig:
    """Tokens ops (admin, from the environment) and viewer (readonly, from a file).
    ``failed_logins`` is generous: the route sweeps present wrong tokens on purpose, from
    the one test client address (test_admin_throttle.py tests the limit). ``extra``:
    more keys of the file (``max_body_bytes``, ``trusted_proxies``...)."""
    secret = tmp_path / "viewer-token"
    secret.write_text(VIEWER_TOKEN + "\n")
    return parse_config(
        {
            "tokens": [
                {"name": "ops", "role": "admin", "env": ADMIN_ENV},
                {"name": "viewer", "role": "readonly", "file": str(secret)},
            ],
            "hubs": [{"name": n, "url": u} for n, u in hubs.items()],
            "bridges": [{"name": n, "health_file": str(p)} for n, p in (bridges or {}).items()],
            "failed_logins": failed_logins,
            **extra,
        }
    )


def make_app(
    tmp_path: Path, hubs: Mapping[str, str], bridges: Mapping[str, Path] | None = None
) -> FastAPI:
    """The admin app over ``hubs``."""
    return create_app(admin_config(tmp_path, hubs, bridges), environ=ENVIRON)


@contextlib.contextmanager
def admin_client(
    tmp_path: Path, hubs: Mapping[str, str], bridges: Mapping[str, Path] | None = None
) -> Iterator[TestClient]:
    """A TestClient of the admin app (its hubs closed afterwards)."""
    with TestClient(make_app(tmp_path, hubs, bridges)) as client:
        yield client


@contextlib.contextmanager
def serving(config: AdminConfig) -> Iterator[str]:
    """The admin app over ``config`` in a real uvicorn server, configured exactly as
    ``iq admin serve`` configures it (:func:`iqbridge.admin.server.server_config`), on a
    free loopback port; yields its base URL."""
    import uvicorn

    from iqbridge.admin.server import server_config

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(config, environ=ENVIRON)
    server = uvicorn.Server(server_config(app, config, host="127.0.0.1", port=port))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def login(client: TestClient, token: str = ADMIN_TOKEN) -> str:
    """Log the client's browser in; the session's CSRF token."""
    r = client.post("/ui/login", data={"token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text
    page = client.get("/ui/")
    assert page.status_code == 200
    m = _CSRF.search(page.text)
    assert m is not None
    return m.group(1)


def detail(client: TestClient, path: str, headers: Mapping[str, str] = AUTH) -> Any:
    """GET a JSON route and return its body (asserting 200)."""
    r = client.get(path, headers=dict(headers))
    assert r.status_code == 200, r.text
    return r.json()


def one_error_line(result: Result, code: int) -> str:
    """The command printed exactly one line on stderr, exited ``code``, no traceback."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("iq: error: ")
    return lines[0]
