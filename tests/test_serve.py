"""serve.py: only regular files under dist/, the isolation headers on every answer, slow and idle connections
closed by the request deadline without holding a thread."""
from __future__ import annotations

import http.client
import selectors
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

import build
import serve

ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp",
             "Cross-Origin-Resource-Policy": "same-origin", "X-Content-Type-Options": "nosniff",
             "Content-Security-Policy": serve.CSP, "Server": "PagedKV"}


@pytest.fixture()
def site(tmp_path, monkeypatch):
    """A small dist/: a page, three asset folders, and three symlinks (out of the tree, to a file, to a dir)."""
    monkeypatch.setenv("PAGEDKV_QUIET_SERVER", "1")
    dist = tmp_path / "dist"
    for folder in ("models/tiny", "pyodide", "wheels"):
        (dist / folder).mkdir(parents=True)
    (dist / "index.html").write_text("<!doctype html><title>t</title>\n")
    (dist / "models/tiny/model.json").write_text("{}\n")
    (dist / "pyodide/pyodide.asm.wasm").write_bytes(b"\0asm\1\0\0\0")
    (dist / "wheels/a-1.0-py3-none-any.whl").write_bytes(b"PK\5\6")
    (tmp_path / "secret.txt").write_text("secret\n")
    (dist / "leak.txt").symlink_to(tmp_path / "secret.txt")
    (dist / "alias.html").symlink_to(dist / "index.html")
    (dist / "up").symlink_to(tmp_path, target_is_directory=True)
    return dist


@contextmanager
def running(dist, **kwargs):
    """The server on a free loopback port; yields it and the errors that would have printed a traceback."""
    srv = serve.make_server("127.0.0.1", 0, dist, **kwargs)
    errors = []
    srv.handle_error = lambda request, address: errors.append(sys.exc_info()[1])
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv, errors
    finally:
        srv.shutdown()
        srv.server_close()


def get(srv, path):
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=10)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp, body


def raw_request(srv, request_line: bytes) -> bytes:
    """The status line of the answer to a request line http.client would refuse to send."""
    with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) as sock:
        sock.sendall(request_line + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
        return sock.makefile("rb").readline()


def headers(resp) -> dict[str, str]:
    return {name: resp.getheader(name) for name in ISOLATION}


def test_files_are_served_with_their_type_and_the_isolation_headers(site):
    with running(site) as (srv, errors):
        resp, body = get(srv, "/pyodide/pyodide.asm.wasm")
        index, page = get(srv, "/")
    assert (resp.status, body, resp.getheader("Content-Type")) == (200, b"\0asm\1\0\0\0", "application/wasm")
    assert headers(resp) == ISOLATION
    assert (index.status, page, index.getheader("Content-Type")) == (
        200, b"<!doctype html><title>t</title>\n", "text/html; charset=utf-8")
    assert errors == []


def test_csp_allows_wasm_but_not_eval():
    csp = serve.CSP
    assert "default-src 'self'" in csp and "'wasm-unsafe-eval'" in csp
    assert "'unsafe-eval'" not in csp.replace("'wasm-unsafe-eval'", "")


@pytest.mark.parametrize("path", ["/models/", "/pyodide/", "/wheels/", "/models", "/models/tiny/"])
def test_no_directory_listing(site, path):
    with running(site) as (srv, errors):
        resp, body = get(srv, path)
    assert resp.status == 404 and b"model.json" not in body and b"Directory listing" not in body
    assert headers(resp) == ISOLATION
    assert errors == []


@pytest.mark.parametrize("path", ["/leak.txt", "/alias.html", "/up/secret.txt", "/up/dist/index.html"])
def test_symlinks_are_not_followed(site, path):
    with running(site) as (srv, errors):
        resp, body = get(srv, path)
    assert (resp.status, b"secret" in body, b"<title>t</title>" in body) == (404, False, False)
    assert headers(resp) == ISOLATION
    assert errors == []


@pytest.mark.parametrize("path", ["/%00", "/index.html%00.png", "/%ff", "/a%C3%28", "/a%0Ab", "/%7f"])
def test_a_control_character_or_bad_utf8_in_the_path_is_a_400(site, path):
    with running(site) as (srv, errors):
        resp, _ = get(srv, path)
    assert resp.status == 400
    assert headers(resp) == ISOLATION
    assert errors == []


def test_a_raw_control_character_in_the_request_line_is_a_400(site):
    with running(site) as (srv, errors):
        status = raw_request(srv, b"GET /index\x01.html HTTP/1.1")
    assert status.startswith(b"HTTP/1.0 400 ") and errors == []


def test_an_idle_connection_is_closed(site):
    with running(site, request_deadline_s=0.3) as (srv, errors):
        with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) as sock:
            t0 = time.monotonic()
            closed_with = sock.recv(1)
            waited = time.monotonic() - t0
    assert closed_with == b"" and 0.2 < waited < 5
    assert errors == []


def test_idle_connections_hold_no_worker(site):
    with running(site, request_deadline_s=3, max_workers=1) as (srv, errors):
        idle = [socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) for _ in range(6)]
        resp, body = get(srv, "/")  # the one worker is free: the six idle connections hold nothing
        waiting = srv.num_waiting
        for sock in idle:
            sock.close()
    assert (resp.status, body, waiting) == (200, b"<!doctype html><title>t</title>\n", 6)
    assert errors == []


