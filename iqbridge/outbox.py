"""Transactional outbox (seed 002, capture side): a message exists if and only if the
producer's business transaction commits.

The producer writes its business rows and the message into its own database in one
transaction: :meth:`Outbox.put` inserts one row into the outbox table through the
caller's open connection, so a rollback takes the message with it and a commit keeps
both. A :class:`~iqbridge.relay.Relay` (``iq relay``) then publishes the outbox rows to
any broker through the facade, with the msg_id assigned here, and marks them relayed.

Databases: whatever SQLAlchemy Core reaches with a dialect of PostgreSQL, MySQL/MariaDB
or SQLite (Oracle through the same code where its dialect allows). The table (default
``iq_outbox``) is created on first use; creating it is idempotent and safe when several
processes start at once.

Rows move ``pending`` -> ``relayed``, or ``pending`` -> ``parked`` when a row cannot be
relayed (a malformed payload or audience, a queue with nobody to deliver to): a parked
row is kept with the reason, never lost; fix the cause and :meth:`Outbox.retry_parked`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from iqbridge.durations import seconds, to_seconds
from iqbridge.errors import (
    ConfigurationError,
    ConnectionError,
    InvalidArgument,
    IQError,
    MessageError,
    MessageTooLarge,
)
from iqbridge.ids import new_id
from iqbridge.model import Pool, check_name, check_text
from iqbridge.payload import encode
from iqbridge.redaction import redact, remember, scrub, url_secrets

try:
    import sqlalchemy as sa
    from sqlalchemy.dialects.mysql import LONGBLOB, LONGTEXT
except ModuleNotFoundError as _exc:  # pragma: no cover - depends on the installation
    raise ConfigurationError(
        f"the transactional outbox needs SQLAlchemy ({_exc.name!r} is missing): "
        f"pip install 'iqbridge[sql]'"
    ) from _exc

__all__ = [
    "MalformedOutboxRow",
    "Outbox",
    "OutboxCounts",
    "OutboxRow",
    "OutboxUnavailable",
    "ParkedRow",
]

PENDING = "pending"
RELAYED = "relayed"
PARKED = "parked"

_DEFAULT_MAX_BYTES = 16 * 1024 * 1024
_CREATE_ATTEMPTS = 5
_ERROR_MAX = 2000

AudienceSpec = str | Pool | Iterable[str | Pool]


class OutboxUnavailable(ConnectionError):
    """The producer's database holding the outbox cannot be reached or refused a query."""


class MalformedOutboxRow(MessageError):
    """An outbox row that cannot be relayed; the relay parks it (kept, not lost)."""

    def __init__(self, seq: int, msg_id: str, table: str, reason: str) -> None:
        self.seq = seq
        self.msg_id = msg_id
        self.table = table
        self.reason = reason
        super().__init__(
            f"outbox row {seq} (msg_id {msg_id}) in table {table!r} cannot be relayed: "
            f"{reason}. The row is parked (state 'parked'), not lost: fix the row or the "
            f"cause, then relay it again with Outbox.retry_parked() or "
            f"`iq relay --retry-parked`, or delete the row if the message must not be sent"
        )


@dataclass(frozen=True, slots=True)
class OutboxCounts:
    """How many rows of the outbox are in each state."""

    pending: int
    relayed: int
    parked: int


