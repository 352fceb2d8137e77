"""K-quant GGUFs made at test time (tests/gguf_models.py): the converter keeps every tensor's type, and the
greedy ids equal llama.cpp's on the CPU (numpy) backend under the near-tie rule. `pytest -s` prints each
file's agreement (the figures the issue's closing note reports)."""
from __future__ import annotations

import pytest
from gguf_models import TINY_K, _tensor_specs, requantized_smollm2, requantized_types, tiny_gguf
from model_fixtures import gguf_path  # noqa: F401  (pytest fixture)
from test_gguf_architectures import MODELS, check_against_llama_cpp

from pagedkv.model.convert import convert_cached, open_gguf
from pagedkv.model.quants import BY_GGUF, WEIGHT_TYPES
from pagedkv.model.weights import read_manifest


def converted_types(path) -> dict[str, str]:
    """Tensor name -> dtype in the converted manifest (gate|up / q|k|v stay separate tensors there)."""
    return {name: t["dtype"] for name, t in read_manifest(convert_cached(path, MODELS))["tensors"].items()}


def file_types(path) -> dict[str, str]:
    """Tensor name -> weight type in the GGUF (the project's reader: gguf's parses the 49,152 tokens slowly)."""
    return {t.name: BY_GGUF[t.tensor_type.name].name for t in open_gguf(path).tensors}


# The exact per-layer choice of the Q4_K_M mix on 2 layers: llama.cpp's use_more_bits() names layer 1 only.
Q4_K_M_LAYERS = [{"attn_q": "q4_K", "attn_k": "q4_K", "attn_v": "q4_K", "attn_output": "q4_K",
                  "ffn_gate": "q4_K", "ffn_up": "q4_K", "ffn_down": "q4_K"},
                 {"attn_q": "q4_K", "attn_k": "q4_K", "attn_v": "q6_K", "attn_output": "q4_K",
                  "ffn_gate": "q4_K", "ffn_up": "q4_K", "ffn_down": "q6_K"}]


def test_q4_k_m_mix_of_the_tiny_files():
    for name, head in (("tiny-llama-q4_k_m", {"token_embd.weight": "Q4_K", "output.weight": "Q6_K"}),
                       ("tiny-qwen2-q4_k_m", {"token_embd.weight": "Q6_K"})):
        types = {n: t for n, _, t, _ in _tensor_specs(TINY_K[name]) if not n.endswith(("norm.weight", ".bias"))}
        want = dict(head)
        for i, layer in enumerate(Q4_K_M_LAYERS):
            want.update({f"blk.{i}.{k}.weight": WEIGHT_TYPES[v].gguf for k, v in layer.items()})
        assert types == want, name


@pytest.mark.parametrize("name", sorted(TINY_K))
def test_k_quant_tiny_model_greedy_ids_match_llama_cpp(gguf_path, name):  # noqa: F811
    path = tiny_gguf(name, gguf_path)
    types = file_types(path)
    assert types == {n: BY_GGUF[t].name for n, _, t, _ in _tensor_specs(TINY_K[name])}  # the recipe's types
    assert converted_types(path) == types, name  # the converter keeps every tensor's type
    check_against_llama_cpp(path)


def test_smollm2_types_fall_back_on_576_wide_rows():
    shapes = {"token_embd.weight": (49152, 576), "output_norm.weight": (576,),
              "blk.0.attn_v.weight": (192, 576), "blk.0.ffn_down.weight": (576, 1536),
              "blk.1.attn_v.weight": (192, 576), "blk.1.ffn_down.weight": (576, 1536),
              "blk.3.ffn_down.weight": (576, 1536), "blk.3.ffn_up.weight": (1536, 576)}
    assert requantized_types(shapes, 30, "Q4_K_M") == {
        "token_embd.weight": "Q8_0", "output_norm.weight": "F32", "blk.0.attn_v.weight": "Q8_0",
        "blk.0.ffn_down.weight": "Q6_K", "blk.1.attn_v.weight": "Q8_0", "blk.1.ffn_down.weight": "Q6_K",
        "blk.3.ffn_down.weight": "Q4_K", "blk.3.ffn_up.weight": "Q5_0"}
    assert set(requantized_types(shapes, 30, "Q6_K").values()) == {"Q8_0", "F32", "Q6_K"}
    assert requantized_types(shapes, 30, "Q6_K")["blk.3.ffn_up.weight"] == "Q8_0"
    assert set(requantized_types(shapes, 30, "Q4_0").values()) == {"Q4_0", "F32"}


@pytest.mark.parametrize("type_name,dtypes", [
    ("Q4_K_M", {"q4_K", "q6_K", "q5_0", "q8_0", "f32"}),
    ("Q4_0", {"q4_0", "f32"}),
])
def test_smollm2_requantized_matches_llama_cpp(gguf_path, type_name, dtypes):  # noqa: F811
    path = requantized_smollm2(gguf_path, type_name)
    types = file_types(path)
    assert set(types.values()) == dtypes
    assert converted_types(path) == types
    check_against_llama_cpp(path)
