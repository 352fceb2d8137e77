"""Which kernels run paged attention (decode and prefill) in each kernel family, and their grids (pure, no GPU).

cpu family: shaders/paged_attention_main.wgsl (paged_attention[_narrow|_wide]: shader_variants.CPU_ATTENTION_HEADS)
(one invocation per (sequence, partition, head tile)) and
paged_attention_reduce.wgsl's `main` (one per output vec4). gpu family: paged_attention_gpu[_sg] (composed, one
workgroup of ATTENTION_WORKGROUP lanes per (sequence, partition, head tile), lanes along the keys of a tile,
then along head_dim; `_sg` reduces with subgroups) and the reduce's `main_gpu` (one workgroup per (sequence,
head), lanes splitting the partitions). Both read the same bindings and uniform and write the same partial
states, so the plan swaps names and grids only. Prefill: the cpu family's paged_prefill_attention_main.wgsl (one
invocation per (query head, tile of up to 4 new tokens)), the gpu family's paged_prefill_attention_gpu.wgsl
(one workgroup per (tile of PREFILL_ROWS / head_tile new tokens, head tile), K/V tiles staged in workgroup
memory). KVKernels compiles these; plan.step_slots and backends/webgpu/dispatch_geometry.py read the same grids.
"""
from __future__ import annotations

from dataclasses import dataclass

from .shader_variants import CPU_ATTENTION_HEADS

ATTENTION_WORKGROUP = 128  # lanes of a gpu-family decode workgroup = keys per tile
REDUCE_WORKGROUP = 128  # lanes of a gpu-family merge workgroup
MAX_PART_BLOCKS = 128  # MAX_PART_BLOCKS in paged_attention_gpu_main.wgsl (the staged block-table slice)
PREFILL_WORKGROUP = 128  # lanes of a gpu-family prefill workgroup
PREFILL_ROWS = 16  # ROWS in paged_prefill_attention_gpu.wgsl: (new token, head) rows of a workgroup (head_dim <= 128)
PREFILL_TILE_VALUES, PREFILL_MAX_KEYS = 1024, 32  # its staged K/V tile: KEYS * head_dim values, KEYS <= 32
# gpu-family decode attention is split into as many partitions as bring its workgroups (sequences x partitions x
# head tiles) to about this many (GpuShapes.split; first-boot tuning picks the adapter's own, tuning.py), each
# partition at least MIN_PARTITION_TOKENS (half a 128-key tile) and at most MAX_PART_BLOCKS blocks.
SPLIT_WORKGROUPS = 96
MIN_PARTITION_TOKENS = 64
# The cpu family's prefill attention walks at most this many keys of a tile per dispatch (then resumes in the next:
# paged_prefill_attention_main.wgsl's passes), so one invocation's work is bounded whatever the context. Bounded
# work keeps a long prefix from tripping a GPU's watchdog, and is what lavapipe needs to be right at all: llvmpipe
# ends every loop once an invocation has taken 65,535 loop back-edges in all, and at head_dim 256 a key costs about
# 39 of them (107 at block size 1), so 512 keys stay under the cap for every block size and head width here (a
# block over 32 keys is walked in 32-key chunks, each costing what a 32-key block does).
PREFILL_PASS_TOKENS = 512
# The gpu family's prefill walks at most this many keys of a tile per dispatch (paged_prefill_attention_gpu.wgsl's
# passes), for the same cap: measured on lavapipe, a 4-key tile at head_dim 256 costs a lane 73 back-edges (its
# 64-step score loop is not unrolled), so a single walk went wrong past 3,588 keys. 1,024 keys take ~18,700 of them;
# unrolling nothing, every loop of a tile counted (k + 1 for k trips), ~26,000 at head_dim 256, the widest head.
# Narrower heads took 32,000 keys in one walk on lavapipe. Twice the cpu family's: each pass is a dispatch, and
# this family is for real GPUs.
PREFILL_GPU_PASS_TOKENS = 1024


@dataclass(frozen=True)
class DecodeKernels:
    """The two decode-attention pipelines of one kernel family: names (the KVKernels.pipelines keys),
    shader files, entry points and workgroup sizes."""

    family: str
    attention: str
    reduce: str
    attention_workgroup: int
    reduce_workgroup: int

    @property
    def specs(self) -> list[tuple[str, str, str, int]]:
        """(pipeline name, shader, entry point, workgroup size) of pass 1 and of the merge pass."""
        return [(self.attention, self.attention, "main", self.attention_workgroup),
                (self.reduce, "paged_attention_reduce", "main" if self.family == "cpu" else "main_gpu",
                 self.reduce_workgroup)]

    def invocations(self, num_seqs: int, max_parts: int, n_heads: int, head_tile: int,
                    head_dim: int) -> tuple[int, int]:
        """Invocations of pass 1 and of the merge pass for a batch of num_seqs decode tokens whose longest
        context has max_parts partitions."""
        items = num_seqs * max_parts * n_heads // head_tile  # (sequence, partition, head tile)
        if self.family == "cpu":
            return items, num_seqs * n_heads * head_dim // 4  # a thread per item, per output vec4
        return items * self.attention_workgroup, num_seqs * n_heads * self.reduce_workgroup


def cpu_heads(head_dim: int) -> str:
    """The name suffix of the cpu family's attention for heads head_dim wide: the narrowest variant of
    shader_variants.CPU_ATTENTION_HEADS that holds them ("_narrow" up to 64, "" up to 128, "_wide" past 128)."""
    return next((suffix for widest, suffix, _ in CPU_ATTENTION_HEADS if head_dim <= widest), CPU_ATTENTION_HEADS[-1][1])


