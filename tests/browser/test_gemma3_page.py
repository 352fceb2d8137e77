"""Gemma 3 270M, the built-in base model (`?model=gemma-3-270m`), in the tab: on SwiftShader `auto` runs it on the
tab's CPU path, which gives llama.cpp's greedy ids (tests/golden/gemma3_golden.json) up to a near tie free running
(`npm run generate`, the capital prompt x 24) and teacher forced in the page (golden cases 2 to 6 x 8, and the
1,783-token case 7 x 4, where the window matters); the page
says the file has no chat template and chats in Gemma's turns; ?backend=webgpu gives those ids too (teacher forced:
the capital prompt x 12, case 5 x 8)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import build
from browser_pages import open_app
from llama_reference import forced_differences, near_tie
from test_real_chat import run_turn

GOLDEN = json.loads((Path(__file__).parent.parent / "golden" / "gemma3_golden.json").read_text())
# golden prompts of 20, 16, 6, 6 and 17 tokens, teacher forced in the tab (forced_in_the_tab); all 8 cases x 24 on
# every path: `python3 -m bench --only gemma3_goldens`
FORCED_CASES = (2, 3, 4, 5, 6)


def generate(*args: str) -> subprocess.CompletedProcess:
    """`npm run generate` on Gemma 3 in its own process (Playwright's sync API runs once per thread)."""
    env = dict(os.environ, PYTHONPATH=str(build.ROOT / "py"), PAGEDKV_BENCH_BUILT="1")  # base_url built dist/
    return subprocess.run([sys.executable, "-m", "pagedkv.generate", "--model", "gemma-3-270m", *args],
                          cwd=build.ROOT, capture_output=True, text=True, env=env, timeout=600)


def assert_llama_cpps_ids(got: dict, golden: dict, at_least: int = 10) -> None:
    """Free running: our ids equal llama.cpp's up to where its own margin is a near tie, and at least that far."""
    ours, theirs = got["output_ids"], golden["output_ids"]
    parted = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
    assert parted == len(ours) or near_tie(golden["margins"][parted]), (parted, ours, theirs)
    assert parted >= at_least, (ours, theirs)


def window_groups_on_panel(memory: list, prompt_tokens: int, groups: list[str], window_blocks: int) -> dict:
    """The last of the panel's numbers (run_turn's) taken while a reply decoded: the KV groups listed as `groups`,
    the full group holding every block of the prompt and each window group at most window_blocks, fewer."""
    busy = [m for m in memory if m and m["used"] > 0 and m.get("groups")]
    assert busy, "no snapshot while the reply decoded"
    last = busy[-1]
    assert last["groups"] == groups
    full, *windows = last["group_used"]
    assert full >= -(-prompt_tokens // 16) and max(windows) <= window_blocks < full, last["group_used"]
    return last


def test_the_tabs_cpu_path_continues_a_prompt_with_llama_cpps_ids(base_url):
    """Free running from llama.cpp's prompt ids (our tokenizer in Pyodide gives them too): equal up to the first
    position where llama.cpp's own margin is a near tie (the capital prompt: its 11th id, margin 0.36)."""
    golden = GOLDEN["cases"][0]
    proc = generate("--prompt", golden["text"], "--max-tokens", "24", "--greedy", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["backend"] == "cpu" and got["prompt_ids"] == golden["prompt_ids"]
    assert_llama_cpps_ids(got, golden)


def test_webgpu_gives_llama_cpps_ids_on_two_prompts(browser, base_url):
    """?backend=webgpu (SwiftShader, the cpu kernel family there), teacher forced in the tab's engine: the capital
    prompt's first 12 ids and golden case 5's first 8 (a 6-token prompt: SwiftShader prefills ~3 tokens a
    second, so case 3's 16 tokens stay with the CPU path); every op of Gemma's layer compiled into the plan, its
    262,144-row head in parts, its window layers in KV groups."""
    booted, info = open_app(browser, base_url + "?model=gemma-3-270m&backend=webgpu&kv_disk=0", 300_000)
    try:
        assert (info["model"], info["backend"]) == ("gemma-3-270m", "webgpu")
        forced_in_the_tab(booted, [(0, 12), (5, 8)])
    finally:
        booted.page.close()


def forced_in_the_tab(booted, cases: list[tuple[int, int]]) -> list:
    """llama.cpp's first n ids of each (golden case, n), teacher forced through the tab's own engine
    (tests/forced_rows.py, installed into the worker), under tests/test_gemma3.py's near-tie rule; returns the
    (argmax, margin) rows of each case."""
    refs = [{"prompt_ids": GOLDEN["cases"][c]["prompt_ids"], "output_ids": GOLDEN["cases"][c]["output_ids"][:n],
             "margins": GOLDEN["cases"][c]["margins"][:n]} for c, n in cases]
    booted.install({"forced_rows.py": (build.ROOT / "tests" / "forced_rows.py").read_text()})
    forced = [(r["prompt_ids"], r["output_ids"]) for r in refs]
    rows = booted.py("import json\nfrom forced_rows import forced_rows\nfrom pagedkv_app.main import state\n"
                     f"json.dumps(await forced_rows(state['engine'], {forced!r}))")
    for got, ref in zip(rows, refs):
        print(got, ref["output_ids"])  # pytest -s
        forced_differences([tuple(row) for row in got], ref)
    return rows


def test_it_chats_in_gemmas_turns_and_the_page_says_why(browser, base_url):
    booted, info = open_app(browser, base_url + "?model=gemma-3-270m", 300_000)
    try:
        assert (info["model"], info["backend"], info["layers"]) == ("gemma-3-270m", "cpu", 18)
        # The CPU path: llama.cpp's ids on two short prompts, and on golden case 7 (1,783 tokens: its answer, a
        # password on its first line, only the 3 global layers see; the window layers' KV groups slide past it
        # during the prefill) its first 4, exactly (llama.cpp's margins 4.2 to 8.0: no near tie)
        rows = forced_in_the_tab(booted, [(c, 8) for c in FORCED_CASES] + [(7, 4)])
        assert [argmax for argmax, _ in rows[-1]] == [84545, 5228, 3118, 236772]
        assert info["chat_template"] == "none in the file: Gemma's <start_of_turn> turns"
        status = booted.page.locator("#chat-status").inner_text()
        assert "chat template: none in the file: Gemma's <start_of_turn> turns" in status
        turn, start, _, _ = run_turn(booted, "What is the capital of France?", 4)
        assert turn["tokens"] == 4 and turn["content"].strip()
        # The prompt is Gemma's turn format: <bos><start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n
        prompt = booted.py("import json\nfrom pagedkv_app.main import state\n"
                           "ids = next(iter(state['service'].sessions.values())).conversation.ids\n"
                           "json.dumps(state['engine'].tokenizer.decode(ids[:16]))")
        assert prompt.startswith("<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"), prompt
        assert start["prompt_tokens"] == 16
    finally:
        booted.page.close()


def test_create_engine_completes_raw_text_with_it(browser, base_url):
    """Any page of the origin: createEngine({model: "gemma-3-270m"}) and engine.completions.create continue a
    prompt with llama.cpp's first greedy ids (before its near tie at the 11th)."""
    from pagedkv.model.weights import read_manifest
    from pagedkv.tokenizer import Tokenizer

    golden = GOLDEN["cases"][0]
    tok = Tokenizer.from_manifest(read_manifest(build.DIST / "models" / "gemma-3-270m"))
    page = browser.new_page()
    try:
        page.goto(base_url + "examples/api.html?model=gemma-3-270m")
        page.wait_for_selector("html[data-engine=ready]", state="attached", timeout=240_000)
        got = page.evaluate("""async (prompt) => {
          const e = window.engine;
          return await e.completions.create({ model: e.model, prompt, max_tokens: 10, temperature: 0 });
        }""", golden["text"])
    finally:
        page.close()
    assert (got["object"], got["model"], got["usage"]["prompt_tokens"]) == ("text_completion", "gemma-3-270m", 6)
    assert got["choices"][0]["text"] == tok.decode(golden["output_ids"][:10])


def test_its_window_layers_hold_only_their_window_and_the_panel_shows_both_groups(browser, base_url):
    """A 752-token chat turn past Gemma's 512-token window: while the reply decodes, the memory panel's numbers
    (dataset.memory, from LLMEngine.kv_snapshot) show the full group holding every block of the context and each
    of the 5 window groups at most the window's ceil(511 / 16) + 1 = 33 blocks; the panel names both kinds."""
    text = GOLDEN["cases"][-1]["text"][:3800]
    booted, info = open_app(browser, base_url + "?model=gemma-3-270m&kv_disk=0", 300_000)
    try:
        turn, start, _, memory = run_turn(booted, text, 24)
        assert start["prompt_tokens"] > 700
        window_groups_on_panel(memory, start["prompt_tokens"], ["full"] + ["window 512"] * 5, 33)
        facts = booted.page.locator("#memory-facts").inner_text()
        assert "KV groups" in facts and "window 512:" in facts and "in 5 groups" in facts, facts
    finally:
        booted.page.close()


def test_it_resumes_after_a_reload_from_the_disk_tier(browser, base_url):
    """Chat, reload, and the next turn restores every KV group's pages of the history from disk (OPFS) instead of
    prefilling them, replying what a page without the disk tier replies."""
    from test_kv_disk_page import REMOVE_KV, reload, settled_memory, turn

    texts = ("Write one sentence about the sea.", "And one about the sky?")
    ref, _ = open_app(browser, base_url + "?model=gemma-3-270m&kv_disk=0", 300_000)
    try:
        refs = [turn(ref.page, t) for t in texts]
        ref.page.evaluate(REMOVE_KV)
    finally:
        ref.page.close()
    booted, _ = open_app(browser, base_url + "?model=gemma-3-270m", 300_000)
    page = booted.page
    try:
        first = turn(page, texts[0])
        assert first["content"] == refs[0]["content"] and first["cached_tokens"] == 0
        blocks = (first["history_tokens"] - 1) // 16  # every full block the first turn computed
        pages = blocks * 6  # a page per KV group: 1 full + 5 window groups (the history is inside the window)
        assert settled_memory(page, "disk_blocks", pages)["disk_blocks"] == pages > 0
        reload(page)
        second = turn(page, texts[1])
        assert second["content"] == refs[1]["content"]
        mem = settled_memory(page, "restored", blocks * 16)
        assert second["cached_tokens"] == mem["restored"] == blocks * 16
    finally:
        for _ in range(50):  # the tier's writer may still hold the directory a moment after the last turn
            try:
                page.evaluate(REMOVE_KV)
                break
            except Exception as exc:  # Playwright's Error
                if "InvalidModificationError" not in str(exc):
                    raise
                page.wait_for_timeout(200)
        page.close()
