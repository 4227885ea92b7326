"""The cross-queue recovery's rules on embedded SQLite (issue 16, point 1): whose state
counts for the module (``via``), children the procedure cannot decide, pools, a member
in GET, and ``iq recover --from/--to`` with its dry run and its error paths."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import iqbridge
from iqbridge import Pool, PublisherState, SubscriberState, engine
from iqbridge.cli import app
from iqbridge.errors import InvalidArgument
from iqbridge.model import Audience
from iqbridge.recovery.crossqueue import CrossQueueRecovery
from tests.unit.test_cli import ok, one_error_line

S = SubscriberState
P = PublisherState


@pytest.fixture
def qs(tmp_path: Path) -> Iterator[tuple[iqbridge.Queue, iqbridge.Queue]]:
    with (
        iqbridge.connect(f"sqlite:///{tmp_path}/a.db", publisher="pos") as ha,
        iqbridge.connect(f"sqlite:///{tmp_path}/b.db", publisher="customer-db") as hb,
    ):
        hb.queue("approvals").subscribe("credit-approval")
        yield ha.queue("sales"), hb.queue("approvals")


def _got(qa: iqbridge.Queue, sub: str, *, done: bool = False) -> str:
    d = qa.get(sub, timeout=1)
    assert d is not None
    if done:
        d.done()
    return d.msg_id


def test_the_childs_publisher_names_the_module_among_several_subscribers(
    qs: tuple[iqbridge.Queue, iqbridge.Queue],
) -> None:
    qa, qb = qs
    qa.subscribe("customer-db", "audit")
    parent = qa.put({"tx": 1})
    _got(qa, "audit", done=True)  # the audit trail is DONE: not the module's verdict
    _got(qa, "customer-db")
    child = qb.put({"tx": 1}, parents=[parent], confirm=True)
    plan = CrossQueueRecovery(qa, qb).plan()
    assert [(r.action, r.msg_id, r.subscriber) for r in plan.rows] == [
        ("release", parent, "customer-db"),
        ("withdraw", child, None),
    ]


def test_a_child_the_procedure_cannot_decide_is_left_alone(
    qs: tuple[iqbridge.Queue, iqbridge.Queue],
) -> None:
    qa, qb = qs
    qa.subscribe("billing", "audit")
    parent = qa.put({"tx": 1})
    _got(qa, "billing")
    child = qb.put({"tx": 1}, parents=[parent], confirm=True, publisher="somebody")
    plan = CrossQueueRecovery(qa, qb).plan()
    [u] = plan.unresolved
    assert u.msg_id == child and "--via" in u.reason and "audit, billing" in u.reason
    # Step 5 still applies to the inbound queue; the child is not touched.
    assert [(r.step, r.action) for r in plan.rows] == [(5, "release")]
    CrossQueueRecovery(qa, qb).apply(plan)
    assert qb.state(child).publisher_state is P.PUT
    # Named with via, it is decided.
    plan = CrossQueueRecovery(qa, qb, via="billing").plan()
    assert plan.unresolved == () and [r.action for r in plan.rows] == ["withdraw"]
    wrong = CrossQueueRecovery(qa, qb, via="nobody").plan()
    assert "no subscriber or pool named 'nobody'" in wrong.unresolved[0].reason


def test_parents_missing_from_the_inbound_queue(
    qs: tuple[iqbridge.Queue, iqbridge.Queue],
) -> None:
    qa, qb = qs
    qa.subscribe("customer-db")
    done = qa.put({"tx": 1})
    _got(qa, "customer-db", done=True)
    lost = qb.put({}, parents=["no-such-parent"], confirm=True)
    saved = qb.put({}, parents=["no-such-parent", done], confirm=True)
    plan = CrossQueueRecovery(qa, qb).plan()
    assert [u.msg_id for u in plan.unresolved] == [lost]
    assert "cannot tell whether it was processed" in plan.unresolved[0].reason
    assert [(r.action, r.msg_id) for r in plan.rows] == [("reveal", saved)]
    # Without the inbound queue, a child with parents cannot be decided at all.
    alone = CrossQueueRecovery(None, qb).plan()
    assert {u.msg_id for u in alone.unresolved} == {lost, saved}
    assert "--from" in alone.unresolved[0].reason
    with pytest.raises(InvalidArgument, match="inbound queue"):
        CrossQueueRecovery(None, None)


def test_a_pool_parent_reopens_for_every_member(
    qs: tuple[iqbridge.Queue, iqbridge.Queue],
) -> None:
    qa, qb = qs
    parent = qa.put({"tx": 1}, to=Pool("customer-db", ["w1", "w2"]))
    _got(qa, "w1")
    assert qa.state(parent).subscribers["w2"].state is S.JOURNALLED  # expired by the claim
    child = qb.put({"tx": 1}, parents=[parent], confirm=True)
    job = CrossQueueRecovery(qa, qb)
    plan = job.plan()
    assert [(r.action, r.subscriber) for r in plan.rows] == [("release", "w1"), ("withdraw", None)]
    job.apply(plan)
    subs = qa.state(parent).subscribers
    assert subs["w1"].state is S.AVAILABLE and subs["w2"].state is S.AVAILABLE
    assert qb.state(child).publisher_state is P.JOURNALLED


def test_a_member_in_get_is_marked_done_through_fetched() -> None:
    rec = engine.new_message(
        msg_id="m",
        queue="q",
        publisher="p",
        audience=Audience(("s",), ()),
        now=1,
    ).record
    rec = engine.claim(rec, "s", 2, token="t", owner="s@x", lease_until=10, fetched=False).record
    change = engine.resolve(rec, "s", 3, done=True, detail="by recovery run-1: step 3")
    assert change is not None
    assert [(e.src, e.dst) for e in change.journal] == [
        ("GET", "FETCHED"),
        ("FETCHED", "DONE"),
        ("DONE", "JOURNALLED"),
        ("REVEALED", "JOURNALLED"),  # the publisher's, once every member is
    ]
    assert all(e.detail == "by recovery run-1: step 3" for e in change.journal[:2])
    assert engine.resolve(change.record, "s", 4, done=False, detail="x") is None


def test_iq_recover_prints_the_plan_and_applies_it(tmp_path: Path) -> None:
    a, b = f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"
    with iqbridge.connect(a) as ha, iqbridge.connect(b, publisher="customer-db") as hb:
        qa, qb = ha.queue("sales"), hb.queue("approvals")
        qa.subscribe("customer-db")
        qb.subscribe("credit-approval")
        parent = qa.put({"tx": 1})
        _got(qa, "customer-db", done=True)
        child = qb.put({"tx": 1}, parents=[parent], confirm=True)
        orphan = qb.put({"tx": 2}, parents=["gone"], confirm=True)
    runner = CliRunner()
    args = ["recover", "--from", f"{a}:sales", "--to", f"{b}:approvals"]
    dry = runner.invoke(app, [*args, "--dry-run"])
    assert dry.exit_code == 3, dry.output  # the orphan is left undecided
    out = dry.stdout
    assert "recovery plan" in out and "reveal" in out and child in out
    assert f"left as it is: {orphan}" in out and "dry run: nothing changed" in out
    with iqbridge.connect(b) as hb:
        assert hb.queue("approvals").state(child).publisher_state is P.PUT
    run = runner.invoke(app, args)
    assert run.exit_code == 3 and "1 move(s) applied, 0 already made" in run.stdout
    with iqbridge.connect(b) as hb:
        assert hb.queue("approvals").state(child).publisher_state is P.REVEALED
        entry = hb.queue("approvals").state(child).journal[-1]
        assert entry.detail is not None and entry.detail.startswith("by recovery run-")
    again = runner.invoke(app, args)
    assert "0 move(s) applied" in again.stdout
    # Only --from: step 5 alone; nothing in doubt there.
    assert "0 reveal, 0 withdraw, 0 done, 0 release" in ok(
        runner.invoke(app, ["recover", "--from", f"{a}:sales"])
    )


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--from", "sqlite:///x.db"], 1, "--from takes URL:QUEUE"),
        (["--to", "redis://127.0.0.1:6379"], 1, "--to takes URL:QUEUE"),
        (["--from", "sqlite:///{tmp}/a.db:nope"], 1, "nope"),
        (["--from", "amqp://u:s3cret@127.0.0.1:1/%2F?index=x:q"], 1, "127.0.0.1"),
        (["QUEUE", "--from", "sqlite:///{tmp}/a.db:sales"], 2, "not both"),
    ],
)
def test_iq_recover_bad_input(tmp_path: Path, args: list[str], code: int, says: str) -> None:
    with iqbridge.connect(f"sqlite:///{tmp_path}/a.db") as ha:
        ha.queue("sales").subscribe("x")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    line = one_error_line(CliRunner().invoke(app, ["recover", *args]), code)
    assert says in line and "s3cret" not in line


def test_iq_recover_plan_reads_in_80_columns_and_as_json(tmp_path: Path) -> None:
    """Issue 27, point 11: every column was cut to one letter at 80 columns."""
    a, b = f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"
    with iqbridge.connect(a) as ha, iqbridge.connect(b, publisher="customer-db") as hb:
        qa, qb = ha.queue("sales"), hb.queue("approvals")
        qa.subscribe("customer-db")
        qb.subscribe("credit-approval")
        qa.put({"tx": 1})
        parent = _got(qa, "customer-db")
        child = qb.put({"tx": 1}, parents=[parent], confirm=True)
        qa.put({"tx": 2})
        in_doubt = _got(qa, "customer-db")
        orphan = qb.put({"tx": 3}, parents=["gone"], confirm=True)
    runner = CliRunner(env={"COLUMNS": "80"})
    args = ["recover", "--from", f"{a}:sales", "--to", f"{b}:approvals", "--dry-run"]
    out = runner.invoke(app, args)
    assert out.exit_code == 3, out.output
    lines = out.stdout.splitlines()
    table = lines[: next(i for i, ln in enumerate(lines) if ln.startswith("left as it is"))]
    assert max(len(ln) for ln in table) <= 80
    text = " ".join(" ".join(table).split())
    # Every move whole: its step and action, its queue, msg_id, member and state, reason.
    for step, action, where, msg_id, member, reason in (
        (
            3,
            "release",
            "source sales",
            parent,
            "customer-db from FETCHED",
            "its child is withdrawn",
        ),
        (
            3,
            "withdraw",
            "target approvals",
            child,
            "(publisher) from PUT",
            "no parent reached DONE",
        ),
        (5, "release", "source sales", in_doubt, "customer-db from FETCHED", "fetched, not DONE"),
    ):
        for part in (f"step {step}", action, where, msg_id, member, reason):
            assert part in text, part
    assert all(any(m in ln for ln in table) for m in (parent, child, in_doubt))  # unfolded
    assert f"left as it is: {orphan}" in out.stdout

    dry = runner.invoke(app, [*args, "--json"])
    assert dry.exit_code == 3, dry.output
    data = json.loads(dry.stdout)
    assert (data["dry_run"], data["applied"], data["already"]) == (True, 0, 0)
    assert data["summary"] == "0 reveal, 1 withdraw, 0 done, 2 release; 1 child(ren) left undecided"
    assert data["source"].endswith("a.db:sales") and data["target"].endswith("b.db:approvals")
    assert data["rows"][1] == {
        "step": 3,
        "action": "withdraw",
        "side": "target",
        "queue": "approvals",
        "msg_id": child,
        "subscriber": None,
        "state": "PUT",
        "reason": "no parent reached DONE",
    }
    assert [r["msg_id"] for r in data["rows"]] == [parent, child, in_doubt]
    assert list(data["unresolved"]) == [orphan]
    applied = runner.invoke(app, [*args[:-1], "--json"])
    assert applied.exit_code == 3, applied.output
    done = json.loads(applied.stdout)
    assert (done["dry_run"], done["applied"], done["already"]) == (False, 3, 0)
    assert done["run"].startswith("run-")
    with iqbridge.connect(b) as hb:
        assert hb.queue("approvals").state(child).publisher_state is P.JOURNALLED
    recovered = runner.invoke(app, ["--url", a, "recover", "--json"])
    assert json.loads(ok(recovered)) == {"recovered": 0}
