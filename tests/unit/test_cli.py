"""The ``iq`` command line: every command against a real SQLite file, its error paths
(one line on stderr, the right exit code, never a traceback), and ``iq demo`` end to end
through the installed entry point."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

import iqbridge
from iqbridge import Pool, PublisherState, SubscriberState
from iqbridge.cli import app
from iqbridge.cli.demo_check import verify
from iqbridge.errors import IndexUnavailable

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
IQ = Path(sys.executable).with_name("iq")

Run = Callable[..., Result]


@pytest.fixture
def iq(sqlite_url: str) -> Run:
    """Run ``iq --url <tmp db> ARGS...`` in-process."""
    runner = CliRunner()

    def run(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
        return runner.invoke(app, ["--url", sqlite_url, *args], input=input, env=env)

    return run


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result.stdout


def one_error_line(result: Result, code: int) -> str:
    """The failure printed exactly one line on stderr, with the exit code, no traceback."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("iq: error: ")
    return lines[0]


def put(iq: Run, *args: str) -> str:
    out = ok(iq("put", *args)).strip()
    assert UUID.fullmatch(out), out
    return out


def state_of(url: str, msg_id: str, queue: str = "orders") -> iqbridge.MessageState:
    with iqbridge.connect(url) as hub:
        return hub.queue(queue).state(msg_id)


# --- messages ---------------------------------------------------------------------------


def test_put_then_get_marks_done_for_that_subscriber_only(iq: Run, sqlite_url: str) -> None:
    msg_id = put(iq, "orders", "hello world", "--to", "billing", "--to", "audit")
    out = ok(iq("get", "orders", "billing"))
    assert msg_id in out and "attempt 1" in out and "hello world" in out
    st = state_of(sqlite_url, msg_id)
    assert st.subscribers["billing"].state is SubscriberState.JOURNALLED
    assert st.subscribers["audit"].state is SubscriberState.AVAILABLE
    again = iq("get", "orders", "billing")
    assert again.exit_code == 0 and again.stdout == ""
    assert "no message for billing" in again.stderr


def test_put_json_file_stdin_headers_and_index_fields(iq: Run, sqlite_url: str) -> None:
    msg_id = put(
        iq,
        "orders",
        '{"order": 7, "items": [1, 2]}',
        "--json",
        "--to",
        "billing",
        "--correlation-id",
        "cart-9",
        "--priority",
        "8",
        "--key",
        "customer-A",
        "--ttl",
        "1h",
        "--header",
        "source=web",
        "--publisher",
        "shop",
    )
    from_stdin = ok(iq("put", "orders", "--file", "-", "--to", "billing", input="line one\n"))
    with iqbridge.connect(sqlite_url) as hub:
        q = hub.queue("orders")
        env = q.peek(msg_id)
        assert env.payload() == {"order": 7, "items": [1, 2]}
        assert env.headers == {"source": "web"}
        assert (env.correlation_id, env.priority, env.ordering_key, env.publisher) == (
            "cart-9",
            8,
            "customer-A",
            "shop",
        )
        assert q.peek(from_stdin.strip()).payload() == "line one\n"


def test_put_to_a_pool_and_named_subscribers_is_combined(iq: Run, sqlite_url: str) -> None:
    msg_id = put(iq, "orders", "x", "--pool", "pickers=p1,p2", "--to", "billing")
    st = state_of(sqlite_url, msg_id)
    assert st.mode is iqbridge.Mode.COMBINED
    assert {n: v.pool for n, v in st.subscribers.items()} == {
        "billing": None,
        "p1": "pickers",
        "p2": "pickers",
    }
    ok(iq("get", "orders", "p2"))
    st = state_of(sqlite_url, msg_id)
    assert st.subscribers["p1"].state is SubscriberState.JOURNALLED  # EXPIRED: pool taken
    assert "pool taken by p2" in (st.subscribers["p1"].reason or "")


def test_confirmed_put_is_hidden_until_confirm_and_undo_withdraws(iq: Run, sqlite_url: str) -> None:
    held = put(iq, "orders", "a", "--to", "s", "--confirm")
    assert state_of(sqlite_url, held).publisher_state is PublisherState.PUT
    assert ok(iq("get", "orders", "s")) == ""
    assert "REVEALED" in ok(iq("confirm", "orders", held))
    assert state_of(sqlite_url, held).publisher_state is PublisherState.REVEALED

    undone = put(iq, "orders", "b", "--to", "s", "--confirm")
    ok(iq("undo", "orders", undone))
    assert state_of(sqlite_url, undone).publisher_state is not PublisherState.REVEALED
    assert state_of(sqlite_url, undone).subscribers["s"].state is SubscriberState.JOURNALLED


