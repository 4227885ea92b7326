"""Message ids: facade-wide unique, time-sortable (UUIDv7), never reused.

Messages adopted from a broker (put there by a client that knows nothing of iqbridge)
get a deterministic id derived from the broker, queue and native id (UUIDv5), so that
every process that sees the same entry derives the same msg_id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import uuid_utils

__all__ = ["LeaseTokens", "adopted_id", "new_id", "new_token"]

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


class LeaseTokens(Sequence[str]):
    """``n`` lease tokens for one batch claim, each made when asked for (a get of up to
    500 that finds 3 makes 3): a random prefix of this claim's, then the position. As
    unguessable as :func:`new_token`'s across claims; unique within one."""

    __slots__ = ("_base", "_n")

    def __init__(self, n: int) -> None:
        self._n = n
        self._base = new_token()[:24]

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...

    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return f"{self._base}{i:08x}"
