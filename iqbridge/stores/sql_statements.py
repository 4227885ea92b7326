"""The batch statements of the SQL index store (:mod:`iqbridge.stores.sql_writes`), for
PostgreSQL and MariaDB/MySQL.

A batch's rows travel as one compact JSON parameter per table (an array of arrays,
encoded by orjson), which the database turns into a row source: ``jsonb_array_elements``
on PostgreSQL, ``JSON_TABLE`` on MariaDB. Every statement is one round trip whatever
the batch size; the texts name the tables as ``{msg}``, ``{mem}``, ``{jr}`` and ``{pl}``
(filled in by :func:`statements`, quoted by the dialect, schema included).
"""

from __future__ import annotations

from collections.abc import Sequence

from iqbridge.stores.sql_rows import _MEMBER_COLS

__all__ = ["ENTRY_COLS", "ITEM_COLS", "LOCK_HEAD", "LOCK_MEMBER", "MEMBER_COLS", "MOVE_COLS"]
__all__ += ["NEW_COLS", "STEP_COLS"]
__all__ += ["statements"]

#: Column kinds: the SQL type of each on PostgreSQL (a cast of the JSON text, None for
#: text) and on MariaDB (a JSON_TABLE column type).
_KINDS: dict[str, tuple[str | None, str]] = {
    "id": (None, "VARCHAR(128)"),
    "name": (None, "VARCHAR(200)"),
    "state": (None, "VARCHAR(16)"),
    "s255": (None, "VARCHAR(255)"),
    "s512": (None, "VARCHAR(512)"),
    "s1024": (None, "VARCHAR(1024)"),
    "text": (None, "LONGTEXT"),
    "big": ("bigint", "BIGINT"),
    "int": ("integer", "INT"),
    "small": ("smallint", "SMALLINT"),
    "bool": ("boolean", "BOOLEAN"),
}
_BIN = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"

Cols = Sequence[tuple[str, str]]

#: A new message row (in the INSERT's column order).
NEW_COLS: Cols = (
    ("msg_id", "id"),
    ("queue", "name"),
    ("publisher", "name"),
    ("ordering_key", "s512"),
    ("correlation_id", "s512"),
    ("priority", "small"),
    ("audience_mode", "state"),
    ("parents", "text"),
    ("native_ref", "s1024"),
    ("content_type", "s255"),
    ("body_size", "big"),
    ("created_at", "big"),
    ("expires_at", "big"),
    ("max_attempts", "int"),
    ("publisher_state", "state"),
    ("withdrawn", "small"),
    ("updated_at", "big"),
    ("lock_id", "id"),
    ("lock_owner", "s512"),
    ("lock_until", "big"),
    ("version", "big"),
    ("next_due", "big"),
)
#: A member row of a new message (queue, seq and priority come from its message).
MEMBER_COLS: Cols = (
    ("msg_id", "id"),
    ("subscriber", "name"),
    ("position", "small"),
    ("pool", "name"),
    ("state", "state"),
    ("outcome", "state"),
    ("attempt", "int"),
    ("lease_token", "id"),
    ("lease_owner", "s512"),
    ("lease_until", "big"),
    ("not_before", "big"),
    ("reason", "text"),
    ("updated_at", "big"),
)
#: A moved message row: the version moved from, then the columns a move sets.
MOVE_COLS: Cols = (
    ("msg_id", "id"),
    ("expected", "big"),
    ("publisher_state", "state"),
    ("withdrawn", "small"),
    ("updated_at", "big"),
    ("lock_id", "id"),
    ("lock_owner", "s512"),
    ("lock_until", "big"),
    ("version", "big"),
    ("next_due", "big"),
)
#: A moved member row (the member columns a move sets).
MOVED_MEMBER_COLS: Cols = (
    ("msg_id", "id"),
    ("subscriber", "name"),
    ("state", "state"),
    ("outcome", "state"),
    ("attempt", "int"),
    ("lease_token", "id"),
    ("lease_owner", "s512"),
    ("lease_until", "big"),
    ("not_before", "big"),
    ("reason", "text"),
    ("updated_at", "big"),
)
#: A journal template's messages: its group, msg_id, the member's attempt.
ITEM_COLS: Cols = (("g", "int"), ("msg_id", "id"), ("attempt", "int"))
#: A journal template's steps: its group, the step, the instant, whether the publisher's.
STEP_COLS: Cols = (
    ("g", "int"),
    ("actor", "name"),
    ("actor_kind", "state"),
    ("src", "state"),
    ("dst", "state"),
    ("detail", "text"),
    ("at", "big"),
    ("pub", "bool"),
)
#: A journal entry of a per-message change.
ENTRY_COLS: Cols = (
    ("msg_id", "id"),
    ("queue", "name"),
    ("actor", "name"),
    ("actor_kind", "state"),
    ("src", "state"),
    ("dst", "state"),
    ("at", "big"),
    ("attempt", "int"),
    ("detail", "text"),
)
_REF_COLS: Cols = (("msg_id", "id"), ("native_ref", "s1024"))
#: What a claim or settle made in place reads of a locked message, then of each member
#: (iqbridge.stores.sql_claim).
LOCK_HEAD = (
    "msg_id",
    "queue",
    "version",
    "publisher",
    "publisher_state",
    "withdrawn",
    "max_attempts",
    "native_ref",
    "updated_at",
    "expires_at",
    "lock_id",
    "priority",
    "seq",
)
LOCK_MEMBER = _MEMBER_COLS  # every member column, as a record reads them
_LOCK_HEAD: Cols = tuple((n, "") for n in LOCK_HEAD)
_LOCK_MEMBER: Cols = tuple((n, "") for n in LOCK_MEMBER)


