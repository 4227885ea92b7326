"""The dashboard's queue-wide forms as a specification: purge by rule on a queue's page
and cross-queue recovery (``/ui/recovery``), each a dry run first, then a confirm form
with the session's CSRF token; nothing changes without the box ticked, a read-only
session never acts, and everything shown is escaped."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import iqbridge
from iqbridge.errors import MessageNotFound
from iqbridge.model import Filter
from iqbridge.states import PublisherState as P
from iqbridge.states import SubscriberState as S
from tests.integration.admin_helpers import DOWN_URL, VIEWER_TOKEN, admin_client, login

pytestmark = pytest.mark.timeout(120)

_DAY = 86400.0


# --- purge by rule -----------------------------------------------------------------------


@dataclass
class Aged:
    """Queue ``orders`` on hub ``sales``: ``old`` JOURNALLED three days ago, ``recent``
    JOURNALLED now, ``waiting`` put three days ago but JOURNALLED only now, ``pending``
    put (with confirm) three days ago and never revealed."""

    url: str
    old: list[str]
    recent: list[str]
    waiting: str
    pending: str


def _settle(q: iqbridge.Queue, sub: str, n: int) -> None:
    for _ in range(n):
        d = q.get(sub, timeout=1)
        assert d is not None
        d.done()


@pytest.fixture
def aged(tmp_path: Path) -> Aged:
    url = f"sqlite:///{tmp_path / 'sales.db'}"
    with iqbridge.connect(url, clock=lambda: time.time() - 3 * _DAY) as hub:
        q = hub.queue("orders")
        q.subscribe("billing", "shipping")
        old = [q.put({"n": i}) for i in range(3)]
        waiting = q.put({"n": "waiting"})
        _settle(q, "billing", 4)
        _settle(q, "shipping", 3)
        pending = q.put({"n": "pending"}, confirm=True)
        assert all(q.state(m).publisher_state is P.JOURNALLED for m in old)
        assert q.state(waiting).publisher_state is not P.JOURNALLED
        assert q.state(pending).publisher_state is P.PUT
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders")
        recent = [q.put({"n": "recent"})]
        _settle(q, "billing", 1)
        _settle(q, "shipping", 2)  # ``waiting`` too: JOURNALLED now, so not old enough
        assert q.state(recent[0]).publisher_state is P.JOURNALLED
    return Aged(url, old, recent, waiting, pending)


def _listed(page: str) -> list[str]:
    m = re.search(r'<ul id="purge-candidates">(.*?)</ul>', page, re.S)
    return [] if m is None else re.findall(r'data-msg-id="([^"]+)"', m.group(1))


def _count(page: str) -> tuple[int, str]:
    m = re.search(r'id="purge-count" data-count="(\d+)" data-dry-run="(yes|no)"', page)
    assert m is not None, page
    return int(m.group(1)), m.group(2)


def _remaining(url: str) -> set[str]:
    with iqbridge.connect(url) as hub:
        return {s.msg_id for s in hub.queue("orders").search(Filter(limit=1000))}


def test_the_queue_page_has_the_purge_form(tmp_path: Path, aged: Aged) -> None:
    with admin_client(tmp_path, {"sales": aged.url}) as c:
        login(c)
        page = c.get("/ui/hubs/sales/queues/orders")
    assert page.status_code == 200
    for el in ("purge-age", "purge-dry-run"):
        assert f'id="{el}"' in page.text
    assert 'action="/ui/hubs/sales/queues/orders/purge"' in page.text


def test_purge_dry_run_lists_exactly_the_old_journalled_ones(tmp_path: Path, aged: Aged) -> None:
    before = _remaining(aged.url)
    with admin_client(tmp_path, {"sales": aged.url}) as c:
        login(c)
        for age in ("1d", "12h", "30m", str(int(_DAY))):
            dry = c.get("/ui/hubs/sales/queues/orders/purge", params={"age": age})
            assert dry.status_code == 200, dry.text
            assert _count(dry.text) == (3, "yes")
            assert sorted(_listed(dry.text)) == sorted(aged.old)
            assert 'id="purge-confirm"' in dry.text and 'id="purge-submit"' in dry.text
            assert f'name="age" value="{age}"' in dry.text
        none = c.get("/ui/hubs/sales/queues/orders/purge", params={"age": "4d"})
        assert _count(none.text) == (0, "yes") and _listed(none.text) == []
        assert 'id="purge-confirm"' not in none.text  # nothing to confirm
        everything = c.get("/ui/hubs/sales/queues/orders/purge", params={"age": "0"})
        assert sorted(_listed(everything.text)) == sorted(aged.old + aged.recent + [aged.waiting])
        for bad in ("", "seven days", "-1d", "999999999w"):
            r = c.get("/ui/hubs/sales/queues/orders/purge", params={"age": bad})
            assert r.status_code == 422, (bad, r.text)
            assert 'id="error"' in r.text and 'id="purge-confirm"' not in r.text
        assert c.get("/ui/hubs/sales/queues/nope/purge?age=1d").status_code == 404
    assert _remaining(aged.url) == before  # a dry run changes nothing


def test_purge_needs_the_box_then_purges_exactly_those(tmp_path: Path, aged: Aged) -> None:
    path = "/ui/hubs/sales/queues/orders/purge"
    before = _remaining(aged.url)
    with admin_client(tmp_path, {"sales": aged.url}) as c:
        csrf = login(c)
        unconfirmed = c.post(path, data={"csrf": csrf, "age": "1d"})
        assert unconfirmed.status_code == 422
        assert "confirmation box" in unconfirmed.text and "nothing changed" in unconfirmed.text
        assert _count(unconfirmed.text) == (3, "yes")
        assert _remaining(aged.url) == before
        done = c.post(path, data={"csrf": csrf, "age": "1d", "confirm": "yes"})
        assert done.status_code == 200, done.text
        assert _count(done.text) == (3, "no")
        assert 'id="flash"' in done.text and "Purged 3 message(s)." in done.text
        again = c.get(path, params={"age": "1d"})
        assert _count(again.text) == (0, "yes")
        gone = c.get(f"/ui/hubs/sales/queues/orders/messages/{aged.old[0]}")
        assert gone.status_code == 404
    assert _remaining(aged.url) == before - set(aged.old)
    with iqbridge.connect(aged.url) as hub:
        q = hub.queue("orders")
        journalled = {s.msg_id for s in q.search(Filter(state=P.JOURNALLED))}
        assert journalled == {*aged.recent, aged.waiting}
        for mid in aged.old:
            with pytest.raises(MessageNotFound):
                q.state(mid)


def test_the_confirmed_purge_takes_what_the_dry_run_showed(tmp_path: Path, aged: Aged) -> None:
    path = "/ui/hubs/sales/queues/orders/purge"
    with admin_client(tmp_path, {"sales": aged.url}) as c:
        csrf = login(c)
        dry = c.get(path, params={"age": "0"})
        shown = sorted(_listed(dry.text))
        assert shown == sorted(aged.old + aged.recent + [aged.waiting])
        m = re.search(r'name="cutoff" value="(\d+)"', dry.text)
        assert m is not None, dry.text
        time.sleep(0.01)
        with iqbridge.connect(aged.url) as hub:  # journalled after the dry run
            q = hub.queue("orders")
            later = q.put({"n": "later"})
            _settle(q, "billing", 1)
            _settle(q, "shipping", 1)
            assert q.state(later).publisher_state is P.JOURNALLED
        done = c.post(path, data={"csrf": csrf, "age": "0", "cutoff": m.group(1), "confirm": "yes"})
        assert done.status_code == 200, done.text
        assert "Purged 5 message(s)." in done.text
    assert _remaining(aged.url) == {aged.pending, later}


# --- cross-queue recovery ----------------------------------------------------------------


@dataclass
class Seed:
    """Seed 000 after a crash: ``parent`` FETCHED by customer-db on hub a's ``sales``,
    its ``child`` put with confirm on hub b's ``approvals`` and never confirmed."""

    a: str
    b: str
    parent: str
    child: str


