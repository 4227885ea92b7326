"""The DB-API surface of the fake python-oracledb (:mod:`iqbridge.testing.fakes.oracledb`):
its exceptions, type objects, ``makedsn`` and bind/fetch variables (``Cursor.var``).

Written from python-oracledb's documentation (``exceptions``, ``DbType``, ``ApiType``,
``Var``, ``makedsn``) with the real names, so SQLAlchemy's Oracle dialect finds what it
looks up on the module. :mod:`iqbridge.testing.fakes.oracledb` re-exports every name.
"""

from __future__ import annotations

import datetime
import decimal
import re
from collections.abc import Callable
from typing import Any

__all__ = [
    "BINARY", "BLOB", "BOOLEAN", "CLOB", "CURSOR", "DATETIME", "DB_TYPE_BINARY_DOUBLE",
    "DB_TYPE_BINARY_FLOAT", "DB_TYPE_BINARY_INTEGER", "DB_TYPE_BLOB", "DB_TYPE_BOOLEAN",
    "DB_TYPE_CHAR", "DB_TYPE_CLOB", "DB_TYPE_CURSOR", "DB_TYPE_DATE", "DB_TYPE_INTERVAL_DS",
    "DB_TYPE_JSON", "DB_TYPE_LONG", "DB_TYPE_LONG_NVARCHAR", "DB_TYPE_LONG_RAW",
    "DB_TYPE_NCHAR", "DB_TYPE_NCLOB", "DB_TYPE_NUMBER", "DB_TYPE_NVARCHAR", "DB_TYPE_RAW",
    "DB_TYPE_ROWID", "DB_TYPE_TIMESTAMP", "DB_TYPE_TIMESTAMP_LTZ", "DB_TYPE_TIMESTAMP_TZ",
    "DB_TYPE_VARCHAR", "DB_TYPE_VECTOR", "FIXED_CHAR", "FIXED_NCHAR", "INTERVAL", "LOB",
    "LONG_BINARY", "LONG_STRING", "NATIVE_FLOAT", "NATIVE_INT", "NCHAR", "NCLOB", "NUMBER",
    "ROWID", "STRING", "TIMESTAMP", "ApiType", "Binary", "DataError", "DatabaseError", "Date",
    "DbType", "Error", "IntegrityError", "InterfaceError", "InternalError", "Lob",
    "NotSupportedError", "OperationalError", "ProgrammingError", "Timestamp", "Var",
    "Warning", "apilevel", "is_thin_mode", "makedsn", "paramstyle", "threadsafety",
]  # fmt: skip

apilevel = "2.0"
threadsafety = 2
paramstyle = "named"


# --- exceptions, as python-oracledb's exceptions module ---------------------------------


class Warning(Exception):
    """A warning the database gave (DB-API)."""


class Error(Exception):
    """Root of the driver's exceptions."""


class InterfaceError(Error):
    """A misuse of the interface: a call on a closed connection."""


class DatabaseError(Error):
    """An error the database (or the driver talking to it) reported."""


class DataError(DatabaseError):
    """A value the database could not take."""


class OperationalError(DatabaseError):
    """The connection failed or broke."""


class IntegrityError(DatabaseError):
    """A constraint was violated (ORA-00001, ORA-01400, ...)."""


class InternalError(DatabaseError):
    """The database's internal error."""


class ProgrammingError(DatabaseError):
    """A misuse of the API."""


class NotSupportedError(DatabaseError):
    """Something the driver (in this mode) does not do."""


class _Error:
    """The object in ``exc.args[0]``: ``code``, ``full_code``, ``message`` as the driver's."""

    def __init__(self, message: str, code: int = 0) -> None:
        self.message = message
        self.code = code
        self.offset = 0
        self.context: str | None = None
        self.isrecoverable = False
        self.iswarning = False
        self.is_session_dead = False
        pos = message.find(":")
        self.full_code = message[:pos] if pos > 0 else ""

    def __str__(self) -> str:
        return self.message


def _ora(code: int, text: str, cls: type[DatabaseError] = DatabaseError) -> DatabaseError:
    return cls(_Error(f"ORA-{code:05d}: {text}", code))


# --- types, as python-oracledb's DbType and ApiType -------------------------------------


