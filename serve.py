#!/usr/bin/env python3
"""Serve the built site (dist/) on loopback with the headers the page needs.

    python3 serve.py [--port 8000] [--host 127.0.0.1] [--allow-origin http://127.0.0.1:8080 ...]

(`python3 build.py serve ...` is the same command.) Cross-origin isolation (COOP/COEP) gives the page
SharedArrayBuffer; the CSP keeps every request on this origin. Only regular files under dist/ are served:
no directory listings, no symlinks, no path with a control character.

Slow clients cannot lock others out: a connection waits for its request's headers in one selector, holding
no thread, and is closed unless the blank line ending them arrives within `REQUEST_DEADLINE_S` of connecting
(a total deadline: trickling bytes does not extend it). Only a complete request takes one of `MAX_WORKERS`
threads; past `MAX_WAITING` waiting connections (`MAX_WAITING_PER_ADDRESS` from one address) the oldest is
closed to admit the newest. Answers are HTTP/1.0, one per connection; bodies are never read.
"""
from __future__ import annotations

import argparse
import http.server
import io
import os
import queue
import re
import selectors
import socket
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

DIST = Path(__file__).resolve().parent / "dist"
# From connecting to the end of the headers: a browser sends them in one packet, a slow client is cut off.
REQUEST_DEADLINE_S = 10.0
# A client that takes none of the answer for this long is dropped (a stalled write, not a slow download).
SEND_TIMEOUT_S = 30.0
MAX_WORKERS = 32  # requests answered at once, a thread each; waiting connections hold none
MAX_WAITING = 256  # connections still sending their headers: 64 KiB of buffer each at most
# A browser opens 6 (HTTP/1.x) to 16 connections to one host, plus preconnects; a flood from one address
# then only closes its own oldest.
MAX_WAITING_PER_ADDRESS = 32
MAX_HEAD_BYTES = 64 * 1024
HEAD_END = re.compile(rb"\r?\n\r?\n")  # the blank line, as http.server reads lines (LF or CRLF)

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
    # StreamRequestHandler puts this on the socket: the answer's writes stall at most this long.
    timeout = SEND_TIMEOUT_S

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


@dataclass
class Waiting:
    """A connection whose request's headers have not all arrived."""

    sock: socket.socket
    address: tuple
    deadline: float  # time.monotonic()
    head: bytearray = field(default_factory=bytearray)


class HeadFirst:
    """The accepted socket as a handler sees it: reads come from the head the server already read."""

    # A head cut at MAX_HEAD_BYTES goes on as one over-long line, so http.server answers it itself
    # (414 in the request line, 431 in a header) with every header the handler adds.
    OVERFLOW = b"x" * 65537

    def __init__(self, sock: socket.socket, head: bytes, complete: bool) -> None:
        self._sock, self._head, self._complete = sock, head, complete

    def makefile(self, mode: str, buffering: int | None = None):
        if "r" in mode:
            return io.BytesIO(self._head if self._complete else self._head + self.OVERFLOW)
        return self._sock.makefile(mode, buffering)

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