@pytest.fixture
def seed(tmp_path: Path) -> Iterator[Seed]:
    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    with (
        iqbridge.connect(a, publisher="pos") as ha,
        iqbridge.connect(b, publisher="customer-db") as hb,
    ):
        qa, qb = ha.queue("sales"), hb.queue("approvals")
        qa.subscribe("customer-db")
        qb.subscribe("credit-approval")
        parent = qa.put({"tx": 1})
        d = qa.get("customer-db", timeout=1)
        assert d is not None and d.msg_id == parent  # fetched, never done: the crash
        child = qb.put({"tx": 1}, parents=[parent], confirm=True)
        assert qa.state(parent).subscribers["customer-db"].state is S.FETCHED
        yield Seed(a, b, parent, child)


_PLAN = {
    "source_hub": "a",
    "source_queue": "sales",
    "target_hub": "b",
    "target_queue": "approvals",
}


def _rows(page: str) -> list[tuple[str, str]]:
    m = re.search(r'<table class="results" id="recovery-plan">(.*?)</table>', page, re.S)
    assert m is not None, page
    return re.findall(r'<tr data-action="([a-z]+)" data-msg-id="([^"]+)"', m.group(1))


def test_the_recovery_page_is_linked_and_offers_every_hub_and_queue(
    tmp_path: Path, seed: Seed
) -> None:
    with admin_client(tmp_path, {"a": seed.a, "b": seed.b}) as c:
        login(c)
        home = c.get("/ui/")
        assert 'href="/ui/recovery"' in home.text and 'id="recovery-link"' in home.text
        assert 'id="nav-recovery"' in home.text
        page = c.get("/ui/recovery")
    assert page.status_code == 200
    for el in (
        "recovery-source-hub",
        "recovery-source-queue",
        "recovery-target-hub",
        "recovery-target-queue",
        "recovery-via",
        "recovery-dry-run",
    ):
        assert f'id="{el}"' in page.text
    assert 'id="recovery-plan"' not in page.text  # no plan before one is asked for
    for hub_name in ("a", "b"):
        assert f'<option value="{hub_name}">{hub_name}</option>' in page.text
    assert '<optgroup label="a"><option value="sales">sales</option></optgroup>' in page.text
    assert '<optgroup label="b"><option value="approvals">' in page.text
    assert page.text.count('<option value="" selected>none</option>') == 4


