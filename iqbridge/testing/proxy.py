"""A TCP proxy that breaks connections on demand, for tests of what a client does when
its connection to a broker is lost in the middle of a call.

Put it between a client and the real server and connect the client to the proxy
(:meth:`FaultProxy.url` rewrites a URL's host and port)::

    from iqbridge.testing.proxy import FaultProxy

    with FaultProxy("127.0.0.1", 5672) as proxy:
        hub = iqbridge.connect(proxy.url("amqp://guest:guest@127.0.0.1:5672/%2F"))
        proxy.reset_every(1.0, 3.0)      # a reset every 1-3 s, until stop_resets()
        proxy.reset()                    # every open connection, now
        proxy.cut_after(50_000)          # mid-request: 50,000 more bytes, then gone
        proxy.arm(b"XREADGROUP")         # the next request holding these bytes gets
                                         # through, its reply never comes back

A connection is broken the way a network fault breaks it: both sides get a TCP reset
(``SO_LINGER`` 0, then close), so the client sees ``ECONNRESET`` and the server drops
the session at once (no orderly close, no goodbye). What a broken connection had sent
before is not taken back: a request the server received is carried out whether or not
its reply came back, which is what leaves a client in doubt.

:meth:`~FaultProxy.cut_after` and :meth:`~FaultProxy.arm` lose a reply: the request
gets through, then the connection is reset as soon as the server answers (the client
never reads the answer), or after ``hold`` seconds when no answer comes (a request cut
in the middle of a frame gets none). ``arm(..., lose="request")`` resets the connection
instead of passing the request on.

One asyncio loop on a thread of its own serves every connection; the methods are called
from any other thread. Shipped in :mod:`iqbridge.testing` with the pytest plugin: an
application's own integration tests use it to check that their handlers ride out a lost
connection to the broker, as iqbridge's own tests do.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

__all__ = ["FaultProxy"]

T = TypeVar("T")

#: SO_LINGER on, zero seconds: close() sends a reset and drops what is unsent.
_RESET = struct.pack("ii", 1, 0)


@dataclass(slots=True)
class _Rule:
    """A cut armed for the next request that matches."""

    left: int | None
    marker: tuple[bytes, ...]
    lose: str
    hold: float
    #: The server's answers still reach the client until the reset (cut_after).
    replies: bool = False


@dataclass(eq=False, slots=True)
class _Pair:
    """One proxied connection: the client's side and the server's side."""

    client: asyncio.Transport
    server: asyncio.Transport | None = None
    #: A cut is under way: nothing more of the client's reaches the server.
    muted: bool = False
    #: ... and the server's next answer is not passed on but resets the connection.
    doomed: bool = False
    cutting: bool = False
    timer: asyncio.TimerHandle | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class _ClientSide(asyncio.Protocol):
    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.pair: _Pair | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # until the server's side is open
        self.pair = _Pair(transport)
        self.proxy._opened(self.pair)

    def data_received(self, data: bytes) -> None:
        if self.pair is not None:
            self.proxy._from_client(self.pair, data)

    def eof_received(self) -> bool:
        if self.pair is not None:
            self.proxy._close(self.pair)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.pair is not None:
            self.proxy._close(self.pair)

    def pause_writing(self) -> None:
        if self.pair is not None and self.pair.server is not None:
            self.pair.server.pause_reading()

    def resume_writing(self) -> None:
        if self.pair is not None and self.pair.server is not None:
            self.pair.server.resume_reading()


class _ServerSide(asyncio.Protocol):
    def __init__(self, proxy: FaultProxy, pair: _Pair) -> None:
        self.proxy = proxy
        self.pair = pair

    def data_received(self, data: bytes) -> None:
        self.proxy._from_server(self.pair, data)

    def eof_received(self) -> bool:
        self.proxy._close(self.pair)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy._close(self.pair)

    def pause_writing(self) -> None:
        self.pair.client.pause_reading()

    def resume_writing(self) -> None:
        self.pair.client.resume_reading()


class FaultProxy:
    """A TCP proxy on a free loopback port to ``host:port`` that resets connections on
    demand, on a schedule, or in the middle of a request (see the module's text)."""

    def __init__(self, host: str, port: int, *, listen: str = "127.0.0.1") -> None:
        self.target = (host, port)
        #: Connections broken so far (resets, cuts).
        self.cuts = 0
        #: Bytes passed on from clients to the server so far (to aim a cut_after).
        self.client_bytes = 0
        #: Run once, then cleared, when an armed cut fires: after the request got
        #: through and before the connection is reset (on a thread of its own, so it may
        #: block; it must not wait for a connection through this proxy).
        self.on_cut: Callable[[], None] | None = None
        self._pairs: set[_Pair] = set()
        self._rule: _Rule | None = None
        self._schedule: asyncio.Task[None] | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"fault-proxy-{port}", daemon=True
        )
        self._thread.start()
        try:
            self._server = self._run(self._loop.create_server(lambda: _ClientSide(self), listen, 0))
        except BaseException:
            self._stop_loop()
            raise
        self.host = listen
        self.port: int = self._server.sockets[0].getsockname()[1]

    # --- for tests --------------------------------------------------------------------

    @property
    def address(self) -> str:
        """The proxy's ``host:port``."""
        return f"{self.host}:{self.port}"

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's (user, password, path
        and query kept)."""
        parts = urlsplit(url)
        userinfo, at, _ = parts.netloc.rpartition("@")
        return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{self.address}"))

    @property
    def connections(self) -> int:
        """How many connections are open through the proxy now."""
        return self._call(lambda: len(self._pairs))

    def reset(self) -> int:
        """Reset every open connection now; return how many."""
        return self._call(self._reset_all)

    def reset_every(self, low: float, high: float | None = None, *, seed: int = 0) -> None:
        """Reset every open connection every ``low`` to ``high`` seconds (uniformly at
        random, from ``seed``) until :meth:`stop_resets` or :meth:`close`."""
        rng = random.Random(seed)
        top = low if high is None else high
        if not 0 < low <= top:
            raise ValueError(f"reset_every needs 0 < low <= high, got {low}, {high}")

        async def resets() -> None:
            while True:
                await asyncio.sleep(rng.uniform(low, top))
                self._reset_all()

        def start() -> None:
            self._cancel_schedule()
            self._schedule = self._loop.create_task(resets())

        self._call(start)

    def stop_resets(self) -> None:
        """Stop the schedule of :meth:`reset_every`."""
        self._call(self._cancel_schedule)

    def cut_after(self, nbytes: int, *, hold: float = 0.5, replies: bool = False) -> None:
        """Let ``nbytes`` more bytes from clients through (on any connection), then cut
        the connection that sent the last of them: nothing more of it reaches the server,
        and it is reset when the server next answers (that answer is lost) or after
        ``hold`` seconds. With ``replies`` the server's answers to what got through still
        reach the client, for ``hold`` seconds, and then the connection is reset."""
        if nbytes < 1:
            raise ValueError(f"cut_after needs at least 1 byte, got {nbytes}")
        self._call(lambda: self._set_rule(_Rule(nbytes, (), "reply", hold, replies)))

    def arm(self, *marker: bytes, lose: str = "reply", hold: float = 0.5) -> None:
        """Cut the connection of the next client chunk that holds every byte string of
        ``marker``: ``lose="reply"`` passes it on and resets the connection when the
        server answers (or after ``hold`` seconds); ``lose="request"`` resets it without
        passing the chunk on."""
        if lose not in ("reply", "request"):
            raise ValueError(f"lose must be 'reply' or 'request', not {lose!r}")
        if not marker:
            raise ValueError("arm needs at least one byte string to look for")
        self._call(lambda: self._set_rule(_Rule(None, marker, lose, hold)))

    @property
    def armed(self) -> bool:
        """Whether a cut of :meth:`cut_after` or :meth:`arm` is still waiting."""
        return self._call(lambda: self._rule is not None)

    def close(self) -> None:
        """Stop listening and reset every connection."""
        if self._loop.is_closed():
            return

        async def shut() -> None:
            self._cancel_schedule()
            self._server.close()
            self._reset_all(count=False)
            await self._server.wait_closed()

        with contextlib.suppress(Exception):
            self._run(shut(), timeout=10)
        self._stop_loop()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<FaultProxy {self.address} -> {self.target[0]}:{self.target[1]}>"

    # --- the loop's side --------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _call(self, fn: Callable[[], T]) -> T:
        async def run() -> T:
            return fn()

        return self._run(run())

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    def _cancel_schedule(self) -> None:
        if self._schedule is not None:
            self._schedule.cancel()
            self._schedule = None

    def _set_rule(self, rule: _Rule) -> None:
        self._rule = rule

    def _opened(self, pair: _Pair) -> None:
        self._pairs.add(pair)
        task = self._loop.create_task(self._connect(pair))
        pair.tasks.add(task)
        task.add_done_callback(pair.tasks.discard)

    async def _connect(self, pair: _Pair) -> None:
        host, port = self.target
        try:
            transport, _ = await self._loop.create_connection(
                lambda: _ServerSide(self, pair), host, port
            )
        except OSError:
            _reset(pair.client)
            self._pairs.discard(pair)
            return
        assert isinstance(transport, asyncio.Transport)
        if pair not in self._pairs:  # the client left meanwhile
            transport.close()
            return
        pair.server = transport
        pair.client.resume_reading()

    def _from_client(self, pair: _Pair, data: bytes) -> None:
        if pair.muted or pair.server is None:
            return
        rule, fire, passed = self._rule, False, data
        if rule is not None:
            if rule.left is not None:
                if len(data) >= rule.left:
                    passed, fire = data[: rule.left], True
                else:
                    rule.left -= len(data)
            elif all(m in data for m in rule.marker):
                fire = True
                if rule.lose == "request":
                    passed = b""
        if passed:
            self.client_bytes += len(passed)
            pair.server.write(passed)
        if fire and rule is not None:
            self._rule = None
            pair.muted = True
            pair.doomed = not rule.replies
            if rule.lose == "request":
                self._start_cut(pair)
            else:
                pair.timer = self._loop.call_later(rule.hold, self._start_cut, pair)

    def _from_server(self, pair: _Pair, data: bytes) -> None:
        if pair.doomed:
            self._start_cut(pair)  # the answer to a lost request: never passed on
            return
        pair.client.write(data)

    def _start_cut(self, pair: _Pair) -> None:
        if pair.cutting:
            return
        pair.cutting = True
        if pair.timer is not None:
            pair.timer.cancel()
        hook, self.on_cut = self.on_cut, None
        task = self._loop.create_task(self._cut(pair, hook))
        pair.tasks.add(task)
        task.add_done_callback(pair.tasks.discard)

    async def _cut(self, pair: _Pair, hook: Callable[[], None] | None) -> None:
        if hook is not None:
            await self._loop.run_in_executor(None, hook)
        self._break(pair)

    def _break(self, pair: _Pair, *, count: bool = True) -> None:
        if pair not in self._pairs:
            return
        self._pairs.discard(pair)
        pair.muted = pair.doomed = True
        if count:
            self.cuts += 1
        for transport in (pair.client, pair.server):
            if transport is not None:
                _reset(transport)

    def _reset_all(self, *, count: bool = True) -> int:
        pairs = list(self._pairs)
        for pair in pairs:
            self._break(pair, count=count)
        return len(pairs)

    def _close(self, pair: _Pair) -> None:
        """One side closed (or was reset): close the other, passing on what it had."""
        if pair not in self._pairs:
            return
        self._pairs.discard(pair)
        for transport in (pair.client, pair.server):
            if transport is not None and not transport.is_closing():
                transport.close()


def _reset(transport: asyncio.Transport) -> None:
    """Close with a TCP reset (RST) instead of an orderly FIN."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    transport.abort()
