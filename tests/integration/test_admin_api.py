"""The admin API (``iq admin serve``) as a specification: counts per state, search,
timelines, lineage across hubs, every action through the state engine and journalled
with the token's name, redrive, purge, cross-queue recovery, bridge health; and the
``iq admin serve`` command's help and one-line errors."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

import iqbridge
from iqbridge import Hub, Queue
from iqbridge.cli import app as cli_app
from iqbridge.states import PublisherState as P
from iqbridge.states import SubscriberState as S
from tests.integration.admin_helpers import (
    ADMIN_ENV,
    ADMIN_TOKEN,
    AUTH,
    admin_client,
    detail,
    one_error_line,
)
from tests.redis_index_helpers import REDIS_URL, drop_streams, fresh_prefix

pytestmark = pytest.mark.timeout(120)


@dataclass
class Orders:
    """A queue ``orders`` on hub ``sales`` with known traffic (see :func:`orders`)."""

    url: str
    hub: Hub
    q: Queue
    m1: str  # billing DONE, shipping UNUSABLE: publisher JOURNALLED
    m2: str  # both AVAILABLE, correlation "c-2", priority 7, publisher "pos"
    m3: str  # put with confirm: PUT, members not revealed
    m4: str  # both AVAILABLE


@pytest.fixture
def orders(tmp_path: Path) -> Iterator[Orders]:
    url = f"sqlite:///{tmp_path / 'sales.db'}"
    with iqbridge.connect(url, publisher="till") as hub:
        q = hub.queue("orders")
        q.subscribe("billing", "shipping")
        m1 = q.put({"n": 1}, correlation_id="c-1")
        m2 = q.put({"n": 2}, correlation_id="c-2", priority=4, publisher="pos")
        m3 = q.put({"n": 3}, confirm=True)
        m4 = q.put({"n": 4})
        got = q.get("billing")
        assert got is not None and got.msg_id == m1
        got.done()
        got = q.get("shipping")
        assert got is not None and got.msg_id == m1
        got.unusable("cannot parse")
        yield Orders(url, hub, q, m1, m2, m3, m4)


def _msg(queue: str, msg_id: str, hub: str = "sales") -> str:
    return f"/api/hubs/{hub}/queues/{queue}/messages/{msg_id}"


def test_hubs_list_their_queues_and_redacted_urls(tmp_path: Path, orders: Orders) -> None:
    with admin_client(tmp_path, {"sales": orders.url}) as c:
        assert detail(c, "/api/hubs") == [
            {
                "name": "sales",
                "url": orders.url,
                "available": True,
                "queues": ["orders"],
                "error": None,
            }
        ]


def test_counts_per_state_and_oldest_undone(tmp_path: Path, orders: Orders) -> None:
    with admin_client(tmp_path, {"sales": orders.url}) as c:
        [counts] = detail(c, "/api/hubs/sales/queues")
    assert counts["queue"] == "orders"
    assert counts["messages"] == 4
    assert counts["publisher"] == {"JOURNALLED": 1, "REVEALED": 2, "PUT": 1}
    assert counts["subscribers"] == {
        "billing": {"JOURNALLED": 1, "AVAILABLE": 2},
        "shipping": {"JOURNALLED": 1, "AVAILABLE": 2},
    }
    put_at = orders.q.state(orders.m2).publisher_history[0][1]
    for sub in ("billing", "shipping"):
        assert counts["oldest_undone"][sub].replace("Z", "+00:00") == put_at.isoformat()
        assert 0 <= counts["oldest_undone_age"][sub] < 120


def test_search_filters(tmp_path: Path, orders: Orders) -> None:
    base = "/api/hubs/sales/queues/orders/messages"

    def ids(query: str) -> list[str]:
        return [m["msg_id"] for m in detail(c, f"{base}?{query}")]

    with admin_client(tmp_path, {"sales": orders.url}) as c:
        assert ids("") == [orders.m1, orders.m2, orders.m3, orders.m4]
        assert ids(f"msg_id={orders.m4}") == [orders.m4]
        assert ids("correlation_id=c-2") == [orders.m2]
        assert ids("publisher=pos") == [orders.m2]
        assert ids("priority=4&publisher=till") == [orders.m1, orders.m3, orders.m4]
        assert ids("state=PUT") == [orders.m3]
        assert ids("state=REVEALED") == [orders.m2, orders.m4]
        # JOURNALLED names a state of both machines: with a subscriber, the subscriber's.
        assert ids("state=JOURNALLED") == [orders.m1]
        assert ids("state=journalled&subscriber=billing") == [orders.m1]
        assert ids("state=AVAILABLE&subscriber=billing") == [orders.m2, orders.m4]
        assert ids("limit=2") == [orders.m1, orders.m2]
        first = orders.q.state(orders.m1).publisher_history[0][1]
        last = orders.q.state(orders.m4).publisher_history[0][1]
        assert ids(f"since={last.isoformat().replace('+00:00', 'Z')}") == [orders.m4]
        until = (first + timedelta(microseconds=1)).isoformat()
        assert ids(f"until={until.replace('+00:00', 'Z')}") == [orders.m1]
        hit = detail(c, f"{base}?msg_id={orders.m2}")[0]
        assert hit["subscribers"] == {"billing": "AVAILABLE", "shipping": "AVAILABLE"}
        assert hit["correlation_id"] == "c-2"
        for bad in ("state=LOST", "priority=10", "limit=0", "since=yesterday"):
            r = c.get(f"{base}?{bad}", headers=AUTH)
            assert r.status_code == 422, bad
            assert r.json()["error"] == "invalid_argument"
        child = orders.q.put({"n": 5}, parents=[orders.m2])
        assert ids(f"parent={orders.m2}") == [child]
        assert ids(f"parent={orders.m1}") == []


def test_timeline_has_every_actor_with_states_and_times(tmp_path: Path, orders: Orders) -> None:
    with admin_client(tmp_path, {"sales": orders.url}) as c:
        msg = detail(c, _msg("orders", orders.m1))
        missing = c.get(_msg("orders", "no-such-id"), headers=AUTH)
        other_queue = c.get(_msg("nope", orders.m1), headers=AUTH)
    assert msg["publisher_state"] == "JOURNALLED"
    assert [s["state"] for s in msg["publisher_history"]] == ["PUT", "REVEALED", "JOURNALLED"]
    subs = {s["subscriber"]: s for s in msg["subscribers"]}
    assert [h["state"] for h in subs["billing"]["history"]] == [
        "AVAILABLE",
        "GET",
        "FETCHED",
        "DONE",
        "JOURNALLED",
    ]
    assert [h["state"] for h in subs["shipping"]["history"]] == [
        "AVAILABLE",
        "GET",
        "FETCHED",
        "UNUSABLE",
        "JOURNALLED",
    ]
    assert subs["shipping"]["reason"] == "cannot parse"
    assert subs["billing"]["attempt"] == 1
    times = [h["at"] for h in subs["billing"]["history"]]
    assert times == sorted(times)
    assert msg["payload"]["text"] == '{"n":1}' or json.loads(msg["payload"]["text"]) == {"n": 1}
    assert msg["correlation_id"] == "c-1"
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    assert other_queue.status_code == 404


def test_journalled_members_say_what_they_were_journalled_after(tmp_path: Path) -> None:
    """A pool member that did the work, one that lost the race and a subscriber that
    failed are all JOURNALLED: ``outcome`` (timeline) and ``outcomes`` (search) tell
    them apart; fields added beside the old ones, which keep their shapes."""
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    with iqbridge.connect(url) as hub:
        q = hub.queue("jobs")
        q.subscribe_pool("workers", ["w1", "w2"])
        q.subscribe("audit", "late")
        job = q.put({"job": 1})
        got = q.get("w1")
        assert got is not None
        got.done()
        got = q.get("audit")
        assert got is not None
        got.unusable("schema unknown")
    with admin_client(tmp_path, {"ops": url}) as c:
        msg = detail(c, _msg("jobs", job, hub="ops"))
        [hit] = detail(c, f"/api/hubs/ops/queues/jobs/messages?msg_id={job}")
    subs = {s["subscriber"]: s for s in msg["subscribers"]}
    assert {n: (s["state"], s["outcome"]) for n, s in subs.items()} == {
        "w1": ("JOURNALLED", "DONE"),
        "w2": ("JOURNALLED", "EXPIRED"),
        "audit": ("JOURNALLED", "UNUSABLE"),
        "late": ("AVAILABLE", None),
    }
    assert hit["subscribers"] == {
        "w1": "JOURNALLED",
        "w2": "JOURNALLED",
        "audit": "JOURNALLED",
        "late": "AVAILABLE",
    }
    assert hit["outcomes"] == {"w1": "DONE", "w2": "EXPIRED", "audit": "UNUSABLE"}


def test_lineage_across_two_hubs(tmp_path: Path) -> None:
    sales, credit = f"sqlite:///{tmp_path / 'sales.db'}", f"sqlite:///{tmp_path / 'credit.db'}"
    with iqbridge.connect(sales) as a, iqbridge.connect(credit) as b:
        qa, qb = a.queue("pos"), b.queue("approvals")
        qa.subscribe("bridge")
        qb.subscribe("approver")
        p1, p2 = qa.put("sale 1"), qa.put("sale 2")
        child = qb.put("approve 1+2", parents=[p1, p2])
        grandchild = qb.put("approved", parents=[child])
        unrelated = qb.put("other")
    with admin_client(tmp_path, {"sales": sales, "credit": credit}) as c:
        up = detail(c, _msg("approvals", child, hub="credit") + "/lineage")
        down = detail(c, _msg("pos", p1) + "/lineage")
    assert up["node"]["hub"] == "credit" and up["node"]["parents"] == [p1, p2]
    assert [(n["msg_id"], n["hub"], n["queue"]) for n in up["ancestors"]] == [
        (p1, "sales", "pos"),
        (p2, "sales", "pos"),
    ]
    assert [n["msg_id"] for n in up["descendants"]] == [grandchild]
    assert [(n["msg_id"], n["hub"]) for n in down["descendants"]] == [
        (child, "credit"),
        (grandchild, "credit"),
    ]
    assert unrelated not in json.dumps(down)
    assert down["ancestors"] == []


def _journal_details(q: Queue, msg_id: str) -> list[str | None]:
    return [e.detail for e in q.state(msg_id).journal]


def test_withdraw_and_reveal_go_through_the_engine(tmp_path: Path, orders: Orders) -> None:
    with admin_client(tmp_path, {"sales": orders.url}) as c:
        r = c.post(
            _msg("orders", orders.m4) + "/withdraw", json={"reason": "duplicate"}, headers=AUTH
        )
        assert r.status_code == 200, r.text
        # Withdrawn, and at once journalled: no member had got it (they expire).
        assert r.json()["publisher_state"] == "JOURNALLED"
        assert r.json()["by"] == "ops"
        r = c.post(_msg("orders", orders.m3) + "/reveal", headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["subscribers"] == {"billing": "AVAILABLE", "shipping": "AVAILABLE"}
    st = orders.q.state(orders.m4)
    assert [s for s, _ in st.publisher_history] == [P.PUT, P.REVEALED, P.UNAVAILABLE, P.JOURNALLED]
    assert {v.state for v in st.subscribers.values()} == {S.JOURNALLED}
    withdrawn = [e for e in st.journal if e.dst == "UNAVAILABLE"]
    assert [e.detail for e in withdrawn] == ["by admin ops: duplicate"]
    revealed = orders.q.state(orders.m3)
    assert revealed.publisher_state is P.REVEALED
    [entry] = [e for e in revealed.journal if e.dst == "REVEALED"]
    assert entry.detail is not None and entry.detail.startswith("by admin ops:")


def test_rereveal_to_one_subscriber_is_journalled_with_the_token(
    tmp_path: Path, orders: Orders
) -> None:
    with admin_client(tmp_path, {"sales": orders.url}) as c:
        r = c.post(
            _msg("orders", orders.m1) + "/rereveal",
            json={"subscriber": "shipping", "reason": "parser fixed"},
            headers=AUTH,
        )
        assert r.status_code == 200, r.text
        assert r.json()["detail"] == "by admin ops: parser fixed"
    st = orders.q.state(orders.m1)
    assert st.subscribers["shipping"].state is S.AVAILABLE
    assert st.subscribers["shipping"].attempt == 2
    assert st.subscribers["billing"].state is S.JOURNALLED  # the other one is left alone
    assert st.publisher_state is P.REVEALED
    assert "by admin ops: parser fixed" in _journal_details(orders.q, orders.m1)


def test_illegal_action_is_409_and_changes_nothing(tmp_path: Path, orders: Orders) -> None:
    before = orders.q.state(orders.m2)
    with admin_client(tmp_path, {"sales": orders.url}) as c:
        r = c.post(
            _msg("orders", orders.m2) + "/rereveal", json={"subscriber": "billing"}, headers=AUTH
        )
        assert r.status_code == 409
        assert r.json()["error"] == "illegal_transition"
        r = c.post(_msg("orders", orders.m2) + "/reveal", headers=AUTH)
        assert r.status_code == 409
        r = c.post(
            _msg("orders", orders.m2) + "/rereveal", json={"subscriber": "nobody"}, headers=AUTH
        )
        assert r.status_code in (409, 422)
        r = c.post(_msg("orders", "no-such-id") + "/withdraw", headers=AUTH)
        assert r.status_code == 404
    after = orders.q.state(orders.m2)
    assert after.journal == before.journal
    assert after.publisher_state is before.publisher_state


def test_redrive_moves_only_the_unusable_ones_for_that_subscriber(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    with iqbridge.connect(url) as hub:
        q = hub.queue("jobs")
        q.subscribe("a", "b")
        m1, m2, m3, m4 = (q.put(i) for i in range(4))
        for expect, outcome in ((m1, "unusable"), (m2, "done"), (m3, "unusable")):
            got = q.get("a")
            assert got is not None and got.msg_id == expect
            got.done() if outcome == "done" else got.unusable("poison")
        got = q.get("b")
        assert got is not None and got.msg_id == m1
        got.unusable("poison")
        path = "/api/hubs/jobs/queues/jobs/redrive"
        with admin_client(tmp_path, {"jobs": url}) as c:
            dry = c.post(path, json={"subscriber": "a"}, headers=AUTH)
            assert dry.status_code == 200, dry.text
            assert dry.json()["dry_run"] is True
            assert dry.json()["candidates"] == [m1, m3]
            assert dry.json()["moved"] == []
            assert q.state(m1).subscribers["a"].state is S.JOURNALLED  # a dry run moves none
            done = c.post(
                path, json={"subscriber": "a", "dry_run": False, "reason": "v2"}, headers=AUTH
            )
            assert done.status_code == 200, done.text
            assert done.json()["moved"] == [m1, m3]
            again = c.post(path, json={"subscriber": "a"}, headers=AUTH)
            assert again.json()["candidates"] == []
        for mid in (m1, m3):
            st = q.state(mid)
            assert st.subscribers["a"].state is S.AVAILABLE
            assert st.subscribers["a"].attempt == 2
            assert "by admin ops: v2" in _journal_details(q, mid)
        assert q.state(m1).subscribers["b"].state is S.JOURNALLED  # b's own stays
        assert q.state(m2).subscribers["a"].state is S.JOURNALLED  # DONE is not redriven
        assert q.state(m4).subscribers["a"].state is S.AVAILABLE


def test_purge_dry_run_counts_then_purges(tmp_path: Path, orders: Orders) -> None:
    path = "/api/hubs/sales/queues/orders/purge"
    time.sleep(0.01)
    with admin_client(tmp_path, {"sales": orders.url}) as c:
        dry = c.post(path, json={"older_than": 0}, headers=AUTH)
        assert dry.status_code == 200, dry.text
        assert dry.json() == {"dry_run": True, "older_than": 0.0, "count": 1}
        assert c.post(path, json={"older_than": 3600}, headers=AUTH).json()["count"] == 0
        assert c.get(_msg("orders", orders.m1), headers=AUTH).status_code == 200
        done = c.post(path, json={"older_than": 0, "dry_run": False}, headers=AUTH)
        assert done.json() == {"dry_run": False, "older_than": 0.0, "count": 1}
        assert c.get(_msg("orders", orders.m1), headers=AUTH).status_code == 404
        assert c.get(_msg("orders", orders.m2), headers=AUTH).status_code == 200
        bad = c.post(path, json={"older_than": -1}, headers=AUTH)
        assert bad.status_code == 422


def test_recovery_between_two_hubs(tmp_path: Path) -> None:
    inbound, outbound = f"sqlite:///{tmp_path / 'in.db'}", f"sqlite:///{tmp_path / 'out.db'}"
    with iqbridge.connect(inbound) as a, iqbridge.connect(outbound) as b:
        qa, qb = a.queue("inbound"), b.queue("outbound")
        qa.subscribe("module")
        qb.subscribe("sink")
        p1, p2 = qa.put("p1"), qa.put("p2")
        d1 = qa.get("module")
        assert d1 is not None and d1.msg_id == p1  # fetched, never done: the crash
        c1 = qb.put("c1", parents=[p1], confirm=True)
        d2 = qa.get("module")
        assert d2 is not None and d2.msg_id == p2
        d2.done()
        c2 = qb.put("c2", parents=[p2], confirm=True)
        body = {
            "source": {"hub": "in", "queue": "inbound"},
            "target": {"hub": "out", "queue": "outbound"},
        }
        with admin_client(tmp_path, {"in": inbound, "out": outbound}) as c:
            dry = c.post("/api/recovery", json=body, headers=AUTH)
            assert dry.status_code == 200, dry.text
            plan = dry.json()
            moves = {(r["action"], r["msg_id"]) for r in plan["rows"]}
            assert moves == {("release", p1), ("withdraw", c1), ("reveal", c2)}
            assert plan["applied"] == 0
            assert qb.state(c2).publisher_state is P.PUT  # nothing moved yet
            applied = c.post("/api/recovery", json={**body, "dry_run": False}, headers=AUTH)
            assert applied.status_code == 200, applied.text
            assert applied.json()["applied"] == 3
            assert applied.json()["run"].startswith("admin-ops-")
            neither = c.post("/api/recovery", json={}, headers=AUTH)
            assert neither.status_code == 422
        assert qb.state(c2).publisher_state is P.REVEALED
        assert P.UNAVAILABLE in [s for s, _ in qb.state(c1).publisher_history]
        assert qa.state(p1).subscribers["module"].state is S.AVAILABLE
        run = applied.json()["run"]
        assert any(d and d.startswith(f"by recovery {run}") for d in _journal_details(qb, c2))


def test_bridges_health(tmp_path: Path) -> None:
    live = tmp_path / "live.json"
    live.write_text(
        json.dumps(
            {
                "time": time.time(),
                "pid": os.getpid(),
                "routes": {"pos-to-credit": {"active": True, "bridged": 3}},
            }
        )
    )
    bridges = {"live": live, "gone": tmp_path / "never.json"}
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with admin_client(tmp_path, {"x": url}, bridges) as c:
        health = {b["name"]: b for b in detail(c, "/api/bridges")}
    assert health["live"]["alive"] is True
    assert "1 route(s)" in health["live"]["reason"]
    assert health["gone"]["alive"] is False
    assert "never ran" in health["gone"]["reason"]


@pytest.mark.redis
def test_a_redis_streams_hub(tmp_path: Path) -> None:
    with fresh_prefix("admin") as prefix:
        url = f"{REDIS_URL}?prefix={prefix}&stream_prefix={prefix}:"
        try:
            with iqbridge.connect(url) as hub:
                q = hub.queue("approvals")
                q.subscribe("approver")
                m1, m2 = q.put("a"), q.put("b")
                got = q.get("approver")
                assert got is not None and got.msg_id == m1
                got.done()
            sqlite = f"sqlite:///{tmp_path / 'sales.db'}"
            with admin_client(tmp_path, {"approvals": url, "sales": sqlite}) as c:
                hubs = {h["name"]: h for h in detail(c, "/api/hubs")}
                assert hubs["approvals"]["queues"] == ["approvals"]
                [counts] = detail(c, "/api/hubs/approvals/queues")
                assert counts["subscribers"] == {"approver": {"JOURNALLED": 1, "AVAILABLE": 1}}
                base = "/api/hubs/approvals/queues/approvals/messages"
                hits = detail(c, f"{base}?state=AVAILABLE&subscriber=approver")
                assert [h["msg_id"] for h in hits] == [m2]
                msg = detail(c, f"{base}/{m1}")
                assert msg["publisher_state"] == "JOURNALLED"
                r = c.post(f"{base}/{m2}/withdraw", json={"reason": "test"}, headers=AUTH)
                assert r.status_code == 200, r.text
                assert r.json()["publisher_state"] == "JOURNALLED"  # withdrawn, none had it
        finally:
            drop_streams(f"{prefix}:")


# --- the command line ------------------------------------------------------------------


def test_cli_admin_serve_help() -> None:
    result = CliRunner().invoke(cli_app, ["admin", "serve", "--help"])
    assert result.exit_code == 0, result.output
    assert "--config" in result.stdout and "--port" in result.stdout


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("hubs: [{name: a, url: 'sqlite:///a.db'}]\n", "tokens: Field required"),
        (
            "tokens: [{name: ops, role: root, env: X}]\nhubs: [{name: a, url: 'sqlite:///a.db'}]\n",
            "tokens.0.role",
        ),
        ("tokens: [\n", "not valid YAML"),
        (
            f"tokens: [{{name: ops, role: admin, env: {ADMIN_ENV}_UNSET}}]\n"
            "hubs: [{name: a, url: 'sqlite:///a.db'}]\n",
            "token 'ops'",
        ),
        (
            f"tokens: [{{name: ops, role: admin, env: {ADMIN_ENV}}}]\n"
            "hubs: [{name: a, url: 'sqlite:///a.db'}, {name: typo, url: 'sqlit:///b.db'}]\n",
            "hubs.1.url (hub 'typo'): unknown URL scheme 'sqlit'; did you mean 'sqlite'?",
        ),
        (
            f"tokens: [{{name: ops, role: admin, env: {ADMIN_ENV}}}]\n"
            "hubs: [{name: r, url: 'redis://:pw-9@127.0.0.1:1/0', index: 'postgress://h/db'}]\n",
            "hubs.0.index (hub 'r'): unknown URL scheme 'postgress'; did you mean 'postgres'?",
        ),
        (
            f"tokens: [{{name: ops, role: admin, env: {ADMIN_ENV}}}]\n"
            "hubs: [{name: aq, url: 'oracle+aq://u:pw-9@db/svc'}]\n",
            "hubs.0 (hub 'aq'): the broker at oracle+aq://u:***@db/svc has no default index",
        ),
    ],
)
def test_cli_admin_serve_bad_config_is_one_line(
    tmp_path: Path, text: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    def started(self: uvicorn.Server) -> None:
        raise AssertionError("the server started with a bad configuration")

    monkeypatch.setattr(uvicorn.Server, "run", started)
    cfg = tmp_path / "hubs.yaml"
    cfg.write_text(text)
    env = {ADMIN_ENV: ADMIN_TOKEN}
    result = CliRunner().invoke(cli_app, ["admin", "serve", "--config", str(cfg)], env=env)
    line = one_error_line(result, 1)
    assert says in line
    assert ADMIN_TOKEN not in result.output and "pw-9" not in result.output


def test_cli_admin_serve_lists_every_problem_of_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "hubs.yaml"
    cfg.write_text(
        "tokens: [{name: ops, role: root, env: X}]\n"
        "hubs: [{name: a, url: 'sqlit:///a.db'}]\n"
        "bridges: [{name: b}]\n"
        "max_body_bytes: 0\n"
        "trusted_proxies: [everyone]\n"
    )
    result = CliRunner().invoke(cli_app, ["admin", "serve", "--config", str(cfg)])
    line = one_error_line(result, 1)
    for problem in (
        "tokens.0.role (token 'ops'): Input should be 'admin' or 'readonly'",
        "hubs.0.url (hub 'a'): unknown URL scheme 'sqlit'; did you mean 'sqlite'?",
        "bridges.0.health_file (bridge 'b'): Field required",
        "max_body_bytes: Input should be greater than or equal to 1",
        "trusted_proxies: 'everyone' is not an IP address or network",
    ):
        assert problem in line, problem
    assert "more problem" not in line


def test_cli_admin_serve_missing_file_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli_app, ["admin", "serve", "--config", str(tmp_path / "no")])
    assert "cannot read admin config" in one_error_line(result, 1)


def test_cli_admin_serve_runs_uvicorn_with_the_files_listen_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    from iqbridge.cli import admin_serve

    cfg = tmp_path / "hubs.yaml"
    cfg.write_text(
        f"listen: {{host: 127.0.0.2, port: 9181}}\n"
        f"tokens: [{{name: ops, role: admin, env: {ADMIN_ENV}}}]\n"
        f"hubs: [{{name: a, url: 'sqlite:///{tmp_path}/a.db'}}]\n"
    )
    configs: list[uvicorn.Config] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: configs.append(self.config))
    monkeypatch.setattr(admin_serve, "_log_to_stderr", lambda: None)
    env = {ADMIN_ENV: ADMIN_TOKEN}
    runner = CliRunner()
    assert runner.invoke(cli_app, ["admin", "serve", "-c", str(cfg)], env=env).exit_code == 0
    args = ["admin", "serve", "-c", str(cfg), "--port", "9999", "--host", "0.0.0.0"]
    assert runner.invoke(cli_app, args, env=env).exit_code == 0
    assert [(c.host, c.port) for c in configs] == [("127.0.0.2", 9181), ("0.0.0.0", 9999)]
    assert not configs[0].server_header


def test_cli_admin_serve_without_the_extra_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from iqbridge.cli import admin_serve

    monkeypatch.setattr(admin_serve, "_NEEDS", (*admin_serve._NEEDS, "iqbridge_no_such_module"))
    cfg = tmp_path / "hubs.yaml"
    cfg.write_text("{}\n")
    result = CliRunner().invoke(cli_app, ["admin", "serve", "--config", str(cfg)])
    line = one_error_line(result, 1)
    assert "iqbridge_no_such_module" in line and "install iqbridge[admin]" in line


def test_metrics_over_every_hub_need_a_token_and_name_no_secret(
    tmp_path: Path, orders: Orders
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from tests.integration.admin_helpers import DOWN_PASSWORD, DOWN_URL

    with admin_client(tmp_path, {"sales": orders.url, "down": DOWN_URL}) as c:
        assert c.get("/metrics").status_code == 401
        first = c.get("/metrics", headers=AUTH)
        assert first.status_code == 200, first.text
        got = orders.q.get("billing")  # m2: one transition to FETCHED, one to GET
        assert got is not None
        r = c.get("/metrics", headers=AUTH)
    assert DOWN_PASSWORD not in first.text + r.text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(r.text)
        for s in f.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("iqbridge_hub_up", hub="sales") == 1
    assert value("iqbridge_hub_up", hub="down") == 0
    assert value("iqbridge_publisher_messages", hub="sales", queue="orders", state="PUT") == 1
    assert (
        value(
            "iqbridge_subscriber_messages",
            hub="sales",
            queue="orders",
            subscriber="billing",
            state="FETCHED",
        )
        == 1
    )
    assert (
        value(
            "iqbridge_transitions_total",
            hub="sales",
            queue="orders",
            actor_kind="subscriber",
            state="FETCHED",
        )
        == 1
    )


# --- bad bodies --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
        (b'{"subscriber": "\xff\xfe"}', "cannot be decoded"),
        (b'{"subscriber": ', "JSON decode error"),
    ],
    ids=["200000-levels", "not-utf8", "truncated"],
)
def test_an_undecodable_body_is_422_invalid_argument(
    tmp_path: Path, orders: Orders, body: bytes, says: str
) -> None:
    headers = {**AUTH, "Content-Type": "application/json"}
    with admin_client(tmp_path, {"sales": orders.url}) as c:
        r = c.post("/api/hubs/sales/queues/orders/redrive", content=body, headers=headers)
        assert r.status_code == 422, r.text
        assert r.json()["error"] == "invalid_argument"
        assert says in r.json()["detail"]
        assert detail(c, "/api/hubs")[0]["available"] is True  # the server is fine
