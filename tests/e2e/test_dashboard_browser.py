"""The admin dashboard end to end in Debian's headless Chromium (driven by Selenium
through Debian's chromedriver), against ``iq admin serve``'s app on a real port.

The operator logs in with the token, reads the queue list with its state counts,
searches a queue by msg_id, opens the message (its timeline, lineage on another hub, an
HTML payload shown as text), re-reveals it to the one subscriber that found it UNUSABLE
(a confirmation box is required: without it nothing changes) and sees the new state;
the index then holds it, journalled with the token's name. A screenshot of each page is
saved under ``IQ_SCREENSHOTS`` (default ``build/screenshots/``, which git ignores).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import iqbridge
from iqbridge import SubscriberState
from tests.conftest import need_server
from tests.integration.admin_helpers import ADMIN_TOKEN, make_app

S = SubscriberState
ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("IQ_SCREENSHOTS", ROOT / "build" / "screenshots"))

pytestmark = pytest.mark.timeout(180)


def _wait_for_next_page(b: Any, old: Any) -> None:
    """Wait until the page that held ``old`` is replaced and the new one has loaded.

    Chromium can answer a probe sent while it swaps documents with a generic
    "unhandled inspector error" instead of a stale-element error; that answer means
    "not yet", so the wait asks again rather than failing the test.
    """
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def replaced(driver: Any) -> bool:
        try:
            old.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException:
            return False
        return False

    def loaded(driver: Any) -> bool:
        try:
            return bool(driver.execute_script("return document.readyState") == "complete")
        except WebDriverException:
            return False

    WebDriverWait(b, 15, poll_frequency=0.05).until(replaced)
    WebDriverWait(b, 15, poll_frequency=0.05).until(loaded)


def _browser_parts() -> tuple[str | None, str | None]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    return chromium, shutil.which("chromedriver")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _served(app: object) -> Iterator[str]:
    """``app`` served by uvicorn on a free port; yields its base URL."""
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the admin server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[str, dict[str, str], str]]:
    """The admin app served by uvicorn on a free port over two SQLite hubs with known
    traffic; yields its base URL, the msg_ids and the sales hub's URL."""
    sales = f"sqlite:///{tmp_path / 'sales.db'}"
    credit = f"sqlite:///{tmp_path / 'credit.db'}"
    with iqbridge.connect(sales, publisher="till") as a, iqbridge.connect(credit) as b:
        q = a.queue("orders")
        q.subscribe("billing", "shipping")
        sale = q.put({"order": 17, "note": "<b>fragile</b><script>alert(1)</script>"})
        q.put({"order": 18})
        got = q.get("billing")
        assert got is not None and got.msg_id == sale
        got.done()
        got = q.get("shipping")
        assert got is not None and got.msg_id == sale
        got.unusable("address missing")
        c = b.queue("approvals")
        c.subscribe("credit")
        child = c.put({"order": 17, "score": 710}, parents=[sale])
    with _served(make_app(tmp_path, {"sales": sales, "credit": credit})) as base:
        yield base, {"sale": sale, "child": child}, sales


@pytest.fixture
def browser() -> Iterator[object]:
    chromium, driver = _browser_parts()
    need_server(
        "Chromium and chromedriver (Debian: apt install chromium chromium-driver)",
        bool(chromium and driver),
    )
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = chromium or ""
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(arg)
    opts.add_argument("--window-size=1280,1400")
    b = webdriver.Chrome(service=Service(driver or ""), options=opts)
    try:
        yield b
    finally:
        b.quit()


