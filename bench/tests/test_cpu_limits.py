"""bench.cpu_limits' accounting of what a decode step reads and a prefill token costs (the numbers its
fractions divide), on a two-layer manifest whose figures are worked out by hand below."""
from bench.cpu_limits import PROJECTIONS, model_costs


def manifest(tied: bool) -> dict:
    cfg = {"n_layers": 2, "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "ffn": 128, "vocab": 100,
           "tied_embeddings": tied}
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
