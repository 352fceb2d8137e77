"""Host side of the model's WGSL kernels: dispatch geometry and uniforms.

Each `*_call` function is pure (no GPU): it validates shapes and returns a
KernelCall (shader, override constants, workgroup grid, uniform bytes) that a
dispatch plan (plan.py) records once and replays. Buffer binding order of every
call = the shader's @binding order. Running one call on numpy arrays is test and
benchmark code: tests/browser/kernel_calls.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ...model.layout import QK
from ...model.quants import WEIGHT_TYPES
from .kv_attention_gpu import SPLIT_WORKGROUPS

MAX_WORKGROUPS_PER_DIM = 65535
# weight types with matvec_* / matmul_* kernels (cpu family) and matvec_gpu[_sg]_* (gpu family); a plan picks
# each matrix's kernel by its dtype
QUANTIZED = tuple(name for name, t in WEIGHT_TYPES.items() if t.quantized)
# float weight types: matvec_<type> / matmul_<type> / embedding_<type> and matvec_gpu[_sg]_<type> over
# shaders/<type>_words.wgsl; the gpu family prefills them on the cpu family's matmuls (no GPU_MATMUL_TYPES)
FLOATS = ("f32", "f16", "bf16")
LINEAR_TYPES = QUANTIZED + FLOATS
MATVEC_ROWS = 8  # output rows per thread in matvec_*.wgsl (one token per thread)
MATMUL_TILE = (8, 4)  # (rows, tokens) per thread in matmul_*.wgsl
FAMILIES = ("cpu", "gpu")  # kernel families: cpu for software adapters (SwiftShader, lavapipe), gpu for real GPUs
MATVEC_ROW_GROUPS = (1, 2, 4, 8)  # groups of 8 rows a gpu-family matvec workgroup may hold (matvec_gpu_main.wgsl)
GPU_WORKGROUP_SIZES = (64, 128, 256)  # threads of a gpu-family matvec workgroup (a power of two: reduce_tree.wgsl)
# A gpu-family matmul workgroup (matmul_gpu_main.wgsl): (threads, threads along rows[, tokens a thread: 4, 2 or
# 1, default 4]); each thread owns 8 rows x 4 tokens by default, so the default tile is 64 rows x 32 tokens,
# staged in 13.5 KiB of workgroup memory.
GPU_MATMUL_SHAPE = (64, 8)
GPU_THREAD_TOKENS = (4, 2, 1)
# Weight types with a gpu-family tiled matmul: every quantized type (K-quants too: a word's weights decoded with
# its block's scales as the matvec decodes them). A model with a float matrix prefills on the cpu family's
# matmuls (a step's grid per slot is shared by every layer, so the choice is per model: WebGpuBackend.gpu_matmul).
GPU_MATMUL_TYPES = QUANTIZED
# Weight types with f16 matvecs of their own; the others run their matvecs in f32.
GPU_F16_TYPES = ("q4_1", "q8_0")


@dataclass(frozen=True)
class GpuShapes:
    """Workgroup shapes of the gpu family's linears: matvec threads, matmul (threads, threads along rows); and
    how many workgroups its decode attention aims at (kv_attention_gpu.decode_partition_blocks). The defaults
    until first-boot tuning picks the adapter's own."""

    matvec: int = GPU_WORKGROUP_SIZES[0]
    matmul: tuple[int, ...] = GPU_MATMUL_SHAPE
    split: int = SPLIT_WORKGROUPS
    # (plan slot, matvec threads, row groups) where a projection has its own (matvec_gpu_call's row_groups)
    matvec_slots: tuple[tuple[str, int, int], ...] = ()
    matvec_row_groups: int = 1  # row groups of the matvec a call is made for (plan.layer_program sets the slot's)
    matvec_whole: tuple[str, ...] = ()  # plan slots whose matvec lanes take whole blocks (WHOLE_BLOCKS)
    matvec_whole_blocks: bool = False  # WHOLE_BLOCKS of the matvec a call is made for (for_slot sets the slot's)

    def matvec_for(self, slot: str) -> int:
        """Matvec threads of the projection in plan slot `slot` (lin_qkv, lin_h, lin_down, lm_head), else matvec."""
        return {s: threads for s, threads, _ in self.matvec_slots}.get(slot, self.matvec)

    def row_groups_for(self, slot: str) -> int:
        """Row groups of the matvec of the projection in plan slot `slot` (1: one group of every lane)."""
        return {s: groups for s, _, groups in self.matvec_slots}.get(slot, 1)

    def for_slot(self, slot: str) -> "GpuShapes":
        """These shapes with the matvec of plan slot `slot` (its threads and row groups) as the one calls use."""
        return replace(self, matvec=self.matvec_for(slot), matvec_row_groups=self.row_groups_for(slot),
                       matvec_whole_blocks=slot in self.matvec_whole)


