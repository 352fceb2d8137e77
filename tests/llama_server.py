"""llama.cpp's own OpenAI-compatible server (the `xllamacpp` wheel embeds it), for the fallback tests.

It serves the same pinned SmolLM2 GGUF as the app, on 127.0.0.1 and a free port,
kept small (1024-token context, 2 threads, one slot) so it shares the machine.
"""
from __future__ import annotations

import json
import socket
import urllib.request
from contextlib import contextmanager
from pathlib import Path

MODEL_NAME = "smollm2-135m-instruct"  # what the server answers to; llama.cpp serves one model whatever is asked


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def llama_server(gguf: Path, n_ctx: int = 1024, threads: int = 2):
    """Start llama.cpp's HTTP server on `gguf` with an `n_ctx`-token context on `threads` threads (prompt and
    generation alike); yields its origin (http://127.0.0.1:PORT); stopped on exit."""
    try:
        import xllamacpp
    except ImportError:
        raise RuntimeError("the fallback tests need llama.cpp's server: pip install xllamacpp==2026.10.11549") from None

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf)
    params.model_alias = {MODEL_NAME}
    params.n_ctx = n_ctx
    params.n_parallel = 1
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.warmup = False
    params.port = free_port()
    server = xllamacpp.Server(params)  # loads the model, then listens; CORS allows any origin by default
    try:
        yield str(server.listening_address).rstrip("/")
    finally:
        del server  # its destructor stops the HTTP thread and frees the model


def complete(origin: str, body: dict, timeout: float = 120) -> dict:
    """One non-streaming chat completion straight from the server (the reference for the page's stream)."""
    req = urllib.request.Request(origin + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())
