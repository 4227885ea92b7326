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

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import iqbridge
from iqbridge import SubscriberState
from tests.conftest import need_server
from tests.integration.admin_helpers import ADMIN_TOKEN, make_app

S = SubscriberState
ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("IQ_SCREENSHOTS", ROOT / "build" / "screenshots"))

pytestmark = pytest.mark.timeout(180)


def _browser_parts() -> tuple[str | None, str | None]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    return chromium, shutil.which("chromedriver")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[str, dict[str, str], str]]:
    """The admin app served by uvicorn on a free port over two SQLite hubs with known
    traffic; yields its base URL, the msg_ids and the sales hub's URL."""
    import uvicorn

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
    app = make_app(tmp_path, {"sales": sales, "credit": credit})
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
        yield f"http://127.0.0.1:{port}", {"sale": sale, "child": child}, sales
    finally:
        server.should_exit = True
        thread.join(10)


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
    from selenium.webdriver.support.expected_conditions import staleness_of
    from selenium.webdriver.support.ui import Select, WebDriverWait

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
        WebDriverWait(b, 15).until(staleness_of(old))

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
    assert b.find_elements(By.CSS_SELECTOR, "#timeline circle.dot")
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
    assert sorted(p.name for p in SHOTS.glob("0*.png")) == [
        "01-login.png",
        "02-queues.png",
        "03-search.png",
        "04-message.png",
        "05-rereveal.png",
    ]
