"""serve.py: only regular files under dist/, the isolation headers on every answer, idle connections closed."""
from __future__ import annotations

import http.client
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
    with running(site, idle_timeout_s=0.3) as (srv, errors):
        with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) as sock:
            t0 = time.monotonic()
            closed_with = sock.recv(1)
            waited = time.monotonic() - t0
    assert closed_with == b"" and 0.2 < waited < 5
    assert errors == []


def test_idle_connections_hold_at_most_max_connections_threads(site):
    def handler_threads():
        return sum("process_request_thread" in t.name for t in threading.enumerate())

    with running(site, idle_timeout_s=0.5, max_connections=2) as (srv, errors):
        socks = [socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) for _ in range(6)]
        time.sleep(0.2)
        busy = handler_threads()
        # Each waits its turn for a slot, then gets closed after the idle timeout: none is held forever.
        closed = [s.recv(1) for s in socks]
        for s in socks:
            s.close()
    assert busy == 2
    assert closed == [b""] * 6
    assert errors == []


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
