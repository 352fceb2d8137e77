"""serve.py --allow-origin: the fallback server's origin joins connect-src and nothing else."""
from __future__ import annotations

import http.client
import subprocess
import sys
import threading

import pytest

import build
import serve


def directives(csp: str) -> dict[str, str]:
    return {d.split(" ", 1)[0]: d for d in csp.split("; ")}


def test_default_connects_only_to_self():
    assert directives(serve.content_security_policy())["connect-src"] == "connect-src 'self'"
    assert serve.content_security_policy() == serve.CSP


def test_allowed_origins_extend_connect_src_only():
    csp = serve.content_security_policy(("http://127.0.0.1:8080", "https://API.example.org:443/"))
    got, default = directives(csp), directives(serve.CSP)
    assert got["connect-src"] == "connect-src 'self' http://127.0.0.1:8080 https://api.example.org:443"
    assert {k: v for k, v in got.items() if k != "connect-src"} == {k: v for k, v in default.items()
                                                                     if k != "connect-src"}


@pytest.mark.parametrize("origin", ["127.0.0.1:8080", "ftp://host", "http://host/v1", "http://host?x=1",
                                    "http://user:pw@host", "http://host:99999", "*"])
def test_a_non_origin_is_refused(origin):
    with pytest.raises(serve.ServeError, match="is not an origin|bad port"):
        serve.content_security_policy((origin,))


def test_served_header_carries_the_origin():
    server = serve.make_server("127.0.0.1", 0, allow_origins=("http://127.0.0.1:8080",))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        conn.request("GET", "/worker.js")  # the worker's own CSP governs its fetches
        resp = conn.getresponse()
        resp.read()
    finally:
        server.shutdown()
        server.server_close()
    assert resp.status == 200
    csp = resp.getheader("Content-Security-Policy")
    assert directives(csp)["connect-src"] == "connect-src 'self' http://127.0.0.1:8080"
    assert resp.getheader("Cross-Origin-Embedder-Policy") == "require-corp"


def test_command_line_refuses_a_bad_origin_before_listening():
    proc = subprocess.run([sys.executable, str(build.ROOT / "build.py"), "serve", "--port", "0",
                           "--allow-origin", "http://host/v1"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "--allow-origin 'http://host/v1' is not an origin" in proc.stderr and "Traceback" not in proc.stderr
