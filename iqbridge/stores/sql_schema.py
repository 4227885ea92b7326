"""URLs, tables and schema management of the SQL index store (:mod:`iqbridge.stores.sql`).

Kept apart from the store so the store module holds only what a transition does.

* :func:`parse_sql_url` turns an index URL into an SQLAlchemy URL for the installed
  driver (psycopg 3 for PostgreSQL, PyMySQL for MySQL and MariaDB, the standard library
  for SQLite, python-oracledb for Oracle) plus the store's own options.
* :func:`make_tables` builds the tables (named ``<prefix><table>``, in ``schema`` if one
  is given) and every index.
* :func:`ensure_schema` creates the tables on first use, or migrates them, under a lock
  (a PostgreSQL advisory lock, a MySQL named lock, SQLite's write lock), so several
  processes opening a new index at once neither fail nor create it twice. The version
  lives in the ``<prefix>meta`` table; so does the index's ``instance`` id, by which a
  caller's own connection is recognised as one to the index's database.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.mysql import LONGBLOB, MEDIUMTEXT
from sqlalchemy.engine import URL, Connection, Engine, make_url

from iqbridge.errors import ConfigurationError, IndexUnavailable
from iqbridge.registry import redact

__all__ = [
    "SCHEMA_VERSION",
    "SqlOptions",
    "Tables",
    "ensure_schema",
    "make_tables",
    "parse_sql_url",
]

#: The table layout this code writes; older layouts are migrated on first use.
#: 2: the ``payloads`` table (retained payload copies).
SCHEMA_VERSION = 2

#: index URL scheme -> SQLAlchemy driver name and the extra that installs the driver
_DRIVERS: dict[str, tuple[str, str]] = {
    "postgresql": ("postgresql+psycopg", "sql"),
    "postgres": ("postgresql+psycopg", "sql"),
    "postgresql+psycopg": ("postgresql+psycopg", "sql"),
    "mysql": ("mysql+pymysql", "sql"),
    "mysql+pymysql": ("mysql+pymysql", "sql"),
    "mariadb": ("mariadb+pymysql", "sql"),
    "mariadb+pymysql": ("mariadb+pymysql", "sql"),
    "sql+sqlite": ("sqlite+pysqlite", "sql"),
    "oracle": ("oracle+oracledb", "oracle"),
    "oracle+oracledb": ("oracle+oracledb", "oracle"),
}

_OWN = (
    "prefix",
    "schema",
    "pool_size",
    "max_overflow",
    "pool_timeout",
    "pool_recycle",
    "pre_ping",
    "connect_timeout",
)
_PREFIX = re.compile(r"[a-z][a-z0-9_]{0,23}")
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class SqlOptions:
    """What an index URL asks for: the SQLAlchemy URL and the store's own options."""

    url: URL
    redacted: str
    extra: str
    prefix: str = "iq_"
    schema: str | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str:
        """``postgresql``, ``mysql`` (MySQL and MariaDB), ``sqlite`` or ``oracle``."""
        backend = self.url.get_backend_name()
        return "mysql" if backend == "mariadb" else backend


def _number(opts: dict[str, str], name: str, default: float, redacted: str) -> float:
    raw = opts.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        what = "is not a number" if math.isnan(value) else "is not finite"
        raise ConfigurationError(f"option {name}={raw!r} of the SQL index {redacted} {what}")
    if value < 0 and name != "pool_recycle":
        raise ConfigurationError(f"option {name} of the SQL index {redacted} must not be negative")
    return value


def _redact(url: str) -> str:
    try:
        return redact(url)
    except ValueError:  # urllib refuses the port: say nothing of the rest either
        return url.split("://", 1)[0] + "://<unparseable URL>"


