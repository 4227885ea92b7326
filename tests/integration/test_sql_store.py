"""The SQL index store beyond the contract: unreachable servers, first use by several
processes at once, schema versions, values too long for their columns."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sql_workers import open_at_once

from iqbridge import engine
from iqbridge.errors import ConfigurationError, IndexUnavailable, InvalidArgument
from iqbridge.ids import new_id
from iqbridge.model import Audience, Filter
from iqbridge.stores.sql import SqlStore
from iqbridge.stores.sql_schema import SCHEMA_VERSION
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
