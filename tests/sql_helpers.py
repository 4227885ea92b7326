"""Helpers for the SQL index store's tests: the servers' URLs, a schema (PostgreSQL) or
database (MariaDB) of its own per test session, dropped afterwards, and a table prefix
per test, so runs never see each other's rows."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import sqlalchemy as sa
from conftest import need_server

from iqbridge.testing.servers import drop_schema

#: The servers the tests use (override with IQ_PG_URL / IQ_MARIADB_URL).
PG_URL = os.environ.get("IQ_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
MARIADB_URL = os.environ.get("IQ_MARIADB_URL", "mariadb://root@127.0.0.1:3306/test")

_DRIVER = {"postgresql": "postgresql+psycopg", "mariadb": "mariadb+pymysql"}


def sa_url(url: str) -> str:
    """The SQLAlchemy URL (with the installed driver) of a test server URL."""
    scheme, rest = url.split("://", 1)
    return f"{_DRIVER.get(scheme, scheme)}://{rest}"


def reachable(url: str) -> tuple[bool, str]:
    """Whether the server answers, and why not."""
    try:
        engine = sa.create_engine(sa_url(url), connect_args={"connect_timeout": 3})
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    except sa.exc.SQLAlchemyError as exc:
        text = str(getattr(exc, "orig", None) or exc).strip()
        return False, text.splitlines()[0] if text else type(exc).__name__
    return True, ""


def unique_name(label: str = "iqt") -> str:
    """A schema, database or prefix stem no other run uses."""
    return f"{label}_{uuid.uuid4().hex[:10]}"


@contextlib.contextmanager
def fresh_schema(server_url: str, what: str, label: str = "iqt") -> Iterator[str]:
    """An index URL on a schema (PostgreSQL) or database (MariaDB) of its own.

    The store creates it on first use; it is dropped afterwards with everything in it.
    Skips (or fails in CI) when the server is unreachable.
    """
    need_server(what, *reachable(server_url))
    name = unique_name(label)
    try:
        yield f"{server_url}?schema={name}"
    finally:
        drop_schema(server_url, name)


def empty_index(url: str) -> None:
    """Create the index a URL names if needed, and delete every row of it but its meta."""
    from iqbridge.stores.sql import SqlStore

    store = SqlStore.from_url(url)
    try:
        t = store.tables
        with store.writer.begin() as conn:
            for table in (t.journal, t.members, t.payloads, t.messages, t.queues):
                conn.execute(table.delete())
    finally:
        store.close()
