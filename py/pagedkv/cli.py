"""Command line: `python3 -m pagedkv generate|complete|tokenize` on a built model directory or, with `--gguf FILE`,
on any GGUF of a supported family (model/families/), converted on first use into .cache/models/<its sha256>/ and reused while current.
`complete` answers an OpenAI Chat Completions body, or a legacy Completions one (a prompt, no messages), through
pagedkv.api.Engine (docs/api.md). `generate --prompt TEXT` continues a raw prompt (a base model: no chat template).

generate runs on the CPU (numpy reference, the default) or with `--backend wgpu` on a native WebGPU device
(wgpu-py: Vulkan, Metal or D3D12; imported only then), which adds `timings` and `adapter` to the JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .backends.cpu import CpuBackend
from .kv.groups import KVGroups
from .chat import ChatTemplate, Conversation, validate_messages
from .engine import EngineConfig, LLMEngine, run_sync
from .model.weights import ModelWeights, read_manifest
from .sampling import SamplingParams
from .tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / "dist" / "models" / "smollm2-135m-instruct"
GGUF_CACHE = ROOT / ".cache" / "models"
BLOCK_SIZE = 16
BACKENDS = ("cpu", "wgpu")


class CliError(Exception):
    """Bad command-line input; printed as one line on stderr with exit status 2."""


def generate_ids(weights: ModelWeights, tokenizer: Tokenizer, prompt_ids: Sequence[int],
                 params: SamplingParams) -> tuple[list[int], str]:
    """Run one request through the engine on the CPU backend; returns (output ids incl. stop token, reason).

    Generation also ends ("length") when the model's context is full.
    """
    total = min(weights.config.context_length, len(prompt_ids) + params.max_tokens)
    chunk = max(256, len(prompt_ids))
    groups = KVGroups.of(weights.config)  # the backend's KV groups: window groups hold their window, + the null block
    num_blocks = groups.blocks_needed(total, chunk, BLOCK_SIZE) + int(groups.is_hybrid)
    backend = CpuBackend(weights, num_blocks=num_blocks, block_size=BLOCK_SIZE)
    engine = LLMEngine(backend, tokenizer, EngineConfig(max_num_batched_tokens=chunk))
    request = run_sync(engine.generate(list(prompt_ids), params))
    return request.output_ids, request.finish_reason


def _load_messages(path: str) -> list[dict[str, str]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read messages file {path}: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"messages file {path} is not valid JSON: {exc}") from exc
    except RecursionError:  # json's decoder recurses once per nesting level
        raise CliError(f"messages file {path} is nested too deeply to read") from None
    try:
        return validate_messages(data)
    except ValueError as exc:
        raise CliError(f"messages file {path}: {exc}") from exc


def _sampling_params(args, stop_ids: tuple[int, ...]) -> SamplingParams:
    if args.greedy and args.temperature is not None:
        raise CliError("--greedy and --temperature exclude each other")
    if args.seed is not None and not args.temperature:
        raise CliError("--seed needs --temperature > 0 (greedy decoding uses no randomness)")
    try:
        return SamplingParams(
            temperature=args.temperature or 0.0, top_k=args.top_k, top_p=args.top_p,
            repetition_penalty=args.repetition_penalty, seed=args.seed, max_tokens=args.max_tokens,
            stop_token_ids=stop_ids,
        )  # fmt: skip
    except ValueError as exc:
        raise CliError(str(exc)) from exc


def _model_dir(args) -> Path:
    """--model, or the conversion of --gguf (made on first use, cached by the file's sha256)."""
    if args.gguf is None:
        return args.model
    from .model.convert import convert_cached  # needs the `gguf` package, a build-time dependency

    return convert_cached(args.gguf, args.gguf_cache)


def _tokenizer(model_dir: Path) -> tuple[dict, Tokenizer]:
    manifest = read_manifest(model_dir)
    return manifest, Tokenizer.from_manifest(manifest)


def _prompt_ids(prompt: str | None, messages: list[dict] | None, manifest: dict, tok: Tokenizer) -> list[int]:
    """--prompt's ids as the legacy Completions API makes them (the text as it is, BOS / EOS as the model's file
    says: llama.cpp's add_special; no template), or the messages rendered by the model's chat template."""
    if prompt is None:
        return Conversation(tok, ChatTemplate.from_manifest(manifest, tok), messages).prompt_ids()
    ids = tok.encode(prompt, add_special=True)
    if not ids:
        raise CliError("--prompt is empty and the model adds no BOS token: give some text to continue")
    return ids


def cmd_generate(args) -> dict:
    """Render the chat (or take --prompt as it is), generate, and return {"prompt_ids", "output_ids", "text"}."""
    messages = None if args.messages_json is None else _load_messages(args.messages_json)
    args.model = _model_dir(args)
    manifest, tok = _tokenizer(args.model)
    # llama.cpp's end-of-generation set (e.g. <|im_end|> for ChatML, <|eot_id|> for Llama 3) and EOS.
    stop_ids = tuple(sorted(tok.eog_ids | ({tok.eos_token_id} - {None})))
    # --ignore-eos: the only stop id is the vocabulary size, an id no model emits (an empty tuple would mean
    # the engine's defaults), so exactly --max-tokens tokens come out unless the context fills.
    params = _sampling_params(args, (manifest["config"]["vocab"],) if args.ignore_eos else stop_ids)
    prompt_ids = _prompt_ids(args.prompt, messages, manifest, tok)
    context = manifest["config"]["context_length"]
    if len(prompt_ids) >= context:
        raise CliError(f"prompt has {len(prompt_ids)} tokens; the model context is {context}; shorten the "
                       f"{'messages' if args.prompt is None else 'prompt'}")
    extra = {}
    if args.backend == "wgpu":
        extra = _generate_wgpu(args, prompt_ids, params)
        output_ids = extra.pop("output_ids")
        del extra["finish_reason"]
    else:
        output_ids, _ = generate_ids(ModelWeights.load(args.model), tok, prompt_ids, params)
    text_ids = output_ids[:-1] if output_ids[-1] in stop_ids and not args.ignore_eos else output_ids
    return {"prompt_ids": prompt_ids, "output_ids": output_ids, "text": tok.decode(text_ids), **extra}


def _generate_wgpu(args, prompt_ids: list[int], params: SamplingParams) -> dict:
    from .backends.webgpu.device import WebGPUUnavailable
    from .backends.webgpu.native_generate import generate_timed
    from .gpu_budget import BudgetExceeded

    tuning = {} if args.tuning_cache is None else {"tuning_cache": args.tuning_cache}
    try:
        return asyncio.run(generate_timed(args.model, prompt_ids, params, budget_mib=args.budget_mib,
                                          block_size=BLOCK_SIZE, kernels=args.kernels,
                                          pipeline_decode=not args.no_pipeline, **tuning))
    except ModuleNotFoundError as exc:
        if exc.name != "wgpu":
            raise
        raise CliError("--backend wgpu needs wgpu-py: pip install wgpu==0.32.0") from exc
    except (WebGPUUnavailable, BudgetExceeded) as exc:
        raise CliError(str(exc)) from exc


def cmd_complete(args) -> int:
    """Answer one request body through pagedkv.api.Engine: the chat.completion JSON (a body with a prompt and no
    messages: legacy Completions, the text_completion), or with stream: true its chunks as `data: {...}` lines
    ending in `data: [DONE]`. A refused request prints OpenAI's error JSON on stdout and exits 1 (HTTP's status
    is in the message on stderr); bad command-line input exits 2."""
    from .api import ApiError, Engine

    try:
        body = json.loads(Path(args.body_json).read_text(encoding="utf-8"))
        engine = Engine([_model_dir(args), *args.also], budget_mib=args.budget_mib, block_size=BLOCK_SIZE)
    except (OSError, CliError, ValueError, RecursionError, ApiError) as exc:
        if isinstance(exc, ApiError):
            return _api_error(exc)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    legacy = isinstance(body, dict) and "prompt" in body and "messages" not in body
    try:
        result = (engine.completions if legacy else engine.chat.completions).create(body)
        if isinstance(result, dict):
            print(json.dumps(result, ensure_ascii=False))
            return 0
        for piece in result:
            print(f"data: {json.dumps(piece, ensure_ascii=False)}\n", flush=True)
        print("data: [DONE]\n")
        return 0
    except ApiError as exc:
        return _api_error(exc)


def _api_error(exc) -> int:
    print(json.dumps(exc.body()))
    print(f"error {exc.status}: {exc.message}", file=sys.stderr)
    return 1


def cmd_tokenize(args) -> dict:
    """Encode --text (special tokens recognised) and return {"ids"}."""
    _, tok = _tokenizer(_model_dir(args))
    return {"ids": tok.encode(args.text)}


def _model_options(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model directory (default: %(default)s)")
    which.add_argument("--gguf", type=Path, help="a GGUF of a supported family (model/families/), converted on first use")
    parser.add_argument("--gguf-cache", type=Path, default=GGUF_CACHE,
                        help="where --gguf conversions are kept, one directory per sha256 (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m pagedkv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="chat completion (or a raw --prompt continued) on the CPU reference "
                         "backend or native WebGPU")
    _model_options(gen)
    gen.add_argument("--backend", choices=BACKENDS, default="cpu",
                     help="cpu: the numpy reference; wgpu: the WebGPU kernels on a native adapter through wgpu-py "
                          "(pip install wgpu), adding timings and the adapter to --json (default: %(default)s)")
    gen.add_argument("--budget-mib", type=int, default=1024, help="GPU memory budget of --backend wgpu, MiB "
                     "(default: %(default)s)")
    gen.add_argument("--kernels", choices=("auto", "cpu", "gpu"), default="auto",
                     help="--backend wgpu's kernel family: auto takes cpu on software adapters (default: %(default)s)")
    gen.add_argument("--tuning-cache", type=Path, help="where the gpu family's first-boot tuning is cached "
                     "(default: .cache/gpu_tuning.json)")
    gen.add_argument("--no-pipeline", action="store_true", help="--backend wgpu: submit each decode step only "
                     "after the last one's ids are read (the baseline of the pipelined decode)")
    given = gen.add_mutually_exclusive_group(required=True)
    given.add_argument("--messages-json", help='file with [{"role": ..., "content": ...}, ...], rendered by the '
                       "model's chat template")
    given.add_argument("--prompt", help="a text continued as it is (a base model): no chat template; BOS as the "
                       "model's file says")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--ignore-eos", action="store_true",
                     help="never stop at an end-of-generation token: exactly --max-tokens (a timing run)")
    gen.add_argument("--greedy", action="store_true", help="argmax decoding (the default)")
    gen.add_argument("--temperature", type=float)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--repetition-penalty", type=float, default=1.0)
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    comp = sub.add_parser("complete", help="an OpenAI Chat Completions request body (or a legacy Completions one: "
                          "a prompt, no messages) in, the response out (pagedkv.api.Engine on the CPU backend; "
                          "stream: true prints server-sent events)")
    _model_options(comp)
    comp.add_argument("--body-json", required=True, help="file with the request body ({model, messages, ...}, or "
                      "{model, prompt, ...}); its model must be a model directory's name")
    comp.add_argument("--also", type=Path, action="append", default=[], metavar="MODEL_DIR",
                      help="another model directory to load into the same budget (repeatable)")
    comp.add_argument("--budget-mib", type=int, default=1024, help="weights + KV pool, MiB (default: %(default)s)")
    tok = sub.add_parser("tokenize", help="token ids of a text")
    _model_options(tok)
    tok.add_argument("--text", required=True)
    tok.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status. Output is printed only after success."""
    args = build_parser().parse_args(argv)
    if args.command == "complete":
        return cmd_complete(args)
    try:
        result = cmd_generate(args) if args.command == "generate" else cmd_tokenize(args)
    except (CliError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    elif args.command == "generate":
        print(result["text"])
    else:
        print(" ".join(map(str, result["ids"])))
    return 0
