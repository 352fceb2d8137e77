"""`npm run generate -- (--messages-json FILE | --prompt TEXT) [--model NAME | --gguf FILE] [--max-tokens N]
[--greedy | --temperature T --seed S] [--backend auto|webgpu|cpu] [--kernels auto|cpu|gpu] [--json]`
(`python3 -m pagedkv.generate ...` from the repository root, dist/ built).

`--gguf FILE` runs any GGUF of a supported family (model/families/): converted on first use into dist/models/<its sha256>/ (the page
loads models from dist/; reused while current) and loaded by that name.

Runs one chat completion (or with --prompt a raw prompt continued: no chat template, BOS as the model's file
says, as the legacy Completions API takes it) in headless Chromium through the page's engine (on the
backend the page's ?backend=auto picks, unless --backend says which) and prints the same JSON as the CPU CLI
(`python3 -m pagedkv generate`): prompt_ids, output_ids, text, plus timings
(ttft_ms, prefill_tok_s, decode_tok_s) measured inside the tab. It drives the built
page with the repository's browser harness (bench/harness/), imported only here, so
the pagedkv wheel imports in Pyodide without Playwright.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DIST_MODELS = Path(__file__).resolve().parents[2] / "dist" / "models"

WORKER_CODE = """
import json, time
from pagedkv_app.main import state
from pagedkv.chat import Conversation, validate_messages
from pagedkv.sampling import SamplingParams
engine, service = state["engine"], state["service"]
args = json.loads({args!r})
if args["prompt"] is None:
    prompt = Conversation(engine.tokenizer, service.template, validate_messages(args["messages"])).prompt_ids()
else:  # as pagedkv.cli's --prompt and the legacy Completions API: the text as it is, BOS as the file says
    prompt = engine.tokenizer.encode(args["prompt"], add_special=True)
    if not prompt:
        raise ValueError("--prompt is empty and the model adds no BOS token: give some text to continue")
params = SamplingParams(temperature=args["temperature"], seed=args["seed"], max_tokens=args["max_tokens"],
                        stop_token_ids=tuple(sorted(engine.default_stop_ids)))
t0 = time.perf_counter()
rid = engine.add_request(prompt, params)
req = engine.request(rid)
t_first = None
while engine.has_unfinished:
    outs = await engine.step()
    if t_first is None and any(o.token_ids for o in outs):
        t_first = time.perf_counter()
t_end = time.perf_counter()
out = req.output_ids
text_ids = out[:-1] if out and out[-1] in engine.default_stop_ids else out
decode_s = t_end - t_first
json.dumps({{"prompt_ids": prompt, "output_ids": out, "text": engine.tokenizer.decode(text_ids),
  "finish_reason": req.finish_reason, "kernels": state.get("kernels"), "backend_reason": state["backend"][1],
  "timings": {{"ttft_ms": round(1000 * (t_first - t0), 1),
               "prefill_tok_s": round(len(prompt) / (t_first - t0), 2),
               "decode_tok_s": round((len(out) - 1) / decode_s, 2) if len(out) > 1 and decode_s > 0 else None}}}})
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--messages-json", help="a chat, rendered by the model's chat template")
    given.add_argument("--prompt", help="a text continued as it is (a base model): no chat template")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--greedy", action="store_true")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--seed", type=int)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--model", default="smollm2-135m-instruct", help="a model directory under dist/models/")
    which.add_argument("--gguf", type=Path, help="a GGUF of a supported family (model/families/), converted on first use")
    parser.add_argument("--backend", choices=("auto", "webgpu", "cpu"), default="auto",
                        help="the page's ?backend= (auto: numpy on a software adapter, else WebGPU)")
    parser.add_argument("--kernels", choices=("auto", "cpu", "gpu"), default="auto",
                        help="WebGPU kernel family (the page's ?kernels=)")
    parser.add_argument("--activations", choices=("int8", "int16", "f32"), default="int8",
                        help="the CPU path's activations in its products (the page's ?activations=)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (else the text)")
    args = parser.parse_args(argv)
    if args.greedy and args.temperature is not None:
        parser.error("--greedy and --temperature exclude each other")
    try:
        messages = None if args.prompt is not None else json.loads(Path(args.messages_json).read_text("utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        print(f"error: cannot read messages from {args.messages_json}: {exc}", file=sys.stderr)
        return 2
    if args.gguf is not None:
        from .model.convert import convert_cached  # the `gguf` package: CPython only, never in the page

        try:
            args.model = convert_cached(args.gguf, DIST_MODELS).name
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    payload = json.dumps({"messages": messages, "prompt": args.prompt, "temperature": args.temperature or 0.0,
                          "seed": args.seed, "max_tokens": args.max_tokens})
    from harness.page import BrowserSession  # the repository's, with Playwright: never in the page

    with BrowserSession(f"?model={args.model}&backend={args.backend}&kernels={args.kernels}"
                        f"&activations={args.activations}") as session:
        try:
            result = session.py(WORKER_CODE.format(args=payload))
        except Exception as exc:  # the worker's exception text names the problem
            print(f"error: {str(exc).strip().splitlines()[-1]}", file=sys.stderr)
            return 2
        result["backend"] = session.model_info["backend"]
    print(json.dumps(result, ensure_ascii=False) if args.json else result["text"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