def test_held_get_confirmed_or_undone_by_confirm_id(iq: Run, sqlite_url: str) -> None:
    first = put(iq, "orders", "one", "--to", "s")
    out = ok(iq("get", "orders", "s", "--confirm"))
    confirm_id = re.search(r"confirm id: (\S+)", out)
    assert confirm_id is not None
    assert state_of(sqlite_url, first).subscribers["s"].state is SubscriberState.FETCHED
    ok(iq("confirm", "orders", confirm_id.group(1)))
    assert state_of(sqlite_url, first).subscribers["s"].state is SubscriberState.JOURNALLED

    second = put(iq, "orders", "two", "--to", "s")
    out = ok(iq("get", "orders", "s", "--confirm"))
    confirm_id = re.search(r"confirm id: (\S+)", out)
    assert confirm_id is not None
    ok(iq("undo", "orders", confirm_id.group(1)))
    view = state_of(sqlite_url, second).subscribers["s"]
    assert (view.state, view.attempt) == (SubscriberState.AVAILABLE, 2)


def test_get_count_and_timeout(iq: Run) -> None:
    ids = [put(iq, "orders", f"m{i}", "--to", "s") for i in range(3)]
    out = ok(iq("get", "orders", "s", "--count", "2", "--timeout", "0.1"))
    assert ids[0] in out and ids[1] in out and ids[2] not in out


def test_withdraw_and_rereveal_to_one_subscriber(iq: Run, sqlite_url: str) -> None:
    gone = put(iq, "orders", "x", "--to", "s")
    ok(iq("withdraw", "orders", gone, "--reason", "wrong price"))
    assert state_of(sqlite_url, gone).publisher_state in (
        PublisherState.UNAVAILABLE,
        PublisherState.JOURNALLED,
    )
    assert ok(iq("get", "orders", "s")) == ""

    bad = put(iq, "orders", "y", "--to", "s", "--to", "t")
    with iqbridge.connect(sqlite_url) as hub:
        d = hub.queue("orders").get("s")
        assert d is not None
        d.unusable("cannot parse")
    ok(iq("reveal", "orders", bad, "--to", "s"))
    view = state_of(sqlite_url, bad).subscribers["s"]
    assert (view.state, view.attempt) == (SubscriberState.AVAILABLE, 2)


# --- looking ----------------------------------------------------------------------------


def test_state_prints_the_timeline_and_json(iq: Run) -> None:
    msg_id = put(iq, "orders", "x", "--pool", "ship=a,b")
    ok(iq("get", "orders", "b"))
    out = ok(iq("state", "orders", msg_id))
    for text in (msg_id, "PUT+REVEALED", "GET+FETCHED", "DONE+JOURNALLED", "pool taken by b"):
        assert text in out, text
    data = json.loads(ok(iq("state", "orders", msg_id, "--json")))
    assert data["publisher_state"] == "JOURNALLED"
    assert data["subscribers"]["a"]["state"] == "JOURNALLED"
    assert [e["to"] for e in data["journal"] if e["actor"] == "a"] == [
        "AVAILABLE",
        "EXPIRED",
        "JOURNALLED",
    ]


def test_search_filters_on_index_fields(iq: Run) -> None:
    urgent = put(iq, "orders", "u", "--to", "s", "--priority", "8", "--correlation-id", "c1")
    normal = put(iq, "orders", "n", "--to", "s", "--to", "t")
    ok(iq("get", "orders", "s"))  # priority first: the urgent one

    def found(*args: str) -> set[str]:
        return {m["msg_id"] for m in json.loads(ok(iq("search", "orders", "--json", *args)))}

    assert found() == {urgent, normal}
    assert found("--priority", "7-9") == {urgent}
    assert found("--priority", "4") == {normal}
    assert found("--correlation-id", "c1") == {urgent}
    assert found("--state", "journalled", "--subscriber", "s") == {urgent}
    assert found("--state", "available") == {normal}
    assert found("--state", "Revealed") == {normal}
    assert found("--state", "journalled") == {urgent}  # the publisher's: all journalled
    assert found("--state", "sub:journalled") == {urgent}
    assert found("--state", "pub:JOURNALLED", "--subscriber", "t") == set()
    assert found("--subscriber", "t") == {normal}
    assert found("--since", "2999-01-01") == set()
    assert found("--until", "2999-01-01T00:00:00", "--limit", "1") == {urgent}
    table = ok(iq("search", "orders", "--state", "in-process"))
    assert "0 message(s)" in table