class DbType:
    """A database type (``oracledb.DB_TYPE_*``): compared by identity."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<DbType {self.name}>"


class ApiType:
    """A DB-API type group (``STRING``, ``NUMBER`` ...): equal to each of its DbTypes."""

    def __init__(self, name: str, *members: DbType) -> None:
        self.name = name
        self.members = members

    def __eq__(self, other: object) -> bool:
        return other is self or any(other is m for m in self.members)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"<ApiType {self.name}>"


DB_TYPE_BINARY_DOUBLE = DbType("DB_TYPE_BINARY_DOUBLE")
DB_TYPE_BINARY_FLOAT = DbType("DB_TYPE_BINARY_FLOAT")
DB_TYPE_BINARY_INTEGER = DbType("DB_TYPE_BINARY_INTEGER")
DB_TYPE_BLOB = DbType("DB_TYPE_BLOB")
DB_TYPE_BOOLEAN = DbType("DB_TYPE_BOOLEAN")
DB_TYPE_CHAR = DbType("DB_TYPE_CHAR")
DB_TYPE_CLOB = DbType("DB_TYPE_CLOB")
DB_TYPE_CURSOR = DbType("DB_TYPE_CURSOR")
DB_TYPE_DATE = DbType("DB_TYPE_DATE")
DB_TYPE_INTERVAL_DS = DbType("DB_TYPE_INTERVAL_DS")
DB_TYPE_JSON = DbType("DB_TYPE_JSON")
DB_TYPE_LONG = DbType("DB_TYPE_LONG")
DB_TYPE_LONG_NVARCHAR = DbType("DB_TYPE_LONG_NVARCHAR")
DB_TYPE_LONG_RAW = DbType("DB_TYPE_LONG_RAW")
DB_TYPE_NCHAR = DbType("DB_TYPE_NCHAR")
DB_TYPE_NCLOB = DbType("DB_TYPE_NCLOB")
DB_TYPE_NUMBER = DbType("DB_TYPE_NUMBER")
DB_TYPE_NVARCHAR = DbType("DB_TYPE_NVARCHAR")
DB_TYPE_RAW = DbType("DB_TYPE_RAW")
DB_TYPE_ROWID = DbType("DB_TYPE_ROWID")
DB_TYPE_TIMESTAMP = DbType("DB_TYPE_TIMESTAMP")
DB_TYPE_TIMESTAMP_LTZ = DbType("DB_TYPE_TIMESTAMP_LTZ")
DB_TYPE_TIMESTAMP_TZ = DbType("DB_TYPE_TIMESTAMP_TZ")
DB_TYPE_VARCHAR = DbType("DB_TYPE_VARCHAR")
DB_TYPE_VECTOR = DbType("DB_TYPE_VECTOR")

BINARY = ApiType("BINARY", DB_TYPE_RAW, DB_TYPE_LONG_RAW)
DATETIME = ApiType(
    "DATETIME", DB_TYPE_DATE, DB_TYPE_TIMESTAMP, DB_TYPE_TIMESTAMP_LTZ, DB_TYPE_TIMESTAMP_TZ
)
NUMBER = ApiType(
    "NUMBER", DB_TYPE_NUMBER, DB_TYPE_BINARY_DOUBLE, DB_TYPE_BINARY_FLOAT, DB_TYPE_BINARY_INTEGER
)
ROWID = ApiType("ROWID", DB_TYPE_ROWID)
STRING = ApiType(
    "STRING", DB_TYPE_VARCHAR, DB_TYPE_NVARCHAR, DB_TYPE_CHAR, DB_TYPE_NCHAR, DB_TYPE_LONG
)
# The legacy (cx_Oracle) names.
BLOB, CLOB, NCLOB, LOB = DB_TYPE_BLOB, DB_TYPE_CLOB, DB_TYPE_NCLOB, DB_TYPE_BLOB
BOOLEAN, CURSOR, INTERVAL = DB_TYPE_BOOLEAN, DB_TYPE_CURSOR, DB_TYPE_INTERVAL_DS
FIXED_CHAR, FIXED_NCHAR, NCHAR = DB_TYPE_CHAR, DB_TYPE_NCHAR, DB_TYPE_NVARCHAR
LONG_BINARY, LONG_STRING = DB_TYPE_LONG_RAW, DB_TYPE_LONG
NATIVE_FLOAT, NATIVE_INT = DB_TYPE_BINARY_DOUBLE, DB_TYPE_BINARY_INTEGER
TIMESTAMP = DB_TYPE_TIMESTAMP

Binary = bytes
Date = datetime.date
Timestamp = datetime.datetime

_TEXT = (DB_TYPE_VARCHAR, DB_TYPE_NVARCHAR, DB_TYPE_CHAR, DB_TYPE_NCHAR, DB_TYPE_LONG)
_LOBS = (DB_TYPE_CLOB, DB_TYPE_NCLOB, DB_TYPE_BLOB)


def is_thin_mode() -> bool:
    """The fake is always in thin mode."""
    return True


def makedsn(
    host: str,
    port: int,
    sid: str | None = None,
    service_name: str | None = None,
    **_: Any,
) -> str:
    """A connect descriptor, as ``oracledb.makedsn`` builds it."""
    data = f"(SERVICE_NAME={service_name})" if service_name else f"(SID={sid})"
    return f"(DESCRIPTION=(ADDRESS=(PROTOCOL=tcp)(HOST={host})(PORT={port}))(CONNECT_DATA={data}))"


_EASY = re.compile(r"^(?P<host>[^:/()]+)(?::(?P<port>\d+))?/(?P<service>[\w.$#-]+)$")
_DESC = re.compile(
    r"^\(DESCRIPTION=\(ADDRESS=\(PROTOCOL=tcp\)\(HOST=(?P<host>[^)]+)\)\(PORT=(?P<port>\d+)\)\)"
    r"\(CONNECT_DATA=\((?P<kind>SERVICE_NAME|SID)=(?P<service>[^)]+)\)\)\)$",
    re.I,
)


def parse_dsn(dsn: str) -> tuple[str, int, str] | None:
    """``(host, port, service)`` of an easy-connect string ``host:port/service`` or of a
    descriptor :func:`makedsn` built; None if it is neither. A descriptor naming a SID
    fails with ORA-12505 (the fake's database has services only, as a PDB has)."""
    match = _EASY.match(dsn) or _DESC.match(dsn)
    if match is None:
        return None
    if "kind" in match.groupdict() and match["kind"].upper() == "SID":
        raise _ora(12505, f"Cannot connect to database. SID {match['service']} is not registered")
    return match["host"].lower(), int(match["port"] or 1521), match["service"]


# --- variables, as oracledb.Var ---------------------------------------------------------


class Lob:
    """A LOB value (``oracledb.LOB``), as an out variable of a LOB type receives it."""

    def __init__(self, value: str | bytes) -> None:
        self._value = value

    def read(self, offset: int = 1, amount: int | None = None) -> str | bytes:
        """The content (``offset`` counts from 1, as Oracle's)."""
        end = None if amount is None else offset - 1 + amount
        return self._value[offset - 1 : end]

    def size(self) -> int:
        """Length in characters or bytes."""
        return len(self._value)


class Var:
    """A bind or fetch variable (``Cursor.var``): ``getvalue``/``setvalue``; as an out
    bind of ``RETURNING ... INTO`` each position holds the list of returned values."""

    def __init__(
        self,
        typ: Any,
        size: int = 0,
        arraysize: int = 1,
        inconverter: Callable[[Any], Any] | None = None,
        outconverter: Callable[[Any], Any] | None = None,
        typename: str | None = None,
        encoding_errors: str | None = None,
        bypass_decode: bool = False,
        convert_nulls: bool = False,
        **_: Any,
    ) -> None:
        self.type = typ
        self.size = size
        self.num_elements = max(int(arraysize), 1)
        self.inconverter = inconverter
        self.outconverter = outconverter
        self.convert_nulls = convert_nulls
        self.values: list[Any] = [None] * self.num_elements

    def getvalue(self, pos: int = 0) -> Any:
        """The value at ``pos``."""
        return self.values[pos]

    def setvalue(self, pos: int, value: Any) -> None:
        """Set the value at ``pos`` (the inconverter, if any, applies)."""
        if pos >= len(self.values):
            self.values.extend([None] * (pos + 1 - len(self.values)))
        self.values[pos] = self.inconverter(value) if self.inconverter else value

    def convert(self, value: Any) -> Any:
        """A fetched value as this variable's type gives it, then its outconverter."""
        if value is not None:
            value = _as_type(self.type, value)
        if self.outconverter is not None and (value is not None or self.convert_nulls):
            value = self.outconverter(value)
        return value


def number_text(value: int | float) -> str:
    """A number as Oracle's TO_CHAR writes it (``1``, ``1.5``, ``-0.25``)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _as_type(typ: Any, value: Any) -> Any:
    if typ is str or any(typ is t for t in _TEXT) or typ == STRING:
        return number_text(value) if isinstance(value, int | float) else str(value)
    if typ is decimal.Decimal:
        return decimal.Decimal(str(value))
    if typ is int or typ is DB_TYPE_BINARY_INTEGER:
        return int(value)
    if typ is float or typ is DB_TYPE_BINARY_DOUBLE or typ is DB_TYPE_BINARY_FLOAT:
        return float(value)
    if typ is bytes or typ is DB_TYPE_RAW:
        return bytes(value)
    if any(typ is t for t in _LOBS):
        return Lob(value)
    return value