@dataclass(frozen=True, slots=True)
class ParkedRow:
    """A row the relay could not publish, with the reason it gave."""

    seq: int
    msg_id: str
    queue: str
    error: str


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One decoded outbox row: what the relay passes to ``Queue.put_many``."""

    seq: int
    msg_id: str
    queue: str
    body: bytes
    content_type: str
    to: list[str | Pool] | None
    publisher: str | None
    correlation_id: str | None
    priority: int
    ordering_key: str | None
    expires_at: int | None
    parents: tuple[str, ...]
    headers: dict[str, str]

    def options(self) -> tuple[Any, ...]:
        """What rows must share to be put in one ``put_many`` call."""
        return (
            self.queue,
            _audience_json(self.to),
            self.publisher,
            self.correlation_id,
            self.priority,
            self.ordering_key,
            self.expires_at,
            self.parents,
            tuple(sorted(self.headers.items())),
            self.content_type,
        )


def _sql_url(url: str) -> str:
    """A SQLAlchemy URL for iqbridge's spelling of a database URL (drivers it installs)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigurationError(
            f"outbox URL {redact(url)!r} has no scheme; write it like "
            f"postgresql://user@host/db, mysql://root@host/db or sqlite:///app.db"
        )
    driver = {
        "postgresql": "postgresql+psycopg",
        "postgres": "postgresql+psycopg",
        "mysql": "mysql+pymysql",
        "mariadb": "mariadb+pymysql",
        "sql+sqlite": "sqlite",
        "oracle": "oracle+oracledb",
    }.get(scheme.lower(), scheme)
    return f"{driver}://{rest}"


def _audience_json(to: AudienceSpec | None) -> str | None:
    """The audience as JSON: names, and pools as ``{"pool": name, "members": [...]}``."""
    if to is None:
        return None
    items: list[str | Pool] = [to] if isinstance(to, str | Pool) else list(to)
    out: list[object] = []
    for item in items:
        if isinstance(item, Pool):
            out.append({"pool": item.name, "members": list(item.members)})
        elif isinstance(item, str):
            out.append(check_name("subscriber", item))
        else:
            raise InvalidArgument(
                f"audience entries must be subscriber names or Pool(...), not {type(item).__name__}"
            )
    if not out:
        raise InvalidArgument(
            "to= names nobody; pass subscribers or Pool(...), or leave it out for the "
            "queue's standing subscribers"
        )
    return json.dumps(out, separators=(",", ":"))


def _audience_from_json(text: str | None) -> list[str | Pool] | None:
    if text is None:
        return None
    data = json.loads(text)
    if not isinstance(data, list) or not data:
        raise ValueError("audience is not a non-empty JSON list")
    out: list[str | Pool] = []
    for item in data:
        if isinstance(item, str):
            out.append(check_name("subscriber", item))
        elif (
            isinstance(item, dict)
            and isinstance(item.get("pool"), str)
            and isinstance(item.get("members", []), list)
        ):
            out.append(Pool(item["pool"], item.get("members", [])))
        else:
            raise ValueError(f"audience entry {item!r} is neither a name nor a pool")
    return out


def _translate(exc: sa.exc.SQLAlchemyError, where: str) -> IQError:
    orig = getattr(exc, "orig", None) or exc
    text = " ".join(str(orig).split())[:500]
    return OutboxUnavailable(f"outbox database {where}: {type(orig).__name__}: {text}")