def test_browse_lock_get_under_lock_and_unlock(iq: Run) -> None:
    first = put(iq, "orders", "first payload", "--to", "s")
    second = put(iq, "orders", "second", "--to", "s", "--correlation-id", "lockme")
    out = ok(iq("browse", "orders", "--payloads"))
    assert "first payload" in out and first in out
    out = ok(iq("browse", "orders", "--correlation-id", "lockme", "--lock"))
    lock = re.search(r"lock id: (\w+)", out)
    assert lock is not None
    got = ok(iq("get", "orders", "s", "--count", "5"))
    assert first in got and second not in got  # hidden by the lock
    assert second in ok(iq("get", "orders", "s", "--lock-id", lock.group(1)))

    third = put(iq, "orders", "third", "--to", "s")
    data = json.loads(ok(iq("browse", "orders", "--msg-id", third, "--lock", "--json")))
    assert [m["msg_id"] for m in data["messages"]] == [third]
    assert "unlocked 1 message(s)" in ok(iq("unlock", "orders", data["lock_id"]))
    assert third in ok(iq("get", "orders", "s"))


def test_purge_accepts_durations(iq: Run, sqlite_url: str) -> None:
    msg_id = put(iq, "orders", "x", "--to", "s")
    ok(iq("get", "orders", "s"))
    assert "purged 0" in ok(iq("purge", "orders", "--older-than", "7d"))
    time.sleep(0.01)
    assert "purged 1" in ok(iq("purge", "orders", "--older-than", "0s"))
    with pytest.raises(iqbridge.MessageNotFound):
        state_of(sqlite_url, msg_id)
    line = one_error_line(iq("purge", "orders", "--older-than", "soon"), 2)
    assert "30s, 15m, 12h, 7d" in line


# --- queues and workers -----------------------------------------------------------------


def test_subscribe_then_put_without_audience_and_list_queues(iq: Run, sqlite_url: str) -> None:
    out = ok(iq("subscribe", "orders", "billing", "audit", "--pool", "ship=a,b"))
    assert "billing, audit, ship{a,b}" in out
    msg_id = put(iq, "orders", "x")
    assert set(state_of(sqlite_url, msg_id).subscribers) == {"billing", "audit", "a", "b"}
    ok(iq("subscribe", "invoices", "--pool", "clerks=c1"))
    out = ok(iq("queues"))
    assert "orders" in out and "invoices" in out and "clerks{c1}" in out
    one_error_line(iq("subscribe", "orders"), 2)


def test_recover_returns_lapsed_leases(iq: Run, sqlite_url: str) -> None:
    msg_id = put(iq, "orders", "x", "--to", "s")
    ok(iq("get", "orders", "s", "--confirm", "--lease", "0.05"))
    time.sleep(0.1)
    assert "recovered 1" in ok(iq("recover", "orders"))
    view = state_of(sqlite_url, msg_id).subscribers["s"]
    assert (view.state, view.attempt) == (SubscriberState.AVAILABLE, 2)
    assert "recovered 0" in ok(iq("recover"))