def decode_kernels(family: str, subgroups: bool, cpu_workgroup: int, head_dim: int = 128) -> DecodeKernels:
    """Decode attention of kernel `family` ("cpu" | "gpu"); subgroups picks the gpu family's subgroup
    variant (the device must have the `subgroups` feature); cpu_workgroup is the cpu family's size."""
    if family == "cpu":
        return DecodeKernels("cpu", "paged_attention" + cpu_heads(head_dim), "paged_attention_reduce", cpu_workgroup,
                             cpu_workgroup)
    if family == "gpu":
        return DecodeKernels("gpu", "paged_attention_gpu_sg" if subgroups else "paged_attention_gpu",
                             "paged_attention_reduce_gpu", ATTENTION_WORKGROUP, REDUCE_WORKGROUP)
    raise ValueError(f"kernel family must be cpu or gpu, got {family!r}")


def check_partition(family: str, partition_blocks: int, block_size: int) -> None:
    """The gpu family stages a partition's block-table slice in workgroup memory: at most MAX_PART_BLOCKS."""
    if family == "gpu" and partition_blocks > MAX_PART_BLOCKS:
        raise ValueError(f"gpu-family decode partitions hold at most {MAX_PART_BLOCKS} blocks, got "
                         f"{partition_blocks} (partition_tokens {partition_blocks * block_size}, block_size "
                         f"{block_size})")


def decode_partition_blocks(split_workgroups: int, num_seqs: int, head_tiles: int, max_blocks: int,
                            block_size: int, max_parts: int) -> int:
    """Blocks per flash-decoding partition of a gpu-family decode step whose longest context spans max_blocks
    blocks: as many partitions as bring num_seqs x partitions x head_tiles workgroups to about
    split_workgroups, none shorter than MIN_PARTITION_TOKENS or longer than MAX_PART_BLOCKS, at most max_parts
    of them (the scratch's room). A long context gets longer partitions, not more of them: the output
    projection merges every partition in each of its workgroups (matvec_io_merge.wgsl)."""
    parts = max(1, min(-(-split_workgroups // (num_seqs * head_tiles)), max_parts))
    blocks = max(-(-max_blocks // parts), -(-MIN_PARTITION_TOKENS // block_size))
    return max(1, min(blocks, MAX_PART_BLOCKS))


def fold_workgroup_bytes(hidden: int, head_dim: int, head_tile: int) -> int:
    """Workgroup memory of the decode attention that computes its own q | k | v (paged_attention_gpu_fold.wgsl):
    the attention's (staged queries, block-table slice, a tile's scores and weights, run maxima, the reductions'
    red / red3 and subgroup-head mask) plus the staged residual row (hidden f32) and the new K and V rows."""
    w = ATTENTION_WORKGROUP
    attention = head_tile * head_dim * 4 + MAX_PART_BLOCKS * 4 + 2 * w * 16 + 16 * 16 + 3 * w * 16 + 32 * 4
    return attention + hidden * 4 + 2 * head_dim * 4


@dataclass(frozen=True)
class PrefillKernel:
    """The prefill-attention pipeline of one kernel family: its name (shader and KVKernels.pipelines key),
    workgroup size, new tokens per tile, and the pipeline constants it adds to the cache layout's."""

    family: str
    name: str
    workgroup: int
    query_tile: int
    constants: tuple
    pass_keys: int  # keys of a tile's walk one dispatch covers at most (whole blocks, or whole key tiles)

    def passes(self, max_keys: int) -> int:
        """Dispatches of prefill attention for a step whose longest context is max_keys keys: a walk of n keys
        from any start spans at most ceil(n / pass_keys) passes, since a pass covers whole blocks (cpu family)
        or whole key tiles (gpu family) from the walk's start."""
        return max(1, -(-max_keys // self.pass_keys))

    def invocations(self, num_tiles: int, n_heads: int, head_tile: int) -> int:
        """Invocations for num_tiles query tiles (over all sequences) of every head."""
        if self.family == "cpu":
            return num_tiles * n_heads  # a thread per (tile, head)
        return num_tiles * (n_heads // head_tile) * self.workgroup  # a workgroup per (tile, head tile)


def prefill_kernel(family: str, head_tile: int, head_dim: int, query_tile: int, cpu_workgroup: int,
                   block_size: int) -> PrefillKernel:
    """Prefill attention of kernel `family`: the cpu family's takes query_tile new tokens per invocation and walks
    PREFILL_PASS_TOKENS keys per dispatch; the gpu family's as many as fill PREFILL_ROWS rows with head_tile heads
    each and walks PREFILL_GPU_PASS_TOKENS keys per dispatch."""
    if family == "cpu":
        pass_blocks = max(1, PREFILL_PASS_TOKENS // block_size)
        return PrefillKernel("cpu", "paged_prefill_attention" + cpu_heads(head_dim), cpu_workgroup, query_tile,
                             (("SLOTS", query_tile), ("PASS_KEYS", PREFILL_PASS_TOKENS)), pass_blocks * block_size)
    # A lane adds four vec4 columns of one row: 16 rows cover head_dim 128, wider heads take fewer rows (and their
    # staged queries stay within WebGPU's 16 KiB of workgroup memory).
    rows = PREFILL_ROWS * 128 // max(head_dim, 128)
    tokens = max(1, rows // head_tile)
    keys = min(PREFILL_TILE_VALUES // head_dim, PREFILL_MAX_KEYS)
    pass_tiles = max(1, PREFILL_GPU_PASS_TOKENS // keys)
    return PrefillKernel("gpu", "paged_prefill_attention_gpu", PREFILL_WORKGROUP, tokens,
                         (("SLOTS", head_tile), ("QUERY_TILE", tokens), ("KEYS", keys), ("PASS_TILES", pass_tiles),
                          *((("ROWS", rows),) if rows != PREFILL_ROWS else ())), pass_tiles * keys)
