"""Fetch a built model (model.json + shards) from this site with byte-level progress."""
from __future__ import annotations

import json

from . import bridge


async def fetch_model(model_dir: str, on_progress) -> tuple[dict, dict[str, bytes]]:
    """Return (manifest, {shard file: bytes}); on_progress(loaded_bytes, total_bytes) as bytes arrive.

    Shard hashes are verified by the weights loader (CPU) or before upload (GPU).
    """
    manifest = json.loads(await bridge.fetch_bytes(f"{model_dir}/model.json"))
    total = sum(s["nbytes"] for s in manifest["shards"])
    loaded = 0
    shards: dict[str, bytes] = {}

    def progress(n: int) -> None:
        nonlocal loaded
        loaded += n
        on_progress(loaded, total)

    for shard in manifest["shards"]:
        shards[shard["file"]] = await bridge.fetch_bytes(f"{model_dir}/{shard['file']}", progress)
    return manifest, shards
