"""The WebGPU backend (whole forward over the paged KV cache, one submit per step) vs the numpy reference,
in real headless Chromium with real WebGPU. Cases run in the page's worker (tests/browser/engine_cases.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from browser_pages import open_and_boot
from model_fixtures import real_model, real_weights  # noqa: F401  (fixtures)

CASES = Path(__file__).with_name("engine_cases.py")


@pytest.fixture(scope="module")
def worker(ready_page):
    ready_page.py(
        "import json, sys, types\n"
        "_mod = types.ModuleType('engine_cases')\n"
        f"exec(compile({json.dumps(CASES.read_text())}, 'engine_cases.py', 'exec'), _mod.__dict__)\n"
        "sys.modules['engine_cases'] = _mod\n"
        "json.dumps(True)"
    )
    return ready_page


def run(worker, call: str):
    return worker.py(f"import json, engine_cases as ec\njson.dumps(await ec.{call})")


# 64-token blocks: the cpu family's attention walks them 32 keys at a time (paged_attention_common.wgsl)
@pytest.mark.parametrize("block_size, kv_dtype", [(bs, dt) for bs in (8, 16, 32) for dt in ("f32", "f16")]
                         + [(64, "f16")])
def test_tiny_greedy_through_engine_equals_numpy(worker, block_size, kv_dtype):
    r = run(worker, f"tiny_greedy({block_size}, {kv_dtype!r})")
    assert r["gpu"] == r["ref"]


@pytest.mark.parametrize("block_size", [8, 32])
def test_tiny_greedy_with_the_gpu_kernel_family_equals_numpy(worker, block_size):
    """Decode steps and the LM head on the gpu family's matvec, decode attention and argmax, chunked prefill on
    its matmul and attention; the matvecs in f16 where the device has `shader-f16`: lavapipe (native) has it,
    SwiftShader (page) has not."""
    r = run(worker, f"tiny_greedy({block_size}, 'f16', kernels='gpu')")
    assert r["gpu"] == r["ref"]
    f16 = r["runtime"] != "emscripten"
    assert r["shader_f16"] == f16
    # a greedy step's LM head (the final norm fused) leaves each workgroup's best row, which argmax_gpu scans
    # (matvec_io_argmax.wgsl)
    assert r["head"] == [f"matvec_gpu_sg_{'f16_' if f16 else ''}q8_0_argmax", "argmax_gpu"]


@pytest.mark.parametrize("kv_dtype", ["f16", "int8"])
def test_gpu_family_decode_past_one_attention_partition_equals_numpy(worker, kv_dtype):
    """Contexts of 124-144 tokens, several flash-decoding partitions (the gpu family sizes them to its workgroup
    aim: 64-token ones here, their count changing as the contexts grow): the gpu family's decode layer
    (5 dispatches: q | k | v with RoPE and the KV write in its epilogue, attention, the output projection
    merging the partitions in its prologue, gate | up, down) against numpy, for f16 KV (written by the
    projection) and int8 (its rows handed to kv_write_quant)."""
    # Not 122 tokens: the reference's second token there is a near tie (ids 84 and 434, 0.011 apart), which the
    # f16 matvecs' rounding of the normalised activations flips on lavapipe with int8 KV.
    prompts = [list(range(5, 5 + n)) for n in (124, 135)]
    r = run(worker, f"tiny_greedy(16, {kv_dtype!r}, max_tokens=9, kernels='gpu', prompts={prompts})")
    assert r["gpu"] == r["ref"], r
    assert [len(o) for o in r["gpu"]] == [9, 9]


def test_tiny_greedy_outputs_are_real_generations(worker):
    r = run(worker, "tiny_greedy(16, 'f16', 10)")
    assert [len(o) for o in r["gpu"]] == [10, 10, 10, 10]
    assert r["gpu"] == r["ref"]
    assert r["progress"] == [[82176, 82176]]  # one progress report per shard (tiny model: one shard)


@pytest.mark.parametrize("kv_dtype,bound", [("f32", 1e-4), ("f16", 2e-2)])
def test_tiny_logits_match_numpy(worker, kv_dtype, bound):
    """Logits of a mixed prefill batch (3 sequences, scattered block tables) and of the decode step after it.
    Bounds relative to max |logit|: f32 KV [measured ~1e-6], f16 KV rounds K/V to 11 bits [~1e-3]."""
    prompts = [[5, 9, 200, 31, 7], list(range(40, 63)), list(range(300, 317))]
    r = run(worker, f"logits_vs_numpy('tiny-random', {prompts}, {kv_dtype!r}, 8)")
    for step in ("prefill", "decode"):
        assert r[step]["max_abs"] <= bound * r[step]["scale"], r
        assert r[step]["argmax_equal"], r


@pytest.mark.parametrize("preemption", ["swap", "recompute"])
def test_preemption_under_small_budget_keeps_outputs(worker, preemption):
    r = run(worker, f"preemption_round_trip({preemption!r})")
    assert r["ledger"]["num_blocks"] == 7
    assert r["preemptions"][preemption] >= 1
    if preemption == "swap":
        assert r["swap_out_blocks"] >= 1 and r["swap_in_blocks"] >= 1
    assert r["gpu"] == r["ref"]
    assert r["ledger"]["used"] <= r["ledger"]["budget"] and r["ledger"]["peak"] <= r["ledger"]["budget"]


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
def test_copy_blocks_and_swap_round_trip(worker, kv_dtype):
    r = run(worker, f"copy_and_swap_blocks({kv_dtype!r})")
    assert r == {str(layer): {"copy": True, "swap": True, "cpu": True, "nonzero": True} for layer in range(2)}


def test_budget_shrinks_pool_and_refuses_what_never_fits(worker):
    r = run(worker, "budget_refusal()")
    led = r["ledger"]
    assert led["num_blocks"] == 3
    assert led["by_kind"]["kv"] == 3 * r["block_bytes"]
    # tiny model, block 16, f16: 2 layers x (K, V) x 16 tokens x 2 kv heads x 16 dims x 2 bytes
    assert r["block_bytes"] == 2 * 2 * 16 * 2 * 16 * 2
    assert led["used"] == r["fixed"] + 3 * r["block_bytes"] <= led["budget"]
    assert led["peak"] <= led["budget"]
    assert led["by_kind"]["weights"] == 83200 and led["by_kind"]["staging"] > 0 and led["by_kind"]["scratch"] > 0
    assert r["refused"] is not None and "= 4 blocks of 16, but the KV pool only has 3 blocks" in r["refused"], r["refused"]
    assert r["gpu"] == r["ref"]  # the page keeps working after the refusal
    assert r["too_small"].startswith("BudgetExceeded: a GPU budget of") and "no room for the KV cache" in r["too_small"]


GOLDEN = json.loads((Path(__file__).parent.parent / "golden" / "llama_golden.json").read_text(encoding="utf-8"))
REAL_CASES = [c for c in GOLDEN["cases"] if c["name"] in ("short_fact", "explain", "code")]
NEAR_TIE = 0.5  # llama.cpp's own batched/incremental paths flip argmaxes below this top-1/top-2 margin
REAL_LOGITS_REL = 2e-3  # max |gpu - numpy| / max |numpy|, first-position logits, f16 KV [measured 4.4e-4]


@pytest.mark.parametrize("kernels", ["cpu", "gpu"])
def test_real_model_greedy_and_logits_match_numpy_and_llama_cpp(worker, real_model, kernels):  # noqa: F811
    import base64

    import numpy as np

    from model_fixtures import reference_greedy
    from pagedkv.model_runner import ForwardBatch
    from pagedkv.backends.numpy_ref import PagedKVCache

    # The gpu family's kernels are shaped for real GPUs and run slowly on the emulators: one prompt there (its
    # batched prefill and decode against the same engine code as the cpu family's three concurrent prompts).
    cases = REAL_CASES if kernels == "cpu" else REAL_CASES[:1]
    prompts = [c["prompt_ids"] for c in cases]
    r = run(worker, f"real_model({prompts}, 8, kernels={kernels!r})")
    assert len(r["gpu"]) == len(cases)
    for case, out in zip(cases, r["gpu"]):
        assert out == reference_greedy(real_model, case["prompt_ids"], 8), case["name"]
        for pos, (mine, ref) in enumerate(zip(out, case["output_ids"][:8])):
            if mine != ref:  # past the first near-tie divergence the continuations differ legitimately
                assert case["top1_top2_margins"][pos] < NEAR_TIE, (case["name"], pos, mine, ref)
                break
    p = prompts[0]
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    blocks = -(-len(p) // 16)
    kv = PagedKVCache.allocate(real_model.config, blocks, 16)
    want = real_model.forward(ForwardBatch(i32(p), i32(range(len(p))), i32(range(len(p))), i32([0, len(p)]),
                                           i32([range(blocks)]), i32([len(p)])), kv)[0]  # (vocab,)
    got = np.frombuffer(base64.b64decode(r["logits"]), "<f4")  # (vocab,)
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"real-model first-position logits: max rel error {rel:.2e}")
    assert rel <= REAL_LOGITS_REL
    assert int(got.argmax()) == int(want.argmax())
    assert r["ledger"]["used"] <= r["ledger"]["budget"]


STORED_CHOICE = """
import json
from pagedkv.browser.opfs import OpfsStore
from pagedkv.backends.webgpu.tuning import JsonInStore
json.dumps((await JsonInStore(await OpfsStore.open("tuning")).get({key!r}))["choice"])
"""


# The default (?backend=auto) takes the numpy path on SwiftShader; ?backend=webgpu overrides it. The gpu kernel
# family's boot (`kernels=gpu`) is checked by the tuning test below, whose first boot tunes.
@pytest.mark.parametrize("query,backend", [("backend=webgpu&budget_mib=16", "webgpu"), ("backend=cpu", "cpu"),
                                           ("budget_mib=16", "cpu")])
def test_app_loads_the_model_on_the_chosen_backend(browser, base_url, query, backend):
    booted = open_and_boot(browser, f"{base_url}?model=tiny-random&{query}")
    try:
        booted.page.wait_for_selector("html[data-model=ready], html[data-model=error]", state="attached")
        loaded_on(booted, query, backend)
    finally:
        booted.page.close()


def loaded_on(booted, query: str, backend: str) -> dict:
    """The booted app's model on `backend` with the kernel family the query asks for (its tuning shown and kept
    where that is the gpu family), its ledger, and a 6-token turn; the kernels' tuning record."""
    data = booted.dataset()
    assert data["model"] == "ready", data
    info = json.loads(data["modelInfo"])
    assert info["backend"] == backend and info["model"] == "tiny-random"
    family = "gpu" if "kernels=gpu" in query else "cpu"  # auto on SwiftShader: cpu
    assert json.loads(data["adapter"])["kernels"] == family
    tuned = info.get("kernels_tuning")  # the gpu family is tuned at boot, the choice kept in OPFS tuning/
    if family == "gpu":
        assert tuned["source"] in ("tuned", "cache"), tuned
        assert sorted(tuned["timings"]) == ["matmul", "matvec", "matvec_slots", "split"], tuned
        assert booted.page.locator("#adapter-kernels").inner_text().startswith(
            f"gpu (kernels=gpu was asked for); tuned ({tuned['source']}): matvec {tuned['choice']['matvec']} ")
        assert booted.py(STORED_CHOICE.format(key=tuned["key"])) == tuned["choice"]
        assert booted.py("import json\nfrom pagedkv_app.main import state\n"
                         "json.dumps(state['engine'].backend.gpu_shapes.matvec)") == tuned["choice"]["matvec"]
        assert booted.py("import json\nfrom pagedkv_app.main import state\n"
                         "json.dumps(state['engine'].backend.gpu_shapes.split)") == tuned["choice"]["split"]
        assert f"decode attention split for {tuned['choice']['split']} workgroups" in booted.page.locator(
            "#adapter-kernels").inner_text()
        threads, groups, *per = tuned["choice"]["matmul"]  # tokens a thread: 4 unless a third number says
        assert (f"matmul {threads} threads x {groups} along rows x {per[0] if per else 4} tokens a thread"
                in booted.page.locator("#adapter-kernels").inner_text())
        assert booted.py("import json\nfrom pagedkv_app.main import state\n"
                         "json.dumps(state['engine'].backend.gpu_shapes.matmul)") == tuned["choice"]["matmul"]
        threads, groups = tuned["choice"]["matvec_slots"]["lm_head"]
        assert f"lm_head {threads}x{groups}" in booted.page.locator("#adapter-kernels").inner_text()
    else:
        assert tuned is None
    assert booted.py("import json\nfrom pagedkv_app.main import state\n"
                     "json.dumps(getattr(state['engine'].backend, 'kernels', None))") == (
        family if backend == "webgpu" else None)  # the numpy backend has no kernels
    if backend == "webgpu":
        ledger = info["ledger"]
        assert ledger["budget_bytes"] == 16 << 20 and ledger["used_bytes"] <= ledger["budget_bytes"]
        assert ledger["by_kind"]["weights"] == 83200  # norm weights also in the stacked tensors
        kv_block = 2 * 2 * 16 * 2 * 16 * 2  # layers x (K, V) x 16 tokens x kv heads x head_dim x f16
        assert ledger["by_kind"]["kv"] == info["num_blocks"] * kv_block
        assert ledger["free_bytes"] < kv_block  # the pool took what the budget left
    booted.py("from pagedkv_app.main import state\n"
              "state['service'].handle({'type': 'send', 'chat': 'chat-1', 'text': 'Hello there',"
              " 'settings': {'temperature': 0, 'max_tokens': 6}})\nNone")
    booted.page.wait_for_selector("html[data-last-turn]", state="attached")
    turn = json.loads(booted.dataset()["lastTurn"])
    assert turn["chat"] == "chat-1" and turn["reason"] in ("length", "stop") and 1 <= turn["tokens"] <= 6, turn
    return tuned