@dataclass(frozen=True)
class KernelCall:
    """One dispatch of shaders/<shader>.wgsl: pipeline constants, workgroup grid and uniform contents."""

    shader: str
    constants: tuple[tuple[str, int], ...]
    workgroups: tuple[int, int, int]
    params: bytes  # the shader's `params` uniform, a multiple of 16 bytes

    def __post_init__(self) -> None:
        if len(self.params) % 16 or not self.params:
            raise ValueError(f"{self.shader}: uniform params must be a non-empty multiple of 16 bytes")
        if any(not 1 <= g <= MAX_WORKGROUPS_PER_DIM for g in self.workgroups):
            raise ValueError(f"{self.shader}: workgroup grid {self.workgroups} outside 1..{MAX_WORKGROUPS_PER_DIM}")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def uniform_words(*fields) -> np.ndarray:
    """A uniform block of u32 (int) and f32 (float) fields in declaration order, as u32 words padded to a
    multiple of 16 bytes (at least 16): the `params` struct every kernel here reads."""
    words = np.zeros(max(4, -(-len(fields) // 4) * 4), dtype="<u4")
    for i, value in enumerate(fields):
        words[i] = np.float32(value).view(np.uint32) if isinstance(value, float) else np.uint32(value)
    return words


def _positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def _weight(dtype: str, rows: int, cols: int) -> None:
    if dtype not in LINEAR_TYPES:
        raise ValueError(f"the linear kernels take {list(LINEAR_TYPES)}, got {dtype!r}")
    _positive(rows=rows, cols=cols)
    block = max(WEIGHT_TYPES[dtype].block, QK)  # the kernels walk every row in 32-weight blocks
    if cols % block:
        raise ValueError(f"{dtype} weight cols must be a multiple of {block}, got {cols}")


# ---------------------------------------------------------------- call builders (pure)


def linear_constants(workgroup_size: int, accumulate: bool = False, norm: bool = False,
                     swiglu: bool = False, row_groups: int = 1, whole_blocks: bool = False) -> tuple:
    """Pipeline constants of matvec_* / matmul_*: ACCUMULATE makes them add into y (a fused residual add),
    NORM (matvec only) applies the RMSNorm whose weight follows the codes in qs to x first, SWIGLU writes
    silu(gate) * up of gate/up rows interleaved in runs of 4 (backends/webgpu/fused.py); ROW_GROUPS (the gpu
    family's matvec, matvec_gpu_call) where there are more than one; WHOLE_BLOCKS (the gpu family's matvec:
    lanes take whole blocks) where set."""
    flags = (("ACCUMULATE", accumulate), ("NORM", norm), ("SWIGLU", swiglu))
    groups = (("ROW_GROUPS", row_groups),) if row_groups > 1 else ()
    whole = (("WHOLE_BLOCKS", 1),) if whole_blocks else ()
    return (("WORKGROUP_SIZE", workgroup_size),) + tuple((name, 1) for name, on in flags if on) + groups + whole


def _check_swiglu(rows: int, swiglu: bool, accumulate: bool) -> None:
    if swiglu and (rows % 8 or accumulate):
        raise ValueError(f"SWIGLU needs rows a multiple of 8 (4 gate + 4 up rows per thread) and no ACCUMULATE, "
                         f"got {rows} rows")


def matvec_call(dtype: str, rows: int, cols: int, tokens: int, workgroup_size: int = 32,
                accumulate: bool = False, norm_eps: float | None = None, swiglu: bool = False) -> KernelCall:
    """y (tokens, rows) = x (tokens, cols) @ W.T (y += ... when accumulate), decode-sized batches;
    with norm_eps, W @ rms_norm(x, g, norm_eps) where g (cols,) f32 follows the codes in qs;
    with swiglu, y (tokens, rows / 2) = silu(gate) * up; buffers: qs, dm|d, x, y, params."""
    _check_matvec(dtype, rows, cols, tokens, accumulate, norm_eps, swiglu)
    grid = (_ceil(_ceil(rows, MATVEC_ROWS), workgroup_size), tokens, 1)
    constants = linear_constants(workgroup_size, accumulate, norm_eps is not None, swiglu)
    params = uniform_words(rows, cols, tokens, float(norm_eps or 0.0)).tobytes()
    return KernelCall(f"matvec_{dtype}", constants, grid, params)


def _check_matvec(dtype: str, rows: int, cols: int, tokens: int, accumulate: bool, norm_eps: float | None,
                  swiglu: bool) -> None:
    _weight(dtype, rows, cols)
    _positive(tokens=tokens)
    _check_swiglu(rows, swiglu, accumulate)
    if norm_eps is not None and not norm_eps > 0:
        raise ValueError(f"norm_eps must be positive, got {norm_eps}")


def matvec_gpu_call(dtype: str, rows: int, cols: int, tokens: int, subgroups: bool, workgroup_size: int = 64,
                    accumulate: bool = False, norm_eps: float | None = None, swiglu: bool = False,
                    f16: bool = False, row_groups: int = 1, whole_blocks: bool = False) -> KernelCall:
    """matvec_call's result from the gpu family (matvec_gpu_main.wgsl): one workgroup of workgroup_size
    lanes (a power of two, 64..256) per 8 rows of one token, lanes along K; subgroups picks the kernel
    that reduces with subgroup operations (the device must have the `subgroups` feature), else a
    workgroup-memory tree; f16 the one whose dot products run in f16 (the device must have `shader-f16`).
    row_groups > 1 (2, 4, 8; at least 8 lanes a group): the lanes split into groups of 8 rows each, summed
    by a tree of their own, for rows too short to keep every lane busy. whole_blocks: each lane takes whole
    32-weight blocks where that adds no trip along K (whole_blocks_apply). Same buffers as matvec_call."""
    _check_matvec(dtype, rows, cols, tokens, accumulate, norm_eps, swiglu)
    if workgroup_size not in GPU_WORKGROUP_SIZES:
        raise ValueError(f"gpu-family matvec workgroups have {GPU_WORKGROUP_SIZES} threads, got {workgroup_size}")
    if row_groups not in MATVEC_ROW_GROUPS or workgroup_size // row_groups < 8:
        raise ValueError(f"a gpu-family matvec splits its lanes into {MATVEC_ROW_GROUPS} row groups of at least 8 "
                         f"lanes, got {row_groups} of {workgroup_size}")
    grid = (_ceil(rows, MATVEC_ROWS * row_groups), tokens, 1)
    constants = linear_constants(workgroup_size, accumulate, norm_eps is not None, swiglu, row_groups, whole_blocks)
    params = uniform_words(rows, cols, tokens, float(norm_eps or 0.0)).tobytes()
    return KernelCall(gpu_matvec_shader(dtype, subgroups, f16), constants, grid, params)


def whole_blocks_apply(cols: int, lanes: int, words_per_block: int = 4) -> bool:
    """Whether a gpu-family matvec's lanes (threads / row groups) take whole blocks under WHOLE_BLOCKS: where that
    adds no trip along K of cols (matvec_gpu_main.wgsl; words_per_block 4 for q4_1 and the nibble types)."""
    blocks = cols // 32
    return -(-blocks // lanes) * words_per_block <= -(-blocks * words_per_block // lanes)


def gpu_matvec_shader(dtype: str, subgroups: bool, f16: bool, io: str = "") -> str:
    """matvec_gpu[_sg][_f16]_<dtype>[io]: subgroup reduction and f16 dot products where the device has them;
    io "" | "_merge" | "_rope_kv" (shader_variants.MATVEC_IO) what the matvec reads and writes around them."""
    f16 = f16 and dtype in GPU_F16_TYPES
    return f"matvec_gpu_{'sg_' if subgroups else ''}{'f16_' if f16 else ''}{dtype}{io}"


def matmul_gpu_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(threads, threads along rows, tokens a thread) of a gpu-family matmul shape (GPU_MATMUL_SHAPE's form)."""
    if len(shape) not in (2, 3):
        raise ValueError(f"a gpu-family matmul shape is (threads, threads along rows[, tokens a thread]), got {shape}")
    threads, row_groups, per = (*shape, 4)[:3]
    if (threads not in GPU_WORKGROUP_SIZES or row_groups not in (2, 4, 8, 16) or row_groups >= threads
            or per not in GPU_THREAD_TOKENS):
        raise ValueError(f"a gpu-family matmul workgroup is (threads in {GPU_WORKGROUP_SIZES}, threads along rows "
                         f"in 2..16, a power of two below threads[, tokens a thread in {GPU_THREAD_TOKENS}]), "
                         f"got {shape}")
    return threads, row_groups, per


def matmul_gpu_call(dtype: str, rows: int, cols: int, tokens: int, shape: tuple[int, ...] = GPU_MATMUL_SHAPE,
                    accumulate: bool = False, swiglu: bool = False) -> KernelCall:
    """matmul_call's result from the gpu family (matmul_gpu_main.wgsl): a workgroup of shape = (threads,
    threads along rows[, tokens a thread, default 4]) stages a tile of 8 * shape[1] rows x shape[2] *
    shape[0] / shape[1] tokens through workgroup memory, one 32-weight block at a time. Same buffers as
    matmul_call."""
    _weight(dtype, rows, cols)
    if dtype not in GPU_MATMUL_TYPES:
        raise ValueError(f"the gpu family's tiled matmul takes {list(GPU_MATMUL_TYPES)}, got {dtype!r}")
    _positive(tokens=tokens)
    _check_swiglu(rows, swiglu, accumulate)
    threads, row_groups, per = matmul_gpu_shape(shape)
    grid = (_ceil(rows, 8 * row_groups), _ceil(tokens, per * threads // row_groups), 1)
    return KernelCall(f"matmul_gpu_{dtype}", matmul_gpu_constants(shape, accumulate, swiglu), grid,
                      uniform_words(rows, cols, tokens).tobytes())


def matmul_gpu_workgroup_bytes(shape: tuple[int, ...]) -> int:
    """Workgroup memory of matmul_gpu_main.wgsl's tiles in `shape`: (8 * row groups + tokens a thread * token
    groups) staged rows of 9 vec4<f32> (8 and one of padding)."""
    threads, row_groups, per = matmul_gpu_shape(shape)
    return (8 * row_groups + per * threads // row_groups) * 9 * 16


def matmul_gpu_constants(shape: tuple[int, ...], accumulate: bool = False, swiglu: bool = False) -> tuple:
    """Pipeline constants of matmul_gpu_*: linear_constants' and ROW_GROUPS (and THREAD_TOKENS where not 4)."""
    threads, row_groups, per = matmul_gpu_shape(shape)
    return (linear_constants(threads, accumulate, swiglu=swiglu) + (("ROW_GROUPS", row_groups),)
            + ((("THREAD_TOKENS", per),) if per != 4 else ()))


def linear_pipeline(family: str, subgroups: bool, kind: str, dtype: str, accumulate: bool = False,
                    norm: bool = False, swiglu: bool = False, shapes: GpuShapes = GpuShapes(),
                    f16: bool = False, gpu_matmul: bool = True, io: str = "") -> tuple[str, tuple]:
    """(shader, pipeline constants) of a `kind` ("matvec" | "matmul") linear in kernel `family`: the gpu
    family has its own matvec (gpu_matvec_shader: subgroups / f16 when the device has them, `io` its
    prologue / epilogue variant) and matmul (matmul_gpu_<dtype>; the cpu family's where not gpu_matmul), in
    the workgroup shapes `shapes`."""
    if family not in FAMILIES:
        raise ValueError(f"kernel family must be one of {FAMILIES}, got {family!r}")
    if io and not (family == "gpu" and kind == "matvec"):
        raise ValueError(f"matvec io variants ({io!r}) are the gpu family's matvec only, not {family} {kind}")
    if family == "gpu" and kind == "matvec":
        return (gpu_matvec_shader(dtype, subgroups, f16, io),
                linear_constants(shapes.matvec, accumulate, norm, swiglu, shapes.matvec_row_groups,
                                 shapes.matvec_whole_blocks))
    if family == "gpu" and gpu_matmul:
        return f"matmul_gpu_{dtype}", matmul_gpu_constants(shapes.matmul, accumulate, swiglu)
    return f"{kind}_{dtype}", linear_constants(32, accumulate, norm, swiglu)


def family_linear_call(family: str, subgroups: bool, dtype: str, rows: int, cols: int, tokens: int,
                       accumulate: bool = False, shapes: GpuShapes = GpuShapes(), f16: bool = False,
                       gpu_matmul: bool = True) -> KernelCall:
    """linear_call for kernel `family`: where linear_call picks matvec or matmul, the gpu family runs its own
    (its matmul only where gpu_matmul)."""
    call = linear_call(dtype, rows, cols, tokens, accumulate)
    if family == "gpu" and call.shader.startswith("matvec_"):
        return matvec_gpu_call(dtype, rows, cols, tokens, subgroups, shapes.matvec, accumulate=accumulate, f16=f16,
                               row_groups=shapes.matvec_row_groups, whole_blocks=shapes.matvec_whole_blocks)
    if family == "gpu" and gpu_matmul:
        return matmul_gpu_call(dtype, rows, cols, tokens, shapes.matmul, accumulate=accumulate)
    return call


SOFTWARE_ADAPTERS = ("swiftshader", "llvmpipe", "lavapipe")  # adapter info words of CPU-emulated WebGPU


def choose_family(requested: str, adapter_name: str, fallback: bool) -> tuple[str, str]:
    """(kernel family, why) for ?kernels=`requested` (auto | cpu | gpu) on the adapter named `adapter_name`
    (vendor / architecture / description) whose isFallbackAdapter is `fallback`: auto picks the cpu family
    on software adapters, whose kernels were shaped for them, and the gpu family elsewhere."""
    if requested not in ("auto", *FAMILIES):
        raise ValueError(f"kernels must be auto, cpu or gpu, got {requested!r}")
    if requested != "auto":
        return requested, f"kernels={requested} was asked for"
    signs = ["isFallbackAdapter"] * fallback + [word for word in SOFTWARE_ADAPTERS if word in adapter_name.lower()]
    if signs:
        return "cpu", f"auto: {adapter_name} is a software adapter ({', '.join(signs)})"
    return "gpu", f"auto: {adapter_name} is a hardware adapter"


def matmul_call(dtype: str, rows: int, cols: int, tokens: int, workgroup_size: int = 32,
                accumulate: bool = False, swiglu: bool = False) -> KernelCall:
    """Y (tokens, rows) = X (tokens, cols) @ W.T (Y += ... when accumulate, Y (tokens, rows / 2) =
    silu(gate) * up with swiglu), prefill-sized; buffers: qs, dm|d, x, y, params."""
    _weight(dtype, rows, cols)
    _positive(tokens=tokens)
    _check_swiglu(rows, swiglu, accumulate)
    tile_rows, tile_tokens = MATMUL_TILE
    grid = (_ceil(_ceil(rows, tile_rows), workgroup_size), _ceil(tokens, tile_tokens), 1)
    return KernelCall(f"matmul_{dtype}", linear_constants(workgroup_size, accumulate, swiglu=swiglu), grid,
                      uniform_words(rows, cols, tokens).tobytes())


def linear_call(dtype: str, rows: int, cols: int, tokens: int, accumulate: bool = False) -> KernelCall:
    """The faster of matvec / matmul for `tokens` rows of activations (same bindings, same result).

    Measured on SwiftShader (bench/model_kernels.py): matvec's cost grows linearly with tokens,
    matmul's 4-token tile costs about 2.5 single-token matvecs, so matmul wins from 3 tokens on.
    """
    return (matvec_call if tokens <= 2 else matmul_call)(dtype, rows, cols, tokens, accumulate=accumulate)


def rmsnorm_call(hidden: int, tokens: int, eps: float, workgroup_size: int = 64) -> KernelCall:
    """out (tokens, hidden) = rms_norm(x, weight, eps); buffers: x, weight, out, params."""
    _positive(hidden=hidden, tokens=tokens)
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    return KernelCall("rmsnorm", (("WORKGROUP_SIZE", workgroup_size),), (tokens, 1, 1),
                      uniform_words(hidden, tokens, float(eps)).tobytes())


def rope_call(tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, workgroup_size: int = 64,
              eps: float = 0.0) -> KernelCall:
    """Split qkv (tokens, (n_heads + 2 n_kv_heads) * head_dim) plus its bias row into q and k rotated and v
    copied; buffers: qkv, q, k, v, positions, cos_sin, bias, params (eps: rope_qk_norm_call's, ignored here)."""
    _positive(tokens=tokens, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    pairs = (n_heads + 2 * n_kv_heads) * head_dim // 2
    return KernelCall("rope", (("WORKGROUP_SIZE", workgroup_size),), (_ceil(pairs, workgroup_size), tokens, 1),
                      uniform_words(tokens, n_heads, n_kv_heads, head_dim, float(eps)).tobytes())


def rope_qk_norm_call(tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, eps: float) -> KernelCall:
    """rope_call's split with each q and k head RMSNormed over head_dim first (rope.wgsl's main_qk_norm: a
    workgroup of head_dim / 2 lanes per head and token); buffers: rope_call's, then the q and k gains
    (head_dim,) f32 at bindings 8 and 9."""
    _positive(tokens=tokens, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)
    if head_dim % 2 or not head_dim // 2 <= 256:
        raise ValueError(f"main_qk_norm takes an even head_dim up to 512 (a lane per pair), got {head_dim}")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    return KernelCall("rope", (("WORKGROUP_SIZE", head_dim // 2),), (n_heads + 2 * n_kv_heads, tokens, 1),
                      uniform_words(tokens, n_heads, n_kv_heads, head_dim, float(eps)).tobytes())


def embedding_call(tokens: int, hidden: int, workgroup_size: int = 64, dtype: str = "q8_0") -> KernelCall:
    """out (tokens, hidden) = dequantized table rows (embedding.wgsl for Q8_0, the embedding_<dtype> variant for
    the others); buffers: qs, the scales part (none for a float table), token_ids, out, params."""
    _positive(tokens=tokens, hidden=hidden)
    if dtype not in LINEAR_TYPES:
        raise ValueError(f"embedding tables are one of {list(LINEAR_TYPES)}, got {dtype!r}")
    block = max(WEIGHT_TYPES[dtype].block, QK)
    if hidden % block:
        raise ValueError(f"{dtype} embedding hidden size must be a multiple of {block}, got {hidden}")
    shader = "embedding" if dtype == "q8_0" else f"embedding_{dtype}"
    return KernelCall(shader, (("WORKGROUP_SIZE", workgroup_size),),
                      (_ceil(hidden // 4, workgroup_size), tokens, 1), uniform_words(tokens, hidden).tobytes())


def argmax_call(vocab: int, seqs: int, workgroup_size: int = 256, family: str = "cpu") -> KernelCall:
    """out (seqs,) u32 = argmax of each logits row (lowest index on ties); buffers: logits, out, params.
    The gpu family (argmax_gpu.wgsl) combines the threads' winners with a tree: workgroup_size a power of two."""
    _positive(vocab=vocab, seqs=seqs)
    if family not in FAMILIES:
        raise ValueError(f"kernel family must be one of {FAMILIES}, got {family!r}")
    if family == "gpu" and workgroup_size & (workgroup_size - 1):
        raise ValueError(f"argmax_gpu's tree needs a power-of-two workgroup size, got {workgroup_size}")
    return KernelCall("argmax" if family == "cpu" else "argmax_gpu", (("WORKGROUP_SIZE", workgroup_size),),
                      (seqs, 1, 1), uniform_words(vocab, seqs).tobytes())


def sample_call(vocab: int, seqs: int, workgroup_size: int = 256) -> KernelCall:
    """out (seqs,) u32 = each row's next token drawn as pagedkv.sampling.Sampler draws it (shaders/sample.wgsl);
    buffers: logits (overwritten), settings (seqs, 4) f32 (temperature, top_p, u, 0), out, params."""
    _positive(vocab=vocab, seqs=seqs)
    if workgroup_size & (workgroup_size - 1):
        raise ValueError(f"sample's reductions need a power-of-two workgroup size, got {workgroup_size}")
    return KernelCall("sample", (("WORKGROUP_SIZE", workgroup_size),), (seqs, 1, 1),
                      uniform_words(vocab, seqs).tobytes())


def sample_shape_call(vocab: int, seqs: int, lp_base: int, workgroup_size: int = 256) -> KernelCall:
    """shaped (seqs, vocab) f32 = each row's logits after its logit bias, penalties, min-p and top-k, and its
    log-prob row (from word lp_base of io) as device_draws.Shaping asks (shaders/sample_shape.wgsl); buffers:
    logits, settings (seqs, 4), rows (seqs, 8) u32, bias (pairs, 2) u32, counts, shaped, io, params."""
    _positive(vocab=vocab, seqs=seqs, lp_base=lp_base)
    if workgroup_size & (workgroup_size - 1):
        raise ValueError(f"sample_shape's reductions need a power-of-two workgroup size, got {workgroup_size}")
    return KernelCall("sample_shape", (("WORKGROUP_SIZE", workgroup_size),), (seqs, 1, 1),
                      uniform_words(vocab, seqs, lp_base).tobytes())


def sample_post_call(vocab: int, seqs: int, lp_base: int, workgroup_size: int = 64) -> KernelCall:
    """After a shaped draw: each row's chosen log-prob into io and its token counted (shaders/sample_post.wgsl);
    buffers: logits (raw), rows, io (ids, then log-prob rows from word lp_base), counts, params."""
    _positive(vocab=vocab, seqs=seqs, lp_base=lp_base)
    return KernelCall("sample_post", (("WORKGROUP_SIZE", workgroup_size),), (-(-seqs // workgroup_size), 1, 1),
                      uniform_words(vocab, seqs, lp_base).tobytes())


def stream_read_call(nbytes: int, workgroups: int = 256, workgroup_size: int = 64) -> KernelCall:
    """Read nbytes once and reduce them; buffers: data, out, params. Every thread reads a run of whole
    vec4<u32> words, four per loop trip: nbytes must split into workgroups * workgroup_size runs of 4k words."""
    _positive(nbytes=nbytes, workgroups=workgroups)
    unit = 16 * 4 * workgroups * workgroup_size
    if nbytes % unit:
        raise ValueError(f"stream_read splits the buffer into {workgroups} x {workgroup_size} runs of 4k vec4<u32> "
                         f"words: nbytes must be a multiple of {unit}, got {nbytes}")
    words = nbytes // 16
    return KernelCall("stream_read", (("WORKGROUP_SIZE", workgroup_size),), (workgroups, 1, 1),
                      uniform_words(words, words // workgroups).tobytes())


def stream_read_grid_call(nbytes: int, workgroups: int = 1024, workgroup_size: int = 256) -> KernelCall:
    """The bandwidth yardstick for real GPUs: a grid-stride coalesced read (shaders/stream_read_grid.wgsl) of
    nbytes, a multiple of 4 words x every thread; buffers: data, out (a u32 per thread), params."""
    _positive(nbytes=nbytes, workgroups=workgroups)
    threads = workgroups * workgroup_size
    if nbytes % (64 * threads):
        raise ValueError(f"stream_read_grid reads 4 words per thread per trip over {threads} threads: nbytes must "
                         f"be a multiple of {64 * threads}, got {nbytes}")
    return KernelCall("stream_read_grid", (("WORKGROUP_SIZE", workgroup_size),), (workgroups, 1, 1),
                      uniform_words(nbytes // 16, threads).tobytes())


def empty_call() -> KernelCall:
    """One workgroup that does no work (shaders/empty.wgsl): the per-dispatch floor; buffers: out, params."""
    return KernelCall("empty", (("WORKGROUP_SIZE", 1),), (1, 1, 1), uniform_words(0).tobytes())


ALU_PEAK_FLOPS_PER_ITERATION = 8 * 4 * 2  # 8 vec4 multiply-adds per loop iteration of alu_peak.wgsl, per thread


def alu_peak_call(iterations: int, workgroups: int = 64, workgroup_size: int = 32) -> KernelCall:
    """Every thread runs `iterations` loop trips of register-only multiply-adds; buffers: out, params.
    Flops of one dispatch: workgroups * workgroup_size * iterations * ALU_PEAK_FLOPS_PER_ITERATION."""
    _positive(iterations=iterations, workgroups=workgroups)
    return KernelCall("alu_peak", (("WORKGROUP_SIZE", workgroup_size),), (workgroups, 1, 1),
                      uniform_words(iterations).tobytes())


def check_q8_0_codes(name: str, parts: dict) -> None:
    """Refuse Q8_0 weights with a code of -128: the matvec / matmul kernels read codes as
    unpack4x8snorm(q) * 127, exact only on [-127, 127] (all that Q8_0 quantization writes)."""
    if np.frombuffer(parts["qs"], dtype=np.int8).min(initial=0) == -128:
        raise ValueError(f"Q8_0 tensor {name} contains the code -128, which Q8_0 quantization never writes "
                         "(scale = amax / 127); re-convert the model from its GGUF file")