def parse_sql_url(url: str) -> SqlOptions:
    """Split an index URL into the SQLAlchemy URL for the installed driver and options.

    Options the store reads: ``prefix`` (table name prefix, default ``iq_``), ``schema``
    (a PostgreSQL schema or MySQL database for the tables, created if missing),
    ``pool_size`` (5), ``max_overflow`` (10), ``pool_timeout`` (30 s), ``pool_recycle``
    (seconds; 3600 on MySQL, else off), ``pre_ping`` (test a pooled connection before
    use, default off), ``connect_timeout`` (10 s; on SQLite how long a writer waits for
    the file's write lock, default 30 s). Any other option goes to the driver as it is
    (``sslmode=require``, ``charset=utf8mb4`` ...).
    """
    redacted = _redact(url)
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in _DRIVERS:
        raise ConfigurationError(
            f"{redacted!r} is not a SQL index URL; use one of "
            f"{', '.join(sorted(s + '://' for s in _DRIVERS))}"
        )
    driver, extra = _DRIVERS[scheme]
    try:
        parsed = make_url(driver + url[len(scheme) :])
    except Exception:  # the parser's message may quote the password
        raise ConfigurationError(
            f"cannot parse the SQL index URL {redacted!r}; write it like "
            f"postgresql://user:password@host:5432/dbname?schema=iq"
        ) from None
    query: dict[str, str] = {}
    for key, value in parsed.query.items():
        query[key] = value[-1] if isinstance(value, tuple) else value
    own = {k: query.pop(k) for k in _OWN if k in query}
    prefix = own.get("prefix", "iq_")
    if not _PREFIX.fullmatch(prefix):
        raise ConfigurationError(
            f"prefix={prefix!r} of the SQL index {redacted}: use 1 to 24 lower-case letters, "
            f"digits or '_', starting with a letter"
        )
    schema = own.get("schema") or None
    if schema is not None and not _SCHEMA.fullmatch(schema):
        raise ConfigurationError(
            f"schema={schema!r} of the SQL index {redacted}: use up to 63 lower-case letters, "
            f"digits or '_', not starting with a digit"
        )
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if schema is not None:
            raise ConfigurationError(
                f"the SQL index {redacted} is an SQLite file, which has no schemas; "
                f"use prefix= to keep several indexes apart in one file"
            )
        if not parsed.database or parsed.database == ":memory:":
            raise ConfigurationError(
                f"the SQL index URL {redacted!r} names no file; write sql+sqlite:///index.db "
                f"(relative) or sql+sqlite:////absolute/index.db"
            )
    args: dict[str, Any] = {"hide_parameters": True}
    connect_args: dict[str, Any] = {}
    timeout = _number(own, "connect_timeout", 30.0 if backend == "sqlite" else 10.0, redacted)
    if backend == "sqlite":
        connect_args["timeout"] = timeout
        connect_args["check_same_thread"] = False
    elif backend == "oracle":
        connect_args["tcp_connect_timeout"] = timeout
    else:
        connect_args["connect_timeout"] = max(1, int(timeout))
    args["connect_args"] = connect_args
    args["pool_size"] = int(_number(own, "pool_size", 5, redacted))
    args["max_overflow"] = int(_number(own, "max_overflow", 10, redacted))
    args["pool_timeout"] = _number(own, "pool_timeout", 30.0, redacted)
    recycle = _number(
        own, "pool_recycle", 3600 if backend in ("mysql", "mariadb") else -1, redacted
    )
    args["pool_recycle"] = int(recycle)
    pre_ping = own.get("pre_ping", "false").lower()
    if pre_ping not in _TRUE + _FALSE:
        raise ConfigurationError(
            f"pre_ping={pre_ping!r} of the SQL index {redacted}: use true or false"
        )
    args["pool_pre_ping"] = pre_ping in _TRUE
    return SqlOptions(
        url=parsed.set(query=query),
        redacted=redacted,
        extra=extra,
        prefix=prefix,
        schema=schema,
        engine_args=args,
    )


@dataclass(frozen=True)
class Tables:
    """The index's tables (and with them its indexes) for one schema and prefix."""

    metadata: sa.MetaData
    meta: sa.Table
    queues: sa.Table
    messages: sa.Table
    members: sa.Table
    journal: sa.Table
    payloads: sa.Table


