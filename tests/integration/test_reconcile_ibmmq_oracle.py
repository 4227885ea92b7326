"""Reconciliation on IBM MQ and Oracle AQ, against the in-process fakes of their clients
(``iqbridge.testing.fakes.ibmmq`` as ``ibmmq``, ``iqbridge.testing.fakes.oracledb`` as
``oracledb``), installed in ``sys.modules`` as the contract tests do.

Every inconsistency is made through the fake's own client API, as a plain MQ or AQ
application would: a destructive MQGET under syncpoint then MQCMIT, a dequeue REMOVE then
commit, a purge of the queue table, a message put or enqueued without iqbridge's
envelope, a copy of a finished message put back. Each is reported exactly, repaired,
checked on the index and on the broker, and reported no more. A member in doubt (a get
under an open unit of work in another process) is never reported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import iqbridge
from iqbridge import SubscriberState
from iqbridge.adapters.ibmmq import IbmMqAdapter
from iqbridge.adapters.oracle_aq import OracleAQAdapter
from iqbridge.inventory import Inventory
from iqbridge.recovery.reconcile import Kind, reconcile
from iqbridge.stores.memory import MemoryStore
from iqbridge.testing.fakes import ibmmq as fake_mq
from iqbridge.testing.fakes import oracledb as fake_ora
from tests.ibmmq_helpers import URL as MQ_URL
from tests.ibmmq_helpers import mq_client, qm_fixture  # noqa: F401 (a fixture)
from tests.oracle_helpers import URL as ORACLE_URL
from tests.oracle_helpers import fake_oracle_fixture  # noqa: F401  (the fixture)
from tests.reconcile_helpers import kinds, one

S = SubscriberState
C = fake_mq.CMQC


def drain(q: iqbridge.Queue, subscriber: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    while (d := q.get(subscriber, timeout=0)) is not None:
        out.append((d.msg_id, d.payload))
        d.done()
    return out


# --- IBM MQ -------------------------------------------------------------------------------


def mq_get_commit(name: str) -> tuple[bytes, Any, dict[str, Any]]:
    """A destructive MQGET under syncpoint and MQCMIT: body, MD and properties."""
    qmgr = mq_client()
    q = fake_mq.Queue(qmgr, name, C.MQOO_INPUT_SHARED)
    mh = fake_mq.MessageHandle(qmgr)
    md = fake_mq.MD()
    gmo = fake_mq.GMO(Options=C.MQGMO_SYNCPOINT | C.MQGMO_NO_WAIT | C.MQGMO_PROPERTIES_IN_HANDLE)
    gmo.MsgHandle = mh.msg_handle
    body = q.get(None, md, gmo)
    props = {"iqEnv": mh.properties.get("iqEnv", max_value_length=65536)}
    qmgr.commit()
    qmgr.disconnect()
    return body, md, props


def mq_put(name: str, body: bytes, md: Any = None, props: dict[str, Any] | None = None) -> None:
    """A plain MQPUT outside syncpoint (with properties when given)."""
    qmgr = mq_client()
    pmo = fake_mq.PMO(Options=C.MQPMO_NO_SYNCPOINT)
    if props:
        mh = fake_mq.MessageHandle(qmgr)
        for key, value in props.items():
            mh.properties.set(key, value)
        pmo.OriginalMsgHandle = mh.msg_handle
    fake_mq.Queue(qmgr, name, C.MQOO_OUTPUT).put(body, md or fake_mq.MD(Format=C.MQFMT_STRING), pmo)
    qmgr.disconnect()


def mq_browse(name: str) -> list[tuple[bytes, Any, dict[str, Any]]]:
    """What a plain client's browse (MQGMO_BROWSE_FIRST / NEXT) finds: body, MD, iqEnv."""
    qmgr = mq_client()
    q = fake_mq.Queue(qmgr, name, C.MQOO_BROWSE)
    mh = fake_mq.MessageHandle(qmgr)
    out: list[tuple[bytes, Any, dict[str, Any]]] = []
    first = True
    while True:
        md = fake_mq.MD()
        browse = C.MQGMO_BROWSE_FIRST if first else C.MQGMO_BROWSE_NEXT
        gmo = fake_mq.GMO(Options=browse | C.MQGMO_NO_WAIT | C.MQGMO_PROPERTIES_IN_HANDLE)
        gmo.MsgHandle = mh.msg_handle
        first = False
        try:
            body = q.get(None, md, gmo)
        except fake_mq.MQMIError as exc:
            assert exc.reason == C.MQRC_NO_MSG_AVAILABLE
            break
        try:
            props = {"iqEnv": mh.properties.get("iqEnv", max_value_length=65536)}
        except fake_mq.MQMIError:
            props = {}
        out.append((body, md, props))
    qmgr.disconnect()
    return out