def _rows(family: str, param: str, cols: Cols) -> str:
    """A row source of the JSON array of arrays bound to ``param``: one row per element,
    a column per position (named as ``cols`` say) and ``o``, the element's ordinal."""
    if family == "postgresql":
        out = []
        for i, (name, kind) in enumerate(cols):
            cast = _KINDS[kind][0]
            out.append(f"(e->>{i})::{cast} AS {name}" if cast else f"e->>{i} AS {name}")
        return (
            f"(SELECT {', '.join(out)}, x.o FROM jsonb_array_elements(CAST(:{param} AS jsonb))"
            f" WITH ORDINALITY AS x(e, o))"
        )
    out = ["o FOR ORDINALITY"]
    for i, (name, kind) in enumerate(cols):
        sql = _KINDS[kind][1]
        text = sql.startswith(("VARCHAR", "LONGTEXT"))
        out.append(f"`{name}` {sql}{' ' + _BIN if text else ''} PATH '$[{i}]'")
    return f"JSON_TABLE(:{param}, '$[*]' COLUMNS ({', '.join(out)}))"


def _names(cols: Cols, prefix: str = "") -> str:
    return ", ".join(prefix + n for n, _ in cols)


def _set(cols: Cols, target: str, source: str) -> str:
    return ", ".join(f"{target}{n} = {source}.{n}" for n, _ in cols)


_JOURNAL_COLS = "msg_id, queue, actor, actor_kind, src, dst, at, attempt, detail"


def _journal(family: str) -> str:
    """The templated journal: each group's messages joined to its steps, one row per
    message per step, in the order Writes.flat gives them."""
    return (
        f"INSERT INTO {{jr}} ({_JOURNAL_COLS})"
        " SELECT m.msg_id, :queue, s.actor, s.actor_kind, s.src, s.dst, s.at,"
        " CASE WHEN s.pub THEN 1 ELSE m.attempt END, s.detail"
        f" FROM {_rows(family, 'items', ITEM_COLS)} m"
        f" JOIN {_rows(family, 'steps', STEP_COLS)} s ON s.g = m.g ORDER BY m.o, s.o"
    )


def _journal_of(family: str, written: str) -> str:
    """The templated journal of the rows a data-modifying CTE ``written`` returned (by
    msg_id): PostgreSQL writes a batch's rows and their journal in one statement."""
    return (
        f"INSERT INTO {{jr}} ({_JOURNAL_COLS})"
        " SELECT i.msg_id, :queue, s.actor, s.actor_kind, s.src, s.dst, s.at,"
        " CASE WHEN s.pub THEN 1 ELSE i.attempt END, s.detail"
        f" FROM {_rows(family, 'items', ITEM_COLS)} i"
        f" JOIN {written} ON {written}.msg_id = i.msg_id"
        f" JOIN {_rows(family, 'steps', STEP_COLS)} s ON s.g = i.g ORDER BY i.o, s.o"
    )


