"""Write a model directory with the tokenizer, chat template and shapes of MODEL_JSON and random weights:

    python3 bench/device/random_model.py dist/models/smollm2-135m-instruct/model.json /tmp/smollm2-random

For a machine the real weights cannot travel to (the device tool carries 64 MiB; SmolLM2's shards are 94 MiB):
`generate --backend wgpu` on it times the very kernels, buffers and plan the real model uses; its text is noise.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "py")]

from bench.kernels import random_tensors  # noqa: E402
from pagedkv.model.config import ModelConfig  # noqa: E402
from pagedkv.model.writer import write_model  # noqa: E402


def main(manifest_path: str, out_dir: str) -> int:
    manifest = json.loads(Path(manifest_path).read_text(encoding="utf-8"))
    config = ModelConfig.from_json(manifest["config"])
    source = {"file": f"random weights at the shapes of {manifest['source'].get('file')}", "sha256": None}
    write_model(out_dir, config, random_tensors(config), manifest["tokenizer"], manifest["chat_template"], source)
    print(f"wrote {out_dir}: {config.n_layers} layers, hidden {config.hidden}, vocab {config.vocab}, random weights")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
