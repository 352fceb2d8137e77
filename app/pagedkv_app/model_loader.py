"""Read a model (model.json + shards) from this site or OPFS (model_library.model_reader) with progress."""
from __future__ import annotations

import json


async def fetch_model(read, on_progress) -> tuple[dict, dict[str, bytes]]:
    """Return (manifest, {shard file: bytes}); on_progress(loaded_bytes, total_bytes) as bytes arrive.

    Shard hashes are verified by the weights loader (CPU) or before upload (GPU).
    """
    manifest = json.loads(await read("model.json"))
    total = sum(s["nbytes"] for s in manifest["shards"])
    loaded = 0
    shards: dict[str, bytes] = {}

    def progress(n: int) -> None:
        nonlocal loaded
        loaded += n
        on_progress(loaded, total)

    for shard in manifest["shards"]:
        shards[shard["file"]] = await read(shard["file"], progress)
    return manifest, shards