def _entries(family: str) -> str:
    return (
        f"INSERT INTO {{jr}} ({_JOURNAL_COLS}) SELECT {_names(ENTRY_COLS, 'e.')}"
        f" FROM {_rows(family, 'doc', ENTRY_COLS)} e ORDER BY e.o"
    )


def _postgresql() -> dict[str, str]:
    fam = "postgresql"
    moved = _set(MOVE_COLS[2:], "", "v")
    members = _set(MOVED_MEMBER_COLS[2:], "", "w")
    return {
        # Ids as one JSON array, sorted, each looked up by the msg_id index and locked
        # in turn: the rows locked in msg_id order (as ORDER BY msg_id ... FOR UPDATE
        # elsewhere), and no table scan whatever the table's size or statistics.
        "lock": (
            "SELECT t.msg_id, t.version FROM (SELECT id FROM jsonb_array_elements_text("
            "CAST(:ids AS jsonb)) AS k(id) ORDER BY id) AS k CROSS JOIN LATERAL"
            " (SELECT msg_id, version FROM {msg} WHERE msg_id = k.id FOR UPDATE) AS t"
        ),
        # The same lock, reading the compact columns of each message (a claim or settle
        # made in place, iqbridge.stores.sql_claim) ...
        "lock_read": (
            f"SELECT {_names(_LOCK_HEAD, 't.')} FROM (SELECT id FROM"
            " jsonb_array_elements_text(CAST(:ids AS jsonb)) AS k(id) ORDER BY id) AS k"
            f" CROSS JOIN LATERAL (SELECT {_names(_LOCK_HEAD)} FROM {{msg}}"
            " WHERE msg_id = k.id FOR UPDATE) AS t"
        ),
        # ... then their member rows, by key, in a statement of its own: a read in the
        # statement that waited for the locks would see the members as they were when it
        # began (READ COMMITTED takes a snapshot per statement; only the locked rows are
        # read again), not what the transaction it waited for wrote.
        "member_read": (
            f"SELECT k.id, {_names(_LOCK_MEMBER, 'u.')} FROM"
            " jsonb_array_elements_text(CAST(:ids AS jsonb)) AS k(id) CROSS JOIN LATERAL"
            f" (SELECT {_names(_LOCK_MEMBER)}, position FROM {{mem}} WHERE msg_id = k.id)"
            " AS u ORDER BY k.id, u.position"
        ),
        # Messages, then their members, payload copies and journal joined to what was
        # inserted: a taken msg_id (ON CONFLICT) writes nothing at all.
        "create": (
            f"WITH v AS ({_rows(fam, 'doc', NEW_COLS)[1:-1]}),"
            f" ins AS (INSERT INTO {{msg}} ({_names(NEW_COLS)}) SELECT {_names(NEW_COLS)}"
            " FROM v ORDER BY o ON CONFLICT (msg_id) DO NOTHING"
            " RETURNING msg_id, seq, queue, priority),"
            " mem AS (INSERT INTO {mem} (msg_id, subscriber, position, queue, seq,"
            " neg_priority, pool, state, outcome, attempt, lease_token, lease_owner,"
            " lease_until, not_before, reason, updated_at)"
            " SELECT u.msg_id, u.subscriber, u.position, ins.queue, ins.seq, -ins.priority,"
            " u.pool, u.state, u.outcome, u.attempt, u.lease_token, u.lease_owner,"
            " u.lease_until, u.not_before, u.reason, u.updated_at"
            f" FROM {_rows(fam, 'members', MEMBER_COLS)} u JOIN ins ON ins.msg_id = u.msg_id),"
            " pl AS (INSERT INTO {pl} (msg_id, body, headers)"
            " SELECT p.msg_id, p.body, p.headers FROM unnest(CAST(:p_id AS VARCHAR[]),"
            " CAST(:p_body AS BYTEA[]), CAST(:p_headers AS TEXT[])) AS p(msg_id, body, headers)"
            " JOIN ins ON ins.msg_id = p.msg_id),"
            f" j AS ({_journal_of(fam, 'ins')})"
            " SELECT msg_id, seq FROM ins"
        ),
        # Message and member rows, and the journal of the moved, in one statement; the
        # version compared again. The msg_id = ANY(...) lets the planner reach the rows
        # by index.
        "move": (
            f"WITH v AS MATERIALIZED ({_rows(fam, 'doc', MOVE_COLS)[1:-1]}),"
            f" m AS (UPDATE {{msg}} t SET {moved} FROM v"
            " WHERE t.msg_id = ANY(ARRAY(SELECT msg_id FROM v)) AND t.msg_id = v.msg_id"
            " AND t.version = v.expected RETURNING t.msg_id),"
            f" w AS MATERIALIZED ({_rows(fam, 'members', MOVED_MEMBER_COLS)[1:-1]}),"
            f" u AS (UPDATE {{mem}} t SET {members} FROM w"
            " WHERE t.msg_id = ANY(ARRAY(SELECT msg_id FROM w)) AND t.msg_id = w.msg_id"
            " AND t.subscriber = w.subscriber),"
            f" j AS ({_journal_of(fam, 'm')})"
            " SELECT count(*) FROM m"
        ),
        "journal": _journal(fam),
        "entries": _entries(fam),
        "refs": (
            f"WITH r AS MATERIALIZED ({_rows(fam, 'doc', _REF_COLS)[1:-1]})"
            " UPDATE {msg} t SET native_ref = r.native_ref FROM r"
            " WHERE t.msg_id = ANY(ARRAY(SELECT msg_id FROM r)) AND t.msg_id = r.msg_id"
        ),
    }