def test_worker_with_default_and_custom_handler(
    iq: Run, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [put(iq, "orders", f"payload-{i}", "--to", "s", "--to", "t") for i in range(3)]
    out = ok(iq("worker", "orders", "s", "--until-idle", "0.3", "--threads", "2"))
    assert all(f"payload-{i}" in out for i in range(3))
    assert "processed 3 message(s)" in out

    seen = tmp_path / "seen.txt"
    (tmp_path / "cli_handler_mod.py").write_text(
        "def handle(d):\n"
        f"    with open({str(seen)!r}, 'a') as f:\n"
        "        f.write(d.msg_id + '\\n')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = ok(
        iq("worker", "orders", "t", "--handler", "cli_handler_mod:handle", "--max-messages", "2")
    )
    assert "processed 2 message(s)" in out
    assert seen.read_text().split() == ids[:2]
    assert state_of(sqlite_url, ids[2]).subscribers["t"].state is SubscriberState.AVAILABLE
    line = one_error_line(iq("worker", "orders", "t", "--handler", "no_such_mod_xyz:f"), 1)
    assert "no_such_mod_xyz" in line


def test_worker_process_stops_cleanly_on_ctrl_c_after_its_messages(sqlite_url: str) -> None:
    with iqbridge.connect(sqlite_url) as hub:
        hub.queue("orders").put_many(["a", "b"], to=["s"])
    proc = subprocess.Popen(
        [str(IQ), "--url", sqlite_url, "worker", "orders", "s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with iqbridge.connect(sqlite_url) as hub:
                if not hub.queue("orders").search(state=SubscriberState.AVAILABLE):
                    break
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in out + err
    assert "processed 2 message(s)" in out


# --- errors -----------------------------------------------------------------------------


def test_unknown_scheme_is_one_line_with_a_hint(iq: Run) -> None:
    line = one_error_line(iq("--url", "sqlit:///x.db", "queues"), 1)
    assert "did you mean 'sqlite'" in line


def test_bad_json_is_a_usage_error(iq: Run) -> None:
    line = one_error_line(iq("put", "orders", '{"a": ', "--json", "--to", "s"), 2)
    assert "not valid JSON" in line


@pytest.mark.parametrize(
    "args",
    [
        ("get", "nope", "s"),
        ("state", "nope", "01a204d2-adcc-703c-a805-10edb4ac4fd1"),
        ("search", "nope"),
        ("browse", "nope"),
        ("purge", "nope", "--older-than", "1d"),
        ("recover", "nope"),
        ("worker", "nope", "s", "--until-idle", "0"),
        ("withdraw", "nope", "01a204d2-adcc-703c-a805-10edb4ac4fd1"),
    ],
)
def test_unknown_queue_is_not_created(iq: Run, sqlite_url: str, args: tuple[str, ...]) -> None:
    put(iq, "orders", "x", "--to", "s")
    line = one_error_line(iq(*args), 1)
    assert "queue 'nope' does not exist" in line
    with iqbridge.connect(sqlite_url) as hub:
        assert hub.queues() == ["orders"]


def test_a_message_asked_of_another_queue_is_named_where_it_is(iq: Run) -> None:
    """Issue 27, point 14: `iq reveal other ID --to nobody` said "never put, or purged"."""
    msg_id = put(iq, "orders", "x", "--to", "s")
    put(iq, "other", "y", "--to", "t")
    for args in (
        ("reveal", "other", msg_id, "--to", "nobody"),
        ("state", "other", msg_id),
        ("withdraw", "other", msg_id),
    ):
        line = one_error_line(iq(*args), 1)
        assert f"message {msg_id} not found in queue 'other': it was put to queue 'orders'" in line


def test_reading_a_database_that_does_not_exist_does_not_create_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "missing.db"
    result = CliRunner().invoke(app, ["--url", f"sqlite:///{path}", "get", "orders", "s"])
    assert "no iqbridge database" in one_error_line(result, 1)
    assert not path.exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("put", "orders", "x", "--to", "s", "--priority", "12"), "--priority"),
        (("search", "orders", "--priority", "9-3"), "N-M"),
        (("search", "orders", "--priority", "high"), "N-M"),
        (("put", "orders", "--to", "s"), "PAYLOAD"),
        (("put", "orders", "x", "--header", "novalue"), "KEY=VALUE"),
        (("put", "orders", "x", "--pool", "p="), "NAME=member1"),
        (("put", "orders", "x", "--ttl", "forever"), "duration"),
        (("search", "orders", "--since", "yesterday"), "ISO 8601"),
        (("nosuchcommand",), "nosuchcommand"),
        (("get", "orders"), "'subscriber'"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(iq: Run, args: tuple[str, ...], needle: str) -> None:
    put(iq, "orders", "x", "--to", "s")
    assert needle in one_error_line(iq(*args), 2)


def test_bad_state_name_lists_the_valid_ones(iq: Run) -> None:
    put(iq, "orders", "x", "--to", "s")
    line = one_error_line(iq("search", "orders", "--state", "finished"), 2)
    for name in ("PUT", "REVEALED", "AVAILABLE", "IN_PROCESS", "DONE", "UNUSABLE", "EXPIRED"):
        assert name in line


def test_missing_message_id(iq: Run) -> None:
    put(iq, "orders", "x", "--to", "s")
    missing = "01a204d2-adcc-703c-a805-10edb4ac4fd1"
    for args in (("state", "orders", missing), ("confirm", "orders", missing)):
        assert f"message {missing}" in one_error_line(iq(*args), 1)
        assert "not found" in one_error_line(iq(*args), 1)


def test_illegal_move_is_one_line(iq: Run) -> None:
    msg_id = put(iq, "orders", "x", "--to", "s")
    line = one_error_line(iq("reveal", "orders", msg_id, "--to", "s"), 1)
    assert "illegal transition" in line and "nothing was changed" in line


def test_unexpected_error_names_its_type_and_debug_shows_the_traceback(
    iq: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> iqbridge.Hub:
        raise ZeroDivisionError("boom")

    put(iq, "orders", "x", "--to", "s")
    monkeypatch.setattr(iqbridge, "connect", broken)
    line = one_error_line(iq("queues"), 1)
    assert "ZeroDivisionError: boom" in line and "--debug" in line
    debug = iq("--debug", "queues")
    assert debug.exit_code == 1
    assert "Traceback" in debug.stderr
    assert debug.stderr.strip().endswith("boom (run with --debug for the traceback)")


def test_url_passwords_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "redis://app:s3cr3t-pw@db.example:6379/0"

    def unreachable(target: str, *args: object, **kwargs: object) -> iqbridge.Hub:
        raise IndexUnavailable(f"cannot reach {target}: connection refused")

    monkeypatch.setattr(iqbridge, "connect", unreachable)
    result = CliRunner().invoke(app, ["queues"], env={"IQ_URL": url})
    line = one_error_line(result, 1)
    assert "s3cr3t-pw" not in result.output
    assert "app:***@db.example" in line


# --- the demo ---------------------------------------------------------------------------


def test_demo_verdict_catches_lost_and_duplicate_deliveries(sqlite_url: str) -> None:
    with iqbridge.connect(sqlite_url) as hub:
        q = hub.queue("orders")
        done = q.put("a", to=["s", Pool("p", ["x", "y"])])
        waiting = q.put("b", to=["s"])
        for sub in ("s", "y"):
            d = q.get(sub)
            assert d is not None and d.msg_id == done
            d.done()
        states = [q.state(done), q.state(waiting)]
    planned = {done: frozenset({"s", "p"}), waiting: frozenset({"s"})}
    good = verify(states[:1], {(done, "s"): 1, (done, "p"): 1}, {done: planned[done]}, {})
    assert good.ok and good.expected == good.done_once == 2
    twice = verify(states[:1], {(done, "s"): 2, (done, "p"): 1}, {done: planned[done]}, {})
    assert not twice.ok and len(twice.twice) == 1
    lost = verify(states, {(done, "s"): 1, (done, "p"): 1}, planned, {waiting: "#2"})
    assert not lost.ok and any(p.startswith("lost: #2") for p in lost.problems)


def _timeline(output: str) -> dict[str, dict[tuple[str, str], str]]:
    """Parse the demo's timeline table: message label -> (who, attempt) -> states text."""
    blocks: dict[str, dict[tuple[str, str], str]] = {}
    label = who = attempt = ""
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) != 5:
            continue
        first, att, text = cells[1], cells[2], cells[3]
        if first.startswith("#"):
            label, who, attempt = first, "", ""
            blocks[label] = {}
            continue
        if not label:
            continue
        if att:
            attempt = att
            if first:
                who = first.split()[0]
        elif first.endswith("publisher"):
            who, attempt = "publisher", ""
        row = blocks[label].setdefault((who, attempt), "")
        blocks[label][(who, attempt)] = f"{row} {text}".strip()
    return blocks


@pytest.mark.slow
def test_demo_end_to_end_through_the_installed_entry_point(tmp_path: Path) -> None:
    assert IQ.exists(), f"the iq console script is not installed next to {sys.executable}"
    db = tmp_path / "demo.db"
    started = time.monotonic()
    proc = subprocess.run(
        [str(IQ), "demo", "--db", str(db)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "100"},
        cwd=tmp_path,
    )
    elapsed = time.monotonic() - started
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in out + proc.stderr
    assert elapsed < 60
    blocks = _timeline(out)
    assert len(blocks) == 12

    crashed = [
        b
        for b in blocks.values()
        if "IN_PROCESS" in b.get(("ledger", "1"), "") and ("ledger", "2") in b
    ]
    assert crashed, "no message shows the killed consumer"
    for b in crashed:
        first, second = b[("ledger", "1")], b[("ledger", "2")]
        assert first.rstrip().endswith(")") and "held by ledger@" in first
        assert second.startswith("AVAILABLE") and "lease of ledger@" in second
        assert second.index("AVAILABLE") < second.index("IN_PROCESS") < second.index("DONE")

    pool = [b for label, b in blocks.items() if label.endswith("pool")]
    assert pool and all(
        sum("DONE" in text for (who, _), text in b.items() if who.startswith("ship-")) == 1
        and sum("EXPIRED+JOURNALLED" in text for text in b.values()) == 2
        for b in pool
    )
    assert all("pool taken by ship-" in t for b in pool for t in b.values() if "EXPIRED" in t)

    rerevealed = [b for b in blocks.values() if "UNUSABLE" in b.get(("audit", "1"), "")]
    assert len(rerevealed) == 1
    second = rerevealed[0][("audit", "2")]
    assert "re-revealed by publisher" in second and "DONE" in second
    assert "again for audit" in rerevealed[0][("publisher", "")]

    assert "nothing lost, nothing processed twice" in out
    assert not db.exists()  # removed without --keep
