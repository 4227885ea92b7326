"""A queue's page on the dashboard counts what matches and pages through it: the count
line, the previous/next/first links (filters and page size kept), the bound past which
it neither counts nor pages, bad offsets; and the durations the timeline prints.

The browser test (tests/e2e/test_dashboard_browser.py) follows the links through 2,002
messages; these check the edges without a browser."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import iqbridge
from iqbridge.admin.dashboard_views import duration
from tests.integration.admin_helpers import admin_client, login

pytestmark = pytest.mark.timeout(120)

PAGE = "/ui/hubs/ops/queues/q"


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[TestClient, list[str]]]:
    """25 messages on queue ``q`` of hub ``ops`` (15 put by east, then 10 by west); a
    logged-in client."""
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    with iqbridge.connect(url) as hub:
        q = hub.queue("q")
        q.subscribe("reader")
        ids = q.put_many(range(15), publisher="east") + q.put_many(range(10), publisher="west")
    with admin_client(tmp_path, {"ops": url}) as client:
        login(client)
        yield client, ids


def _summary(text: str) -> str:
    m = re.search(r'id="page-summary">([^<]*)<', text)
    assert m is not None, "no count line"
    return html.unescape(m.group(1))


def _link(text: str, element_id: str) -> str | None:
    m = re.search(rf'<a href="([^"]*)"[^>]*id="{element_id}"', text)
    return html.unescape(m.group(1)) if m else None


def _ids(text: str) -> list[str]:
    return re.findall(r'<tr data-msg-id="([^"]+)">', text)


def test_pages_link_to_each_other_keeping_the_page_size(
    site: tuple[TestClient, list[str]],
) -> None:
    client, ids = site
    first = client.get(PAGE, params={"limit": "10"})
    assert first.status_code == 200
    assert _summary(first.text) == "messages 1-10 of 25"
    assert _ids(first.text) == ids[:10]
    assert _link(first.text, "page-prev") is None
    assert _link(first.text, "page-next") == f"{PAGE}?limit=10&offset=10"
    last = client.get(PAGE, params={"limit": "10", "offset": "20"})
    assert _summary(last.text) == "messages 21-25 of 25"
    assert _ids(last.text) == ids[20:]
    assert _link(last.text, "page-next") is None
    assert _link(last.text, "page-prev") == f"{PAGE}?limit=10&offset=10"
    assert _link(last.text, "page-first") == f"{PAGE}?limit=10"
    assert "page 3 of 3" in last.text


def test_a_search_counts_its_own_matches_and_its_links_keep_its_filters(
    site: tuple[TestClient, list[str]],
) -> None:
    client, ids = site
    page = client.get(PAGE, params={"publisher": "west", "limit": "4", "offset": "4"})
    assert _summary(page.text) == "messages 5-8 of 10"
    assert _ids(page.text) == ids[19:23]
    assert _link(page.text, "page-next") == f"{PAGE}?publisher=west&limit=4&offset=8"
    assert _link(page.text, "page-prev") == f"{PAGE}?publisher=west&limit=4"
    none = client.get(PAGE, params={"publisher": "north"})
    assert _summary(none.text) == "no message matches"
    assert 'id="no-results"' in none.text


def test_an_offset_past_the_matches_says_so_and_links_back(
    site: tuple[TestClient, list[str]],
) -> None:
    client, _ = site
    page = client.get(PAGE, params={"offset": "30"})
    assert page.status_code == 200
    assert _summary(page.text) == "no messages past the first 30; 25 match"
    assert _ids(page.text) == []
    assert _link(page.text, "page-prev") == PAGE


@pytest.mark.parametrize("offset", ["-1", "ten", "10000"])
def test_a_bad_offset_is_refused_on_the_page(
    site: tuple[TestClient, list[str]], offset: str
) -> None:
    client, _ = site
    page = client.get(PAGE, params={"offset": offset})
    assert page.status_code == 422
    assert 'id="error"' in page.text and "offset" in page.text
    assert _ids(page.text) == []


def test_past_the_scan_bound_it_neither_counts_nor_pages_further(
    site: tuple[TestClient, list[str]],
) -> None:
    client, ids = site
    client.app.state.admin.service.scan_bound = 12  # type: ignore[attr-defined]
    # A filtered search counts up to the bound and says there are more.
    east = client.get(PAGE, params={"publisher": "east", "limit": "5", "offset": "5"})
    assert _summary(east.text) == "messages 6-10 of more than 12"
    assert _link(east.text, "page-next") == f"{PAGE}?publisher=east&limit=5&offset=10"
    tail = client.get(PAGE, params={"publisher": "east", "limit": "5", "offset": "10"})
    assert _ids(tail.text) == ids[10:15]
    assert _link(tail.text, "page-next") is None  # offset 15 is past the bound
    assert 'id="page-bound"' in tail.text
    # Without a filter the index counts the whole queue; pages still stop at the bound.
    whole = client.get(PAGE, params={"limit": "10", "offset": "10"})
    assert _summary(whole.text) == "messages 11-20 of 25"
    assert _link(whole.text, "page-next") is None
    assert 'id="page-bound"' in whole.text
    assert client.get(PAGE, params={"offset": "12"}).status_code == 422


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(0), "0 µs"),
        (timedelta(microseconds=840), "840 µs"),
        (timedelta(microseconds=4_210), "4.2 ms"),
        (timedelta(seconds=1.25), "1.25 s"),
        (timedelta(minutes=3, seconds=4.5), "3 min 4 s"),
        (timedelta(hours=2, minutes=5), "2 h 5 min"),
        (timedelta(days=3, hours=4, minutes=59), "3 d 4 h"),
        (timedelta(microseconds=-5), "0 µs"),
    ],
)
def test_durations_read_for_people(delta: timedelta, text: str) -> None:
    assert duration(delta) == text
