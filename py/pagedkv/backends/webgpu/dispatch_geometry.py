"""Every dispatch of one decode step (one sequence), or of one prefill chunk of N tokens (--prefill N: a new
sequence's first N tokens), of SmolLM2-135M or the synthetic 1.5B preset (--model), from the plan's own call
builders.

    PYTHONPATH=py python3 -m pagedkv.backends.webgpu.dispatch_geometry [--json] [--kernels cpu|gpu]
        [--model smollm2-135m-instruct|synthetic-1.5b] [--context N | --prefill N] [--no-subgroups]
        [--kv-dtype f16|int8|...] [--no-fold]

Pure CPython, no GPU: records the step the way WebGpuBackend does (plan.layer_program with the family's
kernels, plan.step_slots for the grids) over placeholder buffers, and lists per dispatch the kernel, its
workgroup size, workgroup grid and invocations (grid x workgroup size), then the totals: dispatches, and
the fewest invocations of a hot dispatch (matvec, matmul, fused FFN, attention). What a real GPU is given to fill; the gpu
family exists to raise the matvec / matmul and decode attention rows (issue 18) and to launch few dispatches
(issue 30: 5 a decode layer with f32 / f16 KV; issue 50: 4 where the FFN is one dispatch, ffn_gpu_main.wgsl, 3
where q | k | v runs inside the attention, paged_attention_gpu_fold.wgsl).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from types import SimpleNamespace

from pagedkv.backends.webgpu.kv_attention_gpu import decode_partition_blocks
from pagedkv.backends.webgpu.kv_kernels import KVKernels
from pagedkv.backends.webgpu.kv_layout import GpuKVLayout
from pagedkv.backends.webgpu.memory_plan import partition_blocks
from pagedkv.backends.webgpu.model_kernels import FAMILIES, MAX_WORKGROUPS_PER_DIM, GpuShapes
from pagedkv.backends.webgpu.plan import SLOT_INDEX, PlanKey, StepShape, layer_program, step_slots
from pagedkv.kv.spec import KV_DTYPES, KVSpec
from pagedkv.model.config import ModelConfig
from pagedkv.model.synthetic import PRESETS

# SmolLM2-135M-Instruct as convert.py reads it from its GGUF file
SMOLLM2 = ModelConfig("llama", 30, 576, 9, 3, 64, 1536, 49152, 100000.0, "adjacent_pairs", 1e-5, 8192, True)
BLOCK_SIZE = 16


class _Named(dict):
    """Placeholder buffers: each one is its own name."""

    def __missing__(self, name: str) -> str:
        return name


class _Weights(dict):
    """A model's uploaded tensors as (dtype, part placeholders): f32 norms, `embedding` the embedding table / tied
    LM head's type, `layers` the layers' matrices' type."""

    def __init__(self, embedding: str, layers: str):
        super().__init__()
        self.embedding, self.layers = embedding, layers

    def __missing__(self, name: str) -> tuple:
        dtype = "f32" if "norm" in name else self.embedding if name == "token_embd.weight" else self.layers
        return dtype, (f"{name}.qs", f"{name}.scales")


# --model: name -> (config, embedding type, layer matrices' type). SmolLM2's GGUF: a Q8_0 tied embedding, Q4_1
# layers; the synthetic 1.5B preset (model/synthetic.py, the device runs' larger model): Q4_K everywhere.
MODELS = {"smollm2-135m-instruct": (SMOLLM2, "q8_0", "q4_1"), "synthetic-1.5b": (PRESETS["1.5b"], "q4_K", "q4_K")}


def decode_step(kernels: str, context: int, subgroups: bool = True, model: str = "smollm2-135m-instruct",
                kv_dtype: str = "f16", fold: bool = True) -> list[dict]:
    """The dispatches of one decode step of one sequence at `context` tokens, in submission order (fold: q | k | v
    inside the attention where it can be, WebGpuBackend.fold_qkv)."""
    return _step(kernels, context, 1, subgroups, model, kv_dtype, fold)


def prefill_step(kernels: str, tokens: int, subgroups: bool = True, model: str = "smollm2-135m-instruct",
                 kv_dtype: str = "f16") -> list[dict]:
    """The dispatches of one prefill chunk: a new sequence's first `tokens` tokens, in submission order."""
    return _step(kernels, tokens, tokens, subgroups, model, kv_dtype)


HOT = ("matvec", "matmul", "ffn_gpu", "paged_attention", "paged_prefill_attention")  # kernel name prefixes


def totals(rows: list[dict]) -> dict:
    """Dispatches of a step and the fewest invocations of its hot ones (matvec, matmul, fused FFN, attention)."""
    return {"count": len(rows),
            "min_hot_invocations": min(r["invocations"] for r in rows if r["kernel"].startswith(HOT))}


