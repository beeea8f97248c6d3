"""Issue 39, point 8, against a real ``kvreuse serve``: a body held open gets a 408 after
``--body-timeout``, a Content-Length larger than the body followed by a half-close gets an answer
or a closed connection (never a hang), and an oversized chunked body is refused before it ends."""

from __future__ import annotations

import socket
import time

import pytest

from kvreuse.runtime.server.launcher import ServerProcess

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("slow_clients") / "server.log"
    args = ["--kv-cache-memory", "64M", "--body-timeout", "2", "--max-request-bytes", "100000"]
    proc = ServerProcess(args, log).start()
    yield proc
    proc.stop()


def _connect(server) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=15)
    return s


def _head(length: str | None, chunked: bool = False) -> bytes:
    lines = ["POST /v1/chat/completions HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"Content-Length: {length}"] if length is not None else []
    lines += ["Transfer-Encoding: chunked"] if chunked else []
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_status(s: socket.socket) -> int | None:
    """The response's status, or None when the server closed the connection without one."""
    data = b""
    while b"\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            return None
        data += chunk
    return int(data.split(b" ", 2)[1])


def test_a_body_held_open_gets_a_408(server):
    with _connect(server) as s:
        t0 = time.monotonic()
        s.sendall(_head("100") + b'{"messages": ')  # and nothing more, the socket kept open
        status = _read_status(s)
        assert status == 408 and time.monotonic() - t0 < 10, status  # old: no answer at all


def test_a_short_body_and_a_half_close_never_hang(server):
    with _connect(server) as s:
        t0 = time.monotonic()
        s.sendall(_head("1000") + b'{"messages": []}')
        s.shutdown(socket.SHUT_WR)
        status = _read_status(s)  # the socket has a 15 s timeout: a hang raises
        assert status in (None, 400, 408) and time.monotonic() - t0 < 10, status


def test_an_oversized_chunked_body_is_refused_before_it_ends(server):
    with _connect(server) as s:
        s.sendall(_head(None, chunked=True))
        piece = b"x" * 50_000
        for _ in range(3):  # 150 kB > the 100 kB limit, and the body never ends
            s.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        assert _read_status(s) == 413


def test_health_answers_while_a_client_holds_its_body(server):
    import httpx

    with _connect(server) as s:
        s.sendall(_head("100") + b"{")
        t0 = time.monotonic()
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        assert time.monotonic() - t0 < 1
