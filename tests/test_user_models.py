"""A GGUF the user opens: its id, the ledger's verdict with the numbers, and nothing left behind on refusal."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf_files import write_tiny_gguf

from pagedkv.model.convert import CONVERTER_VERSION
from pagedkv.model.gguf_reader import GGUFFile
from pagedkv_app.user_models import (
    ModelRefused,
    check_fits,
    convert_checked,
    is_user_model,
    key_of,
    model_id,
    storage_key,
)

SETTINGS = {"block_size": 16, "kv_dtype": "f16", "max_binding": 1 << 30}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny llama (q4_1).gguf"
    write_tiny_gguf(path)
    return path


def test_ids_are_named_by_the_file():
    assert storage_key("tiny llama (q4_1).gguf") == "tiny_llama__q4_1_.gguf"
    assert model_id("SmolLM2-360M.Q8_0.gguf") == "gguf:SmolLM2-360M.Q8_0.gguf"
    assert is_user_model("gguf:a.gguf") and not is_user_model("tiny-random")
    assert key_of("gguf:a.gguf") == "a.gguf"
    with pytest.raises(ModelRefused, match=r"^the file name '\.\.' leaves no usable model name$"):
        storage_key("..")
    with pytest.raises(ValueError, match=r"^'tiny-random' is not a user model id \(they start with 'gguf:'\)$"):
        key_of("tiny-random")


def test_a_model_that_fits_is_converted_with_its_plan(tiny_gguf, tmp_path):
    manifest = convert_checked(GGUFFile.open(tiny_gguf), tmp_path / "m", budget_bytes=18 << 20, **SETTINGS)
    assert manifest["source"] == {"file": "tiny llama (q4_1).gguf", "bytes": tiny_gguf.stat().st_size,
                                  "converter_version": CONVERTER_VERSION}
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["model.json", "shard-000.bin"]
    plan = check_fits(manifest, name="x.gguf", budget_bytes=18 << 20, **SETTINGS)
    # weights (Q8_0 49152 x 64 embedding, ...) + scratch (with the 512-byte zero q|k|v bias of a model without
    # biases, the sample kernel's uniform slot and (S, 4) draws, the family ops' three uniform slots, a shaped
    # draw's two slots, rows, bias pairs, (16, 49152) counts and shaped logits, the ids' log-prob rows, and the fused
    # FFN's uniform slot and (4 partials, 16 sequences, 64) floats: 16,640 bytes; a decode step's (16,) positions after
    # the context lengths, paged_attention_gpu_fold.wgsl's: 64 bytes) + staging
    # (with the second ids landing of a pipelined decode, log-prob rows included), then 4,096-byte blocks (2 layers
    # x K, V x 16 tokens x 2 heads x 16 dims x f16)
    assert (plan["fixed_bytes"], plan["block_bytes"]) == (16_804_240, 4096)
    assert plan["num_blocks"] == ((18 << 20) - 16_803_408) // 4096


def test_too_big_is_refused_with_the_numbers_and_leaves_nothing(tiny_gguf, tmp_path):
    out = tmp_path / "m"
    with pytest.raises(ModelRefused) as refused:
        convert_checked(GGUFFile.open(tiny_gguf), out, budget_bytes=6 << 20, **SETTINGS)
    assert str(refused.value) == (
        "tiny llama (q4_1).gguf does not fit the GPU budget: needs 17 MiB, budget 6 MiB (weights, scratch and "
        "staging 16.0 MiB + a KV pool of 256 tokens in f16 0.1 MiB); raise the budget in Memory settings or pick "
        "a smaller model")
    assert not out.exists()
    with pytest.raises(ModelRefused) as early:  # the tensors alone: refused before any conversion
        convert_checked(GGUFFile.open(tiny_gguf), out, budget_bytes=1 << 20, **SETTINGS)
    assert str(early.value) == (
        "tiny llama (q4_1).gguf does not fit the GPU budget: needs 4 MiB for its weights alone, budget 1 MiB; "
        "raise the budget in Memory settings or pick a smaller model")
    assert not out.exists()


def test_an_unknown_architecture_is_refused_by_convert_and_leaves_nothing(tmp_path):
    path = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_tensor("x", np.zeros(32, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"architecture 'mamba'"):  # convert.py's error, as it words it
        convert_checked(GGUFFile.open(path), tmp_path / "m", budget_bytes=12 << 20, **SETTINGS)
    assert not (tmp_path / "m").exists()
