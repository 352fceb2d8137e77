"""A hostile OpenAI-style SSE server on 127.0.0.1 and a CPython twin of the bridge's fetch transport.

`HostileServer` is a real socket server in a thread: it reads one POST per
connection, records its JSON body, then runs a behaviour (a function of the
connection) that answers well, badly, slowly or never. Every wait in it is
bounded by `deadline_s`, and leaving the `with` block stops it, so a test that
goes wrong cannot hang the suite.

`open_stream` is what `bridge.open_stream` is under Pyodide: it awaits the
response head, then `read()` returns the body chunk by chunk (None at the end),
`abort()` closes the connection so a pending `read()` fails the way an aborted
fetch does, and cancelling the call while it waits for the head closes the
connection (the bridge aborts its fetch then).
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.parse

SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Connection: close\r\n\r\n")


class HostileServer:
    """`with HostileServer(behave) as server:` serves `behave(conn, server)` for each request on `server.url`."""

    def __init__(self, behave, deadline_s: float = 10.0) -> None:
        self.behave = behave
        self.deadline_s = deadline_s
        self.requests: list[dict] = []  # the JSON body of each request, in order
        self.hung_up: list[str] = []  # how each connection ended: "client" (it closed first), "server", "deadline"
        self.sent = 0  # body bytes written over all connections
        self.stopping = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> HostileServer:
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self._threads.append(accept)
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        for thread in list(self._threads):
            thread.join(self.deadline_s)
        self._sock.close()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(self.deadline_s)
        with conn:
            head, _, body = self._read_head(conn)
            length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            while len(body) < length:
                body += conn.recv(65536)
            self.requests.append(json.loads(body))
            try:
                self.behave(conn, self)
                self.hung_up.append("server")
            except (BrokenPipeError, ConnectionResetError):  # the client aborted while we were writing
                self.hung_up.append("client")
            except TimeoutError:  # the client neither read nor closed within the deadline
                self.hung_up.append("deadline")

    @staticmethod
    def _read_head(conn: socket.socket) -> tuple[bytes, bytes, bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            more = conn.recv(65536)
            if not more:
                raise ConnectionError("the client closed the connection before sending its request")
            data += more
        return data.partition(b"\r\n\r\n")

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def wait_for_client_close(self, conn: socket.socket) -> None:
        """Send nothing until the client hangs up (its timeout or abort); the deadline bounds the wait."""
        if conn.recv(1) != b"":
            raise AssertionError("the client sent more after its request")
        raise ConnectionResetError("the client closed the connection")


# ---------------------------------------------------------------- behaviours


def answers(*events: str):
    """A well-formed stream of `events`, then the end of the body."""
    def behave(conn, server):
        server.send(conn, SSE_HEAD)
        for event in events:
            server.send(conn, event.encode())
    return behave


def never_answers(conn, server) -> None:
    """Reads the request, then sends nothing at all (not even the status line)."""
    server.wait_for_client_close(conn)


def stalls_after(*events: str):
    """Sends the head and `events`, then nothing more while the connection stays open."""
    def behave(conn, server):
        answers(*events)(conn, server)
        server.wait_for_client_close(conn)
    return behave


def endless(piece: bytes, limit_bytes: int = 64 << 20, head: bytes = SSE_HEAD):
    """Sends `piece` again and again (up to `limit_bytes`) until the client hangs up."""
    def behave(conn, server):
        server.send(conn, head)
        while server.sent < limit_bytes and not server.stopping.is_set():
            server.send(conn, piece)
    return behave


# ---------------------------------------------------------------- the CPython transport


class LoopbackStream:
    """bridge._FetchStream's twin: `status`, `read()` per chunk (None at the end), `text()`, `abort()`."""

    def __init__(self, status: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.status = status
        self._reader, self._writer = reader, writer
        self.aborted = False

    async def read(self) -> bytes | None:
        chunk = await self._reader.read(65536)
        if self.aborted:
            raise RuntimeError("AbortError: the operation was aborted")
        return chunk or None

    async def text(self) -> str:
        return (await self._reader.read()).decode()

    def abort(self) -> None:
        self.aborted = True
        self._writer.close()


async def open_stream(url: str, body: str) -> LoopbackStream:
    """POST `body` to `url` and await the response head (HTTP/1.1, the body read until the connection closes)."""
    parts = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        data = body.encode()
        writer.write(f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
                     f"Accept: text/event-stream\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
                     .encode() + data)
        head = await reader.readuntil(b"\r\n\r\n")
    except BaseException:  # a timeout cancels the wait: close the connection, as the bridge aborts its fetch
        writer.close()
        raise
    status = int(head.split(b" ", 2)[1])
    return LoopbackStream(status, reader, writer)
