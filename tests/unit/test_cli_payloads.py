"""Payloads on the command line (issue 27, points 5, 8 and 14): ``--json`` gives every
payload one documented form (binary ones as base64, their encoding named), ``iq get``
shows a payload that does not decode as its content type says and goes on with the next
messages, and ``iq browse --payloads`` keeps payloads readable in 80 columns."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path

from typer.testing import CliRunner, Result

import iqbridge
from iqbridge import SubscriberState
from iqbridge.cli import app

BAD_TEXT = b"\xff\xfeok"  # declared UTF-8 text, not valid UTF-8
BINARY = bytes(range(256))
TEXT = "text/plain; charset=utf-8"


def _iq(url: str, *args: str, width: int = 80) -> Result:
    return CliRunner().invoke(app, ["--url", url, *args], env={"COLUMNS": str(width)})


def _put_all(url: str) -> dict[str, str]:
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders", create=True)
        q.subscribe("billing")
        return {
            "bad_text": q.put(BAD_TEXT, content_type=TEXT),
            "text": q.put("plain words"),
            "json": q.put({"order": 7, "items": [1, 2]}),
            "binary": q.put(BINARY),
            "bad_json": q.put(b"{not json", content_type="application/json"),
        }


def test_browse_json_gives_every_payload_one_documented_form(sqlite_url: str) -> None:
    ids = _put_all(sqlite_url)
    out = _iq(sqlite_url, "browse", "orders", "--payloads", "--json")
    assert out.exit_code == 0, out.output
    found = {m["msg_id"]: m for m in json.loads(out.stdout)["messages"]}
    by = {name: found[msg_id] for name, msg_id in ids.items()}
    assert (by["text"]["content_type"], by["text"]["payload"]) == (TEXT, "plain words")
    assert by["json"]["content_type"] == "application/json"
    assert by["json"]["payload"] == {"order": 7, "items": [1, 2]}
    for name, body in (("binary", BINARY), ("bad_text", BAD_TEXT), ("bad_json", b"{not json")):
        payload = by[name]["payload"]
        assert set(payload) == {"encoding", "data"} and payload["encoding"] == "base64", name
        assert base64.b64decode(payload["data"]) == body, name
    assert by["binary"]["content_type"] == "application/octet-stream"
    # Without --payloads, no payload keys at all.
    plain = json.loads(_iq(sqlite_url, "browse", "orders", "--json").stdout)["messages"]
    assert all("payload" not in m and "content_type" not in m for m in plain)


def test_browse_json_names_why_a_payload_cannot_be_shown(sqlite_url: str, tmp_path: Path) -> None:
    with iqbridge.connect(sqlite_url) as hub:
        msg_id = hub.queue("orders", create=True).put("x", to=["billing"])
    # The broker's row gone behind the index's back: peek cannot find the payload.
    with sqlite3.connect(tmp_path / "iq.db") as raw:
        raw.execute("DELETE FROM iq_queue_rows WHERE msg_id = ?", (msg_id,))
    out = _iq(sqlite_url, "browse", "orders", "--payloads", "--json")
    assert out.exit_code == 0, out.output
    (m,) = json.loads(out.stdout)["messages"]
    assert m["msg_id"] == msg_id and m["payload"] is None and m["content_type"] is None
    assert m["payload_error"].startswith("MessageNotFound: ")


def test_get_shows_an_undecodable_payload_marks_it_unusable_and_goes_on(sqlite_url: str) -> None:
    ids = _put_all(sqlite_url)
    out = _iq(sqlite_url, "get", "orders", "billing", "-n", "5")
    assert out.exit_code == 0, out.output
    assert "Traceback" not in out.output
    shown = out.stdout
    # Every message is printed, in put order, the undecodable ones as their bytes.
    order = [shown.index(ids[k]) for k in ("bad_text", "text", "json", "binary", "bad_json")]
    assert order == sorted(order)
    assert "<4 bytes> fffe6f6b (not valid text/plain; charset=utf-8)" in shown
    assert "plain words" in shown and '{"order":7,"items":[1,2]}' in shown
    assert "<256 bytes> 000102030405060708090a0b0c0d0e0f" in shown
    assert "{not json (not valid application/json)" in shown
    # Each undecodable one is named on stderr with its new state and how to re-reveal it.
    notes = out.stderr.strip().splitlines()
    assert len(notes) == 2, out.stderr
    for note, key in zip(notes, ("bad_text", "bad_json"), strict=True):
        assert note.startswith(f"message {ids[key]}: payload is not valid"), note
        assert "billing marked it UNUSABLE" in note
        assert f"iq reveal orders {ids[key]} --to billing" in note
    with iqbridge.connect(sqlite_url) as hub:
        q = hub.queue("orders")
        for key, msg_id in ids.items():
            view = q.state(msg_id).subscribers["billing"]
            history = [s for s, _ in view.history]
            if key.startswith("bad"):
                assert history[-3:] == [
                    SubscriberState.IN_PROCESS,
                    SubscriberState.UNUSABLE,
                    SubscriberState.JOURNALLED,
                ], key
                assert view.reason is not None and view.reason.startswith("PayloadError"), key
            else:
                assert SubscriberState.DONE in history and view.reason is None, key
        assert q.get("billing") is None


def test_get_with_confirm_shows_an_undecodable_payload_and_holds_it(sqlite_url: str) -> None:
    with iqbridge.connect(sqlite_url) as hub:
        msg_id = hub.queue("orders", create=True).put(BAD_TEXT, to=["a"], content_type=TEXT)
    out = _iq(sqlite_url, "get", "orders", "a", "--confirm")
    assert out.exit_code == 0, out.output
    assert (
        "<4 bytes> fffe6f6b (not valid" in out.stdout and f"confirm id: {msg_id}/a/" in out.stdout
    )
    with iqbridge.connect(sqlite_url) as hub:
        assert hub.queue("orders").state(msg_id).subscribers["a"].state is SubscriberState.FETCHED


def test_browse_payloads_stay_readable_in_80_columns(sqlite_url: str) -> None:
    words = "a payload of several words that an operator wants to read whole here"
    with iqbridge.connect(sqlite_url) as hub:
        q = hub.queue("orders", create=True)
        q.put(words, to=["billing", "audit-department", "shipping"], correlation_id="cart-1")
        q.put(BINARY, to=["billing"])
    out = _iq(sqlite_url, "browse", "orders", "--payloads")
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    # Folded over lines, never cut: every word is there, in order.
    text = " ".join(" ".join(lines).split())
    assert words in text
    assert "<256 bytes> 000102030405060708090a0b0c0d0e0f" in text
