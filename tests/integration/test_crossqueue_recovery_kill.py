"""A cross-queue recovery killed mid-way and run again completes the same plan, applying
nothing twice (issue 16, point 1).

Queue A (``sales``) on embedded SQLite, queue B (``approvals``) on Redis Streams, with
every case of seed 000's procedure at once: children whose parent is in doubt
(withdrawn), whose parent is DONE (revealed), with two parents of which one is DONE, two
children sharing a parent that only the other child's verdict marks DONE (the plan's
fixpoint), children without parents, and sales in doubt with no child (step 5). The
recovery runs in a process of its own that dies (``os._exit``) after its 3rd row, again
after 7 more rows of the next run, then runs to the end: each run's rows are exactly the
next rows of the plan computed before the first, each move is journalled exactly once,
and nothing is left to plan afterwards.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import iqbridge
from iqbridge import PublisherState, SubscriberState
from iqbridge.recovery.crossqueue import CrossQueueRecovery
from tests.conftest import need_server
from tests.redis_index_helpers import REDIS_URL, drop_streams, fresh_prefix, redis_reachable

S = SubscriberState
P = PublisherState
A, B = "sales", "approvals"
CDB, CA = "customer-db", "credit-approval"
SCRIPT = Path(__file__).with_name("recovery_proc.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ends(tmp_path: Path) -> Iterator[tuple[str, str]]:
    ok, why = redis_reachable()
    need_server(f"Redis at {REDIS_URL}", ok, why)
    with fresh_prefix("xqkill") as prefix:
        try:
            yield (
                f"sqlite:///{tmp_path}/in.db",
                f"{REDIS_URL}?prefix={prefix}&stream_prefix={prefix}:",
            )
        finally:
            drop_streams(f"{prefix}:")


def _failed_flow(a_url: str, b_url: str) -> dict[str, list[str]]:
    """Every case at once; returns the msg_ids by role."""
    roles: dict[str, list[str]] = {}
    with (
        iqbridge.connect(a_url, publisher="pos") as ha,
        iqbridge.connect(b_url, publisher=CDB) as hb,
    ):
        qa, qb = ha.queue(A), hb.queue(B)
        qa.subscribe(CDB)
        qb.subscribe(CA)

        def sale(done: bool) -> str:
            msg_id = qa.put({"tx": "sale"})
            d = qa.get(CDB, timeout=5)
            assert d is not None and d.msg_id == msg_id
            if done:
                d.done()
            return msg_id

        def child(*parents: str) -> str:
            return qb.put({"from": list(parents)}, parents=parents, confirm=True)

        def add(role: str, *ids: str) -> None:
            roles.setdefault(role, []).extend(ids)

        for _ in range(4):
            s = sale(done=False)
            add("withdraw-parent", s)
            add("withdrawn", child(s))
        for _ in range(4):
            s = sale(done=True)
            add("done-parent", s)
            add("revealed", child(s))
        p1, p2 = sale(done=True), sale(done=False)
        add("done-parent", p1)
        add("marked-done", p2)
        add("revealed", child(p1, p2))
        x, y = sale(done=True), sale(done=False)
        add("done-parent", x)
        add("marked-done", y)
        add("revealed", child(x, y), child(y))  # y counts as DONE for the second child
        add("no-parents", child(), child())
        for _ in range(3):
            add("in-doubt", sale(done=False))
    return roles


def _run(a_url: str, b_url: str, die_after: int | None) -> tuple[int, list[tuple[str, ...]]]:
    cmd = [sys.executable, str(SCRIPT), a_url, A, b_url, B]
    if die_after is not None:
        cmd += ["--die-after", str(die_after)]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = [tuple(line.split()) for line in proc.stdout.splitlines()]
    assert proc.returncode in (0, 9), proc.stderr
    return proc.returncode, lines


def test_killed_twice_then_run_again_completes_the_same_plan_once(
    ends: tuple[str, str],
) -> None:
    a_url, b_url = ends
    roles = _failed_flow(a_url, b_url)
    with iqbridge.connect(a_url) as ha, iqbridge.connect(b_url) as hb:
        plan = CrossQueueRecovery(ha.queue(A), hb.queue(B)).plan()
    assert plan.unresolved == ()
    rows = [(r.action, r.msg_id, r.subscriber or "-") for r in plan.rows]
    assert Counter(a for a, _, _ in rows) == {"release": 7, "withdraw": 4, "reveal": 9, "done": 2}
    assert len(rows) == 22
    # Each parent moves before its child (a kill between them must not lose the verdict).
    for i, (action, msg_id, _) in enumerate(rows):
        if action in ("reveal", "withdraw"):
            with iqbridge.connect(b_url) as hb:
                parents = hb.queue(B).state(msg_id).parents
            assert all(i > j for j, r in enumerate(rows) if r[1] in parents)

    code1, first = _run(a_url, b_url, die_after=3)
    code2, second = _run(a_url, b_url, die_after=7)
    code3, third = _run(a_url, b_url, die_after=None)
    assert (code1, code2, code3) == (9, 9, 0)
    done_line = third.pop()
    assert done_line[0] == "done" and done_line[2:] == ("12", "0")
    applied = [(a, m, s) for a, m, s, ok in first + second + third]
    assert applied == rows  # the same plan, in order, each row once
    assert all(ok == "True" for *_, ok in first + second + third)

    # Every move journalled once, by the recovery run that made it; nothing more.
    key = {"reveal": "REVEALED", "withdraw": "UNAVAILABLE", "done": "DONE", "release": "AVAILABLE"}
    with iqbridge.connect(a_url) as ha, iqbridge.connect(b_url) as hb:
        moves: Counter[tuple[str, str, str]] = Counter()
        runs: set[str] = set()
        for q in (ha.queue(A), hb.queue(B)):
            for s in q.search(limit=1000):
                for e in q.state(s.msg_id).journal:
                    if e.detail and e.detail.startswith("by recovery "):
                        runs.add(e.detail.split()[2].rstrip(":"))
                        who = "-" if e.actor_kind.value == "publisher" else e.actor
                        if e.dst in key.values() and (e.dst != "AVAILABLE" or e.src is not None):
                            moves[(e.dst, s.msg_id, who)] += 1
        assert moves == Counter({(key[a], m, s): 1 for a, m, s in rows})
        assert len(runs) == 3
        assert CrossQueueRecovery(ha.queue(A), hb.queue(B)).plan().rows == ()

        # The states the seed prescribes, role by role.
        qa, qb = ha.queue(A), hb.queue(B)
        for m in roles["withdraw-parent"] + roles["in-doubt"]:
            sub = qa.state(m).subscribers[CDB]
            assert (sub.state, sub.attempt) == (S.AVAILABLE, 2)
        for m in roles["done-parent"] + roles["marked-done"]:
            assert qa.state(m).subscribers[CDB].state is S.JOURNALLED
        for m in roles["withdrawn"]:
            assert qb.state(m).publisher_state is P.JOURNALLED
            assert qb.state(m).subscribers[CA].state is S.JOURNALLED
        for m in roles["revealed"] + roles["no-parents"]:
            st = qb.state(m)
            assert st.publisher_state is P.REVEALED and st.subscribers[CA].state is S.AVAILABLE
