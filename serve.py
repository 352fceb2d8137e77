#!/usr/bin/env python3
"""Serve the built site (dist/) on loopback with the headers the page needs.

    python3 serve.py [--port 8000] [--host 127.0.0.1] [--allow-origin http://127.0.0.1:8080 ...]

(`python3 build.py serve ...` is the same command.) Cross-origin isolation (COOP/COEP) gives the page
SharedArrayBuffer; the CSP keeps every request on this origin. Only regular files under dist/ are served:
no directory listings, no symlinks, no path with a control character; an idle connection is closed after
`IDLE_TIMEOUT_S`, and at most `MAX_CONNECTIONS` are served at once.
"""
from __future__ import annotations

import argparse
import http.server
import os
import socket
import sys
import threading
import urllib.parse
from pathlib import Path

DIST = Path(__file__).resolve().parent / "dist"
IDLE_TIMEOUT_S = 30.0
# A browser opens about 6 connections per origin; the rest wait in the listen backlog, not in a thread each.
MAX_CONNECTIONS = 32

CSP_DIRECTIVES = (
    "default-src 'self'",
    # Pyodide compiles its wasm module and the wasm in numpy's wheel: that needs wasm-unsafe-eval.
    "script-src 'self' 'wasm-unsafe-eval'",
    "worker-src 'self'",
    "connect-src 'self'",
    "img-src 'self' data:",
    "style-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
)
CSP = "; ".join(CSP_DIRECTIVES)


class ServeError(Exception):
    """The server cannot start as asked (the message says how to fix it)."""


def check_origin(origin: str) -> str:
    """An origin the page may connect to (`scheme://host[:port]`, http or https); ServeError otherwise."""
    parts = urllib.parse.urlsplit(origin)
    if (parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/")
            or parts.query or parts.fragment or parts.username or parts.password):
        raise ServeError(f"--allow-origin {origin!r} is not an origin: give scheme://host[:port], "
                         f"e.g. http://127.0.0.1:8080 (no path)")
    try:
        port = parts.port
    except ValueError:
        raise ServeError(f"--allow-origin {origin!r} has a bad port") from None
    return f"{parts.scheme}://{parts.hostname}" + (f":{port}" if port is not None else "")


def content_security_policy(allow_origins: tuple[str, ...] = ()) -> str:
    """The served CSP; `allow_origins` (e.g. a fallback chat server) are added to connect-src only."""
    extra = [check_origin(o) for o in allow_origins]
    return "; ".join(" ".join(["connect-src 'self'", *extra]) if d == "connect-src 'self'" else d
                     for d in CSP_DIRECTIVES)


def bad_path(raw: str) -> bool:
    """True when the request path is not clean UTF-8 or holds a control character (raw or %-escaped)."""
    try:
        decoded = urllib.parse.unquote(raw, errors="strict")
    except UnicodeDecodeError:
        return True
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw + decoded)


class DistHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".wasm": "application/wasm",
        ".js": "text/javascript",
        ".mjs": "text/javascript",
        ".json": "application/json",
        ".wgsl": "text/plain; charset=utf-8",
        ".whl": "application/zip",
        ".zip": "application/zip",
        ".bin": "application/octet-stream",
        ".css": "text/css",
        ".svg": "image/svg+xml",
        ".html": "text/html; charset=utf-8",
    }

    csp = CSP
    # StreamRequestHandler puts this on the socket: a silent client gets its connection closed.
    timeout = IDLE_TIMEOUT_S

    def version_string(self) -> str:
        # The default names the Python version, which tells an attacker more than a client needs.
        return "PagedKV"

    def end_headers(self) -> None:
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Content-Security-Policy", self.csp)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def send_head(self):
        if bad_path(self.path):
            self.send_error(400, "Bad path")
            return None
        path = self.translate_path(self.path)
        if self._through_symlink(path):
            self.send_error(404, "File not found")
            return None
        if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "index.html")):
            self.send_error(404, "File not found")
            return None
        return super().send_head()

    def list_directory(self, path):
        # send_head above answers 404 first; this keeps a listing impossible should that check change.
        self.send_error(404, "File not found")
        return None

    def _through_symlink(self, path: str) -> bool:
        """True when any component below the served directory is a symlink (none are followed)."""
        rel = os.path.relpath(path, self.directory)
        current = self.directory
        for part in Path(rel).parts:
            current = os.path.join(current, part)
            if os.path.islink(current):
                return True
        return False

    def log_message(self, fmt: str, *args) -> None:
        if os.environ.get("PAGEDKV_QUIET_SERVER"):
            return
        super().log_message(fmt, *args)


class DistServer(http.server.ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` of them; the accept loop waits for a free slot."""

    daemon_threads = True

    def __init__(self, address, handler, max_connections: int) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request: socket.socket, client_address) -> None:
        self._slots.acquire()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def make_server(host: str, port: int, dist: Path = DIST, allow_origins: tuple[str, ...] = (), *,
                idle_timeout_s: float = IDLE_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS) -> DistServer:
    """Serve `dist` with the isolation headers; `allow_origins` extend the CSP's connect-src."""
    handler_class = type("Handler", (DistHandler,), {"csp": content_security_policy(tuple(allow_origins)),
                                                     "timeout": idle_timeout_s})
    if not (dist / "index.html").exists():
        raise ServeError(f"{dist}/index.html is missing: run `python3 build.py` first (or `npm start`).")
    # The symlink check walks from here down, so the root itself is resolved once.
    directory = os.path.realpath(dist)

    def handler(*args, **kwargs):
        return handler_class(*args, directory=directory, **kwargs)

    try:
        return DistServer((host, port), handler, max_connections)
    except OSError as exc:
        raise ServeError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}. "
            f"Is another server running there? Pick another port with --port."
        ) from None


def serve(host: str, port: int, allow_origins: tuple[str, ...] = ()) -> None:
    server = make_server(host, port, allow_origins=allow_origins)
    actual_port = server.server_address[1]
    print(f"PagedKV is served at  http://{host}:{actual_port}/  (open it in Chrome; Ctrl+C stops)", flush=True)
    for origin in allow_origins:
        print(f"the page may connect to {check_origin(origin)} (a fallback chat server)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("\nstopped")
    finally:
        server.server_close()


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                        help="let the page connect to ORIGIN (scheme://host[:port]), e.g. the fallback "
                             "OpenAI-compatible server set in the chat settings; repeatable")
    args = parser.parse_args(argv)
    try:
        serve(args.host, args.port, tuple(args.allow_origin))
    except ServeError as exc:
        parser.exit(1, f"{parser.prog}: error: {exc}\n")  # exit code 1, as build.py's errors
    return 0


if __name__ == "__main__":
    sys.exit(main())
