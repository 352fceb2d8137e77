"""Weight matrices the WebGPU plan multiplies in one dispatch: a layer's q/k/v projections and its gate/up
projections, stacked by rows when the weights are uploaded (gate/up interleaved in runs of 4 rows), with the
RMSNorm weight of their input stored after the codes (after the weights of a float stack: f32, f16, bf16).

Stacking is lossless: every weight layout (model/layout.py) is row-major with per-row blocks, so the
rows of the stacked tensor are the members' rows, bytes unchanged (members of different types are first
promoted to their common type, losslessly: model/quants.PROMOTIONS). One matvec over the stacked rows costs
one dispatch instead of three (or two); on SwiftShader each dispatch has a fixed cost of ~0.45 ms.
Members with no lossless common type (llama.cpp's Q4_K_M: q4_K q / k beside a q6_K v) are not stacked
(stacks()): they are uploaded under their own names and the plan multiplies them one by one into the
stacked path's output layout (plan.py, quant_epilogue.wgsl's Y_STRIDE / Y_OFFSET / SILU_MUL).
"""
from __future__ import annotations

import numpy as np

from ...model.layout import DTYPE_PARTS, QK
from ...model.quants import common_type, pack, part_nbytes, promote, unpack

# stacked tensor (per layer) -> its members in row order, then the RMSNorm weight of its input, which is
# stored after the codes in the stacked qs part (the matvec kernels' NORM variant reads it from there)
FUSED = {
    "attn_qkv.weight": ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_norm.weight"),
    "ffn_gate_up.weight": ("ffn_gate.weight", "ffn_up.weight", "ffn_norm.weight"),
}
_MEMBER = {member: (fused, i) for fused, members in FUSED.items() for i, member in enumerate(members)}
# Gate and up rows alternate in runs of four, so the 8 rows one matvec / matmul thread computes are 4 gate
# rows and their 4 up rows and the kernel's SWIGLU variant writes silu(gate) * up directly.
INTERLEAVE = {"ffn_gate_up.weight": 4}


def fused_member(name: str) -> tuple[str, int, int] | None:
    """(stacked tensor, member index, member count): ("blk.3.attn_qkv.weight", 1, 4) for "blk.3.attn_k.weight";
    None for a tensor that is not stacked."""
    prefix, dot, leaf = name.rpartition(".weight")[0].rpartition(".")
    hit = _MEMBER.get(f"{leaf}.weight") if prefix.startswith("blk.") and dot else None
    if hit is None:
        return None
    return f"{prefix}.{hit[0]}", hit[1], len(FUSED[hit[0]])


def stacks(dtypes) -> bool:
    """Whether matrices of these types (a stack's members, its norm weight excluded) are stacked: they have a
    lossless common type."""
    return common_type(set(dtypes)) is not None


def member_names(stacked: str) -> list[str]:
    """The matrices of a stacked tensor in row order: ["blk.3.ffn_gate.weight", "blk.3.ffn_up.weight"] for
    "blk.3.ffn_gate_up.weight"."""
    block, layer, leaf = stacked.split(".", 2)
    return [f"{block}.{layer}.{member}" for member in FUSED[leaf][:-1]]


def _part_bytes(dtype: str, rows: int, cols: int) -> dict[str, int]:
    """Exact bytes of each part of a (rows, cols) tensor, without the padding of a part to 4 bytes; the first
    part holds the codes ("qs"; "data" for a float matrix), which the norm weight follows."""
    return part_nbytes(dtype, (rows, cols))


