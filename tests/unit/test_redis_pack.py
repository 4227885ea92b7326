"""The Redis index's own command packer writes what redis-py writes (no server needed)."""

from __future__ import annotations

import enum

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from iqbridge.stores.redis import _pack

ARG = st.one_of(
    st.text(),
    st.binary(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
)


@given(st.lists(ARG, max_size=40))
def test_the_same_bytes_as_redis_py(args: list[str | bytes | int]) -> None:
    # The command name first (redis-py splits a first argument with spaces in it).
    command: list[str | bytes | int] = ["EVALSHA", *args]
    conn = redis.Connection()  # never connected: only its packer is used
    assert _pack(command) == b"".join(conn.pack_command(*command))


def test_a_large_payload_and_protocol_bytes_inside_arguments() -> None:
    args: list[str | bytes | int] = ["XADD", "k", "*", "payload", b"\r\n$3\r\n" * 100_000, "é"]
    assert _pack(args) == b"".join(redis.Connection().pack_command(*args))


@pytest.mark.parametrize("bad", [True, 1.5, None])
def test_other_types_are_refused(bad: object) -> None:
    with pytest.raises(TypeError, match="script argument"):
        _pack(["EVALSHA", bad])  # type: ignore[list-item]


class _Text(enum.StrEnum):
    A = "état"


class _Number(enum.IntEnum):
    N = 7


def test_subclasses_are_sent_as_their_plain_values() -> None:
    """An enum member that is a str goes out as its value, as with redis-py; one that is
    an int as its digits (redis-py would send its repr, ``<_Number.N: 7>``)."""
    args: list[str | bytes | int] = ["EVALSHA", _Text.A, b"b", "x"]
    assert _pack(args) == b"".join(redis.Connection().pack_command(*args))
    assert _pack(["EVALSHA", _Text.A, _Number.N, b"b"]) == (
        b"*4\r\n$7\r\nEVALSHA\r\n$5\r\n\xc3\xa9tat\r\n$1\r\n7\r\n$1\r\nb\r\n"
    )
