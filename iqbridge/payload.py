"""Payload encoding: bytes, str, or JSON-serialisable values, each with a content type.

Never pickle: a payload is either raw bytes (``application/octet-stream``), UTF-8 text
(``text/plain; charset=utf-8``) or JSON (``application/json``). Decoding a JSON payload
that is not valid JSON raises :class:`~iqbridge.errors.PayloadError`.
"""

from __future__ import annotations

import json
from typing import Any

from iqbridge.errors import PayloadError

__all__ = ["BINARY", "JSON", "TEXT", "decode", "encode"]

BINARY = "application/octet-stream"
TEXT = "text/plain; charset=utf-8"
JSON = "application/json"


def encode(payload: object, content_type: str | None = None) -> tuple[bytes, str]:
    """Bytes and content type for a payload.

    ``content_type`` overrides the guess for bytes and str payloads (say, bytes that are
    already JSON); for other values it must be JSON's.
    """
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload), content_type or BINARY
    if isinstance(payload, str):
        return payload.encode("utf-8"), content_type or TEXT
    if content_type not in (None, JSON):
        raise PayloadError(
            f"a {type(payload).__name__} payload can only be sent as {JSON}, not "
            f"{content_type!r}; pass bytes or str for other content types"
        )
    try:
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"payload of type {type(payload).__name__} is not JSON-serialisable ({exc}); "
            f"send bytes, str, or JSON values (dict, list, str, int, float, bool, None)"
        ) from None
    return body.encode("utf-8"), JSON


def decode(body: bytes, content_type: str) -> Any:
    """The payload value of stored bytes, by content type."""
    base = content_type.split(";", 1)[0].strip().lower()
    if base == JSON or base.endswith("+json"):
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PayloadError(f"payload is not valid JSON ({exc})") from None
    if base.startswith("text/"):
        charset = "utf-8"
        for part in content_type.split(";")[1:]:
            key, _, value = part.strip().partition("=")
            if key.lower() == "charset" and value:
                charset = value.strip('"')
        try:
            return body.decode(charset)
        except (UnicodeDecodeError, LookupError) as exc:
            raise PayloadError(f"payload is not valid {charset} text ({exc})") from None
    return body
