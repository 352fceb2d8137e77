"""Side by side with wllama (llama.cpp in WebAssembly) in the same headless Chromium, on the same GGUF.

    python3 -m bench.wllama [--prompt 512] [--new 128] [--quick] [--gguf q4_1|q4_k_m|gemma3] [--no-webgpu]
                            [--wllama-threads 1 2]

One server (dist/ plus a bench page under /bench/, all with COOP/COEP so wllama's multi-thread build gets
SharedArrayBuffer) and one browser. The same prompt (a plain text; its ids under our tokenizer for our engine) goes to:
- @wllama/wllama (devDependency) loading the original SmolLM2-135M-Instruct Q4_1 GGUF that build.py
  converts, greedy, at 1 and 2 threads with flash attention on and off: llama.cpp's own prompt and
  generation timings (prefill and decode tok/s) and its output;
- our engine in the app page itself, at ?backend=webgpu (SwiftShader here: a CPU emulation of a GPU),
  ?backend=cpu (numpy inside Pyodide, the wasm kernel on every core) and at ?backend=cpu&threads=1 (one
  thread: the before), and the default ?backend=auto (tab_row);
- our engine's numpy CPU backend in CPython;
- llama.cpp itself, native (bench.native_llama: xllamacpp's server), on the same file, prompt ids and thread count
  as the tab's default (one a core), after the browser has closed (`--no-native` leaves it out).
Then wllama's greedy text, re-encoded, and native llama.cpp's ids against our first 8 greedy ids; the tab's default
and wllama's best over native llama.cpp. Prints JSON (`python3 -m bench` files it).
--gguf q4_k_m runs the same on llama.cpp's Q4_K_M mix of SmolLM2 (the tests' requantized file: q5_0 / q8_0
attention and gate|up, q4_K / q6_K down projections), with one more row: the Q4_1 model at ?backend=auto in the
same browser, for the time per token side by side. --gguf gemma3 runs the pinned Gemma 3 270M file (Q4_K_M, its
262,144-row tied head Q8_0) as the built-in ?model=gemma-3-270m, its prompt ids with Gemma's BOS as llama.cpp
tokenizes the text; --no-webgpu leaves out the SwiftShader row (Gemma's takes ~7 minutes there) and
--wllama-threads the thread counts wllama runs at. Every row carries ttft_s, the prompt's time to first token
(`--prompt 2000 --new 8` gives a pasted document's). --pairs N (N > 1) then runs the tab's default row and native
llama.cpp N - 1 more times, one after the other, each in a fresh browser: the ratio against native is then the
ratio of the N medians (`pairs` holds every one: this machine's speed moves by ~10 % from one run to the next).
"""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import sys
import time
import urllib.parse
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads: BLAS threads thrash on 2 shared cores

import build  # noqa: E402
import serve  # noqa: E402
from bench import ROOT, emit  # noqa: E402
from bench.harness import session  # noqa: E402
from harness.page import open_and_boot, wait_model  # noqa: E402

PAGE = Path(__file__).resolve().parent / "wllama_page"
WLLAMA = ROOT / "node_modules" / "@wllama" / "wllama"
MODEL_DIR = ROOT / "dist" / "models" / "smollm2-135m-instruct"
COMPARE_IDS = 8


GGUFS = ("q4_1", "q4_k_m", "gemma3")
Q4_K_M_MODEL = "smollm2-135m-q4_k_m"
GEMMA3_MODEL = "gemma-3-270m"  # build.py's built-in Gemma 3 270M


def gguf_path(kind: str = "q4_1") -> Path:
    """The pinned GGUF that build.py converts (fetched into .cache/models when missing), for "q4_k_m" the tests'
    requantized Q4_K_M mix of it (tests/gguf_models.py, written into .cache once), for "gemma3" the pinned
    Gemma 3 270M file."""
    from pagedkv.model.convert import fetch_gemma3_gguf, fetch_smollm2_gguf

    if kind == "gemma3":
        return fetch_gemma3_gguf(build.CACHE / "models")
    pinned = fetch_smollm2_gguf(build.CACHE / "models")
    if kind == "q4_1":
        return pinned
    sys.path.insert(0, str(ROOT / "tests"))
    from gguf_models import requantized_smollm2

    return requantized_smollm2(pinned, "Q4_K_M")