class DistServer(http.server.HTTPServer):
    """Accepts and reads request heads in serve_forever's thread (one selector, a total deadline per
    connection); answers complete requests on at most `max_workers` threads."""

    # socketserver's 5 leaves a burst of connections (a page's assets, or clients above) retrying their SYN
    # for a second; the accept loop never blocks, so a longer backlog drains at once.
    request_queue_size = 128

    def __init__(self, address, handler, *, request_deadline_s: float = REQUEST_DEADLINE_S,
                 max_workers: int = MAX_WORKERS, max_waiting: int = MAX_WAITING,
                 max_waiting_per_address: int = MAX_WAITING_PER_ADDRESS) -> None:
        if not (request_deadline_s > 0 and max_workers >= 1 and max_waiting >= 1 and max_waiting_per_address >= 1):
            raise ServeError("the request deadline must be positive and every limit at least 1")
        self.request_deadline_s = request_deadline_s
        self.max_workers = max_workers
        self.max_waiting = max_waiting
        self.max_waiting_per_address = max_waiting_per_address
        self._waiting: dict[socket.socket, Waiting] = {}
        self._selector = selectors.DefaultSelector()
        self._ready: queue.SimpleQueue = queue.SimpleQueue()  # (socket, address, head, complete) or None: stop
        self._workers: list[threading.Thread] = []
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        super().__init__(address, handler)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Accept, read heads and hand complete requests to the workers until shutdown()."""
        self._stopped.clear()
        self._start_workers()
        self._selector.register(self.socket, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                wait = poll_interval
                if self._waiting:
                    first = min(w.deadline for w in self._waiting.values())
                    wait = max(0.0, min(wait, first - time.monotonic()))
                for key, _ in self._selector.select(wait):
                    if key.fileobj is self.socket:
                        self._handle_request_noblock()  # accept; process_request admits it
                    else:
                        self._read(key.data)
                now = time.monotonic()
                for w in [w for w in self._waiting.values() if w.deadline <= now]:
                    self._drop(w)
        finally:
            self._selector.unregister(self.socket)
            self._stop.clear()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serve_forever (running in another thread) and wait for it."""
        self._stop.set()
        self._stopped.wait()

    def server_close(self) -> None:
        for w in list(self._waiting.values()):
            self._drop(w)
        self._selector.close()
        while True:  # requests no worker has taken yet
            try:
                job = self._ready.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self.shutdown_request(job[0])
        for _ in self._workers:
            self._ready.put(None)
        self._workers = []
        super().server_close()

    @property
    def num_waiting(self) -> int:
        """Connections whose request's headers have not all arrived."""
        return len(self._waiting)

    def process_request(self, request: socket.socket, client_address) -> None:
        """Wait for the new connection's headers, closing the oldest waiting one past a limit."""
        same = [w for w in self._waiting.values() if w.address[0] == client_address[0]]
        if len(same) >= self.max_waiting_per_address:
            self._drop(min(same, key=lambda w: w.deadline))
        elif len(self._waiting) >= self.max_waiting:
            self._drop(min(self._waiting.values(), key=lambda w: w.deadline))
        request.setblocking(False)
        waiting = Waiting(request, client_address, time.monotonic() + self.request_deadline_s)
        self._waiting[request] = waiting
        self._selector.register(request, selectors.EVENT_READ, waiting)

    def _read(self, w: Waiting) -> None:
        if self._waiting.get(w.sock) is not w:  # closed by an accept earlier in the same select() round
            return
        try:
            data = w.sock.recv(MAX_HEAD_BYTES + 1 - len(w.head))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(w)
            return
        searched = max(0, len(w.head) - 3)  # the blank line may straddle two reads
        w.head += data
        end = HEAD_END.search(w.head, searched)
        if end is not None:
            self._dispatch(w, bytes(w.head[:end.end()]), complete=True)
        elif len(w.head) > MAX_HEAD_BYTES:
            self._dispatch(w, bytes(w.head[:MAX_HEAD_BYTES]), complete=False)

    def _dispatch(self, w: Waiting, head: bytes, complete: bool) -> None:
        self._forget(w)
        w.sock.setblocking(True)  # the handler sets its own timeout on it
        self._ready.put((w.sock, w.address, head, complete))

    def _drop(self, w: Waiting) -> None:
        self._forget(w)
        self.shutdown_request(w.sock)

    def _forget(self, w: Waiting) -> None:
        del self._waiting[w.sock]
        self._selector.unregister(w.sock)

    def _start_workers(self) -> None:
        while len(self._workers) < self.max_workers:
            worker = threading.Thread(target=self._work, name=f"serve-worker-{len(self._workers)}", daemon=True)
            worker.start()
            self._workers.append(worker)

    def _work(self) -> None:
        while (job := self._ready.get()) is not None:
            sock, address, head, complete = job
            try:
                self.finish_request(HeadFirst(sock, head, complete), address)
            except Exception:
                self.handle_error(sock, address)
            finally:
                self.shutdown_request(sock)


def make_server(host: str, port: int, dist: Path = DIST, allow_origins: tuple[str, ...] = (), *,
                send_timeout_s: float = SEND_TIMEOUT_S, **limits) -> DistServer:
    """Serve `dist` with the isolation headers; `allow_origins` extend the CSP's connect-src. `limits` are
    DistServer's (request_deadline_s, max_workers, max_waiting, max_waiting_per_address)."""
    handler_class = type("Handler", (DistHandler,), {"csp": content_security_policy(tuple(allow_origins)),
                                                     "timeout": send_timeout_s})
    if not (dist / "index.html").exists():
        raise ServeError(f"{dist}/index.html is missing: run `python3 build.py` first (or `npm start`).")
    # The symlink check walks from here down, so the root itself is resolved once.
    directory = os.path.realpath(dist)

    def handler(*args, **kwargs):
        return handler_class(*args, directory=directory, **kwargs)

    try:
        return DistServer((host, port), handler, **limits)
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
