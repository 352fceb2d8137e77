"""The weights' way onto the GPU: a manifest's shards verified, each tensor's parts uploaded into buffers the
backend reserves in its ledger (WebGpuBackend._buffer), q/k/v and gate/up stacked with their input norm
(fused.py) and the q/k/v biases joined into one row. An embedding table or LM head with a part larger than the
adapter's maxStorageBufferBindingSize (Gemma 3's 262,144-row tied embedding: 160 MiB of Q8_0 codes, lavapipe binds
128 MiB) is split by rows into parts that fit (row_chunks), held in b.weight_rows; the plan runs one dispatch
per part."""
from __future__ import annotations

import numpy as np

from ...model.layout import DTYPE_PARTS
from ...model.quants import part_nbytes
from ...model.weights import tensor_parts, verify_shard
from . import model_kernels as ops
from .fused import BIAS_MEMBERS, bias_member, fused_member, member_names, stack_rows, stacks


async def upload_weights(b, manifest: dict, shard_source, on_progress) -> None:
    """Every tensor of `manifest` into backend b's buffers, shard by shard (verified first); q/k/v and gate/up
    stacked with their input norm (fused.py), q/k/v biases as one f32 row per layer."""
    total = sum(s["nbytes"] for s in manifest["shards"])
    loaded = 0
    pending: dict[str, dict[int, tuple]] = {}  # stacked tensor -> member index -> (dtype, shape, parts)
    biases: dict[str, dict[int, bytes]] = {}  # stacked bias -> member index -> f32 bytes
    for shard in manifest["shards"]:
        data = await shard_source(shard["file"])
        verify_shard(shard, data)
        for name, entry in manifest["tensors"].items():
            if entry["file"] != shard["file"]:
                continue
            parts = tensor_parts(entry, data)
            if bias_member(name) is not None:
                _stack_bias(b, name, entry, parts, biases)
                continue
            if entry["dtype"] == "q8_0":
                ops.check_q8_0_codes(name, parts)
            elif len(entry["shape"]) == 2 and entry["dtype"] not in ops.LINEAR_TYPES:
                raise ValueError(f"tensor {name}: {entry['dtype']} matrices have no WebGPU kernels "
                                 f"(supported: {', '.join(ops.LINEAR_TYPES)})")
            member = fused_member(name)
            if member is None or len(entry["shape"]) == 1:  # a norm weight is also used alone (prefill)
                _upload_tensor(b, name, entry["dtype"], parts, tuple(entry["shape"]))
            if member is None:
                continue
            # q/k/v and gate/up run as one matvec over their stacked rows, their input norm fused (fused.py)
            stacked, index, count = member
            group = pending.setdefault(stacked, {})
            group[index] = (entry["dtype"], tuple(entry["shape"]), {k: bytes(v) for k, v in parts.items()})
            if len(group) == count:
                _upload_stack(b, stacked, [group[i] for i in sorted(group)])
                del pending[stacked]
        loaded += shard["nbytes"]
        del data  # the CPU copy goes as soon as its tensors are on the GPU
        if on_progress is not None:
            on_progress(loaded, total)
    if pending or biases:
        raise ValueError(f"the manifest lacks members of the stacked tensors {sorted(pending) + sorted(biases)}")


def _upload_stack(b, stacked: str, members: list[tuple]) -> None:
    """The members stacked (fused.stack_rows), or each on its own where they have no lossless common type."""
    if stacks(dtype for dtype, _, _ in members[:-1]):
        dtype, _, parts = stack_rows(stacked, members)
        _upload_tensor(b, stacked, dtype, parts)
        return
    for name, (dtype, _, parts) in zip(member_names(stacked), members[:-1]):  # the norm weight is up already
        _upload_tensor(b, name, dtype, parts)


def _stack_bias(b, name: str, entry: dict, parts: dict, biases: dict) -> None:
    """Collect a q / k / v bias; upload the layer's (q | k | v) f32 row once all three are there."""
    if entry["dtype"] != "f32":
        raise ValueError(f"tensor {name}: biases must be f32, got {entry['dtype']}")
    stacked, index = bias_member(name)
    group = biases.setdefault(stacked, {})
    group[index] = bytes(parts["data"])[: 4 * entry["shape"][0]]
    if len(group) == len(BIAS_MEMBERS):
        _upload_tensor(b, stacked, "f32", {"data": b"".join(group[i] for i in sorted(group))})
        del biases[stacked]


ROW_CHUNK_ALIGN = 32  # a split matrix's parts start at multiples of 32 rows: whole matvec row groups, u32-aligned parts
# The matrices the plan runs by row parts (plan.row_parts): the embedding table and the LM head, vocab rows each.
ROW_SPLIT = ("token_embd.weight", "output.weight")


def row_chunks(dtype: str, shape: tuple, max_binding: int) -> list[tuple[int, int]]:
    """(first row, rows) of each part a matrix of `shape` is uploaded in so that no buffer of a part exceeds
    max_binding bytes (the adapter's maxStorageBufferBindingSize); [(0, rows)] when it fits whole."""
    if len(shape) != 2:
        return [(0, shape[0])]
    rows, cols = shape
    ceil = lambda a, b: -(-a // b)  # noqa: E731
    n = 1
    while True:  # n parts of equal rows (a multiple of ROW_CHUNK_ALIGN), the last the rest
        size = min(rows, ceil(ceil(rows, n), ROW_CHUNK_ALIGN) * ROW_CHUNK_ALIGN)
        if all(nbytes + 3 <= max_binding for nbytes in part_nbytes(dtype, (size, cols)).values()):
            return [(r, min(size, rows - r)) for r in range(0, rows, size)]
        if size <= ROW_CHUNK_ALIGN:
            raise ValueError(f"{dtype} rows of {cols} columns do not fit a binding of {max_binding} bytes")
        n += 1


def row_slice(dtype: str, shape: tuple, parts: dict, first: int, rows: int) -> dict:
    """Rows first .. first + rows - 1 of a (rows, cols) matrix's parts, each padded to 4 bytes."""
    cols = shape[1]
    out = {}
    for part, per_row in part_nbytes(dtype, (1, cols)).items():
        raw = bytes(parts[part][first * per_row:(first + rows) * per_row])
        out[part] = raw + b"\0" * (-len(raw) % 4)
    return out


def _upload_tensor(b, name: str, dtype: str, parts: dict, shape: tuple | None = None) -> None:
    chunks = row_chunks(dtype, shape, b.max_binding) if name in ROW_SPLIT else [(0, 0)]
    if len(chunks) > 1:  # held by rows, never whole (plan.layer_program dispatches per part)
        b.weight_rows[name] = [(first, rows, _upload_parts(b, f"{name}#{i}", dtype,
                                                             row_slice(dtype, shape, parts, first, rows)))
                               for i, (first, rows) in enumerate(chunks)]
        return
    b.weights[name] = _upload_parts(b, name, dtype, parts)


def _upload_parts(b, label: str, dtype: str, parts: dict) -> tuple[str, tuple]:
    bufs = []
    for part in DTYPE_PARTS[dtype]:
        buf = b._buffer(f"w:{label}.{part}", len(parts[part]), "weights")
        b.ctx.write(buf, np.frombuffer(parts[part], np.uint8))
        bufs.append(buf)
    return dtype, tuple(bufs)