def install_q4_k_m() -> Path:
    """The Q4_K_M file converted into dist/models/smollm2-135m-q4_k_m, where the page's ?model= finds it."""
    import shutil

    from pagedkv.model.convert import convert_cached

    target = ROOT / "dist" / "models" / Q4_K_M_MODEL
    shutil.copytree(convert_cached(gguf_path("q4_k_m"), build.CACHE / "models"), target, dirs_exist_ok=True)
    return target


def make_server(host: str, port: int, gguf_kind: str = "q4_1"):
    """dist/ as serve.py serves it, plus /bench/ (page), /bench/wllama/ (the package), /bench/model.gguf."""
    gguf = gguf_path(gguf_kind)
    routes = [("/bench/model.gguf", gguf), ("/bench/wllama/", WLLAMA), ("/bench/", PAGE)]

    class Handler(serve.DistHandler):
        def translate_path(self, path: str) -> str:
            clean = urllib.parse.unquote(urllib.parse.urlparse(path).path)
            for prefix, target in routes:
                if clean.startswith(prefix) and ".." not in clean:
                    rest = clean[len(prefix):]
                    return str(target / rest) if rest else str(target / "index.html" if target.is_dir() else target)
            return super().translate_path(path)

        def send_head(self):
            if self.path.startswith("/bench/"):  # outside dist/, under symlinks (node_modules, .cache): no checks
                return http.server.SimpleHTTPRequestHandler.send_head(self)
            return super().send_head()

        def end_headers(self) -> None:
            if not self.path.startswith("/bench/"):
                return super().end_headers()
            # The harness page: cross-origin isolated (threads), without the app's CSP (wllama starts blob workers).
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
            self.send_header("Cross-Origin-Resource-Policy", "same-origin")
            self.send_header("Cache-Control", "no-cache")
            http.server.SimpleHTTPRequestHandler.end_headers(self)

    server = http.server.ThreadingHTTPServer((host, port), lambda *a, **kw: Handler(*a, directory=str(build.DIST), **kw))
    server.daemon_threads = True
    return server


PARAGRAPH = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a can of oil and a "
             "notebook in which he recorded the wind, the colour of the sea and the ships that passed the point. ")


def tokenizer(model_dir: Path = MODEL_DIR):
    from pagedkv.model.weights import read_manifest
    from pagedkv.tokenizer import Tokenizer

    return Tokenizer.from_manifest(read_manifest(model_dir))


def prompt_text(n: int, model_dir: Path = MODEL_DIR) -> tuple[str, list[int]]:
    """A plain-text prompt of `n` tokens and its ids under the model's tokenizer, with the special tokens llama.cpp
    adds to a text (Gemma's BOS; none for SmolLM2). wllama gets the text (its completion call crashes on a
    token-id prompt: 'Invalid typed array length'), we and native llama.cpp get the ids."""
    tok = tokenizer(model_dir)
    text, i = "", 0
    while len(tok.encode(text)) < n:
        i += 1
        text += f"Day {i}. {PARAGRAPH}"
    text = tok.decode(tok.encode(text)[:n - tok.add_bos])  # the BOS is one of the n
    return text, tok.encode(text, add_special=True)