def test_ibmmq_is_an_inventory_that_hides_in_flight(qm: fake_mq.FakeQueueManager) -> None:
    with iqbridge.connect(MQ_URL, index="memory://") as hub:
        assert isinstance(hub.adapter, IbmMqAdapter)
        assert hub.adapter.hides_in_flight is True
        assert isinstance(hub.adapter, Inventory)


def test_ibmmq_committed_gets_behind_iqbridge_are_found_and_put_back(
    qm: fake_mq.FakeQueueManager, tmp_path: Path
) -> None:
    with iqbridge.connect(MQ_URL, index=f"sqlite:///{tmp_path / 'index.db'}") as hub:
        q = hub.queue("orders")
        q.subscribe("audit", "billing")
        one_copy, no_copy = q.put(b"one copy left"), q.put(b"no copy left")
        first = reconcile(q)
        assert (first.findings, first.entries) == ((), 2)

        # A plain client gets both of billing's copies and audit's copy of no_copy, under
        # syncpoint, and commits: MQ has dropped them.
        assert mq_get_commit("orders.billing")[0] == b"one copy left"
        assert mq_get_commit("orders.billing")[0] == b"no copy left"
        assert [b for b, _, _ in mq_browse("orders.audit")] == [b"one copy left", b"no copy left"]
        qmgr = mq_client()  # audit's no_copy: matched by its MsgId
        md = fake_mq.MD(MsgId=mq_browse("orders.audit")[1][1].MsgId)
        gmo = fake_mq.GMO(Options=C.MQGMO_SYNCPOINT | C.MQGMO_NO_WAIT)
        gmo.MatchOptions = C.MQMO_MATCH_MSG_ID
        assert fake_mq.Queue(qmgr, "orders.audit", C.MQOO_INPUT_SHARED).get(None, md, gmo) == (
            b"no copy left"
        )
        qmgr.commit()
        qmgr.disconnect()

        report = reconcile(q)
        assert kinds(report) == [
            (Kind.ACKED_ON_BROKER, one_copy, "billing", False),
            (Kind.MISSING_PAYLOAD, no_copy, None, False),
        ]
        acked = one(report, Kind.ACKED_ON_BROKER)
        assert (acked.index_says, acked.broker_says) == (
            "billing AVAILABLE",
            "acknowledged by group billing",
        )
        missing = one(report, Kind.MISSING_PAYLOAD)
        assert (missing.broker_says, missing.fix) == (
            "entry gone",
            "put it back from the retained copy",
        )

        report = reconcile(q, repair=True)
        assert report.consistent and len(report.findings) == 2
        assert one(report, Kind.ACKED_ON_BROKER).fix == (
            "put back for the group from the retained copy"
        )
        assert one(report, Kind.MISSING_PAYLOAD).fix == (
            "put back from the retained copy for audit, billing"
        )
        # One copy per group again, nothing twice; the references did not change.
        for name in ("orders.billing", "orders.audit"):
            assert sorted(b for b, _, _ in qm.messages(name)) == [b"no copy left", b"one copy left"]
        assert hub.store.load(no_copy).native_ref == no_copy
        assert reconcile(q).findings == ()

        for sub in ("billing", "audit"):
            got = sorted(drain(q, sub), key=lambda t: t[1])
            assert got == [(no_copy, b"no copy left"), (one_copy, b"one copy left")]
        for m in (one_copy, no_copy):
            assert {v.state for v in q.state(m).subscribers.values()} == {S.JOURNALLED}
        assert qm.messages("orders.billing") == qm.messages("orders.audit") == []
        assert reconcile(q).findings == ()