REMOVE_TUNING = """async () => {
  try { await (await navigator.storage.getDirectory()).removeEntry("tuning", {recursive: true}); }
  catch (err) { if (err.name !== "NotFoundError") throw err; }
}"""


def test_the_gpu_family_is_tuned_at_first_boot_and_the_next_boot_reuses_the_choice(browser, base_url):
    """The app on ?kernels=gpu: its first boot on an origin without a stored choice tunes (and loads, shows and
    keeps the choice: loaded_on), the reload takes the stored one."""
    query = "backend=webgpu&budget_mib=16&kernels=gpu"
    blank = browser.new_page()  # this origin's OPFS outlives a page: start without a choice
    try:
        blank.goto(base_url + "app.css")
        blank.evaluate(REMOVE_TUNING)
    finally:
        blank.close()
    booted = open_and_boot(browser, f"{base_url}?model=tiny-random&{query}")
    try:
        booted.page.wait_for_selector("html[data-model=ready], html[data-model=error]", state="attached")
        first = loaded_on(booted, query, "webgpu")
        booted.page.reload()
        booted.page.wait_for_selector("html[data-model=ready], html[data-model=error]", state="attached")
        second = json.loads(booted.dataset()["modelInfo"])["kernels_tuning"]
        assert (first["source"], second["source"]) == ("tuned", "cache")
        assert second["choice"] == first["choice"] and second["key"] == first["key"]
        # every candidate has its time, or why it has none ("rejected", "over budget")
        assert set(first["timings"]["matvec"]) == {"64", "128", "256"}, first["timings"]
        assert "tuned (cache): matvec" in booted.page.locator("#adapter-kernels").inner_text()
    finally:
        booted.page.evaluate(REMOVE_TUNING)
        booted.page.close()


