"""bench.cpu_limits' accounting of what a decode step reads and a prefill token costs (the numbers its
fractions divide), on a two-layer manifest whose figures are worked out by hand below."""
from bench.cpu_limits import PROJECTIONS, model_costs


def manifest(tied: bool, **config) -> dict:
    cfg = {"architecture": "llama", "n_layers": 2, "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16,
           "ffn": 128, "vocab": 100, "rope_base": 10000.0, "rope_convention": "adjacent_pairs", "rms_eps": 1e-5,
           "context_length": 256, "tied_embeddings": tied, **config}
    shapes = {"attn_q": (64, 64), "attn_k": (32, 64), "attn_v": (32, 64), "attn_output": (64, 64),
              "ffn_gate": (128, 64), "ffn_up": (128, 64), "ffn_down": (64, 128)}
    tensors = {f"blk.{i}.{p}.weight": {"shape": list(shapes[p]), "dtype": "q4_1"} for i in range(2) for p in PROJECTIONS}
    tensors["token_embd.weight"] = {"shape": [100, 64], "dtype": "q8_0"}
    if not tied:
        tensors["output.weight"] = {"shape": [100, 64], "dtype": "q4_0"}
    return {"config": cfg, "tensors": tensors}


def test_a_decode_step_reads_every_weight_block_once_and_the_mean_contexts_kv():
    layer_weights = 64 * 64 * 2 + 32 * 64 * 2 + 128 * 64 * 3  # 36,864 weights a layer
    # q4_1 24 bytes a block; the q8_0 embedding, the tied head, 36 (q8_d: its codes and one f32 scale), a row's two
    # d (8 bytes) padded to 16 (cpu_wasm.d_rows)
    blocks = 2 * layer_weights // 32 * 24 + 100 * (16 + 64)
    costs = model_costs(manifest(tied=True), prompt=10, new=4)
    assert costs["weight_bytes"] == blocks == 63_296
    assert costs["decode_bytes_per_step"] == blocks + 2 * 2 * 32 * 4 * 12  # f32 K and V, mean context 10 + 2
    assert costs["prefill_flop_per_token"] == 2 * 2 * (layer_weights + 2 * 64 * 5.5) + 2 * 100 * 64 / 10
    untied = model_costs(manifest(tied=False), prompt=10, new=4)
    assert untied["weight_bytes"] == blocks + 100 * 64 // 32 * 40  # q4_0 is held as q8_0


def test_a_window_layer_reads_and_sees_only_its_window():
    """Gemma 3's declaration (model/family.py): every 6th layer attends to every key, the others to a window (4
    here). A decode step's mean context 10 + 2 = 12 keys: 4 in each of 5 window layers, 12 in the last; a prompt of
    10 tokens: token i sees i + 1 keys, at most 4 in a window layer (1 + 2 + 3 + 4 * 7 = 34 over 10 tokens)."""
    full = manifest(tied=True, n_layers=6)
    full["tensors"].update({f"blk.{i}.{p}.weight": full["tensors"][f"blk.0.{p}.weight"] for i in range(2, 6)
                            for p in PROJECTIONS})
    windowed = manifest(tied=True, n_layers=6, architecture="gemma3", sliding_window=4)
    windowed["tensors"] = full["tensors"]
    a, b = (model_costs(m, prompt=10, new=4) for m in (full, windowed))
    assert a["weight_bytes"] == b["weight_bytes"]
    kv_row = 2 * 32 * 4  # f32 K and V of one token, 2 kv heads x 16
    assert a["decode_bytes_per_step"] - b["decode_bytes_per_step"] == kv_row * 5 * (12 - 4)
    assert a["prefill_flop_per_token"] - b["prefill_flop_per_token"] == 2 * 2 * 64 * 5 * (5.5 - 3.4)
