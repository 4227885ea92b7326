"""The fault proxy of :mod:`iqbridge.testing.proxy`, against a small TCP server of the
test's own that records what it received and answers each chunk with ``ok:<chunk>``.

It passes bytes both ways; a reset reaches the client as ECONNRESET (a TCP reset, not an
orderly close); ``cut_after(n)`` lets exactly n bytes through and the server's answer
never comes back; ``arm(marker)`` cuts the connection of the request that holds it,
after (``lose="reply"``) or instead of (``lose="request"``) passing it on, and runs
``on_cut`` in between; a schedule resets connections again and again; new connections
work after every break.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from iqbridge.testing.proxy import FaultProxy


class Answering:
    """A TCP server answering each chunk it reads with ``ok:`` and the chunk."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received = bytearray()
        self.lock = threading.Lock()
        self.resets = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    with self.lock:
                        self.received += data
                    conn.sendall(b"ok:" + data)
            except ConnectionResetError:
                with self.lock:
                    self.resets += 1
            except OSError:
                pass

    def got(self) -> bytes:
        with self.lock:
            return bytes(self.received)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def server() -> Iterator[Answering]:
    srv = Answering()
    yield srv
    srv.close()


@pytest.fixture
def proxy(server: Answering) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", server.port) as p:
        yield p


def _client(proxy: FaultProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=5)


def _until(check: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _read(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def test_it_passes_bytes_both_ways_and_rewrites_urls(proxy: FaultProxy, server: Answering) -> None:
    with _client(proxy) as sock:
        sock.sendall(b"hello")
        assert _read(sock, 8) == b"ok:hello"
        _until(lambda: proxy.connections == 1)
    assert server.got() == b"hello"
    assert proxy.cuts == 0
    assert proxy.url("amqp://u:p@db.example:5672/%2F?x=1") == (
        f"amqp://u:p@127.0.0.1:{proxy.port}/%2F?x=1"
    )
    assert proxy.url("redis://10.0.0.1:6379/0") == f"redis://127.0.0.1:{proxy.port}/0"


def test_reset_reaches_both_sides_as_a_tcp_reset(proxy: FaultProxy, server: Answering) -> None:
    with _client(proxy) as a, _client(proxy) as b:
        for sock in (a, b):
            sock.sendall(b"x")
            assert _read(sock, 4) == b"ok:x"
        assert proxy.reset() == 2
        for sock in (a, b):
            with pytest.raises(ConnectionResetError):
                sock.recv(10)
    _until(lambda: server.resets == 2)
    assert proxy.cuts == 2
    with _client(proxy) as again:  # a new connection works
        again.sendall(b"y")
        assert _read(again, 4) == b"ok:y"


def test_cut_after_lets_exactly_n_bytes_through_and_loses_the_answer(
    proxy: FaultProxy, server: Answering
) -> None:
    with _client(proxy) as sock:
        sock.sendall(b"first")
        assert _read(sock, 8) == b"ok:first"
        proxy.cut_after(7)
        sock.sendall(b"0123456789abcdef")  # 7 of these reach the server
        with pytest.raises(ConnectionResetError):
            sock.recv(100)  # the server's answer to them never comes
    assert server.got() == b"first0123456"
    assert proxy.client_bytes == 12
    assert proxy.cuts == 1
    assert not proxy.armed


def test_cut_after_with_replies_passes_the_answers_then_resets(
    proxy: FaultProxy, server: Answering
) -> None:
    with _client(proxy) as sock:
        proxy.cut_after(3, replies=True, hold=0.3)
        t0 = time.monotonic()
        sock.sendall(b"abcdef")  # "abc" gets through and is answered; "def" never is
        assert _read(sock, 6) == b"ok:abc"
        sock.sendall(b"more")  # lost: the connection is being cut
        with pytest.raises(ConnectionResetError):
            sock.recv(100)
        assert time.monotonic() - t0 >= 0.25
    assert server.got() == b"abc"


def test_cut_after_counts_across_chunks(proxy: FaultProxy, server: Answering) -> None:
    with _client(proxy) as sock:
        proxy.cut_after(5)
        sock.sendall(b"abc")
        assert _read(sock, 6) == b"ok:abc"
        sock.sendall(b"defgh")
        with pytest.raises(ConnectionResetError):
            sock.recv(100)
    assert server.got() == b"abcde"


@pytest.mark.parametrize("lose", ["reply", "request"])
def test_arm_cuts_the_request_holding_the_marker(
    proxy: FaultProxy, server: Answering, lose: str
) -> None:
    ran: list[bytes] = []
    proxy.on_cut = lambda: ran.append(server.got())
    with _client(proxy) as sock:
        proxy.arm(b"GET", b"key-2", lose=lose)
        sock.sendall(b"GET key-1")  # not every marker: passes
        assert _read(sock, 12) == b"ok:GET key-1"
        sock.sendall(b"GET key-2")
        with pytest.raises(ConnectionResetError):
            sock.recv(100)
    sent = b"GET key-1GET key-2" if lose == "reply" else b"GET key-1"
    assert server.got() == sent
    assert ran == [sent], "on_cut runs once, after the request got through, before the reset"
    assert proxy.on_cut is None
    assert proxy.cuts == 1


def test_a_schedule_resets_connections_until_stopped(proxy: FaultProxy) -> None:
    proxy.reset_every(0.05, 0.1, seed=1)
    broken = 0
    deadline = time.monotonic() + 10
    while broken < 3:
        assert time.monotonic() < deadline, "the schedule did not reset 3 connections"
        with _client(proxy) as sock:
            try:
                sock.sendall(b"ping")
                assert _read(sock, 7) == b"ok:ping"
                sock.settimeout(1.0)
                sock.recv(10)  # waits for the next reset
            except ConnectionResetError:
                broken += 1
    proxy.stop_resets()
    cuts = proxy.cuts
    with _client(proxy) as sock:
        for _ in range(5):
            sock.sendall(b"ping")
            assert _read(sock, 7) == b"ok:ping"
            time.sleep(0.05)
    assert proxy.cuts == cuts


def test_bad_arguments_are_refused(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="at least 1 byte"):
        proxy.cut_after(0)
    with pytest.raises(ValueError, match="lose must be"):
        proxy.arm(b"x", lose="both")
    with pytest.raises(ValueError, match="byte string"):
        proxy.arm()
    with pytest.raises(ValueError, match="low <= high"):
        proxy.reset_every(2.0, 1.0)


def test_an_unreachable_server_resets_the_client() -> None:
    # A bound socket that does not listen holds the port for the whole test (no other
    # process can take it, as it could a port closed again), and the kernel refuses
    # every connection to it: the proxy's connect to its target fails at once.
    with socket.socket() as unreachable:
        unreachable.bind(("127.0.0.1", 0))
        port = unreachable.getsockname()[1]
        with FaultProxy("127.0.0.1", port) as proxy:
            # The proxy accepts the client, fails to reach the server and resets the
            # client. The reset can beat the client's own connect() back (under load the
            # client's thread may look at its socket only after the RST arrived), so it
            # may surface there, at the send or at the receive: a reset in every case,
            # never an orderly close (recv would return b"") nor a hang (a timeout).
            with pytest.raises(ConnectionResetError), _client(proxy) as sock:
                sock.sendall(b"x")
                sock.recv(10)
            _until(lambda: proxy.connections == 0)
            assert proxy.cuts == 0  # not a cut of a connection that was ever through
