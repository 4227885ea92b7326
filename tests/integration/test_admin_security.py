"""The admin server's security model as a specification: every route but /health (and
the dashboard's log-in page and its stylesheet) needs a token; a read-only token reads
and never acts; tokens are compared in constant time; no token value or broker password
reaches a response or a log record; an unreachable hub is a clean 503 naming it; the
dashboard's session cookie, CSRF token, confirmation step and HTML escaping."""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.routing import Mount

import iqbridge
from iqbridge.admin import AdminConfigError, TokenRing, create_app
from iqbridge.admin.sessions import COOKIE
from iqbridge.states import SubscriberState as S
from tests.integration.admin_helpers import (
    ADMIN_TOKEN,
    AUTH,
    DOWN_PASSWORD,
    DOWN_URL,
    ENVIRON,
    VIEW,
    VIEWER_TOKEN,
    admin_config,
    login,
    make_app,
)

pytestmark = pytest.mark.timeout(120)

SECRETS = (ADMIN_TOKEN, VIEWER_TOKEN, DOWN_PASSWORD)
WRONG = {"Authorization": "Bearer not-the-token-0000000000000"}


class Data:
    def __init__(self, url: str, ids: dict[str, str]) -> None:
        self.url = url
        self.ids = ids


@pytest.fixture
def data(tmp_path: Path) -> Data:
    url = f"sqlite:///{tmp_path / 'sales.db'}"
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders")
        q.subscribe("billing", "shipping")
        evil = q.put("<script>alert(1)</script>", correlation_id="<b>c</b>")
        bad = q.put({"n": 2})
        got = q.get("billing")
        assert got is not None and got.msg_id == evil
        got.unusable("<img src=x onerror=alert(2)>")
        return Data(url, {"evil": evil, "bad": bad})


@pytest.fixture
def client(tmp_path: Path, data: Data) -> Iterator[TestClient]:
    app = make_app(tmp_path, {"sales": data.url, "down": DOWN_URL})
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _concrete(path: str, data: Data) -> str:
    return (
        path.replace("{hub}", "sales")
        .replace("{queue}", "orders")
        .replace("{msg_id}", data.ids["evil"])
        .replace("{action}", "withdraw")
    )


_BODIES = {
    "rereveal": {"subscriber": "billing"},
    "redrive": {"subscriber": "billing"},
    "purge": {"older_than": 0},
    "recovery": {"target": {"hub": "sales", "queue": "orders"}},
}


def _body(path: str) -> dict[str, object] | None:
    last = path.rsplit("/", 1)[-1]
    return _BODIES.get(last, {"reason": "test"} if last in ("reveal", "withdraw") else None)


def _flat(routes: list[Any]) -> Iterator[Any]:
    """Every route, those of included routers too (FastAPI may include them lazily)."""
    for r in routes:
        inner = getattr(r, "original_router", None)
        if inner is not None:
            yield from _flat(inner.routes)
        else:
            yield r


def _routes(client: TestClient) -> list[tuple[str, str]]:
    """(method, path) of every route of the app (app.routes), static files apart."""
    out = []
    for r in _flat(client.app.routes):  # type: ignore[attr-defined]
        if isinstance(r, Mount):
            continue
        for method in sorted(getattr(r, "methods", None) or ()):
            if method != "HEAD":
                out.append((method, r.path))
    return out


def test_every_api_route_needs_a_token(client: TestClient, data: Data) -> None:
    routes = _routes(client)
    api = [(m, p) for m, p in routes if not p.startswith("/ui")]
    assert {p for _, p in api} >= {
        "/health",
        "/openapi.json",
        "/docs",
        "/api/hubs",
        "/api/recovery",
    }
    checked = 0
    for method, path in api:
        if path == "/health":
            continue
        url = _concrete(path, data)
        for headers in ({}, WRONG, {"Authorization": ADMIN_TOKEN}, {"Authorization": "Basic x"}):
            r = client.request(method, url, headers=headers, json=_body(path))
            assert r.status_code == 401, (method, path, headers, r.text)
            assert r.headers["WWW-Authenticate"] == "Bearer"
            assert r.json()["error"] == "unauthorized"
            checked += 1
    assert checked >= 4 * 12
    health = client.get("/health")
    assert health.status_code == 200 and health.json() == {"status": "ok"}


def test_every_dashboard_page_needs_a_session(client: TestClient, data: Data) -> None:
    public = {"/ui/login"}
    for method, path in _routes(client):
        if not path.startswith("/ui") or path in public:
            continue
        r = client.request(method, _concrete(path, data), follow_redirects=False)
        assert r.status_code == 303, (method, path, r.text)
        assert r.headers["location"] == "/ui/login"
        client.cookies.set(COOKIE, "forged-session-id", path="/ui")
        r = client.request(method, _concrete(path, data), follow_redirects=False)
        client.cookies.clear()
        assert r.status_code == 303, (method, path)
    assert client.get("/ui/static/admin.css").status_code == 200  # the log-in page's style