def _step(kernels: str, context: int, new_tokens: int, subgroups: bool, model: str, kv_dtype: str,
          fold: bool = True) -> list[dict]:
    if kernels not in FAMILIES:
        raise ValueError(f"kernels must be one of {FAMILIES}, got {kernels!r}")
    if model not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {model!r}")
    config, embedding_type, layer_type = MODELS[model]
    if not 1 <= context <= config.context_length:
        raise ValueError(f"context must be 1..{config.context_length}, got {context}")
    blocks = math.ceil(config.context_length / BLOCK_SIZE)
    layout = GpuKVLayout(KVSpec.of(config, block_size=BLOCK_SIZE, dtype=kv_dtype), blocks)
    ctx = SimpleNamespace(info=SimpleNamespace(limits={"maxComputeWorkgroupsPerDimension": MAX_WORKGROUPS_PER_DIM}))
    kv = KVKernels(ctx, layout, config.n_heads, family=kernels, subgroups=subgroups)
    kv_sizes = {name: size for name, _, _, size in kv.decode.specs}  # the KV kernels' workgroup sizes
    kv_sizes[kv.prefill.name] = kv_sizes[kv.prefill_resume] = kv.prefill.workgroup
    kv_sizes["kv_write"] = layout.kv_write_workgroup or kv.workgroup_size
    caches = [SimpleNamespace(k=f"k{i}", v=f"v{i}") for i in range(config.n_layers)]
    # one KV group (neither model has window layers): every layer its own buffers, the whole block tables / slot
    # mapping
    b = SimpleNamespace(config=config, scratch=_Named(), weights=_Weights(embedding_type, layer_type), weight_rows={},
                        kv_kernels=kv,
                        kv_pool=SimpleNamespace(caches=caches, cache_of=caches.__getitem__),
                        group_binding=lambda name, layer: name,
                        kernels=kernels, subgroups=subgroups, gpu_shapes=GpuShapes(),
                        shader_f16=False, gpu_matmul=kernels == "gpu",  # both models: quantized matrices only
                        max_num_seqs=1,  # one sequence: the sampling kernels sized for it
                        # the q | k | v fold on, with a real GPU's 32 KiB of workgroup memory (the 1.5B's fold needs
                        # 20.4 KiB; a 16 KiB device keeps its q | k | v matvec)
                        fold_qkv=fold, workgroup_storage=32768)
    used = math.ceil(context / BLOCK_SIZE)
    part_blocks = kv.partition_blocks  # the fixed split; the gpu family's decode sizes it as WebGpuBackend does
    if kernels == "gpu" and new_tokens == 1:
        part_blocks = decode_partition_blocks(b.gpu_shapes.split, 1, config.n_heads // kv.head_tile, used, BLOCK_SIZE,
                                              math.ceil(blocks / partition_blocks(BLOCK_SIZE)))
    shape = StepShape(num_tokens=new_tokens, num_seqs=1, table_width=used, max_parts=math.ceil(used / part_blocks),
                      num_tiles=math.ceil(new_tokens / kv.query_tile), decode=new_tokens == 1,
                      partition_blocks=part_blocks)
    grids, _ = step_slots(b, shape)  # (slots, 3)
    rows = []
    key = PlanKey.of(new_tokens, 1, greedy=True, prefill_passes=kv.prefill.passes(context))  # greedy: ids come back
    for dispatches in layer_program(b, key):
        for d in dispatches:
            grid = tuple(int(g) for g in grids[SLOT_INDEX[d.slot]])
            if grid[0] == 0:  # skipped this step (the reduce of a single partition)
                continue
            size = kv_sizes.get(d.shader, kv.workgroup_size) if d.constants is None else dict(d.constants)[
                "WORKGROUP_SIZE"]
            rows.append({"kernel": d.shader, "slot": d.slot, "workgroup_size": size, "workgroups": list(grid),
                         "invocations": size * math.prod(grid)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", choices=FAMILIES, default="gpu")
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2-135m-instruct",
                        help="SmolLM2-135M's shapes or the synthetic 1.5B preset's (model/synthetic.py)")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--prefill", type=int, metavar="N", help="list a prefill chunk of N tokens instead")
    parser.add_argument("--no-subgroups", action="store_true", help="the gpu family's workgroup-tree kernels")
    parser.add_argument("--kv-dtype", default="f16", choices=sorted(KV_DTYPES), help="the KV cache's element type")
    parser.add_argument("--no-fold", action="store_true", help="q | k | v a dispatch of its own, not in the attention")
    parser.add_argument("--json", action="store_true", help="one JSON object (else a table)")
    args = parser.parse_args(argv)
    if args.prefill is None:
        rows = decode_step(args.kernels, args.context, not args.no_subgroups, args.model, args.kv_dtype,
                           not args.no_fold)
        step = {"context": args.context}
    else:
        rows = prefill_step(args.kernels, args.prefill, not args.no_subgroups, args.model, args.kv_dtype)
        step = {"prefill": args.prefill}
    if args.json:
        print(json.dumps({"model": args.model, "kernels": args.kernels, "kv_dtype": args.kv_dtype,
                          **step, **totals(rows), "dispatches": rows}, indent=1))
        return 0
    print(f"{'kernel':<35} {'slot':<10} {'wg size':>7} {'workgroups':>16} {'invocations':>11}")
    for r in rows:
        print(f"{r['kernel']:<35} {r['slot']:<10} {r['workgroup_size']:>7} {str(tuple(r['workgroups'])):>16} "
              f"{r['invocations']:>11,}")
    t = totals(rows)
    print(f"{t['count']} dispatches; the smallest hot one (matvec, matmul, FFN, attention) launches "
          f"{t['min_hot_invocations']:,} invocations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
