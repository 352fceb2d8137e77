"""`python3 -m pagedkv generate --backend wgpu`: one request through LLMEngine on a WebGpuBackend over a native
(wgpu-py) device, timed as the page times it (bench/generate.py): time to first token, prefill and decode rates; the first decode
step (where the decode pipelines compile) is reported alone (first_decode_ms) and left out of decode_tok_s, which
counts the decode_tokens after it."""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from ...engine import EngineConfig, LLMEngine
from ...gpu_budget import MIB
from ...model.weights import read_manifest
from ...sampling import SamplingParams
from ...tokenizer import Tokenizer
from .backend import WebGpuBackend
from .model_kernels import choose_family
from .native import NativeDevice
from .tuning import JsonFileStore, tune_device

TUNING_CACHE = Path(__file__).resolve().parents[4] / ".cache" / "gpu_tuning.json"  # the repo's .cache/


async def load_backend(model_dir: Path, *, budget_mib: int, block_size: int, max_num_batched_tokens: int,
                       max_num_seqs: int, kernels: str = "auto",
                       tuning_cache: Path = TUNING_CACHE) -> tuple[NativeDevice, WebGpuBackend, dict, dict]:
    """A native device and the model of `model_dir` on it, in the kernel family `kernels` (auto | cpu | gpu;
    the gpu family tuned at first boot, cached in `tuning_cache`): (device, backend, manifest, kernel report)."""
    manifest = read_manifest(model_dir)
    ctx = await NativeDevice.create()
    family, why = choose_family(kernels, ctx.info.name, False)  # wgpu-py reports no isFallbackAdapter

    async def shard(name: str) -> bytes:
        return (Path(model_dir) / name).read_bytes()

    report = {"family": family, "why": why}
    if family == "gpu":
        import wgpu

        shapes, report["tuning"] = await tune_device(ctx, manifest, JsonFileStore(tuning_cache),
                                                     f"wgpu-py {wgpu.__version__}")
    backend = await WebGpuBackend.create(ctx, manifest, shard, budget_bytes=budget_mib * MIB, block_size=block_size,
                                         max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                         kernels=family)
    if family == "gpu":
        backend.gpu_shapes = shapes
    return ctx, backend, manifest, report


async def generate_timed(model_dir: Path, prompt_ids: Sequence[int], params: SamplingParams, *, budget_mib: int,
                         block_size: int, kernels: str = "auto", tuning_cache: Path = TUNING_CACHE,
                         pipeline_decode: bool = True) -> dict:
    """Generate on the native device; returns output_ids, finish_reason, timings, the adapter and the kernels.

    pipeline_decode=False turns off the decode chain (each step waits for its ids before the next is submitted),
    the baseline that the pipelined decode is measured against."""
    config = EngineConfig(max_num_batched_tokens=max(256, len(prompt_ids)), pipeline_decode=pipeline_decode)
    ctx, backend, manifest, report = await load_backend(
        model_dir, budget_mib=budget_mib, block_size=block_size, max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs, kernels=kernels, tuning_cache=tuning_cache)
    try:
        engine = LLMEngine(backend, Tokenizer.from_manifest(manifest), config)
        t0 = time.perf_counter()
        request = engine.request(engine.add_request(list(prompt_ids), params))
        t_first = t_second = None
        while engine.has_unfinished:
            await engine.step()
            if t_first is None and request.output_ids:
                t_first = time.perf_counter()
            elif t_second is None and len(request.output_ids) > 1:
                t_second = time.perf_counter()
        t_end = time.perf_counter()
    finally:
        backend.destroy()
    # The first decode step compiles the decode pipelines: it is reported alone and left out of the rate.
    decoded = len(request.output_ids) - 2
    pipelined = bool(getattr(backend, "pipelines", False)) and pipeline_decode
    timings = {"ttft_ms": round(1000 * (t_first - t0), 1), "prefill_tok_s": round(len(prompt_ids) / (t_first - t0), 2),
               "first_decode_ms": round(1000 * (t_second - t_first), 1) if t_second is not None else None,
               "decode_tok_s": round(decoded / (t_end - t_second), 2) if decoded > 0 else None,
               "decode_tokens": max(decoded, 0), "pipelined": pipelined}
    info = ctx.info
    adapter = {"name": info.name, "backend": info.backend, "features": list(info.features)}
    return {"output_ids": request.output_ids, "finish_reason": request.finish_reason, "timings": timings,
            "adapter": adapter, "kernels": report}
