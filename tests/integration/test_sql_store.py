"""The SQL index store beyond the contract: unreachable servers, first use by several
processes at once, schema versions, values too long for their columns."""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sql_workers import open_at_once

from iqbridge import engine
from iqbridge.errors import ConfigurationError, IndexUnavailable, InvalidArgument
from iqbridge.ids import new_id
from iqbridge.model import Audience, Filter, Retained
from iqbridge.stores.sql import SqlStore
from iqbridge.stores.sql_schema import SCHEMA_VERSION
from iqbridge.stores.sqlite import SqliteStore
from tests.sql_helpers import MARIADB_URL, PG_URL, fresh_schema

PROCESSES = 4


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://iq:s3cret-pw@127.0.0.1:1/test",
        "mariadb://root:s3cret-pw@127.0.0.1:1/test",
        "mysql://root:s3cret-pw@127.0.0.1:1/test?schema=iq",
    ],
)
def test_a_refused_connection_is_index_unavailable_without_the_password(url: str) -> None:
    with pytest.raises(IndexUnavailable) as info:
        SqlStore.from_url(url)
    text = str(info.value)
    assert "s3cret-pw" not in text
    assert ":***@127.0.0.1:1" in text
    assert "cannot open the SQL index" in text
    cause = info.value.__cause__ or info.value.__context__
    assert cause is None or "s3cret-pw" not in str(cause)


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
        pytest.param("sqlite"),
    ]
)
def new_index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an index nobody has opened yet (on a schema that does not exist yet)."""
    if request.param == "sqlite":
        yield f"sql+sqlite:///{tmp_path / 'index.db'}"
        return
    server, what = (
        (PG_URL, "PostgreSQL at 127.0.0.1:5432")
        if request.param == "postgres"
        else (MARIADB_URL, "MariaDB at 127.0.0.1:3306")
    )
    with fresh_schema(server, what, "iqnew") as url:
        yield url


@pytest.mark.slow
def test_first_use_by_several_processes_at_once_creates_one_index(new_index: str) -> None:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["iqbridge", "sqlalchemy", "psycopg", "pymysql", "sql_workers"])
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=open_at_once, args=(new_index, barrier, results))
        for _ in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    instances = {results.get(timeout=5) for _ in range(PROCESSES)}
    store = SqlStore.from_url(new_index)
    try:
        assert instances == {store.instance}
        with store.reader.connect() as conn:
            meta = conn.execute(sa.select(store.tables.meta)).all()
        assert sorted(r.name for r in meta) == ["instance", "schema_version"]
        assert len(store.search("q", Filter(limit=100))) == PROCESSES
    finally:
        store.close()


def test_an_index_newer_than_this_code_is_refused(tmp_path: Path) -> None:
    url = f"sql+sqlite:///{tmp_path / 'index.db'}"
    store = SqlStore.from_url(url)
    meta = store.tables.meta
    with store.writer.begin() as conn:
        conn.execute(
            meta.update().where(meta.c.name == "schema_version").values(val=str(SCHEMA_VERSION + 1))
        )
    store.close()
    with pytest.raises(ConfigurationError, match="newer than this iqbridge knows"):
        SqlStore.from_url(url)


def test_prefixes_keep_indexes_in_one_database_apart(tmp_path: Path) -> None:
    base = f"sql+sqlite:///{tmp_path / 'index.db'}"
    one, two = SqlStore.from_url(base + "?prefix=one_"), SqlStore.from_url(base + "?prefix=two_")
    try:
        one.declare_queue("q")
        assert (one.queues(), two.queues()) == (["q"], [])
        assert one.instance != two.instance
    finally:
        one.close()
        two.close()


@pytest.mark.postgres
def test_a_value_too_long_for_its_column_is_an_invalid_argument() -> None:
    with fresh_schema(PG_URL, "PostgreSQL at 127.0.0.1:5432", "iqlen") as url:
        store = SqlStore.from_url(url)
        try:
            change = engine.new_message(
                msg_id=new_id(),
                queue="q",
                publisher="p",
                audience=Audience(("a",)),
                now=1,
                correlation_id="c" * 600,
            )
            with pytest.raises(InvalidArgument, match="does not fit its column"):
                store.commit(change)
            assert store.search("q", Filter()) == []
        finally:
            store.close()


def _retained_put(store: SqlStore | SqliteStore, body: bytes) -> str:
    change = engine.new_message(
        msg_id=new_id(), queue="q", publisher="p", audience=Audience(("a",)), now=1
    )
    change.retain = Retained(body, {"h": "v"})
    store.commit(change)
    return change.msg_id


@pytest.mark.parametrize(
    "server",
    [
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
        pytest.param("sqlite"),
    ],
)
def test_an_index_of_schema_version_1_gains_the_payloads_table(server: str, tmp_path: Path) -> None:
    """An index written before retained payloads (version 1: no payloads table) is
    migrated on first use: the table appears, the version goes up, the rows stay."""
    with contextlib.ExitStack() as stack:
        if server == "sqlite":
            url = f"sql+sqlite:///{tmp_path / 'index.db'}"
        else:
            base, what = (
                (PG_URL, "PostgreSQL at 127.0.0.1:5432")
                if server == "postgres"
                else (MARIADB_URL, "MariaDB at 127.0.0.1:3306")
            )
            url = stack.enter_context(fresh_schema(base, what, "iqmig"))
        store = SqlStore.from_url(url)
        old = engine.new_message(
            msg_id=new_id(), queue="q", publisher="p", audience=Audience(("a",)), now=1
        )
        store.commit(old)
        meta = store.tables.meta
        with store.writer.begin() as conn:
            store.tables.payloads.drop(conn)
            conn.execute(meta.update().where(meta.c.name == "schema_version").values(val="1"))
        store.close()

        store = SqlStore.from_url(url)
        try:
            with store.reader.connect() as conn:
                version = conn.execute(
                    sa.select(meta.c.val).where(meta.c.name == "schema_version")
                ).scalar()
                assert sa.inspect(conn).has_table(
                    store.tables.payloads.name, schema=store.options.schema
                )
            assert version == str(SCHEMA_VERSION) == "2"
            assert store.load(old.msg_id) == old.record
            msg_id = _retained_put(store, b"\x00\xff")
            assert store.retained([old.msg_id, msg_id]) == {
                msg_id: Retained(b"\x00\xff", {"h": "v"})
            }
        finally:
            store.close()


@pytest.mark.mariadb
def test_the_retained_body_column_is_a_longblob_on_mariadb() -> None:
    """MariaDB's BLOB holds 64 KiB and MEDIUMBLOB 16 MiB: the body column is LONGBLOB
    (what one statement may send is the server's max_allowed_packet, 16 MiB by default)."""
    with fresh_schema(MARIADB_URL, "MariaDB at 127.0.0.1:3306", "iqbig") as url:
        store = SqlStore.from_url(url)
        try:
            with store.reader.connect() as conn:
                kind = conn.execute(
                    sa.text(
                        "SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE "
                        "TABLE_SCHEMA = :s AND TABLE_NAME = :t AND COLUMN_NAME = 'body'"
                    ),
                    {"s": store.options.schema, "t": store.tables.payloads.name},
                ).scalar()
            assert kind == "longblob"
            body = bytes(range(256)) * 4096  # 1 MiB: more than a BLOB holds
            msg_id = _retained_put(store, body)
            assert store.retained([msg_id])[msg_id].body == body
        finally:
            store.close()


def test_a_sqlite_index_file_without_the_payloads_table_gains_it(tmp_path: Path) -> None:
    """The sqlite:// store (not the SQL store) creates missing tables whenever it opens a
    file: one written before retained payloads gains iq_payloads."""
    url = f"sqlite:///{tmp_path / 'index.db'}"
    store = SqliteStore.from_url(url)
    old = engine.new_message(
        msg_id=new_id(), queue="q", publisher="p", audience=Audience(("a",)), now=1
    )
    store.commit(old)
    with store.db.transaction() as conn:
        conn.execute("DROP TABLE iq_payloads")
    store.close()
    store = SqliteStore.from_url(url)
    try:
        assert store.load(old.msg_id) == old.record
        msg_id = _retained_put(store, b"")
        assert store.retained([msg_id, old.msg_id]) == {msg_id: Retained(b"", {"h": "v"})}
    finally:
        store.close()


def _waiting_on_a_lock(store: SqlStore) -> bool:
    """Whether some transaction of the server waits for a row lock now."""
    if store.options.family == "postgresql":
        sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    else:
        sql = "SELECT count(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'"
    with store.reader.connect() as conn:
        return bool(conn.exec_driver_sql(sql).scalar())


@pytest.mark.parametrize(
    "server",
    [
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ],
)
def test_commit_each_skips_a_new_message_another_transaction_puts_meanwhile(
    server: str,
) -> None:
    """A put of the same msg_id that commits while commit_each runs: reported skipped,
    the others applied, nothing escapes. On PostgreSQL the batch's read cannot see the
    uncommitted row, so the insert meets it (in a savepoint) and the new messages go in
    one by one; on MariaDB the locking read itself waits for the put to commit."""
    base, what = (
        (PG_URL, "PostgreSQL at 127.0.0.1:5432")
        if server == "postgres"
        else (MARIADB_URL, "MariaDB at 127.0.0.1:3306")
    )
    with fresh_schema(base, what, "iqrace") as url:
        store, rival = SqlStore.from_url(url), SqlStore.from_url(url)
        try:

            def new(msg_id: str, body: bytes) -> engine.Change:
                change = engine.new_message(
                    msg_id=msg_id, queue="q", publisher="p", audience=Audience(("a",)), now=1
                )
                change.retain = Retained(body)
                return change

            taken, free = new_id(), new_id()
            batch = [new(taken, b"mine"), new(free, b"free")]
            flags: list[bool] = []
            theirs = new(taken, b"theirs")
            with rival.atomic():
                rival.commit(theirs)
                worker = threading.Thread(target=lambda: flags.extend(store.commit_each(batch)))
                worker.start()
                deadline = time.monotonic() + 10
                while not _waiting_on_a_lock(store):
                    assert time.monotonic() < deadline, "commit_each never waited on the put"
                    # InnoDB refreshes INNODB_TRX only when read 0.1 s after the last read.
                    time.sleep(0.15)
            worker.join(10)
            assert flags == [False, True]
            assert batch[0].record.seq is None
            assert batch[1].record.seq == store.load(free).seq
            assert store.retained([taken, free]) == {
                taken: Retained(b"theirs"),
                free: Retained(b"free"),
            }
            assert store.history(taken) == rival.history(taken)
            assert [(e.actor, e.dst) for e in store.history(taken)] == [
                (e.actor, e.dst) for e in theirs.journal
            ]
            assert len(store.journal(0, 100)) == len(theirs.journal) + len(batch[1].journal)
        finally:
            store.close()
            rival.close()
