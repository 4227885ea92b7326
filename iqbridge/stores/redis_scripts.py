"""The script plumbing of the Redis index store (:mod:`iqbridge.stores.redis`): the Lua
scripts it loads from ``stores/lua/``, :class:`DirectScripts` (runs a script on a
connection each thread keeps, for the hot paths) and the RESP packer it sends them with
(:func:`_pack`). The Redis Streams adapter runs its receive script through
:class:`DirectScripts` too."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

__all__ = ["DirectScripts", "lua_fragment"]

_SCRIPTS = (
    "commit",
    "writes",
    "put",
    "settle",
    "claim",
    "available",
    "history",
    "page",
    "purge",
    "native_ref",
)


#: Lua code several scripts include, each at a line ``{<name>}``: JSON helpers and a
#: member row's encoding (settle.lua, claim_member.lua), the claim of one message for a
#: subscriber (the Redis Streams receive script and claim.lua).
_FRAGMENTS = ("claim_member", "member_row")


def lua_fragment(name: str) -> str:
    """The Lua code of ``stores/lua/<name>.lua`` with the fragments it includes spliced
    in (a script, or a fragment such as ``claim_member`` for a script to splice in)."""
    text = (
        resources.files("iqbridge.stores")
        .joinpath("lua")
        .joinpath(f"{name}.lua")
        .read_text("utf-8")
    )
    for fragment in _FRAGMENTS:
        if f"{{{fragment}}}" in text:
            text = text.replace(f"{{{fragment}}}", lua_fragment(fragment))
    return text


class _Held:
    """A thread's own connection, released to the pool when the thread is gone."""

    __slots__ = ("__weakref__", "conn", "forks")

    def __init__(self, conn: Any, forks: int) -> None:
        self.conn, self.forks = conn, forks


#: How many forks this process descends from: a connection taken before a fork belongs
#: to the parent. Counted at fork time, so a call needs no getpid() system call.
_forks = [0]


def _forked() -> None:
    _forks[0] += 1


os.register_at_fork(after_in_child=_forked)


class DirectScripts:
    """Runs Lua scripts on a connection each thread takes from the client's pool once.

    ``client.evalsha`` takes a connection from the pool and gives it back on every call:
    a lock, a process-id check, a poll of the socket and a few events, about 30 µs of
    CPU a call on the CI machine, a quarter of a loopback round trip. The hot path (the
    index's commit script, the adapter's receive script) runs often enough to skip that.
    Nothing else changes: the same connection settings, health checks and errors
    (a broken connection is closed by redis-py and reconnects on the next call); a
    script the server lost (a restart) is loaded again. A thread's connection goes back
    to the pool when the thread ends, a forked child takes new ones, and closing the
    client closes them all.
    """

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._local = threading.local()

    def _connection(self) -> Any:
        held: _Held | None = getattr(self._local, "held", None)
        if held is None or held.forks != _forks[0]:
            conn = self._pool.get_connection()
            held = _Held(conn, _forks[0])
            weakref.finalize(held, self._pool.release, conn)
            self._local.held = held
        return held.conn

    def run(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """``EVALSHA`` the script with its keys and arguments; the parsed reply."""
        conn = self._connection()
        command = [_pack(["EVALSHA", script.sha, len(keys), *keys, *args])]
        try:
            conn.send_packed_command(command)
            return conn.read_response()
        except NoScriptError:
            conn.send_command("SCRIPT", "LOAD", script.script)
            conn.read_response()
            conn.send_packed_command(command)
            return conn.read_response()


def _pack(args: Sequence[str | bytes | int]) -> bytes:
    """A command in the Redis protocol (RESP): what redis-py's pure-Python packer makes
    of str (UTF-8), bytes and int arguments, in a fifth of the time for the scripts'
    few dozen arguments.

    Text is joined as str and encoded once (an ASCII argument's length in bytes is its
    length in characters); a bytes argument (a payload) ends the text run before it.
    """
    text = [f"*{len(args)}\r\n"]
    done: list[bytes] | None = None
    for arg in args:
        if type(arg) is str:
            size = len(arg) if arg.isascii() else len(arg.encode())
            text.append(f"${size}\r\n{arg}\r\n")
        elif type(arg) is int:
            digits = str(arg)
            text.append(f"${len(digits)}\r\n{digits}\r\n")
        else:
            data = _bulk(arg)
            if done is None:
                done = []
            done.append("".join(text).encode())
            text = []
            done.append(b"$%d\r\n%b\r\n" % (len(data), data))
    if done is None:
        return "".join(text).encode()
    done.append("".join(text).encode())
    return b"".join(done)


def _bulk(arg: object) -> bytes:
    """A bytes argument, or a subclass of str, bytes or int, as the bytes redis-py sends."""
    if isinstance(arg, bytes):
        return bytes(arg)
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, int) and not isinstance(arg, bool):
        return b"%d" % arg
    raise TypeError(f"a script argument must be str, bytes or int, not {arg!r}")
