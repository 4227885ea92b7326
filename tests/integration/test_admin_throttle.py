"""Failed logins to the admin server are limited per client address (3 a minute here):
past the limit the API answers 429 with Retry-After before comparing any token, right
or wrong, and so does the dashboard's log-in form; requests without a token never
count; another address is not affected; a bad rate in the config is refused."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from iqbridge.admin import AdminConfigError, create_app, parse_config
from iqbridge.admin.throttle import Throttle
from tests.integration.admin_helpers import ADMIN_TOKEN, AUTH, ENVIRON, admin_config

WRONG = {"Authorization": "Bearer not-the-token-0000000000000"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    config = admin_config(tmp_path, {"local": "memory://"}, failed_logins="3/minute")
    with TestClient(create_app(config, environ=ENVIRON)) as c:
        yield c


def test_api_refuses_an_address_past_its_wrong_tokens_even_with_the_right_one(
    client: TestClient,
) -> None:
    for _ in range(3):
        assert client.get("/api/hubs", headers=WRONG).status_code == 401
    for headers in (WRONG, AUTH):
        r = client.get("/api/hubs", headers=headers)
        assert r.status_code == 429, r.text
        assert r.json()["error"] == "too_many_attempts"
        assert 1 <= int(r.headers["Retry-After"]) <= 60
        assert ADMIN_TOKEN not in r.text


def test_requests_without_a_token_never_count(client: TestClient) -> None:
    for _ in range(10):
        assert client.get("/api/hubs").status_code == 401
    assert client.get("/api/hubs", headers=AUTH).status_code == 200


def test_the_dashboard_login_counts_with_the_api(client: TestClient) -> None:
    for _ in range(2):
        assert client.get("/api/hubs", headers=WRONG).status_code == 401
    r = client.post("/ui/login", data={"token": "wrong"}, follow_redirects=False)
    assert r.status_code == 401
    r = client.post("/ui/login", data={"token": ADMIN_TOKEN}, follow_redirects=False)
    assert r.status_code == 429
    assert "Too many wrong tokens" in r.text and int(r.headers["Retry-After"]) >= 1


def test_another_address_is_not_affected() -> None:
    throttle = Throttle("2/minute")
    for _ in range(2):
        assert throttle.wait("10.0.0.1") is None
        throttle.failed("10.0.0.1")
    wait = throttle.wait("10.0.0.1")
    assert wait is not None and 1 <= wait <= 60
    assert throttle.wait("10.0.0.2") is None


def test_the_window_moves_on() -> None:
    throttle = Throttle("1/second")
    throttle.failed("a")
    assert throttle.wait("a") == 1
    deadline = time.monotonic() + 3
    while throttle.wait("a") is not None:
        assert time.monotonic() < deadline, "the window never moved on"
        time.sleep(0.05)


def test_a_bad_rate_is_refused_with_the_notation() -> None:
    with pytest.raises(AdminConfigError, match="not a rate"):
        parse_config(
            {
                "tokens": [{"name": "ops", "role": "admin", "env": "X"}],
                "hubs": [{"name": "h", "url": "memory://"}],
                "failed_logins": "ten a minute",
            }
        )