def cpu_numpy(prompt: list[int], new_tokens: int, model_dir: Path = MODEL_DIR) -> dict:
    """Our engine on the numpy CPU backend in CPython: prefill and decode tok/s and the greedy ids."""
    from pagedkv.backends.cpu import CpuBackend
    from pagedkv.engine import EngineConfig, LLMEngine, run_sync
    from pagedkv.model.weights import ModelWeights, read_manifest
    from pagedkv.sampling import SamplingParams
    from pagedkv.tokenizer import Tokenizer

    tok = Tokenizer.from_manifest(read_manifest(model_dir))
    # one block table for every layer (kv_groups=False): a pool sized for one sequence whatever the model's groups
    backend = CpuBackend(ModelWeights.load(model_dir), num_blocks=-(-(len(prompt) + new_tokens) // 16) + 1,
                         block_size=16, kv_groups=False)
    engine = LLMEngine(backend, tok, EngineConfig(enable_prefix_caching=False))
    rid = engine.add_request(prompt, SamplingParams(max_tokens=new_tokens, stop_token_ids=(1_000_000,)))
    times, output = [], []
    while engine.has_unfinished:
        t0 = time.perf_counter()
        outs = run_sync(engine.step())
        times.append(time.perf_counter() - t0)
        output += [t for o in outs if o.request_id == rid for t in o.token_ids]
    n_prefill = len(times) - len(output) + 1
    return {"backend": "numpy CPU (CPython)", "prefill_tok_s": len(prompt) / sum(times[:n_prefill]),
            "decode_tok_s": (len(times) - n_prefill) / sum(times[n_prefill:]), "output_ids": output}


# The app page's own engine, timed in the tab: one row per ?backend= (auto, webgpu, cpu). Each row boots the real
# page (`?model=smollm2-135m-instruct&backend=X`) in the benchmark's browser, waits for its model, and times the
# page's engine step by step on the prompt's ids, greedy: the path a person gets. wasm_heap_mib: the worker's
# wasm memory after the run (wasm32: 4 GiB at most, less where the browser says so). kernel_threads: on the CPU
# path with threads, web/linear_threads.js's stats over the run (products, split ones, chunks and the helpers'
# share, microseconds in this thread's chunks, waiting, copying activations in and out, in the helpers').
TAB_MODEL = "smollm2-135m-instruct"
TAB_TIMEOUT_MS = 1_800_000

TIMED = """
import json, time
import pyodide_js
from pagedkv_app.main import state
from pagedkv.sampling import SamplingParams
_engine = state["engine"]
_js = getattr(getattr(getattr(getattr(_engine.backend, "model", None), "w", {{}}).get("token_embd.weight"), "store", None),
              "js", None)
_stats = lambda: {{k: float(getattr(_js.stats, k)) for k in ("calls", "split", "chunks", "helperChunks", "ownUs",
                                                            "waitUs", "copyUs", "helperUs")}} if _js else {{}}
await _engine.settle_disk()  # a first pass's blocks on disk before the timing (the page writes them once idle)
_s0 = _stats()
_times, _out = [], []
_rid = _engine.add_request({prompt!r}, SamplingParams(max_tokens={new}, stop_token_ids=(1_000_000,)))
while _engine.has_unfinished:
    _t0 = time.perf_counter()
    _outs = await _engine.step()
    _times.append(time.perf_counter() - _t0)
    _out += [t for o in _outs if o.request_id == _rid for t in o.token_ids]
_n_prefill = len(_times) - len(_out) + 1
json.dumps({{"prefill_tok_s": len({prompt!r}) / sum(_times[:_n_prefill]),
            "decode_tok_s": (len(_times) - _n_prefill) / sum(_times[_n_prefill:]), "output_ids": _out,
            "prefill_steps": _n_prefill, "wasm_heap_mib": pyodide_js._module.HEAP8.length / 2**20,
            "kernel_threads": {{k: round(v - _s0[k], 1) for k, v in _stats().items()}}}})
"""


def tab_row(s, backend: str, prompt: list[int], new_tokens: int, threads: int | None = None,
            model: str = TAB_MODEL) -> dict:
    """Prefill / decode tok/s of the page at ?backend=`backend` (auto: the page's default, no parameter), and
    ?threads=`threads` where given (the CPU path's kernel threads; the page's default: one per core).
    On WebGPU a first pass over a reversed prompt (no shared prefix, so no cache hit) records the plans, as
    bench_generate's first run does; the numpy path has nothing to record."""
    query = (f"?model={model}" + ("" if backend == "auto" else f"&backend={backend}")
             + ("" if threads is None else f"&threads={threads}"))
    booted = open_and_boot(s.browser, s.origin + "/" + query, TAB_TIMEOUT_MS, TAB_TIMEOUT_MS)
    try:
        info = wait_model(booted, TAB_TIMEOUT_MS)
        adapter = json.loads(booted.dataset()["adapter"])
        if info["backend"] == "webgpu":
            booted.py(TIMED.format(prompt=prompt[::-1], new=2))
        row = booted.py(TIMED.format(prompt=prompt, new=new_tokens))
    finally:
        booted.page.close()
    chosen = info["backend"]
    label = (f"auto → {chosen} in the tab" if backend == "auto" else f"{chosen} in the tab") + (
        "" if threads is None else f", threads={threads}") + ("" if model == TAB_MODEL else f", {model}")
    return {"backend": label, "asked": backend, "chosen": chosen, "reason": adapter["backend_reason"],
            "kernels": adapter["kernels"] if chosen == "webgpu" else None,
            "cpu_linear": info.get("cpu_linear") if chosen == "cpu" else None, **row}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--quick", action="store_true",
                        help=f"--prompt 64 --new {COMPARE_IDS}, wllama at 2 threads only")
    parser.add_argument("--gguf", choices=GGUFS, default="q4_1",
                        help="the file: the pinned Q4_1 SmolLM2, the tests' Q4_K_M mix of it, or Gemma 3 270M")
    parser.add_argument("--webgpu", action=argparse.BooleanOptionalAction, default=True,
                        help="a row of the tab at ?backend=webgpu (SwiftShader here)")
    parser.add_argument("--wllama-threads", type=int, nargs="+", default=[1, 2],
                        help="the thread counts wllama runs at (each with flash attention on and off)")
    parser.add_argument("--native", action=argparse.BooleanOptionalAction, default=True,
                        help="a row of native llama.cpp (xllamacpp's server) on the same file and thread count")
    parser.add_argument("--pairs", type=int, default=1,
                        help="the tab's default and native llama.cpp this many times in turn (the ratio of medians)")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompt, args.new = 64, COMPARE_IDS
    if args.prompt < 1 or args.new < COMPARE_IDS:
        parser.error(f"--prompt must be >= 1 and --new >= {COMPARE_IDS}")
    if args.pairs < 1 or (args.pairs > 1 and not args.native):
        parser.error("--pairs must be >= 1, and above 1 only with the native row")
    if not (WLLAMA / "esm" / "index.js").exists():
        raise SystemExit("node_modules/@wllama/wllama is missing: run `npm ci` (it is a devDependency)")
    model, model_dir = TAB_MODEL, MODEL_DIR
    if args.gguf == "q4_k_m":
        model, model_dir = Q4_K_M_MODEL, install_q4_k_m()
    elif args.gguf == "gemma3":
        model, model_dir = GEMMA3_MODEL, ROOT / "dist" / "models" / GEMMA3_MODEL
    text, prompt = prompt_text(args.prompt, model_dir)
    version = json.loads((WLLAMA / "package.json").read_text())["version"]
    report = {"benchmark": "wllama", "wllama_version": version, "gguf": gguf_path(args.gguf).name, "model": model,
              "prompt_tokens": args.prompt, "new_tokens": args.new, "wllama": [], "ours": []}
    # cpu at threads=1: the tab's CPU path on one thread ("before" the kernel's threads), in the same run; for the
    # Q4_K_M file, the Q4_1 model's default path last
    rows = ([("webgpu", None, model)] if args.webgpu else []) + [
        ("cpu", 1, model), ("cpu", None, model), ("auto", None, model)]
    if args.gguf == "q4_k_m":
        rows.append(("auto", None, TAB_MODEL))
    server = functools.partial(make_server, gguf_kind=args.gguf)  # dist/, the bench page and the GGUF
    with session(make_server=server) as s:
        for backend, threads, name in rows:
            report["ours"].append(tab_row(s, backend, prompt, args.new, threads, name))
            print(json.dumps({k: v for k, v in report["ours"][-1].items() if k != "output_ids"}), file=sys.stderr)
        report["adapter"] = json.loads(s.dataset()["adapter"])["name"]
        page = s.browser.new_page()
        page.set_default_timeout(1_800_000)
        page.goto(f"{s.origin}/bench/index.html")
        page.wait_for_selector("html[data-ready]", state="attached")
        for threads in ((2,) if args.quick else args.wllama_threads):
            for flash in (True, False):
                config = {"threads": threads, "flashAttn": flash, "prompt": text, "newTokens": args.new,
                          "nCtx": 1024 if args.prompt + args.new <= 1024 else 2048}
                r = page.evaluate("config => window.runWllama(config)", config)
                t = r["timings"] or {}
                report["wllama"].append({"threads": r["threads"], "multithread": r["multithread"],
                                         "cross_origin_isolated": r["cross_origin_isolated"], "flash_attn": flash,
                                         "prefill_tok_s": t.get("prompt_per_second"),
                                         "decode_tok_s": t.get("predicted_per_second"), "timings": t,
                                         "prompt_tokens_wllama": t.get("prompt_n"), "text": r["text"],
                                         "load_ms": r["load_ms"]})
                print(json.dumps(report["wllama"][-1])[:600], file=sys.stderr)
    if args.native:  # the tab's default thread count: one a core (the page's ?threads= default)
        from bench.native_llama import native_row

        run_native = functools.partial(native_row, gguf_path(args.gguf), prompt, args.new, os.cpu_count() or 1)
        report["native"] = run_native()
        print(json.dumps({k: v for k, v in report["native"].items() if k != "output_ids"}), file=sys.stderr)
        first = next(r for r in report["ours"] if r["asked"] == "auto")  # the file's own model
        report["pairs"] = [pair(first, report["native"])]
        for _ in range(args.pairs - 1):  # a fresh browser each time, native right after it closed
            with session(make_server=server) as s:
                tab = tab_row(s, "auto", prompt, args.new, None, model)
            report["pairs"].append(pair(tab, run_native()))
            print(json.dumps(report["pairs"][-1]), file=sys.stderr)
    report["ours"].append(cpu_numpy(prompt, args.new, model_dir))
    for r in report["ours"] + report["wllama"] + ([report["native"]] if args.native else []):
        # time to first token: the prompt at the row's prefill rate
        r["ttft_s"] = args.prompt / r["prefill_tok_s"] if r["prefill_tok_s"] else None
    compare(report, model_dir)
    report["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    emit(report)
    return 0


def compare(report: dict, model_dir: Path = MODEL_DIR) -> None:
    """wllama's greedy text (re-encoded with our tokenizer: it returns no ids) vs our first ids, and the ratio."""
    tok = tokenizer(model_dir)
    ours = report["ours"][0]["output_ids"][:COMPARE_IDS]
    report["ours_first_ids"] = ours
    report["ours_first_text"] = tok.decode(ours)
    report["ours_first_row"] = report["ours"][0]["backend"]  # the row the others' ids are held to (webgpu if run)
    report["ours_rows_match_webgpu"] = {r["backend"]: r["output_ids"][:COMPARE_IDS] == ours for r in report["ours"]}
    for r in report["wllama"]:
        r["first_ids_reencoded"] = tok.encode(r["text"])[:COMPARE_IDS]
        r["ids_match_ours"] = r["first_ids_reencoded"] == ours
        r["text_starts_with_ours"] = r["text"].startswith(report["ours_first_text"])
    report["ratio"] = ratio_line(report)
    native = report.get("native")
    if native:
        native["ids_match_ours"] = native["output_ids"][:COMPARE_IDS] == ours
        native["rows_match_native"] = {r["backend"]: r["output_ids"][:COMPARE_IDS] == native["output_ids"][:COMPARE_IDS]
                                       for r in report["ours"]}
        report["native_ratio"] = native_ratio_line(report)


def ratio_line(report: dict) -> str:
    """Each of our rows over wllama's best configuration, decode and prefill separately."""
    best_dec = max(report["wllama"], key=lambda r: r["decode_tok_s"] or 0)
    best_pre = max(report["wllama"], key=lambda r: r["prefill_tok_s"] or 0)

    def cfg(r: dict) -> str:
        return f"{r['threads']} thread{'s' if r['threads'] > 1 else ''}, flash attention {'on' if r['flash_attn'] else 'off'}"

    rows = "; ".join(f"{r['backend']} {r['decode_tok_s']:.2f} / {r['prefill_tok_s']:.2f} = "
                     f"{r['decode_tok_s'] / best_dec['decode_tok_s']:.2f}x / "
                     f"{r['prefill_tok_s'] / best_pre['prefill_tok_s']:.2f}x" for r in report["ours"])
    return (f"Decode / prefill tok/s against wllama's best, decode {best_dec['decode_tok_s']:.2f} ({cfg(best_dec)}) "
            f"and prefill {best_pre['prefill_tok_s']:.2f} ({cfg(best_pre)}): {rows}. The CPython row (native BLAS) "
            "ran after the browser side finished.")


def pair(tab: dict, native: dict) -> dict:
    """One run of the tab's default row and one of native llama.cpp: their rates and whether their first ids agree."""
    return {"tab": {k: tab[k] for k in ("prefill_tok_s", "decode_tok_s")},
            "native": {k: native[k] for k in ("prefill_tok_s", "decode_tok_s")},
            "ids_match": tab["output_ids"][:COMPARE_IDS] == native["output_ids"][:COMPARE_IDS]}


def pair_medians(pairs: list[dict]) -> dict:
    """The median of each side's prefill and decode tok/s over the pairs, and their ratios (tab / native)."""
    import statistics

    med = {side: {k: statistics.median(p[side][k] for p in pairs) for k in ("prefill_tok_s", "decode_tok_s")}
           for side in ("tab", "native")}
    return {**med, "ratio": {k: med["tab"][k] / med["native"][k] for k in ("prefill_tok_s", "decode_tok_s")}}


def native_ratio_line(report: dict) -> str:
    """The tab's default row and wllama's best (decode, prefill) over native llama.cpp; with several pairs, the
    ratio of their medians too."""
    native = report["native"]
    tab = next(r for r in report["ours"] if r.get("asked") == "auto")  # the file's own model: the first auto row
    best_dec = max(report["wllama"], key=lambda r: r["decode_tok_s"] or 0)
    best_pre = max(report["wllama"], key=lambda r: r["prefill_tok_s"] or 0)
    line = (f"Against native llama.cpp ({native['backend']}, xllamacpp {native['xllamacpp_version']}: decode "
            f"{native['decode_tok_s']:.2f} / prefill {native['prefill_tok_s']:.2f} tok/s): the tab's default "
            f"({tab['backend']}) {tab['decode_tok_s'] / native['decode_tok_s']:.2f}x / "
            f"{tab['prefill_tok_s'] / native['prefill_tok_s']:.2f}x, wllama's best "
            f"{best_dec['decode_tok_s'] / native['decode_tok_s']:.2f}x / "
            f"{best_pre['prefill_tok_s'] / native['prefill_tok_s']:.2f}x. First {COMPARE_IDS} greedy ids equal to "
            f"native llama.cpp's: {', '.join(f'{k}: {v}' for k, v in native['rows_match_native'].items())}.")
    pairs = report.get("pairs", [])
    if len(pairs) > 1:
        m = pair_medians(pairs)
        line += (f" Over {len(pairs)} pairs of the tab's default and native run in turn, medians: tab "
                 f"{m['tab']['decode_tok_s']:.2f} / {m['tab']['prefill_tok_s']:.2f}, native "
                 f"{m['native']['decode_tok_s']:.2f} / {m['native']['prefill_tok_s']:.2f} tok/s (decode / "
                 f"prefill): {m['ratio']['decode_tok_s']:.2f}x / {m['ratio']['prefill_tok_s']:.2f}x; first ids "
                 f"equal in every pair: {all(p['ids_match'] for p in pairs)}.")
    return line


if __name__ == "__main__":
    raise SystemExit(main())
