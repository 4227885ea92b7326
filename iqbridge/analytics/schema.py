"""The layout of an exported journal: one directory, two Parquet datasets and the
exporter's own state, all of it readable by Spark, DuckDB or pyarrow alike::

    DIR/journal/date=YYYY-MM-DD/queue=<name>/part-<store id>-<first seq>-<last seq>.parquet
    DIR/messages/date=YYYY-MM-DD/queue=<name>/part-<store id>-<first seq>-<last seq>.parquet
    DIR/_iqexport/<store id>.json            the store's watermark (see export.py)
    DIR/_iqexport/staging/<store id>/...     a page written but not yet committed

Spark and DuckDB skip names starting with ``_`` when they discover partitions, so the
exporter's state never reads as data. ``date`` is the UTC day of the transition
(``journal``) or of the put (``messages``). Queue names are escaped in directory names
the way Hive and Spark escape partition values (``%2F`` for ``/``), so a queue called
``orders/eu`` reads back as itself.

``journal`` holds one row per transition, exactly once; ``messages`` holds one row per
message, written when its creation is exported, with the fields the journal does not
carry (parents for lineage, priority, correlation id) and, where the store keeps a copy
of the payload, the payload itself (for the retention archive).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - only for the type checker
    import pyarrow as pa

__all__ = [
    "IN_DOUBT",
    "JOURNAL",
    "MESSAGES",
    "STATE_DIR",
    "SUBSCRIBER_STATES",
    "TERMINAL",
    "escape_partition",
    "journal_schema",
    "messages_schema",
    "unescape_partition",
]

#: Subdirectory names under the export root.
JOURNAL = "journal"
MESSAGES = "messages"
STATE_DIR = "_iqexport"

#: Subscriber states in their state-machine order (used for columns and reports).
SUBSCRIBER_STATES = (
    "AVAILABLE",
    "GET",
    "FETCHED",
    "IN_PROCESS",
    "DONE",
    "UNUSABLE",
    "EXPIRED",
    "JOURNALLED",
)
#: A subscriber that reached one of these is finished with the message.
TERMINAL = ("DONE", "UNUSABLE", "EXPIRED", "JOURNALLED")
#: A subscriber in one of these holds the message (in doubt once its lease lapses).
IN_DOUBT = ("GET", "FETCHED", "IN_PROCESS")

# Characters Hive (and so Spark) escapes in partition directory names.
_ESCAPED = frozenset("\"#%'*/:=?\\\x7f{[]^") | frozenset(chr(c) for c in range(0x20))


def escape_partition(value: str) -> str:
    """A partition value as a directory-name component, escaped as Spark unescapes it."""
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPED else ch for ch in value)


def unescape_partition(value: str) -> str:
    """The inverse of :func:`escape_partition`."""
    out: list[str] = []
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "%" and _is_hex(value[i + 1 : i + 3]):
            out.append(chr(int(value[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _is_hex(text: str) -> bool:
    return len(text) == 2 and all(c in "0123456789abcdefABCDEF" for c in text)


def journal_schema() -> pa.Schema:
    """The columns of a journal file (``date`` and ``queue`` are its partition keys)."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("store", pa.string(), nullable=False),
            pa.field("seq", pa.int64(), nullable=False),
            pa.field("msg_id", pa.string(), nullable=False),
            pa.field("actor", pa.string(), nullable=False),
            pa.field("actor_kind", pa.string(), nullable=False),
            pa.field("src", pa.string()),
            pa.field("dst", pa.string(), nullable=False),
            pa.field("at", pa.timestamp("us", tz="UTC"), nullable=False),
            pa.field("attempt", pa.int32(), nullable=False),
            pa.field("detail", pa.string()),
        ]
    )


def messages_schema() -> pa.Schema:
    """The columns of a messages file (``date`` and ``queue`` are its partition keys)."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("store", pa.string(), nullable=False),
            pa.field("seq", pa.int64(), nullable=False),
            pa.field("msg_id", pa.string(), nullable=False),
            pa.field("publisher", pa.string(), nullable=False),
            pa.field("ordering_key", pa.string(), nullable=False),
            pa.field("correlation_id", pa.string()),
            pa.field("priority", pa.int32(), nullable=False),
            pa.field("mode", pa.string(), nullable=False),
            pa.field("parents", pa.list_(pa.string()), nullable=False),
            pa.field("put_at", pa.timestamp("us", tz="UTC"), nullable=False),
            pa.field("content_type", pa.string(), nullable=False),
            pa.field("size", pa.int64(), nullable=False),
            pa.field("native_ref", pa.string()),
            pa.field("payload", pa.binary()),
            pa.field("headers", pa.string()),
        ]
    )
