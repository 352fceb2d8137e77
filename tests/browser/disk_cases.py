"""Cases for test_kv_disk_gpu.py, run in the page's worker (Pyodide; under CPython on wgpu-py for tests/native)
on the WebGPU backend with the tiny model: whole blocks read out and written back for the disk tier, and a
"reload" (a fresh backend over the same in-memory store) that restores a chat's prefix. Builds on
engine_cases (loaded first as a module). Each case returns plain JSON-able data."""
from __future__ import annotations

import numpy as np

import engine_cases as ec
from pagedkv.backends.cpu import CpuBackend
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.kv.disk_tier import DiskKey, DiskTier, MemoryStore, block_chain, model_hash
from pagedkv.kv.dtypes import pack_tokens
from pagedkv.model_runner import ForwardBatch
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

GREEDY = SamplingParams(max_tokens=12, stop_token_ids=(1_000_000,))  # lengths are exactly max_tokens
TURN1 = list(range(3, 43))
MORE = list(range(100, 120))


async def blocks_round_trip(kv_dtype: str) -> dict:
    """After a prefill into blocks 9, 4, 7: read_blocks([9, 4]) and write them into blocks 1 and 2."""
    b = await ec.backend("tiny-random", budget_bytes=8 * ec.MIB, block_size=8, kv_dtype=kv_dtype,
                         max_num_batched_tokens=24, max_num_seqs=4)
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    table = i32([[9, 4, 7]])
    slots = i32(table[0, np.arange(20) // 8] * 8 + np.arange(20) % 8)
    await b.forward(ForwardBatch(i32(range(5, 25)), i32(range(20)), slots, i32([0, 20]), table, i32([20])))
    words = await b.read_blocks([9, 4])  # (2, layers, 2, 8, token_u32s)
    await b.write_blocks([1, 2], words)
    out = {"shape": list(words.shape), "layers": {}}
    cfg = b.config
    for layer, cache in enumerate(b.kv_pool.caches):
        k, v = await cache.read()  # f32 / f16 values or u32 words
        as_words = lambda h: h if h.dtype == np.uint32 else pack_tokens(  # noqa: E731
            h.astype(np.float32).reshape(-1, cfg.n_kv_heads, cfg.head_dim), kv_dtype).reshape(h.shape[0], 8, -1)
        out["layers"][layer] = {
            "read": bool(np.array_equal(words[:, layer, 0], as_words(k[[9, 4]]))
                         and np.array_equal(words[:, layer, 1], as_words(v[[9, 4]]))),
            "written": bool(np.array_equal(k[[1, 2]], k[[9, 4]]) and np.array_equal(v[[1, 2]], v[[9, 4]])),
            "nonzero": bool(np.abs(k[9].astype(np.float32)).sum() > 0)}
    b.destroy()
    return out


async def _engine(store, kv_dtype: str, backend: str):
    w = await ec.weights("tiny-random")
    tok = Tokenizer.from_manifest(w.manifest)
    if backend == "cpu":
        b = CpuBackend(w, num_blocks=64, block_size=16, kv_dtype=kv_dtype)
    else:
        b = await ec.backend("tiny-random", budget_bytes=8 * ec.MIB, block_size=16, kv_dtype=kv_dtype,
                             max_num_batched_tokens=64, max_num_seqs=4)
    engine = LLMEngine(b, tok, EngineConfig(max_num_batched_tokens=64, max_num_seqs=4))
    if store is not None:
        tier = DiskTier(store, DiskKey(model_hash(w.manifest), b.kv_spec), 1 << 30)
        await tier.open()
        engine.attach_disk(tier)
    return engine, b


async def _reply(engine, prompt) -> list[int]:
    return (await engine.generate(prompt, GREEDY)).output_ids


def _disk_stats(engine) -> dict:
    s = engine.stats()
    return {k: s.get(k) for k in ("prefill_tokens", "disk_blocks", "disk_restored_tokens", "disk_written_blocks",
                                  "disk_corrupt_blocks")}


async def reload_restores(kv_dtype: str, backend: str = "webgpu", corrupt: bool = False) -> dict:
    """Engine A: two turns. Engine B (fresh backend, same store: a reload): turn 2 only. With corrupt, one byte
    of the second block's file is flipped before B runs."""
    store = MemoryStore()
    a, ba = await _engine(store, kv_dtype, backend)
    out1 = await _reply(a, TURN1)
    turn2 = TURN1 + out1 + MORE
    out2 = await _reply(a, turn2)
    before = _disk_stats(a)
    if backend == "webgpu":
        ba.destroy()
    if corrupt:
        name = a.disk.key.file_name(block_chain(a.disk.key, turn2, 2)[1])
        data = bytearray(store.files[name])
        data[-1] ^= 0x40
        store.files[name] = bytes(data)
    b, bb = await _engine(store, kv_dtype, backend)
    again = await _reply(b, turn2)
    after = _disk_stats(b)
    if backend == "webgpu":
        bb.destroy()
    return {"out2": out2, "reloaded": again, "a": before, "b": after}


async def opfs_listing_while_writing(rounds: int = 40) -> dict:
    """OpfsStore.names() while 120 files are written and 60 of them deleted at once (another tab's disk tier,
    or this one's write-behind): every listing must succeed and name only files of the store. Before the fix a
    listing read the size of a write's swap file (`<name>.crswap`) or of a deleted file: NotFoundError."""
    import asyncio

    from pagedkv.browser.opfs import OpfsStore, _js_obj

    store = await OpfsStore.open("kv-listing-case")
    for name in await store.names():  # a failed earlier run's files
        await store.delete(name)
    data = bytes(range(256)) * 90  # 23,040 bytes: an f16 block of SmolLM2
    names = [f"f-{i:03d}" for i in range(120)]

    async def write_then_delete():
        for name in names:
            await store.write(name, data)
        for name in names[::2]:
            await store.delete(name)

    async def list_all():
        seen, stray, sizes = [], set(), set()
        for _ in range(rounds):
            listed = await store.names()
            seen.append(len(listed))
            stray |= set(listed) - set(names)
            sizes |= set(listed.values())
            await asyncio.sleep(0)
        return seen, sorted(stray), sorted(sizes)

    _, (seen, stray, sizes) = await asyncio.gather(write_then_delete(), list_all())
    final = await store.names()
    for name in final:
        await store.delete(name)
    return {"listings": len(seen), "grew": seen[-1] > seen[0] or max(seen) > 0, "stray": stray,
            "sizes": [s for s in sizes if s != len(data)], "final": sorted(final) == names[1::2]}


async def opfs_store_outlives_its_directory() -> dict:
    """The store's directory removed under it (its handle then raises NotFoundError, as a stale one did in a long
    benchmark run under load): a write, then a listing, takes the handle again from the OPFS root."""
    import js

    from pagedkv.browser.opfs import OpfsStore, _js_obj

    store = await OpfsStore.open("kv-gone-case")
    root = await js.navigator.storage.getDirectory()
    recursive = _js_obj({"recursive": True})
    await store.write("a", b"123")
    await root.removeEntry("kv-gone-case", recursive)
    await store.write("b", b"45")  # the directory is gone: created again, then written
    out = {"after_write": await store.names(), "reopened_by_write": store.reopened}
    await root.removeEntry("kv-gone-case", recursive)
    out["after_listing"] = await store.names()  # the same handle fails twice, then the root's is listed
    out["reopened"] = store.reopened
    await root.removeEntry("kv-gone-case", recursive)
    return out


async def opfs_listing_retries_a_failing_iterator() -> dict:
    """OpfsStore.names() over a directory whose iterator raises a real NotFoundError (a rejected promise) on
    its first tries, as Chromium's did twice in long benchmark runs: listed on a later try; raised when every
    try fails."""
    import js

    from pagedkv.browser.opfs import LIST_ATTEMPTS, OpfsStore

    real = (await OpfsStore.open("kv-retry-case")).directory
    await OpfsStore(real).write("a", b"12345")

    class Rejecting:  # a directory iterator whose next step rejects, as Chromium's did
        def next(self):
            return js.Promise.reject(js.DOMException.new("an entry went", "NotFoundError"))

    class Failing:
        def __init__(self, fails: int) -> None:
            self.fails = fails

        def values(self):
            if self.fails:
                self.fails -= 1
                return Rejecting()
            return real.values()

    out = {"listed": await OpfsStore(Failing(LIST_ATTEMPTS - 1)).names()}
    try:
        await OpfsStore(Failing(LIST_ATTEMPTS)).names()
        out["raised"] = None
    except Exception as err:  # noqa: BLE001 (the JsException's text is the result)
        out["raised"] = str(err)
    await OpfsStore(real).delete("a")
    return out


async def opfs_write_while_deleted(rounds: int = 30) -> dict:
    """OpfsStore.write while the same file is deleted (this tab forgetting a deleted chat's blocks, another
    tab evicting): the write ends either with the whole file or, where the delete came last, no file; it
    never raises. Each round starts the delete at a different point of the write."""
    import asyncio

    from pagedkv.browser.opfs import OpfsStore

    store = await OpfsStore.open("kv-write-delete-case")
    for name in await store.names():
        await store.delete(name)
    data = bytes(range(256)) * 90
    raised, sizes = [], set()
    for i in range(rounds):
        name = f"f-{i:03d}"

        async def delete_later(n=name, ticks=i % 6):
            for _ in range(ticks):
                await asyncio.sleep(0)
            await store.delete(n)

        results = await asyncio.gather(store.write(name, data), delete_later(), return_exceptions=True)
        raised += [repr(r) for r in results if isinstance(r, BaseException)]
        sizes |= set((await store.names()).values())
    for name in await store.names():
        await store.delete(name)
    return {"raised": raised, "sizes": sorted(sizes - {len(data)})}