def test_an_unreachable_hub_is_named_and_the_others_still_offered(
    tmp_path: Path, seed: Seed
) -> None:
    with admin_client(tmp_path, {"a": seed.a, "down": DOWN_URL}) as c:
        login(c)
        page = c.get("/ui/recovery")
        assert page.status_code == 200
        assert re.search(r'id="recovery-unreachable">[^<]*down', page.text)
        assert '<option value="down">' not in page.text
        dry = c.get(
            "/ui/recovery", params={"source_hub": "a", "source_queue": "sales", "plan": "1"}
        )
        assert _rows(dry.text) == [("release", seed.parent)]
        r = c.get("/ui/recovery", params={"source_hub": "down", "source_queue": "x", "plan": "1"})
        assert r.status_code == 422 and "no reachable hub" in r.text


def test_recovery_dry_run_then_apply_moves_the_seed_states(tmp_path: Path, seed: Seed) -> None:
    with admin_client(tmp_path, {"a": seed.a, "b": seed.b}) as c:
        csrf = login(c)
        dry = c.get("/ui/recovery", params={**_PLAN, "via": "", "plan": "1"})
        assert dry.status_code == 200, dry.text
        assert _rows(dry.text) == [("release", seed.parent), ("withdraw", seed.child)]
        assert f'href="/ui/hubs/a/queues/sales/messages/{seed.parent}"' in dry.text
        assert f'href="/ui/hubs/b/queues/approvals/messages/{seed.child}"' in dry.text
        assert "its child is withdrawn" in dry.text and 'data-state="FETCHED"' in dry.text
        assert 'id="recovery-confirm"' in dry.text and 'id="recovery-submit"' in dry.text
        assert 'id="recovery-result"' not in dry.text
        assert '<option value="a" selected>a</option>' in dry.text  # the choice is kept

        unconfirmed = c.post("/ui/recovery", data={**_PLAN, "csrf": csrf})
        assert unconfirmed.status_code == 422
        assert "confirmation box" in unconfirmed.text and "nothing changed" in unconfirmed.text
        assert _rows(unconfirmed.text) == _rows(dry.text)
        with iqbridge.connect(seed.a) as ha, iqbridge.connect(seed.b) as hb:
            assert ha.queue("sales").state(seed.parent).subscribers["customer-db"].state is (
                S.FETCHED
            )
            assert hb.queue("approvals").state(seed.child).publisher_state is P.PUT

        done = c.post("/ui/recovery", data={**_PLAN, "csrf": csrf, "confirm": "yes"})
        assert done.status_code == 200, done.text
        m = re.search(
            r'id="recovery-result" data-applied="(\d+)" data-already="(\d+)" '
            r'data-run="(admin-ops-[0-9a-f]+)"',
            done.text,
        )
        assert m is not None, done.text
        assert (m.group(1), m.group(2)) == ("2", "0")
        run = m.group(3)
        assert 'id="recovery-confirm"' not in done.text and 'id="flash"' in done.text

        again = c.get("/ui/recovery", params={**_PLAN, "plan": "1"})
        assert _rows(again.text) == [] and 'id="recovery-nothing"' in again.text
        assert 'id="recovery-confirm"' not in again.text

    with iqbridge.connect(seed.a) as ha, iqbridge.connect(seed.b) as hb:
        pst = ha.queue("sales").state(seed.parent)
        cst = hb.queue("approvals").state(seed.child)
    assert pst.subscribers["customer-db"].state is S.AVAILABLE
    assert cst.publisher_state is P.JOURNALLED
    assert P.UNAVAILABLE in [s for s, _ in cst.publisher_history]
    for st in (pst, cst):
        details = [e.detail for e in st.journal if e.detail and "recovery" in e.detail]
        assert details and all(d.startswith(f"by recovery {run}: step ") for d in details)