def _mysql() -> dict[str, str]:
    fam = "mysql"
    return {
        "move": (
            f"UPDATE {{msg}} t JOIN {_rows(fam, 'doc', MOVE_COLS)} v"
            " ON t.msg_id = v.msg_id AND t.version = v.expected"
            f" SET {_set(MOVE_COLS[2:], 't.', 'v')}"
        ),
        "move_members": (
            f"UPDATE {{mem}} t JOIN {_rows(fam, 'members', MOVED_MEMBER_COLS)} w"
            " ON t.msg_id = w.msg_id AND t.subscriber = w.subscriber"
            f" SET {_set(MOVED_MEMBER_COLS[2:], 't.', 'w')}"
        ),
        # The journal is not written by INSERT ... SELECT here: InnoDB hands a bulk
        # insert of unknown size AUTO_INCREMENT values in growing chunks and drops the
        # unused ones, and readers take a gap in the journal's numbers for a commit still
        # to come (LateJournal). A multi-row INSERT ... VALUES gets consecutive numbers.
        # (Multi-row INSERT ... VALUES: the rows follow, as literals.)
        "journal_rows": f"INSERT INTO {{jr}} ({_JOURNAL_COLS}) VALUES ",
        "message_rows": f"INSERT INTO {{msg}} ({_names(NEW_COLS)}) VALUES ",
        "member_rows": (
            "INSERT INTO {mem} (msg_id, subscriber, `position`, queue, seq, neg_priority,"
            " pool, state, outcome, attempt, lease_token, lease_owner, lease_until,"
            " not_before, reason, updated_at) VALUES "
        ),
        "refs": (
            f"UPDATE {{msg}} t JOIN {_rows(fam, 'doc', _REF_COLS)} r ON t.msg_id = r.msg_id"
            " SET t.native_ref = r.native_ref"
        ),
    }


def statements(
    family: str, names: dict[str, str], version: tuple[int, ...], mariadb: bool = False
) -> dict[str, str]:
    """The batch statements of ``family`` (``postgresql`` or ``mysql``; none for other
    dialects, which use ``executemany``) on a server of ``version``, the table names
    filled in.

    PostgreSQL before 12 has no ``MATERIALIZED`` (its CTEs always are). ``JSON_TABLE``
    statements are made for MariaDB 10.6 or later only (MySQL's column syntax differs,
    and is not tested here): elsewhere moves go by ``executemany``, and new rows and the
    journal still by multi-row ``INSERT ... VALUES``."""
    if family == "postgresql":
        made = _postgresql()
        if version < (12,):
            made = {k: v.replace(" AS MATERIALIZED (", " AS (") for k, v in made.items()}
    elif family == "mysql":
        made = _mysql()
        if not mariadb or version < (10, 6):
            made = {k: v for k, v in made.items() if k.endswith("_rows")}
    else:
        made = {}
    return {k: v.format(**names) for k, v in made.items()}