def connect_from(source: str, port: int) -> socket.socket:
    """A loopback connection to the server from `source` (127.0.0.2, ...: another client address)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def closed_after(socks: list[socket.socket], since: list[float], limit_s: float) -> list[float | None]:
    """Seconds from since[i] until the server closed socks[i] (None: still open after `limit_s`; bytes: it
    answered instead)."""
    closed: list = [None] * len(socks)
    index = {sock: i for i, sock in enumerate(socks)}
    end = time.monotonic() + limit_s
    with selectors.DefaultSelector() as sel:
        for sock in socks:
            sel.register(sock, selectors.EVENT_READ)
        while sel.get_map() and time.monotonic() < end:
            for key, _ in sel.select(max(0.0, end - time.monotonic())):
                try:
                    data = key.fileobj.recv(64)
                except OSError:  # reset: the trickle wrote after the close
                    data = b""
                i = index[key.fileobj]
                closed[i] = time.monotonic() - since[i] if data == b"" else data
                sel.unregister(key.fileobj)
    return closed


def slow_clients_scenario(srv, deadline_s: float, n: int = 40, every_s: float = 0.25):
    """n clients, each from its own address, send a request line and then a header line every `every_s`
    (well inside any idle timeout); a normal GET meanwhile. Returns (the GET's status or error, the slow
    clients still waiting when it was answered, header lines each sent, when each was closed)."""
    port = srv.server_address[1]
    slow, since = [], []
    for i in range(n):
        slow.append(connect_from(f"127.0.0.{i + 2}", port))
        since.append(time.monotonic())
        slow[-1].sendall(b"GET / HTTP/1.1\r\n")
    lines = [0] * n
    stop = threading.Event()

    def trickle():
        for _ in range(int((deadline_s + 3) / every_s)):  # bounded: ends by itself past the deadline
            for i, sock in enumerate(slow):
                try:
                    sock.send(b"X-Slow: 1\r\n")
                    lines[i] += 1
                except OSError:
                    pass
            if stop.wait(every_s):
                return

    feeder = threading.Thread(target=trickle, daemon=True)
    feeder.start()
    try:
        time.sleep(0.3)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/")
            resp = conn.getresponse()
            got = (resp.status, resp.read())
        except OSError as exc:
            got = exc
        finally:
            conn.close()
        waiting = getattr(srv, "num_waiting", None)
        closed = closed_after(slow, since, deadline_s + 3)
    finally:
        stop.set()
        feeder.join(5)
        for sock in slow:
            sock.close()
    return got, waiting, lines, closed


def test_slow_clients_do_not_lock_out_a_normal_get(site):
    deadline = 1.5
    with running(site, request_deadline_s=deadline) as (srv, errors):
        got, waiting, lines, closed = slow_clients_scenario(srv, deadline)
    # Answered while all 40 slow clients (more than the 32 workers) still held their connections.
    assert got == (200, b"<!doctype html><title>t</title>\n") and waiting == 40
    # Each kept trickling (a line every 0.25 s: an idle timeout would never fire) and was cut at the deadline.
    assert min(lines) >= 4
    assert all(isinstance(t, float) and deadline - 0.05 < t < deadline + 1 for t in closed), closed
    assert errors == []


def test_one_address_keeps_at_most_32_waiting(site):
    with running(site, request_deadline_s=5) as (srv, errors):
        port = srv.server_address[1]
        socks = [connect_from("127.0.0.2", port) for _ in range(40)]
        other = connect_from("127.0.0.3", port)
        for _ in range(100):  # until the server has accepted all 41 (bounded: 2 s)
            if srv.num_waiting == 33 and socks[7].recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                break
            time.sleep(0.02)
        # The eight oldest from 127.0.0.2 were closed to admit its newest; the client at .3 kept its place.
        first_eight = [s.recv(1) for s in socks[:8]]
        # A browser on the same address still gets its page: its newest connection pushes out the next oldest.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=("127.0.0.2", 0))
        conn.request("GET", "/")
        resp = conn.getresponse()
        status, body = resp.status, resp.read()
        conn.close()
        ninth = socks[8].recv(1)
        waiting = srv.num_waiting
        with selectors.DefaultSelector() as sel:
            for s in [*socks[9:], other]:
                sel.register(s, selectors.EVENT_READ)
            still_open = sel.select(0) == []
        for s in [*socks, other]:
            s.close()
    assert first_eight == [b""] * 8 and ninth == b""
    assert (status, body) == (200, b"<!doctype html><title>t</title>\n")
    assert (waiting, still_open) == (32, True)  # 31 from .2, 1 from .3
    assert errors == []


def test_headers_split_anywhere_are_one_request(site):
    with running(site) as (srv, errors):
        with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) as sock:
            sock.sendall(b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r")
            time.sleep(0.1)
            sock.sendall(b"\n")
            status = sock.makefile("rb").readline()
    assert status == b"HTTP/1.0 200 OK\r\n" and errors == []


@pytest.mark.parametrize("head, status", [
    (b"GET /" + b"a" * 65532, b"HTTP/1.0 414 "),  # no end to the request line within 64 KiB
    (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 65514, b"HTTP/1.0 431 "),  # nor to a header line
])
def test_a_head_past_64_kib_is_refused(site, head, status):
    assert len(head) == serve.MAX_HEAD_BYTES + 1
    with running(site) as (srv, errors):
        with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) as sock:
            sock.sendall(head)
            answer = sock.makefile("rb").readline()
    assert answer.startswith(status) and errors == []


def test_port_in_use_gives_a_clear_message():
    if not (serve.DIST / "index.html").exists():
        build.build()  # the command serves the real dist/, and says so first when it is missing
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, serve.__file__, "--port", str(port)],
                              capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "--port" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_missing_dist_says_how_to_build_it(tmp_path):
    with pytest.raises(serve.ServeError) as err:
        serve.make_server("127.0.0.1", 0, tmp_path)
    assert str(err.value) == f"{tmp_path}/index.html is missing: run `python3 build.py` first (or `npm start`)."
