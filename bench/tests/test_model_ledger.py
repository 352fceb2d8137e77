"""bench/harness/model_ledger.py on the synthetic GGUF's tiny preset: the GPU ledger's split of a budget (weights,
scratch, staging, the KV pool) and the page's refusal with its numbers."""
from __future__ import annotations

import pytest

from bench.harness.model_ledger import model_ledger
from pagedkv.backends.webgpu.plan import SLOTS
from pagedkv.gpu_budget import MIB
from pagedkv.model.synthetic import write_synthetic_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("synthetic") / "tiny.gguf"
    write_synthetic_gguf(path, "tiny", seed=0)
    return path


def test_ledger_weights_are_the_file_bytes_plus_the_stacked_norms(tiny_gguf, tmp_path):
    ledger = model_ledger(tiny_gguf, budget_bytes=16 * MIB, cache=tmp_path, refusal_mib=(4,))
    # q4_K's web parts (qs 128 + sc 16 bytes a block) are the GGUF block's 144; attn_norm / ffn_norm are also
    # uploaded after the stacked q|k|v and gate|up codes (their matvec fuses the norm)
    assert ledger["gguf_tensor_bytes"] == 742_400
    assert ledger["weights_bytes"] == 742_400 + 2 * 2 * 256 * 4 == 746_496
    # scratch: the uniform slots of 256 bytes among it (plan.SLOTS, "ffn" the last), the device sampling's per-row
    # counts and shaped logits (device_draws.py; their log-probs read back too), and after x's rows a decode step's
    # fused-FFN partials: 16 sequences x 16 partials (ffn 512 = 16 blocks of 32, plan.ffn_split) x hidden 256 f32,
    # and each sequence's new-token rope position (a u32 after the context lengths, for the folded q|k|v attention)
    assert ledger["scratch_bytes"] == 2_738_320 + len(SLOTS) * 256 + 16 * 16 * 256 * 4 + 16 * 4 == 3_006_416
    assert ledger["staging_bytes"] == 563_904
    assert ledger["bytes_per_token"] == 2 * 2 * 2 * 64 * 2  # K and V, 2 layers, 2 KV heads of 64, f16
    # the rest of 16 MiB: 760 blocks of 16 tokens (the partials and the slot took 16 blocks: 776 before them)
    assert (ledger["num_blocks"], ledger["kv_bytes"]) == (760, 760 * 16 * 1024)
    assert ledger["fixed_bytes"] + ledger["kv_bytes"] + ledger["unused_bytes"] == 16 * MIB
    assert 0 <= ledger["unused_bytes"] < ledger["block_bytes"]
    assert ledger["refusals"] == {"4 MiB": (
        "tiny.gguf does not fit the GPU budget: needs 5 MiB, budget 4 MiB (weights, scratch and staging 4.1 MiB "
        "+ a KV pool of 256 tokens in f16 0.2 MiB); raise the budget in Memory settings or pick a smaller model")}
