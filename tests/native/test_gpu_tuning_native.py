"""First-boot tuning of the gpu family (backends/webgpu/tuning.py) on wgpu-py (lavapipe here): candidates
timed, a wrong one rejected, the choice cached and reused. Small model shapes keep it quick."""
from __future__ import annotations

from dataclasses import replace

from pagedkv.backends.webgpu import model_kernels as ops
from pagedkv.backends.webgpu import tuning
from pagedkv.model.config import ModelConfig

SMALL = ModelConfig("llama", 2, 64, 4, 2, 16, 128, 512, 1e5, "adjacent_pairs", 1e-5, 256, True)  # gate|up 256 x 64


class CountingStore(tuning.JsonFileStore):
    def __init__(self, path) -> None:
        super().__init__(path)
        self.puts = 0

    async def put(self, key: str, value: dict) -> None:
        self.puts += 1
        await super().put(key, value)


def _tune(native_loop, store, config=SMALL, **kw) -> dict:
    async def run():
        from pagedkv.backends.webgpu.native import NativeDevice

        ctx = await NativeDevice.create()
        return await tuning.tune(ctx, config, store, "test-runtime", subgroups=False, f16=False, **kw)

    return native_loop.run(run())


def test_candidates_are_timed_and_the_choice_is_cached_then_reused(native_loop, native_device, tmp_path):
    store = CountingStore(tmp_path / "tuning.json")
    first = _tune(native_loop, store, budget_ms=120_000.0)  # lavapipe on shared cores: time every candidate
    assert first["source"] == "tuned" and store.puts == 1
    assert sorted(first["timings"]) == ["matmul", "matvec", "matvec_slots", "split"]
    assert list(first["timings"]["matvec"]) == ["64", "128", "256"]
    # decode attention + the merging output projection at 2,048 tokens, the default aim first
    assert list(first["timings"]["split"]) == [str(a) for a in tuning.SPLIT_CANDIDATES] == ["96", "24", "48", "192",
                                                                                          "384"]
    # lavapipe's 64 KiB of workgroup memory fits every matmul candidate
    assert list(first["timings"]["matmul"]) == [str(c) for c in tuning.MATMUL_CANDIDATES] == [
        "(64, 8)", "(64, 4)", "(128, 8)", "(128, 16)", "(64, 8, 2)", "(64, 8, 1)", "(128, 16, 1)"]
    # each projection's own matvec threads and row groups: q|k|v, o, gate|up, down and the LM head
    slots = first["timings"].pop("matvec_slots")
    assert sorted(slots) == ["lin_down", "lin_ffn", "lin_h", "lin_qkv", "lm_head"]
    for slot, timed in slots.items():
        assert list(timed) == [str(c) for c in tuning.SLOT_CANDIDATES]
        assert all(isinstance(ms, float) and ms > 0 for ms in timed.values())
        fastest = tuning.SLOT_CANDIDATES[list(timed).index(min(timed, key=timed.get))]
        assert (first["shapes"].matvec_for(slot), first["shapes"].row_groups_for(slot)) == fastest, slot
    for timed in first["timings"].values():
        assert all(isinstance(ms, float) and ms > 0 for ms in timed.values()), timed
    fastest = min(first["timings"]["matvec"], key=first["timings"]["matvec"].get)
    assert first["shapes"].matvec == int(fastest)
    assert first["shapes"].split == int(min(first["timings"]["split"], key=first["timings"]["split"].get))
    again = _tune(native_loop, store)
    assert (again["source"], again["key"], again["shapes"], store.puts) == ("cache", first["key"], first["shapes"], 1)


def test_a_candidate_whose_output_differs_is_rejected(native_loop, native_device, tmp_path):
    rows, cols = 2 * SMALL.ffn, SMALL.hidden

    def matmul(shape, grid=None):
        call = ops.matmul_gpu_call("q4_1", rows, cols, tuning.PREFILL_TOKENS, shape, swiglu=True)
        return replace(call, workgroups=grid) if grid else call

    cands = [tuning.Candidate("matvec", 64, lambda: ops.matvec_gpu_call("q4_1", rows, cols, 1, False, 64,
                                                                        norm_eps=1e-5, swiglu=True)),
             tuning.Candidate("matmul", (64, 8), lambda: matmul((64, 8))),
             tuning.Candidate("matmul", (64, 4), lambda: matmul((64, 4), grid=(1, 1, 1)))]  # a quarter of the tiles
    r = _tune(native_loop, tuning.JsonFileStore(tmp_path / "t.json"), cands=cands, split=False)
    assert r["timings"]["matmul"]["(64, 4)"] == "rejected: output differs from the default's"
    assert isinstance(r["timings"]["matmul"]["(64, 8)"], float)
    assert r["shapes"] == ops.GpuShapes(matvec=64, matmul=(64, 8))


def test_past_the_budget_the_default_stays(native_loop, native_device, tmp_path):
    r = _tune(native_loop, tuning.JsonFileStore(tmp_path / "t.json"), budget_ms=0.0)
    assert set(r["timings"]["matvec"].values()) == set(r["timings"]["matmul"].values()) == {"over budget"}
    assert set(r["timings"]["split"].values()) == {"over budget"}
    assert {ms for timed in r["timings"]["matvec_slots"].values() for ms in timed.values()} == {"over budget"}
    assert r["shapes"].matvec_for("lm_head") == ops.GpuShapes().matvec
    assert replace(r["shapes"], matvec_slots=()) == ops.GpuShapes()


def test_where_lanes_can_take_whole_blocks_those_candidates_are_timed_too(native_loop, native_device, tmp_path):
    # hidden 2,048: the projections over K = 2,048 (q|k|v, o, gate|up, the LM head) add WHOLE_BLOCKS candidates
    # for the shapes whose lanes take whole blocks without a trip more (64 x 1: one block a lane; 64 x 2, x 4, x 8)
    wide = replace(SMALL, hidden=2048, n_heads=16, head_dim=128)
    r = _tune(native_loop, tuning.JsonFileStore(tmp_path / "w.json"), budget_ms=120_000.0, config=wide)
    slots = r["timings"]["matvec_slots"]
    whole = [str((t, g, tuning.WHOLE)) for t, g in tuning.SLOT_CANDIDATES if ops.whole_blocks_apply(2048, t // g)]
    assert whole == ["(64, 1, 'whole')", "(64, 2, 'whole')", "(64, 4, 'whole')", "(64, 8, 'whole')"]
    for slot in ("lin_qkv", "lin_h", "lin_ffn", "lm_head"):
        assert list(slots[slot]) == [str(c) for c in tuning.SLOT_CANDIDATES] + whole, slot
        assert all(isinstance(ms, float) and ms > 0 for ms in slots[slot].values()), slots[slot]  # all agreed
        fastest = min(slots[slot], key=slots[slot].get)
        assert (slot in r["shapes"].matvec_whole) == (tuning.WHOLE in fastest), (slot, fastest)
    # the down projection's K = 128: no lane takes a whole block without more trips
    assert list(slots["lin_down"]) == [str(c) for c in tuning.SLOT_CANDIDATES]
    assert "lin_down" not in r["shapes"].matvec_whole