def test_ibmmq_plain_message_adopted_and_finished_copy_skipped(
    qm: fake_mq.FakeQueueManager, tmp_path: Path
) -> None:
    with iqbridge.connect(MQ_URL, index=f"sqlite:///{tmp_path / 'index.db'}") as hub:
        q = hub.queue("orders")
        q.subscribe("billing")
        finished = q.put(b"finished")
        [(body, md, props)] = mq_browse("orders.billing")
        assert drain(q, "billing") == [(finished, b"finished")]
        # A plain client puts a copy of the finished message back (a duplicate after a
        # lost commit: DONE in the index, on the broker again), and a message of its own.
        mq_put("orders.billing", body, md, props)
        mq_put("orders.billing", b"plain")

        report = reconcile(q)
        stranger = one(report, Kind.UNKNOWN_ENTRY)
        assert len(report.findings) == 1  # the finished copy: skipped by the next get
        assert (stranger.index_says, stranger.broker_says, stranger.repaired) == (
            "no record",
            "entry without an iqbridge envelope",
            False,
        )
        assert stranger.fix == "adopt it (adopt=True, iq reconcile --adopt)"
        assert report.entries == 2

        report = reconcile(q, adopt=True)
        assert kinds(report) == [(Kind.UNKNOWN_ENTRY, stranger.msg_id, None, True)]
        assert report.findings[0].fix == "adopted, as a get would"
        assert stranger.msg_id is not None
        assert q.state(stranger.msg_id).subscribers["billing"].state is S.AVAILABLE
        assert reconcile(q).findings == ()

        # The get skips the finished copy (once-only) and delivers the adopted message once.
        assert drain(q, "billing") == [(stranger.msg_id, "plain")]
        assert qm.messages("orders.billing") == []
        assert q.state(finished).subscribers["billing"].state is S.JOURNALLED
        assert reconcile(q).findings == ()