def make_tables(prefix: str, schema: str | None) -> Tables:
    """Every table and index of an index named by ``prefix`` in ``schema``.

    Column types are the portable ones (no JSON or array types): the same layout works
    on PostgreSQL, MySQL/MariaDB, SQLite and Oracle. Text in MySQL tables is
    ``utf8mb4`` with a binary collation, so names and ids compare case-sensitively as
    they do everywhere else.
    """
    md = sa.MetaData(schema=schema)
    p = prefix
    big = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    long_text = sa.Text().with_variant(MEDIUMTEXT(), "mysql", "mariadb")
    opts: dict[str, Any] = {}
    for d in ("mysql", "mariadb"):
        opts.update(
            {f"{d}_engine": "InnoDB", f"{d}_charset": "utf8mb4", f"{d}_collate": "utf8mb4_bin"}
        )

    def name(n: str) -> str:
        return p + n

    def state() -> sa.String:
        return sa.String(16)

    meta = sa.Table(
        name("meta"),
        md,
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("val", sa.String(255), nullable=False),
        **opts,
    )
    queues = sa.Table(
        name("queues"),
        md,
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("subscriptions", long_text, nullable=False),
        **opts,
    )
    messages = sa.Table(
        name("messages"),
        md,
        # Put order. Identity() where the database has identity columns (PostgreSQL,
        # Oracle); AUTO_INCREMENT on MySQL; AUTOINCREMENT (never reused) on SQLite.
        sa.Column("seq", big, sa.Identity(), primary_key=True),
        sa.Column("msg_id", sa.String(128), nullable=False),
        sa.Column("queue", sa.String(200), nullable=False),
        sa.Column("publisher", sa.String(200), nullable=False),
        sa.Column("ordering_key", sa.String(512), nullable=False),
        sa.Column("correlation_id", sa.String(512)),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("audience_mode", sa.String(16), nullable=False),
        sa.Column("parents", sa.Text()),
        sa.Column("native_ref", sa.String(1024)),
        sa.Column("content_type", sa.String(255), nullable=False),
        sa.Column("body_size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger()),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("publisher_state", state()),
        sa.Column("withdrawn", sa.SmallInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.Column("lock_id", sa.String(128)),
        sa.Column("lock_owner", sa.String(512)),
        sa.Column("lock_until", sa.BigInteger()),
        sa.Column("version", sa.BigInteger(), nullable=False),
        # When time next makes something due (MessageRecord.due_at()): the sweep's index.
        sa.Column("next_due", sa.BigInteger()),
        sa.UniqueConstraint("msg_id", name=name("messages_msg_id")),
        sqlite_autoincrement=True,
        **opts,
    )
    c = messages.c
    sa.Index(name("messages_queue"), c.queue, c.seq)
    sa.Index(name("messages_corr"), c.queue, c.correlation_id)
    sa.Index(name("messages_prio"), c.queue, c.priority)
    sa.Index(name("messages_pub"), c.queue, c.publisher)
    sa.Index(name("messages_created"), c.queue, c.created_at)
    sa.Index(name("messages_state"), c.queue, c.publisher_state)
    sa.Index(name("messages_lock"), c.lock_id)
    sa.Index(name("messages_due"), c.next_due)
    sa.Index(name("messages_qdue"), c.queue, c.next_due)
    members = sa.Table(
        name("members"),
        md,
        sa.Column("msg_id", sa.String(128), primary_key=True),
        sa.Column("subscriber", sa.String(200), primary_key=True),
        sa.Column("position", sa.SmallInteger(), nullable=False),
        # Copied from the message, so a subscriber's claim order is one index range.
        sa.Column("queue", sa.String(200), nullable=False),
        sa.Column("seq", big, nullable=False),
        sa.Column("neg_priority", sa.SmallInteger(), nullable=False),
        sa.Column("pool", sa.String(200)),
        sa.Column("state", state()),
        sa.Column("outcome", state()),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("lease_token", sa.String(128)),
        sa.Column("lease_owner", sa.String(512)),
        sa.Column("lease_until", sa.BigInteger()),
        sa.Column("not_before", sa.BigInteger()),
        sa.Column("reason", sa.Text()),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        **opts,
    )
    m = members.c
    # The claim order: AVAILABLE members of one subscriber, priority first, then put order.
    sa.Index(name("members_claim"), m.queue, m.subscriber, m.state, m.neg_priority, m.seq)
    sa.Index(name("members_state"), m.queue, m.state)
    journal = sa.Table(
        name("journal"),
        md,
        sa.Column("seq", big, sa.Identity(), primary_key=True),
        sa.Column("msg_id", sa.String(128), nullable=False),
        sa.Column("queue", sa.String(200), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("actor_kind", sa.String(16), nullable=False),
        sa.Column("src", state()),
        sa.Column("dst", state(), nullable=False),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("detail", sa.Text()),
        sqlite_autoincrement=True,
        **opts,
    )
    sa.Index(name("journal_msg"), journal.c.msg_id, journal.c.seq)
    # Retained payload copies (Change.retain), written with the message row, purged with it.
    # LONGBLOB on MySQL/MariaDB: a plain BLOB holds 64 KiB, a MEDIUMBLOB 16 MiB. The body
    # is nullable because Oracle stores an empty RAW as NULL: NULL reads as b"".
    payloads = sa.Table(
        name("payloads"),
        md,
        sa.Column("msg_id", sa.String(128), primary_key=True),
        sa.Column("body", sa.LargeBinary().with_variant(LONGBLOB(), "mysql", "mariadb")),
        sa.Column("headers", long_text, nullable=False),
        **opts,
    )
    return Tables(md, meta, queues, messages, members, journal, payloads)


# --- creation and migration -------------------------------------------------------------


def _add_payloads(conn: Connection, tables: Tables) -> None:
    tables.payloads.create(conn, checkfirst=True)


#: version -> the step that upgrades a schema of that version to the next one.
_MIGRATIONS: dict[int, Callable[[Connection, Tables], None]] = {1: _add_payloads}

_CREATE_ATTEMPTS = 6


def _lock_key(opts: SqlOptions) -> str:
    return f"iqbridge:{opts.schema or ''}:{opts.prefix}"


@contextmanager
def _schema_lock(conn: Connection, opts: SqlOptions) -> Iterator[None]:
    """Hold a lock that serialises schema work on one index across processes.

    Inside, a transaction is open on ``conn``; it commits on a clean exit. PostgreSQL:
    a transaction-scoped advisory lock; MySQL/MariaDB: a named lock (its DDL commits
    implicitly, so the lock must outlive transactions); SQLite: the writer's
    ``BEGIN IMMEDIATE``. Oracle offers no lock every user may take, so there creation
    relies on the retries of :func:`ensure_schema`.
    """
    key = _lock_key(opts)
    family = opts.family
    if family == "mysql":
        name = "iq" + hashlib.sha1(key.encode()).hexdigest()[:40]
        got = conn.execute(sa.text("SELECT GET_LOCK(:n, 60)"), {"n": name}).scalar()
        conn.commit()
        if got != 1:
            raise IndexUnavailable(
                f"SQL index {opts.redacted}: another process held the schema lock for 60 s"
            )
        try:
            with conn.begin():
                yield
        finally:
            conn.execute(sa.text("SELECT RELEASE_LOCK(:n)"), {"n": name})
            conn.commit()
        return
    with conn.begin():
        if family == "postgresql":
            digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
            conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(:k)"),
                {"k": int.from_bytes(digest, "big", signed=True)},
            )
        yield


def _read_meta(conn: Connection, tables: Tables) -> dict[str, str]:
    rows = conn.execute(sa.select(tables.meta.c.name, tables.meta.c.val)).all()
    return {r[0]: r[1] for r in rows}


def _create_or_migrate(conn: Connection, tables: Tables, opts: SqlOptions) -> dict[str, str]:
    inspector = sa.inspect(conn)
    schema = opts.schema
    creates_schemas = opts.family in ("postgresql", "mysql")
    if schema is not None and creates_schemas and not inspector.has_schema(schema):
        conn.execute(sa.schema.CreateSchema(schema, if_not_exists=True))
    has_meta = inspector.has_table(tables.meta.name, schema=schema)
    meta = _read_meta(conn, tables) if has_meta else {}
    if not meta:
        tables.metadata.create_all(conn, checkfirst=True)
        meta = {"schema_version": str(SCHEMA_VERSION), "instance": uuid.uuid4().hex}
        conn.execute(tables.meta.insert(), [{"name": k, "val": v} for k, v in meta.items()])
        return meta
    version = int(meta.get("schema_version", "0"))
    _check_version(version, opts)
    while version < SCHEMA_VERSION:
        step = _MIGRATIONS.get(version)
        if step is None:
            raise ConfigurationError(
                f"SQL index {opts.redacted} has schema version {version}, which this "
                f"iqbridge cannot migrate; migrate it with the iqbridge release that "
                f"wrote it, or start a new index (another prefix= or schema=)"
            )
        step(conn, tables)
        version += 1
        conn.execute(
            tables.meta.update()
            .where(tables.meta.c.name == "schema_version")
            .values(val=str(version))
        )
    tables.metadata.create_all(conn, checkfirst=True)  # tables added by later versions
    meta["schema_version"] = str(version)
    return meta


def _check_version(version: int, opts: SqlOptions) -> None:
    if version > SCHEMA_VERSION:
        raise ConfigurationError(
            f"SQL index {opts.redacted} has schema version {version}, newer than this "
            f"iqbridge knows ({SCHEMA_VERSION}); upgrade iqbridge"
        )


def ensure_schema(writer: Engine, reader: Engine, tables: Tables, opts: SqlOptions) -> str:
    """Create or migrate the index's tables if needed; return the index's instance id.

    The usual case, an index already at :data:`SCHEMA_VERSION`, costs one query and
    takes no lock. Otherwise the work runs under :func:`_schema_lock`, and is retried
    (up to six times) if a concurrent creator still got in the way.
    """
    with reader.connect() as conn:
        try:
            meta = _read_meta(conn, tables)
        except sa.exc.DBAPIError as exc:
            if exc.connection_invalidated:
                raise
            meta = {}
    if meta.get("schema_version") == str(SCHEMA_VERSION) and "instance" in meta:
        return meta["instance"]
    if meta:
        _check_version(int(meta.get("schema_version", "0")), opts)
    last: Exception | None = None
    for attempt in range(_CREATE_ATTEMPTS):
        try:
            with writer.connect() as conn, _schema_lock(conn, opts):
                meta = _create_or_migrate(conn, tables, opts)
            return meta["instance"]
        except (sa.exc.ProgrammingError, sa.exc.IntegrityError, sa.exc.DatabaseError) as exc:
            # A creator without a lock (Oracle) or a stale view raced us: look again.
            if isinstance(exc, sa.exc.OperationalError) and exc.connection_invalidated:
                raise
            last = exc
            time.sleep(0.05 * (attempt + 1))
    raise IndexUnavailable(
        f"cannot create the tables of the SQL index {opts.redacted}: {_reason(last)}; check "
        f"that the user may create tables (and the schema, if schema= names a new one)"
    )


def _reason(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
