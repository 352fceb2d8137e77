"""GGUF files the user opens in the page: their ids, the ledger's verdict, and the conversion.

Pure Python (no `js`): model_library.py does the reading of the File and the storage in OPFS. The
ledger decides before anything is stored or uploaded: a model whose weights + scratch + staging + a
minimum KV pool exceed the GPU budget is refused with the numbers, and the model in use keeps serving.
"""
from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

from pagedkv.backends.webgpu.memory_plan import plan_kv_pool
from pagedkv.gpu_budget import MIB
from pagedkv.model.convert import CONVERTER_VERSION, convert_reader

USER_PREFIX = "gguf:"  # a user model's id is this + its storage key; built-in models are bare names
MIN_KV_TOKENS = 256  # the smallest KV pool worth loading a model for: one short chat
# WebGpuBackend.create's defaults, which main.py's loads use: the scratch buffers are sized by them
MAX_NUM_BATCHED_TOKENS = 256
MAX_NUM_SEQS = 16


class ModelRefused(ValueError):
    """The model does not fit the GPU budget (or cannot be opened); nothing was stored or uploaded."""


def storage_key(file_name: str) -> str:
    """The OPFS directory name of a file's model: its name, reduced to characters every file system takes."""
    key = re.sub(r"[^A-Za-z0-9._-]", "_", file_name.strip())[:120].strip(".")
    if not key:
        raise ModelRefused(f"the file name {file_name!r} leaves no usable model name")
    return key


def model_id(file_name: str) -> str:
    return USER_PREFIX + storage_key(file_name)


def is_user_model(name: str) -> bool:
    return name.startswith(USER_PREFIX)


def key_of(name: str) -> str:
    """The storage key of user model id `name`."""
    if not is_user_model(name):
        raise ValueError(f"{name!r} is not a user model id (they start with {USER_PREFIX!r})")
    return name[len(USER_PREFIX):]


def _mib(nbytes: int) -> str:
    return f"{math.ceil(nbytes / MIB):,} MiB"


def check_weights_fit(reader, budget_bytes: int) -> None:
    """Refuse early, before converting, a file whose tensor bytes alone exceed the budget."""
    weights = sum(t.n_bytes for t in reader.tensors)
    if weights > budget_bytes:
        raise ModelRefused(f"{reader.name} does not fit the GPU budget: needs {_mib(weights)} for its weights "
                           f"alone, budget {_mib(budget_bytes)}; raise the budget in Memory settings or pick a "
                           "smaller model")


def check_fits(manifest: dict, *, name: str, budget_bytes: int, block_size: int, kv_dtype: str,
               max_binding: int) -> dict:
    """The ledger's verdict on a converted model: its plan (plan_kv_pool), or ModelRefused with the numbers."""
    plan = plan_kv_pool(manifest, budget_bytes=budget_bytes, block_size=block_size, kv_dtype=kv_dtype,
                        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, max_num_seqs=MAX_NUM_SEQS,
                        max_binding=max_binding)
    min_kv = -(-MIN_KV_TOKENS // block_size) * plan["block_bytes"]
    needs = plan["fixed_bytes"] + min_kv
    if needs > budget_bytes or plan["num_blocks"] * block_size < MIN_KV_TOKENS:
        raise ModelRefused(
            f"{name} does not fit the GPU budget: needs {_mib(needs)}, budget {_mib(budget_bytes)} (weights, "
            f"scratch and staging {plan['fixed_bytes'] / MIB:,.1f} MiB + a KV pool of {MIN_KV_TOKENS} tokens in "
            f"{kv_dtype} {min_kv / MIB:,.1f} MiB); raise the budget in Memory settings or pick a smaller model")
    return plan


def convert_checked(reader, out_dir: str | Path, *, budget_bytes: int, block_size: int, kv_dtype: str,
                    max_binding: int, on_tensor=None) -> dict:
    """Convert a parsed GGUF into out_dir and return its manifest, or raise (out_dir removed) when the ledger
    refuses it or convert.py cannot convert it."""
    out_dir = Path(out_dir)
    check_weights_fit(reader, budget_bytes)
    source = {"file": reader.name, "bytes": reader.size, "converter_version": CONVERTER_VERSION}
    try:
        manifest = convert_reader(reader, out_dir, source, on_tensor)
        check_fits(manifest, name=reader.name, budget_bytes=budget_bytes, block_size=block_size,
                   kv_dtype=kv_dtype, max_binding=max_binding)
    except BaseException:
        if out_dir.exists():  # a refused model leaves nothing behind
            shutil.rmtree(out_dir)
        raise
    return manifest
