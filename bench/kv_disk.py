"""The disk tier of the KV cache: time to first token of a chat's next turn after a reload, disk tier on vs off.

    python3 -m bench.kv_disk [--quick] [--sizes 256,1024,4096] [--model smollm2-135m-instruct]

A chat of N tokens is computed (its full blocks are written behind to disk when the tier is on), then a fresh
engine ("the reload") gets the next turn: the history plus a 16-token message; with the tier on it restores
the history's blocks from disk and prefills only the rest. CPU path: the numpy backend in CPython, f32 KV as the
page's CPU fallback holds it, block files in a temporary directory. CPU path in the tab: the app page at
?backend=cpu, its own backend in Pyodide (the wasm SIMD projections and attention a person without WebGPU
gets), f32 KV, block files in OPFS. WebGPU: the page's worker in headless Chromium (SwiftShader here), f16 KV,
block files in OPFS. Also the disk bytes per token of every KV dtype
(block file incl. header / block size) for the model. Prints JSON (`python3 -m bench` files it). Figures only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads: BLAS threads thrash on 2 shared cores

from bench import ROOT, emit  # noqa: E402
from bench.harness import install_bench, session  # noqa: E402
from harness.page import open_and_boot, wait_model  # noqa: E402

# The page's worker keeps its globals between calls: the backend is set up once, then each row is its own call,
# so a row that fails leaves the rows before it (run_rows).
WEB_SETUP = """
from bench.page.kv_disk_turns import reload_ttft
from bench.page.webgpu_engine import bench_backend
from pagedkv.browser.opfs import OpfsStore
from pagedkv.tokenizer import Tokenizer
_ctx, _b, _m, _ledger = await bench_backend(model={model!r})
_store = await OpfsStore.open("kv-bench")
_tok = Tokenizer.from_manifest(_m)
await reload_ttft(_b, _tok, _m, _store, 48, True, seed=99)  # records the step plans outside the figures
_b.num_blocks
"""
WEB_ROW = """
import json
json.dumps(await reload_ttft(_b, _tok, _m, _store, {n}, {on}, seed={n}))
"""
WEB_END = "if '_b' in globals():\n    _b.destroy()\n"  # also after a failed setup


# The app page's own backend at ?backend=cpu (?kv_disk=0 keeps the page's own disk tier off OPFS `kv/`).
TAB_SETUP = """
import json
from bench.page.kv_disk_turns import reload_ttft
from pagedkv.browser.interop import fetch_bytes
from pagedkv.browser.opfs import OpfsStore
from pagedkv_app.main import state
_e = state["engine"]
_m = json.loads(await fetch_bytes("models/{model}/model.json"))
_store = await OpfsStore.open("kv-bench-cpu")
await reload_ttft(_e.backend, _e.tokenizer, _m, _store, 48, True, seed=99)  # as on WebGPU: first-call costs out
_e.backend.num_blocks
"""
TAB_ROW = """
import json
json.dumps(await reload_ttft(_e.backend, _e.tokenizer, _m, _store, {n}, {on}, seed={n}))
"""
TAB_TIMEOUT_MS = 3_600_000


class DirStore:
    """A kv_disk.FileStore over a directory (the CPU path's disk under CPython)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    async def read(self, name: str) -> bytes | None:
        path = self.root / name
        return path.read_bytes() if path.exists() else None

    async def write(self, name: str, data: bytes) -> None:
        (self.root / name).write_bytes(data)

    async def delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    async def names(self) -> dict[str, int]:
        return {p.name: p.stat().st_size for p in self.root.iterdir()}


def cpu_rows(model: str, sizes: list[int]) -> list[dict]:
    from bench.page.kv_disk_turns import reload_ttft
    from pagedkv.backends.cpu import CpuBackend
    from pagedkv.engine import run_sync
    from pagedkv.model.weights import ModelWeights, read_manifest
    from pagedkv.tokenizer import Tokenizer

    model_dir = ROOT / "dist" / "models" / model
    weights = ModelWeights.load(model_dir)
    manifest = read_manifest(model_dir)
    tok = Tokenizer.from_manifest(manifest)
    backend = CpuBackend(weights, num_blocks=max(sizes) // 16 + 8, block_size=16, kv_dtype="f32")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pagedkv-kv-disk-") as tmp:
        store = DirStore(Path(tmp))
        for n in sizes:
            for on in (False, True):
                rows.append(run_sync(reload_ttft(backend, tok, manifest, store, n, on, seed=n)))
                print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def run_rows(page, setup: str, row: str, sizes: list[int], **fmt) -> dict:
    """{"num_blocks", "rows", "store_reopened"}: setup once in the page's worker, then one call per row (off,
    then on, for each size), each printed to stderr as it ends. A failure ends the half with "error" beside the
    rows before it."""
    out = {"rows": []}
    try:
        out["num_blocks"] = page.py(setup.format(**fmt))
        for n in sizes:
            for on in (False, True):
                out["rows"].append(page.py(row.format(n=n, on=on)))
                print(json.dumps(out["rows"][-1]), file=sys.stderr, flush=True)
    except Exception as err:  # noqa: BLE001  (filed with the rows measured; the other half still runs)
        out["error"] = f"{type(err).__name__}: {err}"[:2000]
        print(f"kv_disk: {out['error']}", file=sys.stderr, flush=True)
    # how often the OPFS store took its directory's handle again from the root (pagedkv.browser.opfs.OpfsStore)
    out["store_reopened"] = page.py("globals()['_store'].reopened if '_store' in globals() else None")
    return out


def web_rows(model: str, sizes: list[int], tab_sizes: list[int]) -> dict:
    """The same runs in the browser: the WebGPU backend in the page's worker (sizes, none when empty), then the
    tab's CPU path (tab_sizes, none when empty); block files in OPFS."""
    out = {}
    with session() as page:
        if sizes:
            t0 = time.perf_counter()
            install_bench(page, "page/kv_disk_turns.py", "page/webgpu_engine.py")
            rows = run_rows(page, WEB_SETUP, WEB_ROW, sizes, model=model)
            page.py(WEB_END)
            out["webgpu"] = {"kv_dtype": "f16", "store": "OPFS", **rows}
            out["webgpu_s"] = round(time.perf_counter() - t0, 1)
        if tab_sizes:
            t0 = time.perf_counter()
            out["cpu_tab"] = tab_cpu_rows(page, model, tab_sizes)
            out["cpu_tab_s"] = round(time.perf_counter() - t0, 1)
        out["adapter"] = json.loads(page.dataset()["adapter"])["name"]
    return out


def tab_cpu_rows(s, model: str, sizes: list[int]) -> dict:
    """The same runs in the app page at ?backend=cpu: the tab's CPU path, block files in OPFS. Its KV pool
    (?kv_mib=) holds the longest chat and its next turn."""
    from pagedkv.kv.dtypes import kv_dtype
    from pagedkv.model.weights import check_manifest, read_manifest

    cfg = check_manifest(read_manifest(ROOT / "dist" / "models" / model))
    token_bytes = 2 * cfg.n_layers * kv_dtype("f32").token_bytes(cfg.n_kv_heads, cfg.head_dim)
    kv_mib = -(-(max(sizes) + 64) * token_bytes // (1 << 20))
    query = f"?model={model}&backend=cpu&kv_disk=0&kv_mib={kv_mib}"
    booted = open_and_boot(s.browser, s.origin + "/" + query, TAB_TIMEOUT_MS, TAB_TIMEOUT_MS)
    try:
        info = wait_model(booted, TAB_TIMEOUT_MS)
        install_bench(booted, "page/kv_disk_turns.py")
        rows = run_rows(booted, TAB_SETUP, TAB_ROW, sizes, model=model)
    finally:
        booted.page.close()
    return {"kv_dtype": info["kv_dtype"], "store": "OPFS", "query": query, "cpu_linear": info["cpu_linear"], **rows}


def bytes_per_token(model: str) -> dict:
    """Disk bytes per token of each KV dtype: a block file (header, token ids, K and V of every layer) / 16."""
    from pagedkv.kv.disk_tier import DiskKey
    from pagedkv.kv.dtypes import KV_DTYPES
    from pagedkv.kv.spec import KVSpec
    from pagedkv.model.weights import check_manifest, read_manifest

    cfg = check_manifest(read_manifest(ROOT / "dist" / "models" / model))
    out = {}
    for name in KV_DTYPES:
        layout = DiskKey("m", KVSpec.of(cfg, block_size=16, dtype=name))
        out[name] = {"file_bytes_per_token": layout.file_bytes / 16,
                     "payload_bytes_per_token": layout.payload_bytes // 16}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="256,1024,4096", help="chat lengths in tokens, comma-separated")
    parser.add_argument("--web-sizes", default=None, help="chat lengths on WebGPU (default: --sizes; '' none)")
    parser.add_argument("--tab-sizes", default=None,
                        help="chat lengths on the tab's CPU path (default: --sizes; '' none)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--quick", action="store_true",
                        help="256 and 1,024 tokens on the CPU path in CPython, 256 in the tab and on WebGPU")
    parser.add_argument("--no-web", action="store_true", help="CPython only (no browser)")
    parser.add_argument("--no-cpu", action="store_true", help="the browser only")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    def size_list(value: str | None) -> list[int]:
        return [int(x) for x in (args.sizes if value is None else value).split(",") if x]

    web_sizes, tab_sizes = size_list(args.web_sizes), size_list(args.tab_sizes)
    if args.quick:
        sizes, web_sizes, tab_sizes = [256, 1024], [256], [256]
    report = {"benchmark": "kv_disk", "model": args.model, "bytes_per_token": bytes_per_token(args.model),
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    t0 = time.perf_counter()
    if not args.no_cpu:
        report["cpu_numpy"] = {"kv_dtype": "f32", "store": "directory", "rows": cpu_rows(args.model, sizes)}
        report["cpu_s"] = round(time.perf_counter() - t0, 1)
    if not args.no_web:
        report.update(web_rows(args.model, web_sizes, tab_sizes))
    emit(report)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
