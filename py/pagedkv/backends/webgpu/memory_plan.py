"""What the WebGPU backend's GPU buffers take, from the model manifest and the engine's limits alone (no device):
the weights as uploaded (fused.py's stacks), the scratch of one step, the staging buffers, and the KV blocks a
budget leaves after them (plan_kv_pool).

WebGpuBackend reserves exactly these buffers in its GpuLedger (backend.py); the app's model list
(user_models.py) and the benchmarks ask plan_kv_pool for a model's verdict without a GPU.
"""
from __future__ import annotations

from ...device_draws import LP_STRIDE
from ...gpu_budget import GpuLedger, kv_blocks_that_fit, rounded
from ...kv.dtypes import kv_dtype as lookup_kv_dtype
from ...kv.groups import KVGroups
from ...kv.spec import KVSpec
from ...model.config import ModelConfig
from ...model.quants import part_nbytes
from ...model.weights import check_manifest
from ...sampling import MAX_LOGIT_BIAS
from .fused import bias_member, fused_member, stacked_nbytes, stacks
from .kv_kernels import PARTITION_TOKENS
from .kv_layout import GpuKVLayout
from .kv_pool import SWAP_CHUNK_BLOCKS
from .plan import PARAM_SLOT_BYTES, SLOTS, ffn_split, rope_table_label, rope_tables
from .weight_upload import ROW_SPLIT, row_chunks

TEMP_SLACK_BYTES = 4096  # ids / params uniforms of one swap or copy call
# WebGPU's largest allowed minStorageBufferOffsetAlignment: a KV group's block tables / slots start at a multiple
GROUP_ALIGN = 256


