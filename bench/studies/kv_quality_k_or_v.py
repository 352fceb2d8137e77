"""Which of K or V carries a KV dtype's perplexity cost: the dtype applied to keys only, values only, both.

    python3 -m bench.studies.kv_quality_k_or_v [--dtype int4-asym] [--windows 2] [--window 512] [--model DIR]

Same corpus, windows and perplexity as bench.kv_quality_dtypes (its evaluate), over the
first `--windows` windows; the f32 cache's rows are replaced by the dtype's round trip for K, V or both
(numpy_ref writes K then V of each layer through round_trip, which is what is swapped here). Prints JSON.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from unittest import mock

import numpy as np

from bench.kv_quality_dtypes import ROOT, corpus_ids, evaluate
from pagedkv.backends import numpy_ref
from pagedkv.backends.numpy_ref import NumpyModel
from pagedkv.kv.dtypes import kv_dtype, round_trip
from pagedkv.model.weights import ModelWeights, read_manifest
from pagedkv.tokenizer import Tokenizer


def perplexity(model: NumpyModel, ids: list[int], window: int, dtype: str, which: str) -> float:
    """Perplexity over len(ids) - 1 targets, windows of `window`, `dtype` on "k", "v", "kv" or neither ("")."""
    writes = [0]

    def store(x: np.ndarray, _cache_dtype: str) -> np.ndarray:
        writes[0] += 1
        part = "k" if writes[0] % 2 else "v"  # _attention stores K, then V, layer after layer
        return round_trip(x, dtype) if part in which else x

    with mock.patch.object(numpy_ref, "round_trip", store):
        return evaluate(model, ids, window, ["f32"], None, {})["f32"]["perplexity"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "dist" / "models" / "smollm2-135m-instruct")
    parser.add_argument("--dtype", default="int4-asym")
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--window", type=int, default=512)
    args = parser.parse_args()
    kv_dtype(args.dtype)  # an unknown name fails here, before the model loads
    model = NumpyModel(ModelWeights.load(args.model))
    ids = corpus_ids(Tokenizer.from_manifest(read_manifest(args.model)), args.windows * args.window + 1)
    ppl = {label: perplexity(model, ids, args.window, args.dtype, which)
           for label, which in (("f32", ""), ("k only", "k"), ("v only", "v"), ("k and v", "kv"))}
    print(json.dumps({"benchmark": "kv_quality_k_or_v", "model": args.model.name, "dtype": args.dtype,
                      "tokens": args.windows * args.window, "window": args.window, "perplexity": ppl,
                      "delta_ppl_vs_f32": {k: round(v - ppl["f32"], 4) for k, v in ppl.items()}}, indent=2))


if __name__ == "__main__":
    main()
