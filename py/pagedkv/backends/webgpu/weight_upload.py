"""The weights' way onto the GPU: a manifest's shards verified, each tensor's parts uploaded into buffers the
backend reserves in its ledger (WebGpuBackend._buffer), q/k/v and gate/up stacked with their input norm
(fused.py) and the q/k/v biases joined into one row."""
from __future__ import annotations

import numpy as np

from ...model.layout import DTYPE_PARTS
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
                _upload_tensor(b, name, entry["dtype"], parts)
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


def _upload_tensor(b, name: str, dtype: str, parts: dict) -> None:
    order = DTYPE_PARTS[dtype]
    bufs = []
    for part in order:
        buf = b._buffer(f"w:{name}.{part}", len(parts[part]), "weights")
        b.ctx.write(buf, np.frombuffer(parts[part], np.uint8))
        bufs.append(buf)
    b.weights[name] = (dtype, tuple(bufs))