def group_strides(cfg: ModelConfig, *, block_size: int, max_num_batched_tokens: int, max_num_seqs: int,
                  num_groups: int) -> dict[str, int]:
    """Bytes from one KV group's range to the next in the "slot_mapping" (T,) and "block_tables" (S,
    max_blocks_per_seq) scratch buffers: one group's bytes with one group (the buffers as they always were), else
    rounded up to GROUP_ALIGN so every group's range is bindable."""
    max_blocks_per_seq = -(-cfg.context_length // block_size)
    nbytes = {"slot_mapping": max_num_batched_tokens * 4, "block_tables": max_num_seqs * max_blocks_per_seq * 4}
    if num_groups == 1:
        return nbytes
    return {name: -(-n // GROUP_ALIGN) * GROUP_ALIGN for name, n in nbytes.items()}


def kv_groups_of(config: ModelConfig, kv_groups: bool) -> KVGroups:
    """The KV groups a WebGPU pool of `config` is laid out in: the model's (kv/groups.py) when asked, else one
    group of every layer (every layer holds the whole context)."""
    groups = KVGroups.of(config)
    return groups if kv_groups and groups.is_hybrid else KVGroups.flat(config.n_layers)


def weights_bytes(manifest: dict, max_binding: int | None = None) -> int:
    """Bytes the backend's weight upload reserves: each tensor's parts, the stacked projections (fused.py)
    instead of their members (or the members themselves where they are not stacked: fused.stacks), the norm
    weights both alone and inside their stacked tensor; an embedding table or LM head larger than max_binding in
    its row parts (weight_upload.row_chunks)."""
    total, groups, biases, alone = 0, {}, {}, {}
    for name, t in manifest["tensors"].items():
        bias = bias_member(name)
        if bias is not None:  # uploaded stacked per layer (q | k | v)
            biases[bias[0]] = biases.get(bias[0], 0) + 4 * t["shape"][0]
            continue
        member = fused_member(name)
        nbytes = sum(rounded(loc["nbytes"]) for loc in t["parts"].values())
        if name in ROW_SPLIT and max_binding is not None:
            chunks = row_chunks(t["dtype"], tuple(t["shape"]), max_binding)
            if len(chunks) > 1:
                nbytes = sum(rounded(n + -n % 4) for _, rows in chunks
                             for n in part_nbytes(t["dtype"], (rows, t["shape"][1])).values())
        if member is None or len(t["shape"]) == 1:  # a norm weight is also uploaded on its own
            total += nbytes
        else:
            alone[member[0]] = alone.get(member[0], 0) + nbytes
        if member is not None:
            groups.setdefault(member[0], {})[member[1]] = (t["dtype"], tuple(t["shape"]))
    for stacked, group in groups.items():
        members = [group[i] for i in sorted(group)]
        if stacks(d for d, _ in members[:-1]):
            total += sum(rounded(n) for n in stacked_nbytes(members).values())
        else:
            total += alone[stacked]
    return total + sum(rounded(n) for n in biases.values())


def partition_blocks(block_size: int) -> int:
    """Blocks of one flash-decoding partition (KVKernels' default PARTITION_TOKENS)."""
    return max(1, PARTITION_TOKENS // block_size)


def scratch_buffers(cfg: ModelConfig, *, block_size: int, max_num_batched_tokens: int,
                    max_num_seqs: int, num_groups: int = 1) -> list[tuple[str, int, str]]:
    """(label, bytes, ledger kind) of the buffers one step reads and writes, sized for the engine's limits;
    num_groups: KV groups, each with its block tables and slot mapping at group_strides in the same buffers."""
    t, s = max_num_batched_tokens, max_num_seqs
    max_blocks_per_seq = -(-cfg.context_length // block_size)
    max_parts = -(-max_blocks_per_seq // partition_blocks(block_size))
    f32 = 4
    q = cfg.q_dim  # n_heads * head_dim, which need not be hidden (Qwen3, Gemma 3)
    strides = group_strides(cfg, block_size=block_size, max_num_batched_tokens=t, max_num_seqs=s,
                            num_groups=num_groups)
    return [
        ("token_ids", t * 4, "scratch"), ("positions", t * 4, "scratch"),  # (T,) int32
        ("slot_mapping", num_groups * strides["slot_mapping"], "scratch"),  # (G, T) at group_strides
        ("block_tables", num_groups * strides["block_tables"], "scratch"),  # (G, S, max_blocks_per_seq) likewise
        # (S,) context lengths, then a decode step's (S,) rotary positions (paged_attention_gpu_fold.wgsl); (2, S + 1)
        ("context_lens", 2 * s * 4, "scratch"), ("starts", 2 * (s + 1) * 4, "scratch"),
        ("params", len(SLOTS) * PARAM_SLOT_BYTES, "scratch"),  # (slots, 256) uniforms
        # (context, head_dim / 2, 2) each: one cos / sin table per distinct rotary of the layers (rope_tables)
        *((rope_table_label(i), cfg.context_length * cfg.head_dim * f32, "scratch")
          for i in range(len(rope_tables(cfg)[0]))),
        # (T, hidden), then a decode step's fused-FFN partials (parts, S, hidden): ffn_gpu_main.wgsl
        ("x", (t + s * ffn_split(cfg.ffn)[1]) * cfg.hidden * f32, "scratch"),
        ("h", t * cfg.hidden * f32, "scratch"),  # (T, hidden)
        ("qkv", t * (q + 2 * cfg.kv_dim) * f32, "scratch"),  # (T, n_heads*hd + 2 kv_dim)
        *([] if cfg.attention_bias else [("zero_bias", (q + 2 * cfg.kv_dim) * f32, "scratch")]),
        ("q", t * q * f32, "scratch"), ("attn", t * q * f32, "scratch"),  # (T, n_heads*hd)
        ("k", t * cfg.kv_dim * f32, "scratch"), ("v", t * cfg.kv_dim * f32, "scratch"),  # (T, kv_dim)
        ("act", t * cfg.ffn * f32, "scratch"),  # (T, ffn) act(gate) * up
        ("part_acc", s * max_parts * q * f32, "scratch"),  # (S, parts, n_heads, head_dim)
        ("part_stats", s * max_parts * cfg.n_heads * 2 * f32, "scratch"),  # (S, parts, n_heads, 2)
        ("last", s * cfg.hidden * f32, "scratch"), ("last_norm", s * cfg.hidden * f32, "scratch"),  # (S, hid)
        ("logits", s * cfg.vocab * f32, "scratch"),  # (S, vocab)
        ("ids", (s + s * LP_STRIDE) * 4, "scratch"),  # (S,) u32, then (S, LP_STRIDE) log-probs (sample_shape.wgsl)
        ("sampling", s * 4 * 4, "scratch"),  # (S, 4) f32: temperature, top_p, u (sample.wgsl)
        # a shaped draw's (device_draws.py): its rows' settings, logit-bias pairs, requests' counts, shaped logits
        ("sample_rows", s * 8 * 4, "scratch"),  # (S, 8) u32
        ("sample_bias", s * MAX_LOGIT_BIAS * 2 * 4, "scratch"),  # (S * 300, 2) u32: id, bias
        ("token_counts", s * cfg.vocab * 4, "scratch"),  # (S slots, vocab) u32
        ("shaped_logits", s * cfg.vocab * f32, "scratch"),  # (S, vocab)
    ]


def staging_buffers(cfg: ModelConfig, spec: KVSpec, *, max_num_seqs: int) -> list[tuple[str, int, str]]:
    """(label, bytes, ledger kind) of the logits' read-back landing and of the swap / copy temporaries."""
    # The swap / copy temporaries are created and freed inside one call (KVKernels): this reservation
    # covers the largest of them (gather staging + its read-back copy, SWAP_CHUNK_BLOCKS blocks of K and V).
    block = GpuKVLayout(spec, num_blocks=1).nbytes  # one block of one layer's K (or V)
    chunk = 2 * SWAP_CHUNK_BLOCKS * block
    return [("readback", max_num_seqs * cfg.vocab * 4, "staging"),  # (S, vocab) landing
            # (S,) drawn ids land here and in readback by turns: a pipelined step's while the last one's is mapped
            ("readback_ids", max_num_seqs * (1 + LP_STRIDE) * 4, "staging"),  # and a shaped step's log-probs
            ("swap_temporaries", 2 * chunk + TEMP_SLACK_BYTES, "staging")]


def plan_kv_pool(manifest: dict, *, budget_bytes: int, block_size: int, kv_dtype: str, max_num_batched_tokens: int,
                 max_num_seqs: int, max_binding: int, kv_groups: bool = True) -> dict:
    """The ledger's split of `budget_bytes` without a GPU: weights + scratch + staging first (weights_bytes,
    scratch_bytes, staging_bytes; fixed_bytes their sum), then as many KV blocks as kv_blocks_that_fit allows: a
    block is a page of K and V of one KV group's layers in `kv_dtype` (every layer for a model without window
    layers, or with kv_groups False: kv_groups_of). WebGpuBackend.create() uses it; so do the app's model list,
    the capacity benchmark (bench/kv_quality_dtypes.py) and bench/harness/model_ledger.py."""
    config = check_manifest(manifest)
    if max_num_batched_tokens < 1 or max_num_seqs < 1 or max_num_seqs > max_num_batched_tokens:
        raise ValueError(f"need 1 <= max_num_seqs ({max_num_seqs}) <= max_num_batched_tokens "
                         f"({max_num_batched_tokens})")
    GpuLedger(budget_bytes)  # the ledger's own check of the budget
    lookup_kv_dtype(kv_dtype)  # the registry's message for a name the GPU has no kernels for
    groups = kv_groups_of(config, kv_groups)
    spec = KVSpec.of(config, block_size=block_size, dtype=kv_dtype, groups=groups)
    one_block = GpuKVLayout(spec, num_blocks=1)  # checks what the kernels can run
    split = {"weights_bytes": weights_bytes(manifest, max_binding),
             "scratch_bytes": sum(rounded(n) for _, n, _ in scratch_buffers(
                 config, block_size=block_size, max_num_batched_tokens=max_num_batched_tokens,
                 max_num_seqs=max_num_seqs, num_groups=groups.num_groups)),
             "staging_bytes": sum(rounded(n) for _, n, _ in staging_buffers(config, spec, max_num_seqs=max_num_seqs))}
    fixed = sum(split.values())
    block_bytes = 2 * groups.group_size * one_block.nbytes  # K and V of a page's layers, one block
    num_blocks = kv_blocks_that_fit(budget_bytes - fixed, block_bytes, max_binding, groups.group_size)
    return {"fixed_bytes": fixed, "block_bytes": block_bytes, "num_blocks": num_blocks,
            "bytes_per_token": spec.bytes_per_token, **split}
