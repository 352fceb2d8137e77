"""bench.native_llama (llama.cpp's native server, the row issue 51 measures the tab against) on the pinned SmolLM2
GGUF, and how bench.wllama's report sets it beside the tab's default and wllama's best."""
import json

from llama_reference import near_tie
from model_fixtures import cached_gguf, gemma3_gguf  # noqa: F401  (fixture)

from bench import ROOT
from bench.native_llama import native_row
from bench.report.summary import wllama_table
from bench.wllama import native_ratio_line, pair, pair_medians, prompt_text
from pagedkv.model.weights import read_manifest
from pagedkv.tokenizer import Tokenizer

GOLDEN = json.loads((ROOT / "tests" / "golden" / "llama_golden.json").read_text(encoding="utf-8"))


def test_the_native_row_gives_llama_cpps_greedy_ids_and_its_own_timings():
    """A golden prompt (tests/golden/llama_golden.json, made by llama.cpp through another binding): the same 8
    greedy ids up to a near tie of llama.cpp's own, timings of exactly the prompt and the new tokens. One thread:
    two spin-wait for each other on cores other work shares (2 threads took 37 s here beside other jobs)."""
    case = GOLDEN["cases"][0]
    row = native_row(cached_gguf(), case["prompt_ids"], 8, threads=1)
    pos = next((i for i, (a, b) in enumerate(zip(row["output_ids"], case["output_ids"])) if a != b), None)
    assert len(row["output_ids"]) == 8 and (pos is None or near_tie(case["top1_top2_margins"][pos])), row
    assert (row["backend"], row["threads"]) == ("llama.cpp native, 1 thread", 1)
    assert (row["timings"]["prompt_n"], row["timings"]["predicted_n"]) == (len(case["prompt_ids"]), 8)
    assert row["prefill_tok_s"] > 0 and row["decode_tok_s"] > 0


def report() -> dict:
    """A bench.wllama report of made-up figures with a native row (what compare() leaves in it)."""
    tab = {"backend": "auto → cpu in the tab", "asked": "auto", "prefill_tok_s": 160.0, "decode_tok_s": 72.0,
           "ttft_s": 3.2}
    wllama = [{"threads": t, "flash_attn": f, "prefill_tok_s": p, "decode_tok_s": d, "ttft_s": 512 / p,
               "ids_match_ours": True} for t, f, p, d in ((1, True, 10.0, 4.0), (2, False, 25.0, 16.0))]
    native = {"backend": "llama.cpp native, 2 threads", "threads": 2, "xllamacpp_version": "2026.10.11549",
              "prefill_tok_s": 320.0, "decode_tok_s": 80.0, "ttft_s": 1.6, "ids_match_ours": True,
              "rows_match_native": {"webgpu in the tab": True, "auto → cpu in the tab": True}}
    return {"gguf": "SmolLM2-135M-Instruct.Q4_1.gguf", "prompt_tokens": 512, "new_tokens": 128,
            "wllama_version": "3.13.0", "ours": [tab], "wllama": wllama, "native": native}


def test_the_tab_and_wllamas_best_over_native_llama_cpp():
    assert native_ratio_line(report()) == (
        "Against native llama.cpp (llama.cpp native, 2 threads, xllamacpp 2026.10.11549: decode 80.00 / prefill "
        "320.00 tok/s): the tab's default (auto → cpu in the tab) 0.90x / 0.50x, wllama's best 0.20x / 0.08x. "
        "First 8 greedy ids equal to native llama.cpp's: webgpu in the tab: True, auto → cpu in the tab: True.")


def test_several_pairs_give_the_ratio_of_their_medians():
    """--pairs 3: the tab's default and native run in turn three times; the line adds each side's medians (one slow
    run of either side moves neither), their ratio, and whether every pair's first ids agree."""
    r = report()
    r["pairs"] = [pair({**r["ours"][0], "output_ids": list(range(9))},
                       {**r["native"], "output_ids": list(range(8)) + [99]})]
    for tab, native, ids in (((150.0, 60.0), (330.0, 79.0), 7), ((170.0, 75.0), (250.0, 50.0), 3)):
        r["pairs"].append(pair({"prefill_tok_s": tab[0], "decode_tok_s": tab[1], "output_ids": [ids] * 8},
                               {"prefill_tok_s": native[0], "decode_tok_s": native[1], "output_ids": [ids] * 8}))
    m = pair_medians(r["pairs"])
    assert (m["tab"], m["native"]) == ({"prefill_tok_s": 160.0, "decode_tok_s": 72.0},
                                       {"prefill_tok_s": 320.0, "decode_tok_s": 79.0})
    assert native_ratio_line(r).endswith(
        " Over 3 pairs of the tab's default and native run in turn, medians: tab 72.00 / 160.00, native 79.00 / "
        "320.00 tok/s (decode / prefill): 0.91x / 0.50x; first ids equal in every pair: True.")
    r["pairs"][1]["ids_match"] = False
    assert native_ratio_line(r).endswith("every pair: False.")


def test_the_summary_table_has_the_native_row_and_its_ratios():
    r = report()
    r["native_ratio"] = native_ratio_line(r)
    lines = wllama_table(r)
    assert "| llama.cpp native (xllamacpp 2026.10.11549) | 2 | | 320.0 | 80.0 | 1.6 s | True |" in lines
    assert r["native_ratio"] in lines


def test_gemmas_prompt_starts_with_its_bos_as_llama_cpp_tokenizes_the_text(gemma3_gguf):  # noqa: F811
    """bench.wllama --gguf gemma3: wllama gets the text and adds Gemma's BOS itself, so our and native llama.cpp's
    ids carry it too, the prompt `n` ids long with it; the summary names the run's command line."""
    from pagedkv.model.convert import convert_cached

    converted = convert_cached(gemma3_gguf, ROOT / ".cache" / "models")
    text, ids = prompt_text(64, converted)
    assert (ids[0], len(ids), text.startswith("Day 1. The lighthouse keeper")) == (2, 64, True)
    assert ids[1:] == Tokenizer.from_manifest(read_manifest(converted)).encode(text)
    lines = wllama_table({**report(), "gguf": "gemma-3-270m-q4_k_m.gguf"}, "Gemma")
    assert lines[2].startswith("`python3 -m bench.wllama --gguf gemma3 --no-webgpu --wllama-threads 2`")