def test_openapi_and_docs_need_a_token(client: TestClient) -> None:
    assert client.get("/openapi.json").status_code == 401
    assert client.get("/docs").status_code == 401
    spec = client.get("/openapi.json", headers=VIEW)
    assert spec.status_code == 200
    assert "/api/hubs/{hub}/queues/{queue}/redrive" in spec.json()["paths"]
    assert client.get("/docs", headers=AUTH).status_code == 200
    assert client.get("/redoc", headers=AUTH).status_code == 404


def test_readonly_token_reads_but_never_acts(client: TestClient, data: Data) -> None:
    api = [(m, p) for m, p in _routes(client) if p.startswith("/api")]
    posts = [(m, p) for m, p in api if m == "POST"]
    gets = [(m, p) for m, p in api if m == "GET"]
    assert len(posts) == 6 and len(gets) == 6
    for _, path in gets:
        r = client.get(_concrete(path, data), headers=VIEW)
        assert r.status_code == 200, (path, r.text)

    def counts() -> object:
        body = client.get("/api/hubs/sales/queues", headers=AUTH).json()
        return [{k: v for k, v in c.items() if k != "oldest_undone_age"} for c in body]

    before = counts()
    for _, path in posts:
        r = client.post(_concrete(path, data), headers=VIEW, json=_body(path))
        assert r.status_code == 403, (path, r.text)
        assert r.json()["error"] == "forbidden"
    assert counts() == before


def test_readonly_dashboard_session_cannot_act(client: TestClient, data: Data) -> None:
    csrf = login(client, VIEWER_TOKEN)
    page = client.get(f"/ui/hubs/sales/queues/orders/messages/{data.ids['evil']}")
    assert page.status_code == 200
    assert 'id="rereveal-form"' not in page.text
    r = client.post(
        f"/ui/hubs/sales/queues/orders/messages/{data.ids['evil']}/rereveal",
        data={"csrf": csrf, "confirm": "yes", "subscriber": "billing"},
    )
    assert r.status_code == 403
    with iqbridge.connect(data.url) as hub:
        view = hub.queue("orders").state(data.ids["evil"]).subscribers["billing"]
    assert (view.state, view.attempt) == (S.JOURNALLED, 1)  # refused: nothing moved


def test_tokens_are_compared_in_constant_time_against_every_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ring = TokenRing(
        [("a", "admin", "a" * 20), ("b", "readonly", "b" * 20), ("c", "admin", "c" * 20)]
    )
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(x: bytes, y: bytes) -> bool:
        calls.append((x, y))
        return real(x, y)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    found = ring.check("a" * 20)
    assert found is not None and found.name == "a" and found.role == "admin"
    assert len(calls) == 3  # no early exit on the first match
    assert ring.check("a" * 19) is None
    assert ring.check("") is None and ring.check(None) is None
    assert "a" * 20 not in repr(ring)


def test_token_values_come_from_env_or_file_and_errors_never_show_them(tmp_path: Path) -> None:
    cfg = admin_config(tmp_path, {"x": "memory://"})
    with pytest.raises(AdminConfigError, match=r"token 'ops'.*IQ_TEST_ADMIN_TOKEN"):
        create_app(cfg, environ={})
    with pytest.raises(AdminConfigError, match="at least 16") as err:
        create_app(cfg, environ={"IQ_TEST_ADMIN_TOKEN": "short"})
    assert "short" not in str(err.value)
    (tmp_path / "viewer-token").unlink()
    with pytest.raises(AdminConfigError, match="token 'viewer'"):
        create_app(cfg, environ={"IQ_TEST_ADMIN_TOKEN": ADMIN_TOKEN})


def test_unreachable_hub_is_a_clean_503_naming_it(client: TestClient) -> None:
    r = client.get("/api/hubs/down/queues", headers=AUTH)
    assert r.status_code == 503
    assert r.json()["error"] == "unavailable"
    assert "'down'" in r.json()["detail"]
    assert DOWN_PASSWORD not in r.text
    hubs = {h["name"]: h for h in client.get("/api/hubs", headers=AUTH).json()}
    assert hubs["down"]["available"] is False
    assert hubs["down"]["url"] == "redis://:***@127.0.0.1:1/0"
    assert hubs["sales"]["available"] is True
    r = client.get("/api/hubs/down/queues/q/messages/x", headers=AUTH)
    assert r.status_code == 503