def test_log_in_search_open_rereveal_and_see_the_new_state(
    site: tuple[str, dict[str, str], str], browser: object
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import Select

    assert isinstance(browser, WebDriver)
    b = browser
    base, ids, sales = site
    sale = ids["sale"]
    SHOTS.mkdir(parents=True, exist_ok=True)

    def shot(name: str) -> None:
        b.save_screenshot(str(SHOTS / f"{name}.png"))

    def go(element_id: str | None = None, *, css: str | None = None) -> None:
        """Click a link or submit button and wait for the next page."""
        old = b.find_element(By.TAG_NAME, "html")
        target = (
            b.find_element(By.ID, element_id)
            if element_id
            else b.find_element(By.CSS_SELECTOR, css or "")
        )
        target.click()
        _wait_for_next_page(b, old)

    def attr(selector: str, name: str) -> str:
        return b.find_element(By.CSS_SELECTOR, selector).get_attribute(name) or ""

    # No session: the dashboard sends the browser to the log-in page.
    b.get(f"{base}/ui/")
    assert b.current_url.endswith("/ui/login")
    shot("01-login")
    b.find_element(By.ID, "token").send_keys("not-the-token-at-all")
    go("login-submit")
    assert b.current_url.endswith("/ui/login")  # refused
    b.find_element(By.ID, "token").send_keys(ADMIN_TOKEN)
    go("login-submit")
    assert b.find_element(By.ID, "who").text.startswith("ops")
    assert ADMIN_TOKEN not in b.page_source

    # The queue list: counts per state, per subscriber.
    pills = b.find_elements(
        By.CSS_SELECTOR, '#queue-sales-orders ~ tr [data-subscriber="shipping"]'
    )
    pills += b.find_elements(By.CSS_SELECTOR, '#queue-sales-orders [data-subscriber="shipping"]')
    assert any(p.get_attribute("data-state") == "JOURNALLED" for p in pills)
    assert b.find_elements(By.ID, "hub-credit")
    shot("02-queues")

    # Search the queue by msg_id.
    go(css="#queue-sales-orders a.queue-link")
    b.find_element(By.ID, "search-msg-id").send_keys(sale)
    go("search-submit")
    rows = b.find_elements(By.CSS_SELECTOR, "#results tr[data-msg-id]")
    assert [r.get_attribute("data-msg-id") for r in rows] == [sale]
    shot("03-search")

    # Open it: the timeline, the lineage on the other hub, the payload as text.
    go(f"msg-{sale}")
    assert b.find_element(By.ID, "msg-id").text == sale
    assert attr("#state-shipping", "data-state") == "JOURNALLED"
    assert attr("#state-billing", "data-state") == "JOURNALLED"
    assert b.find_elements(
        By.CSS_SELECTOR, '#timeline td.lane[data-actor="shipping"] [data-state="UNUSABLE"]'
    )
    kids = b.find_elements(By.CSS_SELECTOR, "#lineage-descendants li[data-msg-id]")
    assert [k.get_attribute("data-msg-id") for k in kids] == [ids["child"]]
    payload = b.find_element(By.ID, "payload").text
    assert "<script>alert(1)</script>" in payload  # shown as text, never run
    assert not b.find_elements(By.CSS_SELECTOR, "#payload script, #payload b")
    shot("04-message")

    # The action needs its confirmation box: without it nothing changes.
    Select(b.find_element(By.ID, "rereveal-subscriber")).select_by_value("shipping")
    go("rereveal-submit")
    assert attr("#state-shipping", "data-state") == "JOURNALLED"
    with iqbridge.connect(sales) as hub:
        assert hub.queue("orders").state(sale).subscribers["shipping"].attempt == 1

    # Re-reveal to shipping alone, confirmed.
    Select(b.find_element(By.ID, "rereveal-subscriber")).select_by_value("shipping")
    b.find_element(By.ID, "rereveal-reason").send_keys("address fixed")
    b.find_element(By.ID, "rereveal-confirm").click()
    go("rereveal-submit")
    assert attr("#state-shipping", "data-state") == "AVAILABLE"
    assert b.find_element(By.ID, "attempt-shipping").text == "2"
    assert attr("#state-billing", "data-state") == "JOURNALLED"
    shot("05-rereveal")

    with iqbridge.connect(sales) as hub:
        st = hub.queue("orders").state(sale)
    assert st.subscribers["shipping"].state is S.AVAILABLE
    assert st.subscribers["billing"].state is S.JOURNALLED
    [entry] = [
        e for e in st.journal if e.actor == "shipping" and e.dst == "AVAILABLE" and e.attempt == 2
    ]
    assert entry.detail == "by admin ops: address fixed"
    assert {p.name for p in SHOTS.glob("0*.png")} >= {
        "01-login.png",
        "02-queues.png",
        "03-search.png",
        "04-message.png",
        "05-rereveal.png",
    }


# --- a busy hub: a pool racing for a message, and a queue too long for one page ---------

#: Messages on the long queue: more than 20 pages of the default 100.
BULK = 2_002
STATE_NAMES = [*(s.value for s in iqbridge.PublisherState), *(s.value for s in S)]


@dataclass
class Busy:
    """Hub ``ops``: queue ``jobs`` (pool ``workers`` w1-w3 plus audit, archive and
    billing; one message every one of them finished within milliseconds) and queue
    ``bulk`` (:data:`BULK` messages, half put by ``east``, half by ``west``)."""

    base: str
    url: str
    job: str
    bulk: list[str]


@pytest.fixture
def busy(tmp_path: Path) -> Iterator[Busy]:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    with iqbridge.connect(url, publisher="planner") as hub:
        q = hub.queue("jobs")
        q.subscribe_pool("workers", ["w1", "w2", "w3"])
        q.subscribe("audit", "archive", "billing")
        job = q.put({"job": 1})
        for who in ("w1", "audit", "archive", "billing"):
            got = q.get(who)
            assert got is not None and got.msg_id == job
            got.in_process()
            if who == "audit":
                got.unusable("schema 3 unknown")
            else:
                got.done()
        bulk = hub.queue("bulk")
        bulk.subscribe("reader")
        ids = bulk.put_many([{"n": n} for n in range(BULK // 2)], publisher="east")
        ids += bulk.put_many([{"n": n} for n in range(BULK // 2, BULK)], publisher="west")
    with _served(make_app(tmp_path, {"ops": url})) as base:
        yield Busy(base, url, job, ids)


class Pages:
    """The browser on the dashboard: log in, open a page, follow a link."""

    def __init__(self, driver: object, base: str) -> None:
        from selenium.webdriver.remote.webdriver import WebDriver

        assert isinstance(driver, WebDriver)
        self.b = driver
        self.base = base

    def login(self) -> None:
        from selenium.webdriver.common.by import By

        self.b.get(f"{self.base}/ui/login")
        self.b.find_element(By.ID, "token").send_keys(ADMIN_TOKEN)
        self.follow("login-submit")
        assert self.b.find_element(By.ID, "who").text.startswith("ops")

    def open(self, path: str) -> None:
        self.b.get(self.base + path)

    def follow(self, element_id: str) -> None:
        """Click a link or button and wait for the next page."""
        from selenium.webdriver.common.by import By

        old = self.b.find_element(By.TAG_NAME, "html")
        self.b.find_element(By.ID, element_id).click()
        _wait_for_next_page(self.b, old)

    def text(self, css: str) -> str:
        from selenium.webdriver.common.by import By

        return " ".join(self.b.find_element(By.CSS_SELECTOR, css).text.split())

    def listed(self) -> list[str]:
        """The msg_ids of the search results shown, in order."""
        ids = self.b.execute_script(
            "return [...document.querySelectorAll('#results tr[data-msg-id]')]"
            ".map(r => r.dataset.msgId);"
        )
        assert isinstance(ids, list)
        return [str(i) for i in ids]

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.b.save_screenshot(str(SHOTS / f"{name}.png"))


#: Every leaf element of the timeline whose text is a state name, with its box.
_LABEL_BOXES = """
const names = new Set(arguments[0]);
const out = [];
for (const e of document.querySelectorAll('#timeline *')) {
  if (e.children.length) continue;
  const text = e.textContent.trim();
  if (!names.has(text)) continue;
  const r = e.getBoundingClientRect();
  out.push([text, r.left, r.top, r.right, r.bottom]);
}
return out;
"""


def test_timeline_labels_never_overlap_for_transitions_milliseconds_apart(
    busy: Busy, browser: object
) -> None:
    with iqbridge.connect(busy.url) as hub:
        st = hub.queue("jobs").state(busy.job)
    steps = list(st.publisher_history) + [s for v in st.subscribers.values() for s in v.history]
    times = sorted(at for _, at in steps)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert min(g for g in gaps if g > 0) < 0.05  # the case the issue met: ms apart

    page = Pages(browser, busy.base)
    page.login()
    page.open(f"/ui/hubs/ops/queues/jobs/messages/{busy.job}")
    boxes = page.b.execute_script(_LABEL_BOXES, STATE_NAMES)
    page.shot("06-timeline")
    # One label per transition, each drawn (a label hidden or left out is no fix)...
    assert sorted(b[0] for b in boxes) == sorted(s.value for s, _ in steps)
    assert all(right - left > 1 and bottom - top > 1 for _, left, top, right, bottom in boxes)

    # ...and no two of them overlap.
    def overlap(a: list[Any], b: list[Any]) -> bool:
        wide = min(a[3], b[3]) - max(a[1], b[1])
        high = min(a[4], b[4]) - max(a[2], b[2])
        return wide > 0.5 and high > 0.5

    clashes = [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if overlap(a, b)]
    assert clashes == []


def test_queue_page_counts_the_matches_and_pages_through_every_one(
    busy: Busy, browser: object
) -> None:
    from selenium.webdriver.common.by import By

    page = Pages(browser, busy.base)
    page.login()
    page.open("/ui/hubs/ops/queues/bulk")
    assert page.text("#page-summary") == "messages 1-100 of 2,002"
    assert not page.b.find_elements(By.ID, "page-prev")
    page.shot("07-queue-paged")
    seen: list[str] = []
    summaries = []
    for _ in range(30):
        summaries.append(page.text("#page-summary"))
        seen += page.listed()
        if not page.b.find_elements(By.ID, "page-next"):
            break
        page.follow("page-next")
    assert len(summaries) == 21
    assert summaries[1] == "messages 101-200 of 2,002"
    assert summaries[-1] == "messages 2,001-2,002 of 2,002"
    assert len(seen) == len(set(seen)) == BULK  # every message exactly once...
    assert seen == busy.bulk  # ...in put order
    page.follow("page-prev")
    assert page.text("#page-summary") == "messages 1,901-2,000 of 2,002"

    # A search counts its own matches and pages through them, filters and page size kept.
    page.open("/ui/hubs/ops/queues/bulk")
    page.b.find_element(By.ID, "search-publisher").send_keys("west")
    page.b.find_element(By.ID, "search-limit").clear()
    page.b.find_element(By.ID, "search-limit").send_keys("250")
    page.follow("search-submit")
    assert page.text("#page-summary") == "messages 1-250 of 1,001"
    west: list[str] = []
    for _ in range(5):
        west += page.listed()
        if not page.b.find_elements(By.ID, "page-next"):
            break
        page.follow("page-next")
    assert page.text("#page-summary") == "message 1,001 of 1,001"
    assert page.text("nav.pager .hint") == "page 5 of 5"
    assert west == busy.bulk[BULK // 2 :]


def test_pool_members_show_what_they_did_before_journalled(busy: Busy, browser: object) -> None:
    from selenium.webdriver.common.by import By

    page = Pages(browser, busy.base)
    page.login()
    page.open(f"/ui/hubs/ops/queues/jobs/messages/{busy.job}")
    want = {
        "w1": "DONE",  # won the race and did the work
        "w2": "EXPIRED",  # lost it
        "w3": "EXPIRED",
        "audit": "UNUSABLE",
        "billing": "DONE",
    }
    for who, outcome in want.items():
        cell = page.b.find_element(By.ID, f"state-{who}")
        assert cell.get_attribute("data-state") == "JOURNALLED"
        assert cell.get_attribute("data-outcome") == outcome
        assert page.text(f"#state-{who}") == f"JOURNALLED ({outcome})"

    page.open("/ui/hubs/ops/queues/jobs")
    row = f'#results tr[data-msg-id="{busy.job}"]'
    for who, outcome in want.items():
        pill = page.b.find_element(By.CSS_SELECTOR, f'{row} [data-subscriber="{who}"]')
        assert pill.get_attribute("data-outcome") == outcome
        assert " ".join(pill.text.split()) == f"{who}: JOURNALLED ({outcome})"
    page.shot("08-pool-outcomes")