def test_bad_weights_are_refused_at_load(worker):
    r = run(worker, "bad_weights()")
    assert r["tampered"].startswith("WeightsError: shard shard-000.bin sha256 mismatch"), r
    assert r["code_minus_128"].startswith("ValueError: Q8_0 tensor token_embd.weight contains the code -128"), r


@pytest.mark.parametrize("kv_dtype,kernels", [("f16", "cpu"), ("int8", "gpu")])
def test_two_models_share_one_page_buffer(worker, kv_dtype, kernels):
    """Two models of different KV widths in one buffer of pages (shared_gpu.shared_gpu_engine): their requests
    batch into the same steps on interleaved pages, and each model's greedy ids equal its numpy run alone.
    Unloading one model gives its weights, scratch and staging back to the ledger; the pages stay."""
    r = run(worker, f"two_models_shared({kv_dtype!r}, {kernels!r})")
    assert r["gpu"] == r["ref"]
    wide, tiny = r["pool"]["models"]["tiny-random-wide"], r["pool"]["models"]["tiny-random"]
    # a page: 16 wide tokens, and the most tiny ones that fit: 64 in f16 (blocks past 32 tokens walk in chunks of
    # 32 keys), 32 in int8
    assert (wide["block_size"], tiny["block_size"]) == (16, {"f16": 64, "int8": 32}[kv_dtype])
    assert r["peak_pages"] >= 4 and r["pages"] == r["pool"]["pages"]
    assert r["ledger"]["by_kind"]["kv"] == r["pages"] * r["page_bytes"]
    assert r["ledger"]["used_bytes"] <= r["ledger"]["budget_bytes"]
    freed = r["ledger"]["used_bytes"] - r["after_unload"]["used_bytes"]
    assert freed > 0 and r["after_unload"]["by_kind"]["kv"] == r["ledger"]["by_kind"]["kv"]
    assert r["end_ledger"]["used_bytes"] == 0


def test_a_model_loaded_at_run_time_takes_pages_of_the_budget(worker):
    """The pages took all the budget the first model left: loading a second one allocates the page buffers again
    with fewer pages (a GPU buffer cannot shrink), only while no request holds a page (refused with the numbers
    before); both models then answer as numpy does alone; unloading it leaves its pages spare."""
    r = run(worker, "load_at_run_time()")
    assert "running requests hold" in r["refused"] and len(r["first"]) == 8
    given = r["pages_before"] - r["pages_after"]
    assert given >= 1 and r["pool"]["pages"] == r["pages_before"]  # page ids stay; those given up hold weights
    assert r["pool"]["models"]["tiny-random"]["weights_pages"] == given and r["pool"]["backed_pages"] == r["pages_after"]
    assert r["gpu"] == r["ref"]
    assert r["ledger"]["used_bytes"] <= r["ledger"]["budget_bytes"]
    assert r["after"]["spare_pages"] == given and list(r["after"]["models"]) == ["tiny-random-wide"]