def test_an_unreachable_hub_says_where_and_why(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The server log names the hub, its URL (redacted) and the reason; the API and the
    dashboard give the reason itself, not "see the server log"."""
    caplog.set_level(logging.WARNING, logger="iqbridge.admin")
    r = client.get("/api/hubs/down/queues", headers=AUTH)
    assert r.status_code == 503
    why = r.json()["detail"]
    assert why.startswith("hub 'down' is unavailable: BrokerUnavailable: cannot reach Redis")
    assert "refused" in why.lower(), why
    assert "server log" not in why
    records = [m.getMessage() for m in caplog.records]
    [line] = [m for m in records if m.startswith("hub 'down' ")]
    assert line.startswith("hub 'down' (redis://:***@127.0.0.1:1/0) cannot be opened: ")
    assert "BrokerUnavailable: cannot reach Redis" in line
    [request] = [m for m in records if m.startswith("admin request")]
    assert "cannot reach Redis" in request
    login(client)
    page = client.get("/ui/")
    m = re.search(r'data-hub-error="down">([^<]*)<', page.text)
    assert m is not None and "cannot reach Redis" in m.group(1), page.text
    for text in (why, line, request, page.text):
        assert DOWN_PASSWORD not in text


def test_no_secret_in_any_response_or_log_record(
    client: TestClient, data: Data, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    for method, path in _routes(client):
        for headers in ({}, WRONG, VIEW, AUTH):
            for url in (_concrete(path, data), _concrete(path.replace("{hub}", "down"), data)):
                r = client.request(method, url, headers=headers, json=_body(path))
                assert r.status_code < 500 or r.status_code == 503, (method, url, r.text)
                seen.append(r.text)
                seen.extend(f"{k}: {v}" for k, v in r.headers.items())
    login(client, ADMIN_TOKEN)
    seen.append(client.get("/ui/").text)
    seen.append(client.post("/ui/login", data={"token": VIEWER_TOKEN + "x"}).text)
    records = [rec.getMessage() for rec in caplog.records]
    assert any("down" in m for m in records)  # the unreachable hub was logged, by name
    for secret in SECRETS:
        assert not [t for t in seen if secret in t], secret
        assert not [m for m in records if secret in m], secret


def test_payloads_and_fields_are_escaped_in_the_timeline(client: TestClient, data: Data) -> None:
    login(client)
    page = client.get(f"/ui/hubs/sales/queues/orders/messages/{data.ids['evil']}")
    assert page.status_code == 200
    assert "<script>alert(1)</script>" not in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert "<img src=x" not in page.text  # the unusable reason, escaped too
    assert "<b>c</b>" not in page.text
    assert "Content-Security-Policy" in page.headers
    search = client.get("/ui/hubs/sales/queues/orders?correlation_id=<b>c</b>")
    assert "<b>c</b>" not in search.text
    assert search.text.count('class="msg-link"') == 1


def test_session_cookie_attributes_and_logout(client: TestClient) -> None:
    r = client.post("/ui/login", data={"token": ADMIN_TOKEN}, follow_redirects=False)
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    assert ADMIN_TOKEN not in cookie
    bad = client.post("/ui/login", data={"token": "nope"})
    assert bad.status_code == 401 and "not valid" in bad.text
    page = client.get("/ui/")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    assert client.post("/ui/logout", data={"csrf": "forged"}).status_code == 403
    out = client.post("/ui/logout", data={"csrf": csrf.group(1)}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    assert client.get("/ui/", follow_redirects=False).status_code == 303


def test_dashboard_actions_need_csrf_and_confirmation(client: TestClient, data: Data) -> None:
    csrf = login(client)
    mid = data.ids["evil"]
    action = f"/ui/hubs/sales/queues/orders/messages/{mid}/rereveal"
    page = f"/ui/hubs/sales/queues/orders/messages/{mid}"

    def billing_state() -> str:
        m = re.search(r'id="state-billing" data-state="([A-Z_]*)"', client.get(page).text)
        assert m is not None
        return m.group(1)

    assert billing_state() == "JOURNALLED"
    form = {"subscriber": "billing", "reason": "fixed", "confirm": "yes"}
    assert client.post(action, data={**form, "csrf": "forged"}).status_code == 403
    assert client.post(action, data=form).status_code == 403
    unconfirmed = client.post(action, data={**form, "csrf": csrf, "confirm": ""})
    assert unconfirmed.status_code == 422 and "confirmation box" in unconfirmed.text
    assert billing_state() == "JOURNALLED"
    done = client.post(action, data={**form, "csrf": csrf}, follow_redirects=False)
    assert done.status_code == 303
    assert done.headers["location"].endswith("?done=rereveal")
    assert billing_state() == "AVAILABLE"
    with iqbridge.connect(data.url) as hub:
        st = hub.queue("orders").state(mid)
    assert st.subscribers["billing"].state is S.AVAILABLE
    assert "by admin ops: fixed" in [e.detail for e in st.journal]
    again = client.post(action, data={**form, "csrf": csrf})
    assert again.status_code == 409 and 'id="error"' in again.text


def test_dashboard_redrive_lists_first_then_applies(client: TestClient, data: Data) -> None:
    csrf = login(client)
    path = "/ui/hubs/sales/queues/orders/redrive"
    dry = client.get(f"{path}?subscriber=billing")
    assert dry.status_code == 200
    assert f'data-msg-id="{data.ids["evil"]}"' in dry.text
    assert 'id="redrive-confirm"' in dry.text
    mid = data.ids["evil"]

    def billing() -> tuple[S | None, int]:
        with iqbridge.connect(data.url) as hub:
            v = hub.queue("orders").state(mid).subscribers["billing"]
        return v.state, v.attempt

    before = billing()
    assert before[0] is S.JOURNALLED
    unconfirmed = client.post(path, data={"csrf": csrf, "subscriber": "billing"})
    assert unconfirmed.status_code == 422
    assert billing() == before  # not confirmed: nothing moved
    applied = client.post(path, data={"csrf": csrf, "subscriber": "billing", "confirm": "yes"})
    assert applied.status_code == 200
    assert 'id="redrive-done"' in applied.text and mid in applied.text
    assert billing() == (S.AVAILABLE, before[1] + 1)


def test_an_unreachable_hub_is_retried_after_a_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    from iqbridge.admin import hubs as hubs_module
    from iqbridge.admin.config import HubSpec
    from iqbridge.admin.hubs import Hubs, HubUnavailable

    tries: list[str] = []
    real = hubs_module.connect

    def counting(url: str, index: str | None = None, **kw: object) -> iqbridge.Hub:
        tries.append(url)
        return real(url, index, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(hubs_module, "connect", counting)
    clock = [100.0]
    hubs = Hubs([HubSpec(name="down", url=DOWN_URL)], retry_after=5, clock=lambda: clock[0])
    for _ in range(3):
        with pytest.raises(HubUnavailable, match="'down'") as err:
            hubs.hub("down")
        assert DOWN_PASSWORD not in str(err.value)
    assert len(tries) == 1  # reported at once, not tried again within the pause
    clock[0] += 5
    with pytest.raises(HubUnavailable):
        hubs.hub("down")
    assert len(tries) == 2


def test_the_token_is_checked_before_the_body_is_read(tmp_path: Path) -> None:
    """A stranger's body is never read, however large (the gate answers first); a
    caller's body over max_body_bytes is 413 and no route runs."""
    config = admin_config(tmp_path, {"local": "memory://"}, max_body_bytes=1024)
    pulled: list[int] = []

    def body() -> Iterator[bytes]:
        for i in range(64):
            pulled.append(i)
            yield b" " * 1024

    ran: list[str] = []
    route = "/api/hubs/local/queues/q/redrive"
    with TestClient(create_app(config, environ=ENVIRON)) as c:
        state = c.app.state.admin  # type: ignore[attr-defined]
        state.service = _Spy(state.service, ran)
        for headers in ({}, WRONG, {"Authorization": ADMIN_TOKEN}):
            r = c.post(route, content=body(), headers=headers)
            assert r.status_code == 401, r.text
            assert pulled == []  # not one byte of the body was asked for
        big = c.post(
            route, content=b"{" + b" " * 4096 + b"}", headers={**AUTH, "Content-Type": "x/y"}
        )
        assert big.status_code == 413, big.text
        assert big.json() == {
            "error": "payload_too_large",
            "detail": "the request body is larger than 1024 bytes, the server's max_body_bytes",
        }
        streamed = c.post(route, content=body(), headers=AUTH)
        assert streamed.status_code == 413 and streamed.json()["error"] == "payload_too_large"
        form = c.post("/ui/login", data={"token": "x" * 5000})
        assert form.status_code == 413 and 'data-kind="payload_too_large"' in form.text
        assert ran == []  # no route reached the service
        ok = c.post(route, json={"subscriber": "billing"}, headers=AUTH)
        assert ok.status_code != 413 and ran == ["redrive"]


class _Spy:
    """Wraps the app's service: records the name of each method a route calls."""

    def __init__(self, inner: object, calls: list[str]) -> None:
        self._inner = inner
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        self._calls.append(name)
        return getattr(self._inner, name)
