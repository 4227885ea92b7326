"""A queue's standing audience (issue 27, point 4): a pool that would make every put
without ``to`` fail is refused when it is declared, with a typed error naming the queue,
the pool and the member, and nothing changes; ``unsubscribe`` removes standing
subscribers and pools (also ones an index holds from before the check); messages already
put keep their audience. Through the facade and through ``iq subscribe``/``iq
unsubscribe`` on a real SQLite file."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner, Result

import iqbridge
from iqbridge import AudienceError, SubscriberState
from iqbridge.cli import app
from iqbridge.model import Pool, Subscriptions


def _iq(url: str, *args: str) -> Result:
    return CliRunner().invoke(app, ["--url", url, *args])


def _error(result: Result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("iq: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("before", "declare", "says"),
    [
        ([], ("p", ["a", "a"]), ["pool 'p'", "'orders'", "member 'a'", "listed twice"]),
        (
            [("sub", "a")],
            ("p", ["a", "b"]),
            ["pool 'p'", "'orders'", "member 'a'", "standing subscriber"],
        ),
        (
            [("pool", "q", ["b", "c"])],
            ("p", ["a", "c"]),
            ["pool 'p'", "'orders'", "member 'c'", "standing pool 'q'"],
        ),
        ([], ("p", []), ["pool 'p'", "'orders'", "needs members"]),
        ([("sub", "p")], ("p", ["a"]), ["'p'", "names a subscriber", "'orders'"]),
    ],
)
def test_a_pool_every_put_would_refuse_is_refused_and_nothing_changes(
    hub: iqbridge.Hub, before: list[tuple[str, ...]], declare: tuple[str, list[str]], says: str
) -> None:
    q = hub.queue("orders", create=True)
    for kind, name, *members in before:
        if kind == "sub":
            q.subscribe(name)
        else:
            q.subscribe_pool(name, members[0])
    standing = q.subscriptions()
    with pytest.raises(AudienceError) as err:
        q.subscribe_pool(*declare)
    for part in says:
        assert part in str(err.value)
    assert q.subscriptions() == standing
    if standing.subscribers or standing.pools:
        q.put("still fine")  # the standing audience still takes puts


def test_a_subscriber_already_in_a_standing_pool_is_refused(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders", create=True)
    q.subscribe_pool("shippers", ["s1", "s2"])
    with pytest.raises(AudienceError, match=r"'s2'.*'orders'.*standing pool 'shippers'"):
        q.subscribe("billing", "s2")
    assert q.subscriptions().subscribers == ()
    # Redefining a pool with its own members again is fine.
    q.subscribe_pool("shippers", ["s2", "s3"])
    assert q.subscriptions().pools == (Pool("shippers", ["s2", "s3"]),)


def test_iq_subscribe_refuses_a_bad_pool_and_changes_nothing(sqlite_url: str) -> None:
    assert _iq(sqlite_url, "subscribe", "orders", "audit").exit_code == 0
    line = _error(_iq(sqlite_url, "subscribe", "orders", "--pool", "p=a,a"))
    assert "pool 'p' on queue 'orders': member 'a' is listed twice" in line
    # A new subscriber and a pool naming it: refused before either is added.
    line = _error(_iq(sqlite_url, "subscribe", "orders", "billing", "--pool", "p=billing,b"))
    assert "member 'billing'" in line and "standing subscriber" in line
    with iqbridge.connect(sqlite_url) as hub:
        q = hub.queue("orders")
        assert q.subscriptions() == Subscriptions(("audit",))
        assert set(q.state(q.put("x")).subscribers) == {"audit"}


def test_unsubscribe_removes_a_bad_standing_pool_from_before_the_check(sqlite_url: str) -> None:
    with iqbridge.connect(sqlite_url) as hub:
        q = hub.queue("orders", create=True)
        # What an index written before the check can hold: every put without `to` fails.
        hub.store.set_subscriptions(
            "orders", Subscriptions(("a",), (Pool("p", ["a", "b"]), Pool("r", ["c", "c"])))
        )
        with pytest.raises(AudienceError, match=r"standing audience of queue 'orders'"):
            q.put("x")
    put = _iq(sqlite_url, "put", "orders", "x")
    assert "iq unsubscribe orders" in _error(put)
    out = _iq(sqlite_url, "unsubscribe", "orders", "--pool", "p", "--pool", "r")
    assert out.exit_code == 0, out.output
    assert out.stdout.strip() == "orders: a"
    assert _iq(sqlite_url, "put", "orders", "x").exit_code == 0


def test_unsubscribing_affects_later_puts_only(sqlite_url: str) -> None:
    with iqbridge.connect(sqlite_url) as hub:
        q = hub.queue("orders", create=True)
        q.subscribe("billing", "audit")
        q.subscribe_pool("shippers", ["s1", "s2"])
        before = q.put("before")
    out = _iq(sqlite_url, "unsubscribe", "orders", "audit", "shippers")
    assert out.exit_code == 0, out.output
    assert out.stdout.strip() == "orders: billing"
    with iqbridge.connect(sqlite_url) as hub:
        q = hub.queue("orders")
        after = q.put("after")
        assert set(q.state(after).subscribers) == {"billing"}
        kept = q.state(before).subscribers
        assert set(kept) == {"billing", "audit", "s1", "s2"}
        assert kept["audit"].state is SubscriberState.AVAILABLE
        got = q.get("audit")  # its message before the unsubscribe is still its own
        assert got is not None and got.msg_id == before
        got.done()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["nobody"], "no standing subscriber or pool 'nobody' on queue 'orders'"),
        (["--pool", "billing"], "no standing pool 'billing' on queue 'orders'"),
        (["billing", "--pool", "nope"], "no standing pool 'nope'"),
    ],
)
def test_unsubscribing_what_is_not_standing_is_an_error_and_changes_nothing(
    sqlite_url: str, args: list[str], says: str
) -> None:
    assert _iq(sqlite_url, "subscribe", "orders", "billing", "--pool", "p=a,b").exit_code == 0
    line = _error(_iq(sqlite_url, "unsubscribe", "orders", *args))
    assert says in line and "standing: billing, pool p" in line
    with iqbridge.connect(sqlite_url) as hub:
        subs = hub.queue("orders").subscriptions()
        assert subs == Subscriptions(("billing",), (Pool("p", ["a", "b"]),))


def test_unsubscribe_pool_leaves_a_subscriber_of_the_same_name(hub: iqbridge.Hub) -> None:
    q = hub.queue("orders", create=True)
    hub.store.set_subscriptions("orders", Subscriptions(("p",), (Pool("p", ["a"]),)))
    q.unsubscribe_pool("p")
    assert q.subscriptions() == Subscriptions(("p",))