def stack_rows(name: str, members: list[tuple[str, tuple, dict]]) -> tuple[str, tuple[int, int], dict]:
    """Stack (dtype, (rows, cols), parts) members by rows, the last member being the f32 (cols,) RMSNorm weight
    appended to qs -> (dtype, (sum rows, cols), parts as bytes)."""
    *members, (gain_dtype, gain_shape, gain_parts) = members
    dtype = common_type({dtype for dtype, _, _ in members})
    cols = {shape[1] for _, shape, _ in members}
    if dtype is None or len(cols) != 1:
        raise ValueError(f"{name}: the stacked projections need one dtype and one column count (types that promote "
                         f"losslessly to one count as one), got {[(d, list(shape)) for d, shape, _ in members]}; "
                         "re-convert the model with one quantization for these projections")
    members = [(dtype, shape, _promoted(member_dtype, dtype, shape, member_parts))
               for member_dtype, shape, member_parts in members]
    n_cols = cols.pop()
    if n_cols % QK:
        raise ValueError(f"{name}: cols must be a multiple of {QK}, got {n_cols}")
    if gain_dtype != "f32" or tuple(gain_shape) != (n_cols,):
        raise ValueError(f"{name}: the norm weight must be f32 ({n_cols},), got {gain_dtype} {list(gain_shape)}")
    run = INTERLEAVE.get(name.split(".", 2)[-1], 0)
    if run and (len({shape[0] for _, shape, _ in members}) != 1 or members[0][1][0] % run):
        raise ValueError(f"{name}: interleaved members need one row count, a multiple of {run}, got "
                         f"{[shape[0] for _, shape, _ in members]}")
    parts = {}
    for part in _part_bytes(dtype, 1, n_cols):
        chunks = []
        for _, (rows, _), member_parts in members:
            want = _part_bytes(dtype, rows, n_cols)[part]
            raw = bytes(member_parts[part])
            if len(raw) < want:
                raise ValueError(f"{name}: a member's {part!r} part holds {len(raw)} bytes, needs {want}")
            chunks.append(np.frombuffer(raw[:want], np.uint8).reshape(rows // run if run else 1, -1))
        raw = np.concatenate(chunks, axis=1).tobytes()  # runs of `run` rows alternate (one run: all rows)
        parts[part] = raw + b"\0" * (-len(raw) % 4)
    parts[DTYPE_PARTS[dtype][0]] += bytes(gain_parts["data"])[: 4 * n_cols]
    return dtype, (sum(shape[0] for _, shape, _ in members), n_cols), parts


def _promoted(dtype: str, target: str, shape: tuple, parts: dict) -> dict:
    if dtype == target:
        return parts
    return pack(target, promote(dtype, target, unpack(dtype, tuple(shape), parts)))


def stacked_nbytes(members: list[tuple[str, tuple]]) -> dict[str, int]:
    """Bytes of each part stack_rows makes from members given as (dtype, shape), the norm weight last."""
    *matrices, _ = members
    dtype = common_type({d for d, _ in matrices})
    if dtype is None:  # refused here, before the backend uploads anything (its ledger plan sizes the stacks first)
        raise ValueError(f"stacked projections of types {sorted({d for d, _ in matrices})} have no lossless common "
                         "type; re-convert the model with one quantization for these projections")
    cols = matrices[0][1][1]
    sizes = {part: 0 for part in _part_bytes(dtype, 1, cols)}
    for _, (rows, _) in matrices:
        for part, n in _part_bytes(dtype, rows, cols).items():
            sizes[part] += n
    sizes = {part: n + -n % 4 for part, n in sizes.items()}
    sizes[DTYPE_PARTS[dtype][0]] += 4 * cols  # the norm weight
    return sizes



# q / k / v biases (qwen2) stacked like their weights: rope.wgsl adds the (q | k | v) row before it rotates.
BIAS_MEMBERS = ("attn_q.bias", "attn_k.bias", "attn_v.bias")
STACKED_BIAS = "attn_qkv.bias"


def bias_member(name: str) -> tuple[str, int] | None:
    """(stacked bias, member index): ("blk.3.attn_qkv.bias", 1) for "blk.3.attn_k.bias"; None otherwise."""
    prefix, _, leaf = name.partition(".")[2].partition(".")
    if not name.startswith("blk.") or leaf not in BIAS_MEMBERS:
        return None
    return f"blk.{prefix}.{STACKED_BIAS}", BIAS_MEMBERS.index(leaf)