class Outbox:
    """The outbox table in the producer's own database.

    ``engine`` is a SQLAlchemy :class:`~sqlalchemy.engine.Engine` (share the one your
    application uses) or a database URL (``postgresql://``, ``mysql://``/``mariadb://``,
    ``sqlite:///``; iqbridge's drivers are chosen for them, and the outbox makes and
    owns an engine). ``table`` and ``schema`` name the outbox table; ``publisher``
    is stamped on rows put without one; ``max_bytes`` refuses larger payloads at once,
    inside the business transaction.
    """

    def __init__(
        self,
        engine: sa.engine.Engine | sa.engine.URL | str,
        *,
        table: str = "iq_outbox",
        schema: str | None = None,
        publisher: str | None = None,
        max_bytes: int = _DEFAULT_MAX_BYTES,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if isinstance(engine, sa.engine.URL):
            engine = engine.render_as_string(hide_password=False)
        if isinstance(engine, str):
            url = _sql_url(engine)
            try:
                options: dict[str, Any] = {}
                if url.startswith("sqlite"):
                    options["connect_args"] = {"timeout": 30.0}
                self.engine = sa.create_engine(url, **options)
            except (sa.exc.ArgumentError, ImportError) as exc:
                why = scrub(str(exc), url_secrets(engine))
                raise ConfigurationError(
                    f"cannot open the outbox database {redact(engine)!r}: {why}"
                ) from None
            self._owns_engine = True
        else:
            self.engine = engine
            self._owns_engine = False
        full = self.engine.url.render_as_string(hide_password=False)
        remember(full)
        self.url = redact(full)
        self.publisher = check_name("publisher", publisher) if publisher else None
        if max_bytes <= 0:
            raise InvalidArgument(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self._clock = clock
        self.metadata = sa.MetaData(schema=schema)
        self.table = _define(self.metadata, table)
        self.name = f"{schema}.{table}" if schema else table
        self._ready = False

    def __repr__(self) -> str:
        return f"<Outbox {self.name} on {self.url}>"

    def now_us(self) -> int:
        """Now in microseconds since the epoch, from the outbox's clock."""
        if self._clock is None:
            return time.time_ns() // 1000
        return int(self._clock() * 1_000_000)

    # --- the table ---------------------------------------------------------------------

    def create_table(self) -> None:
        """Create the outbox table and its index if missing (idempotent; safe when several
        processes do it at the same moment)."""
        if self._ready:
            return
        last: sa.exc.SQLAlchemyError | None = None
        for attempt in range(_CREATE_ATTEMPTS):
            try:
                with self.engine.begin() as conn:
                    self.metadata.create_all(conn, checkfirst=True)
                self._ready = True
                return
            except sa.exc.SQLAlchemyError as exc:
                # Another process created it between our check and our CREATE: the table
                # is there now, which is all we wanted.
                last = exc
                try:
                    if self._exists():
                        self._ready = True
                        return
                except sa.exc.SQLAlchemyError as again:  # cannot even look: give up now
                    raise _translate(again, f"{self.url} (creating {self.name})") from again
                time.sleep(0.05 * (attempt + 1))
        assert last is not None
        raise _translate(last, f"{self.url} (creating {self.name})") from last

    def _exists(self) -> bool:
        with self.engine.connect() as conn:
            return sa.inspect(conn).has_table(self.table.name, self.table.schema)

    def _ensure(self, conn: sa.engine.Connection) -> None:
        if self._ready:
            return
        if conn.dialect.name == "sqlite":
            # A second connection would wait for the write lock the caller's transaction
            # may hold: create it in the caller's transaction (SQLite DDL is transactional),
            # and trust it only once it is seen at the start of a later put.
            if sa.inspect(conn).has_table(self.table.name, self.table.schema):
                self._ready = True
            else:
                self.metadata.create_all(conn, checkfirst=True)
            return
        # Elsewhere DDL may commit the caller's transaction (MySQL): use our own connection.
        self.create_table()

    # --- producing ---------------------------------------------------------------------

    def put(
        self,
        conn: sa.engine.Connection,
        queue: str,
        payload: object,
        *,
        to: AudienceSpec | None = None,
        publisher: str | None = None,
        correlation_id: str | None = None,
        priority: int = 4,
        ordering_key: str | None = None,
        ttl: float | timedelta | None = None,
        parents: Iterable[str] = (),
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> str:
        """Write one message into the outbox inside the caller's transaction; return its
        msg_id (assigned now, kept by the relay and in the index).

        ``conn`` is the open SQLAlchemy connection of the business transaction (with the
        ORM: ``session.connection()``): the message is relayed if and only if that
        transaction commits. The other arguments mean what they mean for
        :meth:`iqbridge.Queue.put`; ``to=None`` means the queue's standing subscribers
        when the relay publishes it. ``ttl`` counts from now, not from the relay.
        """
        queue = check_name("queue", queue)
        if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 9:
            raise InvalidArgument(f"priority must be an int from 0 to 9, got {priority!r}")
        hdrs = dict(headers or {})
        for k, v in hdrs.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidArgument("headers must map str to str")
            check_text(f"header {k!r}", v)
            check_text("header name", k)
        parent_ids = tuple(parents)
        if not all(isinstance(p, str) and p for p in parent_ids):
            raise InvalidArgument("parents must be msg_id strings")
        ttl_s = to_seconds(ttl, "ttl")
        if ordering_key is not None:
            check_text("ordering_key", ordering_key)
        if correlation_id is not None:
            check_text("correlation_id", correlation_id)
        who = publisher or self.publisher
        if who is not None:
            check_name("publisher", who)
        body, ctype = encode(payload, content_type)
        if len(body) > self.max_bytes:
            raise MessageTooLarge(len(body), self.max_bytes, queue)
        audience = _audience_json(to)
        msg_id = new_id()
        now = self.now_us()
        row = {
            "msg_id": msg_id,
            "queue": queue,
            "body": body,
            "content_type": ctype,
            "audience": audience,
            "publisher": who,
            "correlation_id": correlation_id,
            "priority": priority,
            "ordering_key": ordering_key,
            "expires_at": now + int(ttl_s * 1_000_000) if ttl_s is not None else None,
            "parents": json.dumps(list(parent_ids)) if parent_ids else None,
            "headers": json.dumps(hdrs, separators=(",", ":")) if hdrs else None,
            "created_at": now,
            "state": PENDING,
        }
        try:
            self._ensure(conn)
            conn.execute(self.table.insert(), row)
        except sa.exc.SQLAlchemyError as exc:
            raise _translate(exc, self.url) from exc
        return msg_id

    # --- reading and housekeeping --------------------------------------------------------

    def counts(self) -> OutboxCounts:
        """Rows per state."""
        self.create_table()
        t = self.table
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(sa.select(t.c.state, sa.func.count()).group_by(t.c.state)).all()
        except sa.exc.SQLAlchemyError as exc:
            raise _translate(exc, self.url) from exc
        got = {str(state): int(n) for state, n in rows}
        return OutboxCounts(got.get(PENDING, 0), got.get(RELAYED, 0), got.get(PARKED, 0))

    def parked(self, limit: int = 100) -> list[ParkedRow]:
        """Parked rows, oldest first, with the reason each was parked."""
        self.create_table()
        t = self.table
        stmt = (
            sa.select(t.c.seq, t.c.msg_id, t.c.queue, t.c.error)
            .where(t.c.state == PARKED)
            .order_by(t.c.seq)
            .limit(limit)
        )
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(stmt).all()
        except sa.exc.SQLAlchemyError as exc:
            raise _translate(exc, self.url) from exc
        return [ParkedRow(int(r[0]), str(r[1]), str(r[2]), str(r[3] or "")) for r in rows]

    def retry_parked(self, seqs: Iterable[int] | None = None) -> int:
        """Make parked rows (all, or those with these ``seqs``) pending again; return how
        many. Do it once their cause is fixed; the relay then publishes them."""
        self.create_table()
        t = self.table
        stmt = sa.update(t).where(t.c.state == PARKED).values(state=PENDING, error=None)
        if seqs is not None:
            stmt = stmt.where(t.c.seq.in_(list(seqs)))
        try:
            with self.engine.begin() as conn:
                return int(conn.execute(stmt).rowcount)
        except sa.exc.SQLAlchemyError as exc:
            raise _translate(exc, self.url) from exc

    def purge(self, older_than: float | timedelta) -> int:
        """Delete rows relayed more than ``older_than`` ago; return how many. The messages
        live on in the index; the outbox only needs rows not yet relayed."""
        secs = seconds(older_than, "older_than")
        self.create_table()
        t = self.table
        before = self.now_us() - int(secs * 1_000_000)
        stmt = sa.delete(t).where(t.c.state == RELAYED, t.c.relayed_at < before)
        try:
            with self.engine.begin() as conn:
                return int(conn.execute(stmt).rowcount)
        except sa.exc.SQLAlchemyError as exc:
            raise _translate(exc, self.url) from exc

    def close(self) -> None:
        """Dispose of the engine if the outbox made it from a URL."""
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- for the relay -------------------------------------------------------------------

    def decode(self, row: sa.engine.Row[Any]) -> OutboxRow:
        """An outbox row as put arguments; :class:`MalformedOutboxRow` if it cannot be."""
        m = row._mapping
        seq, msg_id = int(m["seq"]), str(m["msg_id"])
        try:
            body = m["body"]
            if not isinstance(body, bytes | bytearray | memoryview):
                raise ValueError(f"body is {type(body).__name__}, not bytes")
            headers = json.loads(m["headers"]) if m["headers"] else {}
            if not isinstance(headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
            ):
                raise ValueError("headers are not a JSON object of strings")
            parents = json.loads(m["parents"]) if m["parents"] else []
            if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
                raise ValueError("parents are not a JSON list of msg_ids")
            return OutboxRow(
                seq=seq,
                msg_id=msg_id,
                queue=check_name("queue", m["queue"]),
                body=bytes(body),
                content_type=str(m["content_type"]),
                to=_audience_from_json(m["audience"]),
                publisher=check_name("publisher", m["publisher"]) if m["publisher"] else None,
                correlation_id=m["correlation_id"],
                priority=int(m["priority"]),
                ordering_key=m["ordering_key"],
                expires_at=int(m["expires_at"]) if m["expires_at"] is not None else None,
                parents=tuple(parents),
                headers=headers,
            )
        except (ValueError, TypeError, IQError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            raise MalformedOutboxRow(seq, msg_id, self.name, why) from None

    def pending_stmt(self, limit: int) -> sa.Select[Any]:
        """The oldest ``limit`` pending rows, in put order."""
        t = self.table
        return sa.select(t).where(t.c.state == PENDING).order_by(t.c.seq).limit(limit)

    def mark(
        self,
        conn: sa.engine.Connection,
        relayed: Sequence[int],
        parked: Sequence[MalformedOutboxRow],
    ) -> None:
        """Mark rows relayed (one UPDATE) and park the malformed ones, in ``conn``."""
        t = self.table
        now = self.now_us()
        if relayed:
            conn.execute(
                sa.update(t)
                .where(t.c.seq.in_(list(relayed)), t.c.state == PENDING)
                .values(state=RELAYED, relayed_at=now)
            )
        for bad in parked:
            conn.execute(
                sa.update(t)
                .where(t.c.seq == bad.seq, t.c.state == PENDING)
                .values(state=PARKED, error=bad.reason[:_ERROR_MAX])
            )


def _define(metadata: sa.MetaData, name: str) -> sa.Table:
    big = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    blob = sa.LargeBinary().with_variant(LONGBLOB(), "mysql", "mariadb")
    text = sa.Text().with_variant(LONGTEXT(), "mysql", "mariadb")
    return sa.Table(
        name,
        metadata,
        sa.Column("seq", big, sa.Identity(), primary_key=True),
        sa.Column("msg_id", sa.String(128), nullable=False),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("body", blob, nullable=False),
        sa.Column("content_type", sa.String(255), nullable=False),
        sa.Column("audience", text),
        sa.Column("publisher", sa.String(255)),
        sa.Column("correlation_id", sa.String(255)),
        sa.Column("priority", sa.SmallInteger, nullable=False),
        sa.Column("ordering_key", sa.String(255)),
        sa.Column("expires_at", sa.BigInteger),
        sa.Column("parents", text),
        sa.Column("headers", text),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("relayed_at", sa.BigInteger),
        sa.Column("error", text),
        sa.UniqueConstraint("msg_id", name=f"{name}_msg_id_key"),
        sa.Index(f"{name}_state_seq", "state", "seq"),
    )
