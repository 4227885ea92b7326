"""Message ids: facade-wide unique, time-sortable (UUIDv7), never reused.

Messages adopted from a broker (put there by a client that knows nothing of iqbridge)
get a deterministic id derived from the broker, queue and native id (UUIDv5), so that
every process that sees the same entry derives the same msg_id.
"""

from __future__ import annotations

import uuid_utils

__all__ = ["adopted_id", "new_id", "new_token"]

_ADOPT_NAMESPACE = uuid_utils.UUID("6f2b6f8e-4b0c-4c2a-9a55-1b0c1e1f0a01")


def new_id() -> str:
    """A new time-sortable message id (UUIDv7, canonical text form)."""
    return str(uuid_utils.uuid7())


def new_token() -> str:
    """An opaque random token (leases, locks, confirm ids)."""
    return uuid_utils.uuid4().hex


def adopted_id(broker: str, queue: str, native_id: str) -> str:
    """The stable msg_id of a message iqbridge did not put itself."""
    return str(uuid_utils.uuid5(_ADOPT_NAMESPACE, f"{broker}\x00{queue}\x00{native_id}"))
