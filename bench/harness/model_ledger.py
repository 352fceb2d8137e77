"""The GPU ledger's split of a budget for one GGUF model, from the code that loads it.

    python3 -m bench.harness.model_ledger (--gguf FILE | --model synthetic-1.5b) [--budget-mib 1024]

The file goes the way `python3 -m pagedkv generate --gguf FILE` takes it (gguf_reader -> convert_cached,
kept under .cache/models/<sha256>/), then through the page's verdict (app user_models.check_fits ->
memory_plan.plan_kv_pool, the reservations create() makes): weights, scratch and staging first, the KV
pool gets the rest. No GPU is needed. The budgets in REFUSAL_MIB show the page's refusal with its numbers:
the first check the page runs (weights alone, before converting), then the ledger's full verdict.
bench/kv_sim.py --model / --gguf replays the seeds' workload on the KV pool this leaves.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench import ROOT
from pagedkv.gpu_budget import MIB
from pagedkv.model.convert import convert_cached, open_gguf
from pagedkv.model.synthetic import cached_synthetic_gguf
from pagedkv.model.weights import read_manifest
from pagedkv_app.user_models import ModelRefused, check_fits, check_weights_fit

CACHE = ROOT / ".cache"
MODELS = {"synthetic-1.5b": ("1.5b", 0)}  # --model name -> (synthetic preset, seed)
DEFAULT_MAX_BINDING = 128 * MIB  # WebGPU's default maxStorageBufferBindingSize (the smallest an adapter may have)
REFUSAL_MIB = (768, 880)


def model_path(model: str, cache: Path = CACHE) -> Path:
    """The GGUF of a --model name, written into cache/synthetic/ on first use."""
    if model not in MODELS:
        raise ValueError(f"unknown --model {model!r}; known: {sorted(MODELS)}")
    preset, seed = MODELS[model]
    return cached_synthetic_gguf(cache / "synthetic", preset, seed, models_cache=cache / "models")


def refusal(reader, manifest: dict, name: str, budget_bytes: int, **plan) -> str | None:
    """The page's refusal at budget_bytes (its first failing check), or None when the model fits."""
    try:
        check_weights_fit(reader, budget_bytes)
        check_fits(manifest, name=name, budget_bytes=budget_bytes, **plan)
    except ModelRefused as exc:
        return str(exc)
    return None


def model_ledger(path: Path, *, budget_bytes: int, block_size: int = 16, kv_dtype: str = "f16",
                 max_binding: int = DEFAULT_MAX_BINDING, cache: Path = CACHE,
                 refusal_mib: tuple[int, ...] = REFUSAL_MIB) -> dict:
    """Where budget_bytes goes for the GGUF at path (ModelRefused when it does not fit), and the refusals."""
    t0 = time.perf_counter()
    reader = open_gguf(path)
    check_weights_fit(reader, budget_bytes)  # the page's first check, before it converts anything
    model_dir = convert_cached(path, cache / "models")
    convert_s = time.perf_counter() - t0
    manifest = read_manifest(model_dir)
    plan = {"block_size": block_size, "kv_dtype": kv_dtype, "max_binding": max_binding}
    fit = check_fits(manifest, name=path.name, budget_bytes=budget_bytes, **plan)
    kv_bytes = fit["num_blocks"] * fit["block_bytes"]
    config = manifest["config"]
    return {
        "file": path.name, "file_bytes": path.stat().st_size, "config": config,
        "gguf_tensor_bytes": sum(t.n_bytes for t in reader.tensors),
        "budget_bytes": budget_bytes, "kv_dtype": kv_dtype, "block_size": block_size, "max_binding": max_binding,
        "weights_bytes": fit["weights_bytes"], "scratch_bytes": fit["scratch_bytes"],
        "staging_bytes": fit["staging_bytes"], "fixed_bytes": fit["fixed_bytes"],
        "kv_bytes": kv_bytes, "unused_bytes": budget_bytes - fit["fixed_bytes"] - kv_bytes,
        "bytes_per_token": fit["bytes_per_token"], "block_bytes": fit["block_bytes"],
        "num_blocks": fit["num_blocks"], "kv_tokens": fit["num_blocks"] * block_size,
        "refusals": {f"{mib} MiB": refusal(reader, manifest, path.name, mib * MIB, **plan) for mib in refusal_mib},
        "convert_s": round(convert_s, 2),
    }


def resolve(gguf: Path | None, model: str | None) -> Path:
    """The GGUF of --gguf or --model (generated on first use)."""
    if gguf is not None:
        return gguf
    return model_path(model)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--gguf", type=Path, help="a GGUF of a supported family")
    which.add_argument("--model", choices=sorted(MODELS), help="a synthetic model, generated on first use")
    ap.add_argument("--budget-mib", type=int, default=1024)
    ap.add_argument("--kv-dtype", default="f16")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    path = resolve(args.gguf, args.model)
    generate_s = time.perf_counter() - t0
    out = model_ledger(path, budget_bytes=args.budget_mib * MIB, kv_dtype=args.kv_dtype)
    out["generate_s"] = round(generate_s, 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