def test_ibmmq_a_get_in_flight_elsewhere_is_not_reported(
    qm: fake_mq.FakeQueueManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = f"sqlite:///{tmp_path / 'index.db'}"
    with (
        iqbridge.connect(MQ_URL, index=index) as hub,
        iqbridge.connect(MQ_URL, index=index) as other,
    ):
        q = hub.queue("orders", lease=60)
        q.subscribe("billing")
        msg_id = q.put(b"in flight")
        # Another process gets it under syncpoint and has not committed yet.
        held = other.queue("orders", lease=60).get("billing", timeout=0)
        assert held is not None and held.msg_id == msg_id
        assert q.state(msg_id).subscribers["billing"].state is S.FETCHED
        assert mq_browse("orders.billing") == []  # hidden from every browse

        report = reconcile(q)
        assert (report.findings, report.entries) == ((), 0)
        assert reconcile(q, repair=True).findings == ()
        # What hides_in_flight prevents: the open get taken for a lost message.
        monkeypatch.setattr(hub.adapter, "hides_in_flight", False)
        assert kinds(reconcile(q)) == [(Kind.MISSING_PAYLOAD, msg_id, None, False)]
        monkeypatch.setattr(hub.adapter, "hides_in_flight", True)

        held.done()
        assert q.state(msg_id).subscribers["billing"].state is S.JOURNALLED
        assert qm.messages("orders.billing") == []
        assert reconcile(q).findings == ()


# --- Oracle AQ ----------------------------------------------------------------------------


def ora_client() -> Any:
    """A plain AQ application's session (python-oracledb's own ``connect``)."""
    from tests.oracle_helpers import PASSWORD

    return fake_ora.connect(user="iq", password=PASSWORD, dsn="oracle.test:1521/FREEPDB1")


def ora_remove_commit(queue: str, consumer: str, msgid: bytes) -> bytes:
    """A dequeue in REMOVE mode for ``consumer``, then commit: the payload."""
    conn = ora_client()
    q = conn.queue(queue)
    q.deqoptions.mode, q.deqoptions.wait = fake_ora.DEQ_REMOVE, fake_ora.DEQ_NO_WAIT
    q.deqoptions.navigation = fake_ora.DEQ_FIRST_MSG
    q.deqoptions.consumername, q.deqoptions.msgid = consumer, msgid
    props = q.deqone()
    assert props is not None
    conn.commit()
    conn.close()
    return bytes(props.payload)


def ora_enqueue(queue: str, payload: bytes, recipients: list[str]) -> None:
    conn = ora_client()
    conn.queue(queue).enqone(conn.msgproperties(payload=payload, recipients=recipients))
    conn.commit()
    conn.close()


def ora_rows(table: str, queue: str) -> list[tuple[str, str | None, str]]:
    """(msgid hex, consumer name, state) of every row of the queue in the AQ$ view."""
    conn = ora_client()
    with conn.cursor() as cur:
        cur.execute(
            f"SELECT msg_id, consumer_name, msg_state FROM AQ${table} WHERE queue = :q",
            {"q": queue},
        )
        rows = cur.fetchall()
    conn.close()
    return [(bytes(m).hex(), c, s) for m, c, s in rows]


def test_oracle_aq_is_an_inventory_that_sees_in_flight(
    fake_oracle: fake_ora.Database,
) -> None:
    with iqbridge.connect(ORACLE_URL, index="memory://") as hub:
        assert isinstance(hub.adapter, OracleAQAdapter)
        assert isinstance(hub.adapter, Inventory)
        assert not getattr(hub.adapter, "hides_in_flight", False)


def test_oracle_aq_removed_and_purged_behind_iqbridge_are_repaired(
    fake_oracle: fake_ora.Database,
) -> None:
    with iqbridge.connect(ORACLE_URL, index="memory://") as hub:
        adapter = hub.adapter
        assert isinstance(adapter, OracleAQAdapter)
        q = hub.queue("orders", retain=True)
        q.subscribe("audit", "billing")
        removed, purged = q.put(b"removed"), q.put(b"purged")
        ref1 = hub.store.load(removed).native_ref
        ref2 = hub.store.load(purged).native_ref
        assert ref1 and ref2
        aq, table = adapter.queue_name("orders"), adapter.queue_name("orders") + "_QT"
        billing, audit = adapter.consumer_name("billing"), adapter.consumer_name("audit")
        first = reconcile(q)
        assert (first.findings, first.entries) == ((), 2)

        # billing's copy of "removed" dequeued (REMOVE) and committed by a plain client:
        # AQ keeps it (retention) as PROCESSED for billing. "purged" leaves the table.
        assert ora_remove_commit(aq, billing, bytes.fromhex(ref1)).endswith(b"removed")
        with ora_client() as conn, conn.cursor() as cur:
            cur.execute(
                "DECLARE po DBMS_AQADM.AQ$_PURGE_OPTIONS_T; BEGIN po.block := FALSE; "
                "DBMS_AQADM.PURGE_QUEUE_TABLE(queue_table => :queue_table, "
                "purge_condition => :condition, purge_options => po); END;",
                {
                    "queue_table": table,
                    "condition": f"qtview.msg_id IN (HEXTORAW('{ref2.upper()}'))",
                },
            )

        report = reconcile(q)
        assert kinds(report) == [
            (Kind.ACKED_ON_BROKER, removed, "billing", False),
            (Kind.MISSING_PAYLOAD, purged, None, False),
        ]
        assert one(report, Kind.ACKED_ON_BROKER).index_says == "billing AVAILABLE"
        assert one(report, Kind.MISSING_PAYLOAD).fix == "put it back from the retained copy"

        report = reconcile(q, repair=True)
        assert report.consistent and len(report.findings) == 2
        assert one(report, Kind.ACKED_ON_BROKER).fix == "delivered to the group again"
        new_ref = hub.store.load(purged).native_ref
        assert new_ref and new_ref != ref2
        assert one(report, Kind.MISSING_PAYLOAD).fix == (
            f"put back from the retained copy as {new_ref}"
        )
        rows = ora_rows(table, aq)
        assert (ref1, billing, "PROCESSED") in rows and (ref1, audit, "READY") in rows
        assert {(c, s) for r, c, s in rows if r == new_ref} == {
            (audit, "READY"),
            (billing, "READY"),
        }
        copies = [r for r, c, s in rows if r not in (ref1, new_ref)]
        assert len(copies) == 1  # "removed" again, for billing alone
        assert (copies[0], billing, "READY") in rows
        assert reconcile(q).findings == ()

        for sub in ("billing", "audit"):
            got = sorted(drain(q, sub), key=lambda t: t[1])
            assert got == [(purged, b"purged"), (removed, b"removed")]
        for m in (removed, purged):
            assert {v.state for v in q.state(m).subscribers.values()} == {S.JOURNALLED}
        assert {s for _, _, s in ora_rows(table, aq)} == {"PROCESSED"}
        assert reconcile(q).findings == ()


def test_oracle_aq_plain_message_adopted_and_finished_copy_skipped(
    fake_oracle: fake_ora.Database,
) -> None:
    with iqbridge.connect(ORACLE_URL, index="memory://") as hub:
        adapter = hub.adapter
        assert isinstance(adapter, OracleAQAdapter)
        q = hub.queue("orders")
        q.subscribe("billing")
        aq = adapter.queue_name("orders")
        billing = adapter.consumer_name("billing")
        finished = q.put(b"finished")
        assert drain(q, "billing") == [(finished, b"finished")]
        # A plain client enqueues a copy of the finished message (its payload read from the
        # AQ$ view: DONE in the index, READY on the broker) and a message of its own.
        with ora_client() as conn, conn.cursor() as cur:
            cur.execute(f"SELECT user_data FROM AQ${aq}_QT WHERE queue = :q", {"q": aq})
            [(payload,)] = cur.fetchall()
        ora_enqueue(aq, bytes(payload), [billing])
        ora_enqueue(aq, b"plain", [billing])

        report = reconcile(q)
        stranger = one(report, Kind.UNKNOWN_ENTRY)
        assert len(report.findings) == 1  # the finished copy: skipped by the next get
        assert (stranger.index_says, stranger.broker_says) == (
            "no record",
            "entry without an iqbridge envelope",
        )
        assert report.entries == 3

        report = reconcile(q, adopt=True)
        assert kinds(report) == [(Kind.UNKNOWN_ENTRY, stranger.msg_id, None, True)]
        assert stranger.msg_id is not None
        assert q.state(stranger.msg_id).subscribers["billing"].state is S.AVAILABLE
        assert reconcile(q).findings == ()

        assert drain(q, "billing") == [(stranger.msg_id, b"plain")]
        assert {s for _, _, s in ora_rows(f"{aq}_QT", aq)} == {"PROCESSED"}
        assert q.state(finished).subscribers["billing"].state is S.JOURNALLED
        assert reconcile(q).findings == ()


def test_oracle_aq_a_get_in_flight_elsewhere_is_not_reported(
    fake_oracle: fake_ora.Database,
) -> None:
    store = MemoryStore()
    with (
        iqbridge.connect(ORACLE_URL, index=store) as hub,
        iqbridge.connect(ORACLE_URL, index=store) as other,
    ):
        q = hub.queue("orders", lease=60)
        q.subscribe("billing")
        msg_id = q.put(b"in flight")
        held = other.queue("orders", lease=60).get("billing", timeout=0)  # LOCKED elsewhere
        assert held is not None and held.msg_id == msg_id
        assert q.state(msg_id).subscribers["billing"].state is S.FETCHED

        report = reconcile(q)
        assert (report.findings, report.entries) == ((), 1)
        assert reconcile(q, repair=True).findings == ()

        held.done()
        assert q.state(msg_id).subscribers["billing"].state is S.JOURNALLED
        assert reconcile(q).findings == ()


# --- what the fakes must model for these listings -------------------------------------------


def test_fake_mq_browse_lock_is_skipped_by_a_get_and_unlock_without_lock_warns(
    qm: fake_mq.FakeQueueManager,
) -> None:
    qm.define("Q1")
    mq_put("Q1", b"first")
    mq_put("Q1", b"second")
    browser, getter = mq_client(), mq_client()
    bq = fake_mq.Queue(browser, "Q1", C.MQOO_BROWSE)
    gmo = fake_mq.GMO(Options=C.MQGMO_BROWSE_FIRST | C.MQGMO_LOCK | C.MQGMO_NO_SYNCPOINT)
    assert bq.get(None, fake_mq.MD(), gmo) == b"first"
    # While "first" is locked, a destructive get takes the next message.
    gq = fake_mq.Queue(getter, "Q1", C.MQOO_INPUT_SHARED)
    assert gq.get(None, fake_mq.MD(), fake_mq.GMO(Options=C.MQGMO_NO_WAIT)) == b"second"
    unlock = fake_mq.GMO(Options=C.MQGMO_UNLOCK | C.MQGMO_NO_WAIT)
    assert bq.get(None, fake_mq.MD(), unlock) == b""
    with pytest.raises(fake_mq.MQMIError) as info:
        bq.get(None, fake_mq.MD(), unlock)
    assert (info.value.comp, info.value.reason) == (C.MQCC_WARNING, C.MQRC_NO_MSG_LOCKED)
    assert gq.get(None, fake_mq.MD(), fake_mq.GMO(Options=C.MQGMO_NO_WAIT)) == b"first"


def test_fake_aq_view_lists_a_whole_queue_in_enqueue_order(
    fake_oracle: fake_ora.Database,
) -> None:
    with iqbridge.connect(ORACLE_URL, index="memory://") as hub:
        adapter = hub.adapter
        assert isinstance(adapter, OracleAQAdapter)
        q = hub.queue("orders")
        q.subscribe("billing")
        ids = [q.put(b"a"), q.put(b"b")]
        aq = adapter.queue_name("orders")
        with ora_client() as conn, conn.cursor() as cur:
            cur.execute(
                f"SELECT msg_id, priority FROM AQ${aq}_QT WHERE queue = :q ORDER BY enq_time",
                {"q": aq},
            )
            rows = cur.fetchall()
        assert [bytes(m).hex() for m, _ in rows] == [hub.store.load(i).native_ref for i in ids]
        assert [e.msg_id for e in adapter.entries("orders")] == ids