def test_recovery_with_one_side_only_and_bad_choices(tmp_path: Path, seed: Seed) -> None:
    with admin_client(tmp_path, {"a": seed.a, "b": seed.b}) as c:
        login(c)
        source_only = {"source_hub": "a", "source_queue": "sales", "plan": "1"}
        dry = c.get("/ui/recovery", params=source_only)
        assert dry.status_code == 200, dry.text
        assert _rows(dry.text) == [("release", seed.parent)]
        target_only = {"target_hub": "b", "target_queue": "approvals", "plan": "1"}
        alone = c.get("/ui/recovery", params=target_only)
        assert _rows(alone.text) == []
        assert re.search(f'id="recovery-unresolved".*data-msg-id="{seed.child}"', alone.text, re.S)
        assert "--from" in alone.text  # the reason the child cannot be decided
        for bad in (
            {"plan": "1"},
            {"source_hub": "a", "plan": "1"},
            {"source_hub": "b", "source_queue": "sales", "plan": "1"},
            {"source_hub": "zz", "source_queue": "sales", "plan": "1"},
            {"source_queue": "sales", "plan": "1"},
        ):
            r = c.get("/ui/recovery", params=bad)
            assert r.status_code == 422, (bad, r.text)
            assert 'id="error"' in r.text and 'id="recovery-plan"' not in r.text


def test_readonly_session_sees_no_action_form_and_cannot_act(
    tmp_path: Path, seed: Seed, aged: Aged
) -> None:
    hubs = {"a": seed.a, "b": seed.b, "sales": aged.url}
    before = _remaining(aged.url)
    with admin_client(tmp_path, hubs) as c:
        csrf = login(c, VIEWER_TOKEN)
        dry = c.get("/ui/hubs/sales/queues/orders/purge", params={"age": "1d"})
        assert dry.status_code == 200 and _count(dry.text) == (3, "yes")
        assert 'id="purge-confirm"' not in dry.text and 'id="purge-submit"' not in dry.text
        plan = c.get("/ui/recovery", params={**_PLAN, "plan": "1"})
        assert plan.status_code == 200 and len(_rows(plan.text)) == 2
        assert 'id="recovery-confirm"' not in plan.text
        r = c.post(
            "/ui/hubs/sales/queues/orders/purge",
            data={"csrf": csrf, "age": "1d", "confirm": "yes"},
        )
        assert r.status_code == 403 and "read-only" in r.text
        r = c.post("/ui/recovery", data={**_PLAN, "csrf": csrf, "confirm": "yes"})
        assert r.status_code == 403 and "read-only" in r.text
    assert _remaining(aged.url) == before
    with iqbridge.connect(seed.b) as hb:
        assert hb.queue("approvals").state(seed.child).publisher_state is P.PUT


def test_posts_without_the_csrf_token_are_refused(tmp_path: Path, seed: Seed, aged: Aged) -> None:
    hubs = {"a": seed.a, "b": seed.b, "sales": aged.url}
    before = _remaining(aged.url)
    with admin_client(tmp_path, hubs) as c:
        login(c)
        purge = "/ui/hubs/sales/queues/orders/purge"
        for token in ({}, {"csrf": ""}, {"csrf": "forged"}):
            r = c.post(purge, data={**token, "age": "1d", "confirm": "yes"})
            assert r.status_code == 403 and 'data-kind="csrf"' in r.text
            r = c.post("/ui/recovery", data={**_PLAN, **token, "confirm": "yes"})
            assert r.status_code == 403 and 'data-kind="csrf"' in r.text
        c.cookies.clear()  # no session at all: to the log-in page
        r = c.post(purge, data={"age": "1d", "confirm": "yes"}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    assert _remaining(aged.url) == before
    with iqbridge.connect(seed.b) as hb:
        assert hb.queue("approvals").state(seed.child).publisher_state is P.PUT


def test_what_the_forms_echo_is_escaped(tmp_path: Path, seed: Seed, aged: Aged) -> None:
    evil = "<script>alert(1)</script>"
    with admin_client(tmp_path, {"a": seed.a, "b": seed.b, "sales": aged.url}) as c:
        login(c)
        purge = c.get("/ui/hubs/sales/queues/orders/purge", params={"age": evil})
        assert purge.status_code == 422
        assert evil not in purge.text and "&lt;script&gt;" in purge.text
        plan = c.get("/ui/recovery", params={**_PLAN, "via": evil, "plan": "1"})
        assert plan.status_code == 200, plan.text
        assert evil not in plan.text
        # The via is echoed in its field and in the undecided child's reason.
        assert plan.text.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 2
        assert re.search(f'id="recovery-unresolved".*data-msg-id="{seed.child}"', plan.text, re.S)
        assert "Content-Security-Policy" in plan.headers
        bad_hub = c.get("/ui/recovery", params={"source_hub": evil, "plan": "1"})
        assert bad_hub.status_code == 422 and evil not in bad_hub.text
