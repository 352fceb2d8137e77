"""bench/device/random_model.py (the weights bench/device/gpu.sh generates with): every row drawn on its own,
so a tied LM head's logits do not repeat every 64 ids (the old tiled 64-row block made greedy decoding reach
<|im_end|> within a few tokens)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from pagedkv.model.layout import dequantize

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "device" / "random_model.py"


def load_script():
    spec = importlib.util.spec_from_file_location("random_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_random_rows_do_not_repeat_with_period_64():
    rm = load_script()
    rng = np.random.default_rng(0)
    for dtype in ("q8_0", "q4_1"):
        w = dequantize(dtype, (256, 64), rm.untiled(dtype, 256, 64, rng))
        logits = w @ rng.standard_normal(64).astype(np.float32)  # a tied LM head: one logit per row
        assert not np.allclose(logits[:64], logits[64:128]) and not np.allclose(logits[:64], logits[192:])
        assert len(set(np.round(logits, 4))) > 250
        assert 0.5 < np.sqrt(np.mean(w ** 2)) * 8 < 1.5  # N(0, 1 / cols)
