"""SQL index URLs: each scheme goes to the installed driver; options are checked."""

from __future__ import annotations

import importlib.util

import pytest

from iqbridge.errors import ConfigurationError
from iqbridge.registry import STORES
from iqbridge.stores.sql import SqlStore
from iqbridge.stores.sql_schema import make_tables, parse_sql_url


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("postgresql://u@h/db", "postgresql+psycopg"),
        ("postgres://u@h/db", "postgresql+psycopg"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg"),
        ("mysql://u@h/db", "mysql+pymysql"),
        ("mysql+pymysql://u@h/db", "mysql+pymysql"),
        ("mariadb://u@h/db", "mariadb+pymysql"),
        ("mariadb+pymysql://u@h/db", "mariadb+pymysql"),
        ("sql+sqlite:///index.db", "sqlite+pysqlite"),
        ("oracle://u@h:1521/?service_name=x", "oracle+oracledb"),
        ("oracle+oracledb://u@h:1521/?service_name=x", "oracle+oracledb"),
    ],
)
def test_each_scheme_uses_the_installed_driver(url: str, driver: str) -> None:
    assert url.split("://", maxsplit=1)[0] in STORES
    assert parse_sql_url(url).url.drivername == driver


def test_own_options_are_read_and_the_rest_go_to_the_driver() -> None:
    opts = parse_sql_url(
        "postgresql://u:pw@h:5/db?schema=iq_a&prefix=x_&pool_size=2&pre_ping=true"
        "&connect_timeout=3&sslmode=require"
    )
    assert (opts.schema, opts.prefix) == ("iq_a", "x_")
    assert dict(opts.url.query) == {"sslmode": "require"}
    assert opts.engine_args["pool_size"] == 2
    assert opts.engine_args["pool_pre_ping"] is True
    assert opts.engine_args["connect_args"] == {"connect_timeout": 3}
    assert opts.redacted == "postgresql://u:***@h:5/db?schema=iq_a&prefix=x_&pool_size=2" + (
        "&pre_ping=true&connect_timeout=3&sslmode=require"
    )
    assert opts.family == "postgresql"
    assert parse_sql_url("mariadb://u@h/db").family == "mysql"


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("postgresql://u@h/db?prefix=Bad-Prefix", "prefix="),
        ("postgresql://u@h/db?schema=1abc", "schema="),
        ("postgresql://u@h/db?pool_size=many", "not a number"),
        ("postgresql://u@h/db?pre_ping=maybe", "pre_ping="),
        ("sql+sqlite:///index.db?schema=x", "no schemas"),
        ("sql+sqlite://", "names no file"),
        ("redis://h/0", "not a SQL index URL"),
    ],
)
def test_bad_urls_say_what_to_write(url: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        parse_sql_url(url)


def test_a_password_never_shows_in_a_parse_error() -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_sql_url("postgresql://u:hunter2@h:notaport/db")
    assert "hunter2" not in str(info.value)


@pytest.mark.skipif(
    importlib.util.find_spec("oracledb") is not None, reason="the Oracle driver is installed"
)
def test_a_missing_driver_names_the_extra_to_install() -> None:
    with pytest.raises(ConfigurationError, match=r"pip install 'iqbridge\[oracle\]'"):
        SqlStore.from_url("oracle://u:pw@127.0.0.1:1521/?service_name=x")


def test_tables_are_named_by_prefix_in_their_schema() -> None:
    tables = make_tables("abc_", "iq")
    assert sorted(t.fullname for t in tables.metadata.sorted_tables) == [
        "iq.abc_journal",
        "iq.abc_members",
        "iq.abc_messages",
        "iq.abc_meta",
        "iq.abc_payloads",
        "iq.abc_queues",
    ]
    names = {i.name for t in tables.metadata.sorted_tables for i in t.indexes}
    assert all(n is not None and n.startswith("abc_") for n in names)
    searched = {c.name for i in tables.messages.indexes for c in i.columns}
    assert {"correlation_id", "priority", "publisher", "created_at", "publisher_state"} <= searched
    assert {"lock_id", "next_due"} <= searched
    claim = next(i for i in tables.members.indexes if i.name == "abc_members_claim")
    assert [c.name for c in claim.columns] == [
        "queue",
        "subscriber",
        "state",
        "neg_priority",
        "seq",
    ]
