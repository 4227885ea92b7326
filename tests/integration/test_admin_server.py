"""The admin server as ``iq admin serve`` runs it: a real uvicorn server configured by
:func:`iqbridge.admin.server.server_config`, over real sockets. A stranger's big body
is refused before it is read; X-Forwarded-For is believed only from a configured proxy,
so the wrong-token limit cannot be dodged; the access log never shows a credential
passed in a query string."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from iqbridge.admin.server import scrub_target
from tests.integration.admin_helpers import (
    ADMIN_TOKEN,
    AUTH,
    VIEWER_TOKEN,
    admin_config,
    serving,
)

pytestmark = pytest.mark.timeout(120)

WRONG = {"Authorization": "Bearer not-the-token-0000000000000"}
REDRIVE = "/api/hubs/local/queues/q/redrive"


def _answer(base: str, head: str, body: bytes = b"", timeout: float = 10.0) -> tuple[int, str]:
    """Send a request head (and the first bytes of its body) on a fresh connection and
    return the status and body of the answer; the rest of the body is never sent, so
    only a server that answers without reading it answers at all."""
    where = urlsplit(base)
    with socket.create_connection((where.hostname, where.port), timeout=timeout) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed without an answer: {data!r}"
            data += chunk
        top, _, rest = data.partition(b"\r\n\r\n")
        lines = top.decode("latin-1").split("\r\n")
        length = next(
            int(v) for k, _, v in (h.partition(": ") for h in lines[1:]) if k == "content-length"
        )
        while len(rest) < length:
            chunk = sock.recv(65536)
            assert chunk
            rest += chunk
    return int(lines[0].split()[1]), rest.decode()


# --- defect 19: the token before the body, and a bounded body ------------------------------


def test_a_strangers_huge_body_is_refused_unread_and_a_callers_is_413(tmp_path: Path) -> None:
    config = admin_config(tmp_path, {"local": "memory://"}, max_body_bytes=1024)
    head = (
        f"POST {REDRIVE} HTTP/1.1\nHost: x\nContent-Type: application/json\n"
        "Content-Length: 200000000\n{auth}"
    )
    with serving(config) as base:
        started = time.monotonic()
        status, body = _answer(base, head.format(auth=""), b'{"subscriber": "')
        assert status == 401, body
        assert json.loads(body)["error"] == "unauthorized"
        wrong = head.format(auth=f"Authorization: {WRONG['Authorization']}\n")
        assert _answer(base, wrong, b"{")[0] == 401
        status, body = _answer(base, head.format(auth=f"Authorization: {AUTH['Authorization']}\n"))
        assert status == 413, body
        assert json.loads(body)["error"] == "payload_too_large"
        assert "1024 bytes" in json.loads(body)["detail"]
        assert time.monotonic() - started < 10  # answered at once, never waiting for 200 MB

        # No Content-Length: the streamed body is counted as it comes.
        chunked = (
            f"POST {REDRIVE} HTTP/1.1\nHost: x\nContent-Type: application/json\n"
            f"Transfer-Encoding: chunked\nAuthorization: {AUTH['Authorization']}\n"
        )
        piece = b"400\r\n" + b" " * 1024 + b"\r\n"
        status, body = _answer(base, chunked, piece * 3)
        assert status == 413, body
        assert json.loads(body)["error"] == "payload_too_large"

        # Under the limit, the same route works.
        r = httpx.post(base + REDRIVE, json={"subscriber": "billing"}, headers=AUTH)
        assert r.status_code in (200, 404), r.text  # the queue is unknown: 404, not 413


# --- defect 20: X-Forwarded-For is believed only from a configured proxy ---------------


def test_spoofed_forwarded_for_does_not_escape_the_wrong_token_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # uvicorn would believe this variable; iq admin serve never does.
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")
    config = admin_config(tmp_path, {"local": "memory://"}, failed_logins="3/minute")
    assert config.trusted_proxies == []
    with serving(config) as base, httpx.Client(base_url=base) as client:
        for _ in range(3):
            assert client.get("/api/hubs", headers=WRONG).status_code == 401
        for i in range(10):
            spoof = {"X-Forwarded-For": f"198.51.100.{i}"}
            r = client.get("/api/hubs", headers={**WRONG, **spoof})
            assert r.status_code == 429, (i, r.text)
            assert "127.0.0.1" in r.json()["detail"]  # counted against the real peer
        r = client.get("/api/hubs", headers={**AUTH, "X-Forwarded-For": "203.0.113.7"})
        assert r.status_code == 429, r.text
        assert int(r.headers["Retry-After"]) >= 1
        login = client.post(
            "/ui/login", data={"token": ADMIN_TOKEN}, headers={"X-Forwarded-For": "203.0.113.8"}
        )
        assert login.status_code == 429


def test_a_named_proxy_is_believed(tmp_path: Path) -> None:
    """With the proxy named in trusted_proxies, each client behind it has its own count."""
    config = admin_config(
        tmp_path, {"local": "memory://"}, failed_logins="2/minute", trusted_proxies=["127.0.0.1"]
    )
    with serving(config) as base, httpx.Client(base_url=base) as client:
        first = {"X-Forwarded-For": "198.51.100.1"}
        for _ in range(2):
            assert client.get("/api/hubs", headers={**WRONG, **first}).status_code == 401
        r = client.get("/api/hubs", headers={**WRONG, **first})
        assert r.status_code == 429 and "198.51.100.1" in r.json()["detail"]
        other = {"X-Forwarded-For": "198.51.100.2"}
        assert client.get("/api/hubs", headers={**AUTH, **other}).status_code == 200


# --- defect 21: no credential from a query string in the access log --------------------


def test_query_string_credentials_never_reach_the_access_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lines uvicorn's access handler writes, as configured by iq admin serve."""
    config = admin_config(tmp_path, {"local": "memory://"})
    secrets = [ADMIN_TOKEN, VIEWER_TOKEN, "pa55-w0rd-in-a-query", "k3y-in-a-query"]
    with serving(config) as base, httpx.Client(base_url=base) as client:
        queries = [
            f"/api/hubs?token={ADMIN_TOKEN}&limit=5",
            f"/api/hubs?Access_Token={VIEWER_TOKEN}",
            "/api/hubs/local/queues?x=1&API_KEY=k3y-in-a-query",
            "/ui/login?password=pa55-w0rd-in-a-query",
            f"/metrics?au%74h={ADMIN_TOKEN}",
        ]
        for target in queries:
            assert client.get(target).status_code in (200, 401)
        assert client.get("/health?probe=1").status_code == 200
    out = capsys.readouterr()
    logged = out.out + out.err
    lines = [line for line in logged.splitlines() if '"GET ' in line]
    assert len(lines) == len(queries) + 1, logged
    for secret in secrets:
        assert not [line for line in lines if secret in line], secret
    assert "/api/hubs?token=***&limit=5" in lines[0]
    assert "/api/hubs/local/queues?x=1&API_KEY=***" in lines[2]
    assert "/health?probe=1" in lines[-1]  # other parameters are kept


@pytest.mark.parametrize(
    ("target", "logged"),
    [
        ("/api/hubs", "/api/hubs"),
        ("/a?token=x", "/a?token=***"),
        ("/a?id_token=x&client_secret=y&n=1", "/a?id_token=***&client_secret=***&n=1"),
        ("/a?PassWord=x;apikey=y", "/a?PassWord=***;apikey=***"),
        ("/a?x-api-key=x&key=y&keyboard=z", "/a?x-api-key=***&key=***&keyboard=z"),
        ("/a?to%6Ben=x", "/a?to%6Ben=***"),
        ("/a?token", "/a?token"),
        ("/a?q=token%3Dx", "/a?q=token%3Dx"),
    ],
)
def test_scrub_target(target: str, logged: str) -> None:
    assert scrub_target(target) == logged
