"""bench/results/SUMMARY.md from the benchmark JSON: the headline tables, each with its command and the machine.

`python3 -m bench` writes it after a run; `python3 -m bench --report` rewrites it and docs/results.md (links
relative to docs/) from the JSON. Sections whose JSON is missing are left out (and say so). docs/results.md is
this file with a generated header; README.md's short results table links into it.
"""
from __future__ import annotations

import json
import os
import platform
import re
from pathlib import Path

SEED = {"contiguous": {"ctx": "~1,200", "util": "22.4 %", "oom": "38.5 %"},
        "paged": {"ctx": "~4,800", "util": "88.6 %", "oom": "0 %"}}
LABELS = {"contiguous": "contiguous", "paged": "paged (no prefix cache)", "paged+prefix": "paged + prefix cache",
          "paged+prefix+preempt": "paged + prefix cache, waits / preempts instead of failing"}


def _load(results: Path, name: str) -> dict | None:
    path = results / name
    return json.loads(path.read_text()) if path.exists() else None


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _quick(data: dict) -> str:
    return " --quick" if data.get("quick") else ""


def machine(adapter: str | None) -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores (shared with other jobs while measuring: timings are noisy), "
            f"{platform.system()} {platform.machine()}, Python {platform.python_version()}; "
            f"headless Chromium WebGPU adapter: {adapter or 'n/a'}")


def _preempted(row: dict) -> str:
    if not row.get("preempt"):
        return ""
    return f"; {row['preemptions']:,} preemptions, {row['deferred_ticks']:,} turn-seconds waiting for memory"


def _kv_dtype(kv: dict, entry: dict) -> str:
    return entry.get("kv_dtype") or kv["kv_dtype"]  # results written before int8 rows named one dtype per file


def seed_table(kv: dict) -> list[str]:
    dtypes = list(dict.fromkeys(_kv_dtype(kv, e) for e in kv["budgets"]))  # in run order
    out = ["## The seed's experiment in the real tab", "",
           f"`python3 -m bench.kv_browser{_quick(kv)}` — kv_sim's workload ({kv['sessions']} sessions, seed "
           f"{kv['seed']}, KV {' and '.join(dtypes)}) against pools sized by the GPU ledger after loading "
           "SmolLM2-135M; every token's slot written by the real kv_write kernel (synthetic K/V). Seed figures: "
           "its authors' 1.5B model under 1 GiB.", "",
           "| budget | KV dtype | allocator | max context reached (workload) "
           "| one conversation alone (capacity / formula) | memory utilization mean / p5 | slot efficiency "
           "| failed allocations (turns) | conversations served |",
           "|---|---|---|---|---|---|---|---|---|"]
    for kind in ("contiguous", "paged"):
        s = SEED[kind]
        out.append(f"| 1 GiB | | seed: {kind} | {s['ctx']} | | {s['util']} | | {s['oom']} | |")
    for entry in kv["budgets"]:
        led = entry["ledger"]
        for label, row in entry["rows"].items():
            cap = entry["capacity"]["contiguous" if label == "contiguous" else "paged"]
            out.append(
                f"| {entry['budget_mib']} MiB | {_kv_dtype(kv, entry)} | ours: {LABELS[label]} "
                f"| {row['max_context_tokens']:,} "
                f"| {cap['max_context_tokens']:,} / {led['formula_tokens']:,} ({_pct(cap['fraction_of_formula'])}) "
                f"| {_pct(row['token_utilization_mean'])} / {_pct(row['token_utilization_p5'])} "
                f"| {_pct(row['slot_efficiency'])} | {_pct(row['oom_rate'])} ({row['turns_failed']} of "
                f"{row['turns_started']:,} {'attempts, waits included' if row.get('preempt') else 'turns'})"
                f"{_preempted(row)} | {row['sessions_served']} of {row['sessions']} |")
    first = kv["budgets"][0]
    out += [""] + [ledger_line(kv, e) for e in kv["budgets"] if e["budget_mib"] == first["budget_mib"]]
    out += ["formula = (budget - weights - scratch - staging) / bytes_per_token; bytes per token = the KV "
            "buffers the ledger holds / their slots (for int8 its per-group scales included).",
            "Memory utilization = KV slots holding a token that is still usable (live, or a cached prefix block) / "
            f"all slots, sampled every second between warm-up ({kv.get('warmup_s', 300)} s) and the last arrival. Slot efficiency = tokens "
            "in allocated slots / allocated slots. Allocated-slot share (the contiguous baseline reserves "
            f"2,048 slots per conversation; {first['budget_mib']} MiB, {_kv_dtype(kv, first)}): " + ", ".join(
                f"{LABELS[k]} {_pct(r['utilization_mean'])}" for k, r in first["rows"].items()) + ".",
            "Except in the preempt row, a refused allocation ends the conversation (raw headroom); the preempt row "
            "does what the engine's scheduler does: a turn whose prompt does not fit waits, a decode that does not "
            "fit frees its blocks (full ones stay cached) and the turn is recomputed (retries count as started "
            "turns).", ""]
    return out


def ledger_line(kv: dict, entry: dict) -> str:
    led, kinds = entry["ledger"], entry["ledger"]["by_kind"]
    return (f"Ledger at {entry['budget_mib']} MiB, KV {_kv_dtype(kv, entry)}: weights "
            f"{kinds['weights'] / 2**20:.1f} MiB, scratch {kinds['scratch'] / 2**20:.1f} MiB, staging "
            f"{kinds['staging'] / 2**20:.1f} MiB, KV {kinds['kv'] / 2**20:.1f} MiB = {led['kv_tokens']:,} tokens at "
            f"{led['bytes_per_token']:,} B/token.")


def roofline_table(rf: dict) -> list[str]:
    sr = rf["stream_read"]
    out = ["## Roofline, paged vs contiguous attention, block size", "",
           f"`python3 -m bench.roofline{_quick(rf)}` — streaming read of this adapter: {sr['gb_s_best']:.2f} GB/s best, "
           f"{sr['gb_s_median']:.2f} GB/s median (64 MiB); roofline ms = bytes / the best figure. Decode step: the "
           "real model, one sequence, greedy, scattered block table. Attention: one layer's paged_attention with a "
           "scattered vs an identity block table, alternated rounds (median of per-round ratios).", ""]
    alu = rf.get("alu_peak")
    if alu:
        out += [f"Compute limit: register-only f32 multiply-adds (shaders/alu_peak.wgsl) run at {alu['gflops_best']:.2f} "
                f"GFLOP/s best, {alu['gflops_median']:.2f} median; compute roofline ms = the step's flops (2 per weight, "
                "4 per head dimension per context token for attention) / the best figure.", ""]
    out += ["| context | bytes a decode step reads | roofline ms (memory / compute) | measured step ms (median / best) "
            "| fraction of roofline, memory (median / best) | fraction of roofline, compute (median / best) "
            "| Python controller ms (backend) | JS crossings / step | attention kernel paged / contiguous |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r, step, att in zip(rf["roofline"], rf["decode_steps"], rf["attention_by_context"]):
        compute = (f"{r['compute_roofline_ms']:.1f}", f"{_pct(r['fraction_of_compute_roofline'])} / "
                   f"{_pct(r['compute_fraction_best_sample'])}") if "compute_roofline_ms" in r else ("", "")
        out.append(f"| {r['context']:,} | {r['bytes_read'] / 1e6:.1f} MB | {r['roofline_ms']:.1f} / {compute[0]} "
                   f"| {r['step_ms']:.1f} / {step['step_ms_min']:.1f} "
                   f"| {_pct(r['fraction_of_roofline'])} / {_pct(r['fraction_best_sample'])} | {compute[1]} "
                   f"| {step['backend_python_ms']:.2f} "
                   f"| {'/'.join(str(c) for c in step['js_crossings'])} | {att['paged_over_contiguous']:.3f} "
                   f"({att['paged_ms']:.2f} vs {att['contiguous_ms']:.2f} ms) |")
    out += ["", "| block size | attention at 4k: paged / contiguous | paged ms | slot efficiency (kv_sim, 1 GiB) "
            "| failed allocations | prefix hit rate |", "|---|---|---|---|---|---|"]
    for att, eff in zip(rf["attention_by_block_size"], rf["slot_efficiency_by_block_size"]):
        kernel = (f"not run: {att.get('unsupported')}", "")  # the reason recorded then (before blocks of 64)
        if "unsupported" not in att:
            kernel = (f"{att['paged_over_contiguous']:.3f}", f"{att['paged_ms']:.2f}")
        out.append(f"| {eff['block_size']} | {kernel[0]} | {kernel[1]} "
                   f"| {_pct(eff['slot_efficiency'])} | {_pct(eff['oom_rate'])} | {_pct(eff['prefix_hit_rate'])} |")
    return out + [""]


def concurrency_table(cc: dict, pb: dict | None) -> list[str]:
    """Generated tok/s by number of conversations (batched vs one at a time), swap vs recompute, page boot."""
    out = ["## Concurrent conversations, preemption cost, page boot", "",
           f"`python3 -m bench.webgpu_engine --concurrency{_quick(cc)}` — WebGPU; every conversation gets the same number of new "
           "tokens, all queued at once (the engine's continuous batching) vs each queued after the previous finished; "
           "tok/s = tokens generated / wall time, prefills included.",
           "", "| model | prompt tokens | new tokens each | conversations | batched tok/s | one at a time tok/s "
           "| speedup |", "|---|---|---|---|---|---|---|"]
    for key in ("tiny", "smollm2"):
        if key not in cc:
            continue
        info = cc[key]["info"]
        for r in cc[key]["rows"]:
            out.append(f"| {info['model']} | {info['prompt_tokens']} | {r['new_tokens_each']} | {r['concurrency']} "
                       f"| {r['batched_tok_s']:.2f} | {r['one_at_a_time_tok_s']:.2f} | {r['speedup']:.2f} |")
    if cc.get("swap_vs_recompute"):
        out += ["", "Preempted sequence (tiny model), wall ms: swap out + back in vs recompute (one prefill).", "",
                "| blocks | tokens | swap out + in | recompute | cheaper |", "|---|---|---|---|---|"]
        out += [f"| {r['blocks']} | {r['tokens']} | {r['swap_round_trip_ms']:.1f} | {r['recompute_ms']:.1f} "
                f"| {r['cheaper']} |" for r in cc["swap_vs_recompute"]]
    if pb:
        out += ["", f"`python3 -m bench.page_boot{_quick(pb)}` — page to ready (Pyodide, packages, the engine's "
                f"self-test; the model loads after): cold (fresh browser profile) {pb['cold_median_ms'] / 1e3:.1f} s, "
                f"warm (reload, HTTP cache) {pb['warm_median_ms'] / 1e3:.1f} s, median of {pb['runs']}."]
    return out + [""]


def ttft_table(tt: dict) -> list[str]:
    out = ["## Time to first token by turn", "",
           f"`python3 -m bench.ttft{_quick(tt)}` — one greedy conversation ({tt['system_tokens']}-token system prompt, "
           f"{tt['user_tokens']}-token user messages, {tt['answer_tokens']}-token answers), prefix caching on vs off.",
           "", "| turn | prompt tokens | new tokens prefilled (cache on) | WebGPU on / off (s) | numpy CPU on / off (s) |",
           "|---|---|---|---|---|"]
    for i, on in enumerate(tt["webgpu"]["on"]):
        off, con, coff = tt["webgpu"]["off"][i], tt["cpu_numpy"]["on"][i], tt["cpu_numpy"]["off"][i]
        out.append(f"| {on['turn']} | {on['prompt_tokens']} | {on['prompt_tokens'] - on['cached_tokens']} "
                   f"| {on['ttft_ms'] / 1e3:.2f} / {off['ttft_ms'] / 1e3:.2f} "
                   f"| {con['ttft_ms'] / 1e3:.2f} / {coff['ttft_ms'] / 1e3:.2f} |")
    return out + [""]


def structured_table(st: dict, wgpu: dict | None = None) -> list[str]:
    """Decode ms/token free text vs json_schema vs a forced tool call (bench/structured.py), on the CPU backend and,
    where structured_wgpu.json is there, on the WebGPU one; then the grammar mask's own cost per token."""
    runs = [(st, "CPU backend (numpy)", "")] + ([(wgpu, f"WebGPU, gpu kernels, {wgpu['adapter']}", " --backend wgpu")]
                                               if wgpu else [])
    out = ["## Structured output: what the grammar costs per token", "",
           f"`python3 -m bench.structured{_quick(st)}` — {st['model']}, one greedy request at a time, the same "
           f"question, as many new tokens in every mode (every reply runs past them), the modes interleaved round by "
           "round; ms per decode token from the engine's steps (first to last new token), median over the rounds; "
           "x plain: the median of each round's ratio to that round's plain request (and the rounds' range: where it "
           "spans 1, the machine's noise outweighs the grammar's cost). json_schema: a response_format; "
           "tools: one tool, tool_choice required (its instruction makes the prompt longer).", "",
           "| backend | rounds x tokens | load average (start, end) | plain ms/token | json_schema ms/token (x plain) "
           "| tools ms/token (x plain) |", "|---|---|---|---|---|---|"]
    for run, label, _ in runs:
        dec, load = run["decode"], run["load_average"]
        modes = dec["modes"]
        cells = [f"{modes[m]['ms_per_token_median']:.0f} ({modes[m]['ratio_to_plain']:.2f}x; rounds "
                 f"{min(modes[m]['rounds_ratio_to_plain']):.2f}-{max(modes[m]['rounds_ratio_to_plain']):.2f})"
                 for m in ("json_schema", "tools")]
        out.append(f"| {label}{' (quick)' if run.get('quick') else ''} | {dec['rounds']} x {dec['tokens_per_request']} "
                   f"| {load['start'][0]:.1f}, {load['end'][0]:.1f} | {modes['plain']['ms_per_token_median']:.0f} "
                   f"| {' | '.join(cells)} |")
    mask = st["mask_ms"]
    out += ["", f"The mask alone (GrammarMatcher over the {st['trie_nodes']:,}-node vocabulary trie, "
            f"{mask['cold']['n']} tokens of {st['seeds']['count']} seeded replies): cold median "
            f"{mask['cold']['median']:.2f} ms, p95 {mask['cold']['p95']:.1f} ms; cached median "
            f"{mask['cached']['median']:.3f} ms" + (f"; in the tab's Pyodide worker cold median "
                                                    f"{st['tab']['mask_ms']['cold']['median']:.2f} ms, cached "
                                                    f"{st['tab']['mask_ms']['cached']['median']:.3f} ms"
                                                    if st.get("tab") else "") + ".", ""]
    return out


def hybrid_kv_table(hk: dict, wgpu: dict | None = None) -> list[str]:
    """Gemma 3 270M's KV with window groups (kv/groups.py) beside every layer holding the whole context; wgpu: the
    same on the WebGPU backend (`--backend wgpu`, hybrid_kv_wgpu.json), where there is one."""
    g, fit, dec = hk["groups"], hk["fits_64mib"], hk["decode"]
    out = ["## KV groups: sliding-window layers hold only their window", "",
           f"`python3 -m bench.hybrid_kv{_quick(hk)}` — {hk['model']}, {hk['kv_dtype']} KV, blocks of "
           f"{hk['block_size']} tokens: {len(g['layers'])} groups of {g['group_size']} layers (windows "
           f"{', '.join('full' if w is None else str(w) for w in g['windows'])}), a page {g['page_bytes']:,} B "
           f"against {g['flat_page_bytes']:,} B with every layer in one block.", "",
           "| tokens | window groups (MB) | every layer full (MB) | ratio |", "|---|---|---|---|"]
    for row in hk["held"]:
        out.append(f"| {row['tokens']:,} | {row['groups_bytes'] / 1e6:.1f} | {row['flat_bytes'] / 1e6:.1f} "
                   f"| {row['ratio']:.2f}x |")
    greedy = hk["greedy"]
    out += ["", f"In {fit['budget_bytes'] / 2 ** 20:.0f} MiB of KV: {fit['groups_tokens']:,} tokens with groups, "
            f"{fit['flat_tokens']:,} with every layer full. Greedy ids of a {greedy['prompt_tokens']}-token prompt "
            f"+ {greedy['new_tokens']}: {'equal' if greedy['equal'] else 'DIFFERENT'} both ways. Decode at "
            f"{dec['context_tokens']:,} tokens (CPU backend): {dec['groups']['decode_tok_s']:.1f} vs "
            f"{dec['flat']['decode_tok_s']:.1f} tok/s.", ""]
    if wgpu:
        eng, pages = wgpu["engine_1k"], wgpu["page_bytes"]
        out += [f"`python3 -m bench.hybrid_kv --backend wgpu` — the WebGPU backend on {wgpu['adapter']}: its ledger "
                f"reserves a page of {pages['groups']:,} B with groups, {pages['flat']:,} B with every layer full "
                f"({wgpu['num_blocks']['groups']:,} / {wgpu['num_blocks']['flat']:,} pages in a "
                f"{wgpu['budget_bytes'] / 2 ** 30:g} GiB budget). Held (the manager's blocks x those pages): "
                + "; ".join(f"{row['tokens']:,} tokens {row['groups_bytes'] / 1e6:.1f} vs "
                            f"{row['flat_bytes'] / 1e6:.1f} MB ({row['ratio']:.2f}x)" for row in wgpu["held"])
                + f". The engine on the adapter, a {eng['prompt_tokens']:,}-token prompt and one decoded token: "
                f"{eng['groups']['used_blocks']} pages ({eng['groups']['bytes'] / 1e6:.1f} MB) with groups, "
                f"{eng['flat']['used_blocks']} ({eng['flat']['bytes'] / 1e6:.1f} MB) with every layer full.", ""]
    return out


WLLAMA_TITLE = "Side by side with wllama (same GGUF, same prompt, greedy)"


def _wllama_args(wl: dict) -> str:
    """The command-line arguments that gave a bench.wllama result (its file and prompt)."""
    gguf = wl.get("gguf", "")
    args = (" --gguf gemma3 --no-webgpu --wllama-threads 2" if gguf.startswith("gemma-3")
            else " --gguf q4_k_m" if "q4_k_m" in gguf else "")
    if wl["prompt_tokens"] != 512 or wl["new_tokens"] != 128:
        args += f" --prompt {wl['prompt_tokens']} --new {wl['new_tokens']}"
    return args + _quick(wl)


def wllama_table(wl: dict, title: str = WLLAMA_TITLE) -> list[str]:
    ttft = all("ttft_s" in r for r in wl["wllama"] + wl["ours"])
    out = [f"## {title}", "",
           f"`python3 -m bench.wllama{_wllama_args(wl)}` — @wllama/wllama {wl.get('wllama_version', '?')}, "
           f"{wl['gguf']}, {wl['prompt_tokens']}-token prompt, {wl['new_tokens']} new tokens.", "",
           "| engine | threads | flash attention | prefill tok/s | decode tok/s |" + (" time to first token |" if ttft else "")
           + " first 8 greedy tokens match ours |", "|---|---|---|---|---|---|" + ("---|" if ttft else "")]

    def first_token(r: dict) -> str:
        return (f" {r['ttft_s']:.1f} s |" if r["ttft_s"] is not None else " |") if ttft else ""

    for r in wl["wllama"]:
        out.append(f"| wllama (CPU, wasm) | {r['threads']} | {'on' if r['flash_attn'] else 'off'} "
                   f"| {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.1f} |{first_token(r)} {r['ids_match_ours']} |")
    for r in wl["ours"]:
        out.append(f"| PagedKV {r['backend']} | | | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.1f} |"
                   f"{first_token(r)} |")
    native = wl.get("native")
    if native:
        out.append(f"| llama.cpp native (xllamacpp {native['xllamacpp_version']}) | {native['threads']} | "
                   f"| {native['prefill_tok_s']:.1f} | {native['decode_tok_s']:.1f} |{first_token(native)} "
                   f"{native['ids_match_ours']} |")
    if wl.get("ratio"):
        out += ["", wl["ratio"]]
    if wl.get("native_ratio"):
        out += ["", wl["native_ratio"]]
    out += ["", "wllama runs on the CPU here: its WebGPU backend needs shader-f16, which SwiftShader lacks, and our "
            "WebGPU runs on SwiftShader, itself a CPU emulation. Both ran in one session on the same 2 cores; "
            "measured while planning issue 9 (same GGUF), wllama gave 9.6 / 4.1 (1 thread, flash attention on), "
            "7.5 / 6.2 (off), 17.9 / 7.5 and 14.1 / 9.7 (2 threads) prefill / decode tok/s on a 512-token prompt, "
            "so compare the rows of one table, not across tables."]
    return out + [""]


def _policy_label(name: str) -> str:
    if name == "full_attention":
        return "full attention"
    if name.startswith("h2o_"):
        return f"H2O eviction, {name.split('_')[1].replace('pct', ' %')} of the blocks (4 sinks, half recent)"
    w = name.split("_")[1]
    return {"no_sinks": f"window {w}, no sinks", "4_sinks": f"window {w} + 4 sinks",
            "4_sinks_original_positions": f"window {w} + 4 sinks, original positions"}[name.split("_", 2)[2]]


def kv_quality_window_table(kq: dict) -> list[str]:
    full = kq["policies"]["full_attention"]
    seg_blocks = kq["segment_tokens"] // kq["block_size"]
    out = ["## Quality of bounded KV: sliding window, attention sinks, H2O eviction", "",
           f"`python3 -m bench.kv_quality_window{_quick(kq)}` — {kq['tokens_scored']:,} scored tokens of "
           f"{kq['corpus']}, {kq['segments']} segments of {kq['segment_tokens']:,} tokens, each a fresh conversation "
           f"through the engine's scheduler, cache manager, retention policy and model runner on the {kq['engine']} "
           f"engine (SmolLM2-135M), {kq['block_size']}-token blocks. Agreement: share of positions whose greedy "
           f"next token equals full attention's. Tail: positions from {kq['tail_from_position']:,} on, where every "
           "window has dropped blocks.", "",
           f"| policy | KV blocks held (of {seg_blocks}) | perplexity | ΔPPL vs full | perplexity, tail "
           "| greedy agreement | agreement, tail | blocks evicted |",
           "|---|---|---|---|---|---|---|---|"]
    for name, r in kq["policies"].items():
        out.append(f"| {_policy_label(name)} | {r['max_blocks_held']} | {r['ppl']:.3f} | {r['ppl'] - full['ppl']:+.3f} "
                   f"| {r['ppl_tail']:.3f} | {_pct(r['agreement'])} | {_pct(r.get('agreement_tail', r['agreement']))} "
                   f"| {r.get('evicted_blocks', 0):,} |")
    lr = kq.get("long_run")
    if lr:
        out += ["", f"Past the model's {lr['model_context']:,}-token context: one {lr['tokens']:,}-token stretch under "
                f"window {lr['window_tokens']:,} + {lr['sink_tokens']} sinks ({lr['block_size']}-token blocks, "
                f"{lr['engine']}): perplexity before / past {lr['model_context']:,} tokens = "
                + "; ".join(f"{mode} positions {lr[mode]['ppl_before_context']:.3f} / {lr[mode]['ppl_past_context']:.3f}"
                            f" ({lr[mode]['max_blocks_held']} blocks held)" for mode in ("shifted", "original"))
                + (f". Note: {lr['note']}." if lr.get("note") else ".")]
    missing = kq.get("runs", {}).get("missing_rows")
    if missing:
        out += ["", f"Not measured yet: {'; '.join(_policy_label(n) for n in missing)} (resume: "
                f"`{kq['runs']['resume']}`)."]
    return out + ["", "Plot: [kv_quality_window.png](kv_quality_window.png) (perplexity and agreement vs blocks held).", ""]


def kv_quality_dtypes_table(kd: dict) -> list[str]:
    f16 = kd["capacity_1gib"]["f16"]
    out = ["## Quality and capacity of each KV cache dtype", "",
           f"`python3 -m bench.kv_quality_dtypes{_quick(kd)}` — {kd['tokens']:,} tokens of {kd['corpus']}, perplexity "
           f"with a fixed {kd['window']}-token window (stride {kd['stride']}), K/V stored as each dtype's quantizer "
           "returns them (numpy CPU engine, the values the WGSL kernels read). Agreement: greedy next token equal to "
           "f32's. Row error: relative RMS round-trip error of real K / V rows. Capacity: max tokens under a 1 GiB "
           "budget from the WebGPU backend's ledger plan.", "",
           "| KV dtype | bytes / token | max tokens in 1 GiB (vs f16) | perplexity | ΔPPL vs f32 | greedy agreement "
           "| K / V row error |", "|---|---|---|---|---|---|---|"]
    for name, q in kd["quality"].items():
        cap, err = kd["capacity_1gib"].get(name), kd["row_error_real_kv"].get(name)
        cap_text = f"{cap['bytes_per_token']:,} | {cap['max_tokens']:,} ({cap['max_tokens'] / f16['max_tokens']:.2f}x)" \
            if cap else " | "
        err_text = f"{100 * err['k_rel_rms']:.2f} % / {100 * err['v_rel_rms']:.2f} %" if err else ""
        out.append(f"| {name} | {cap_text} | {q['perplexity']:.4f} | {q['delta_ppl_vs_f32']:+.4f} "
                   f"| {100 * q['agreement_vs_f32']:.2f} % | {err_text} |")
    for extra in kd.get("later_runs", []):  # dtypes measured by a later `--dtypes f32,NAME` run (same corpus, f32 checked)
        for name, q in extra["quality"].items():
            if name in kd["quality"]:
                continue
            cap, err = extra["capacity_1gib"][name], extra["row_error_real_kv"][name]
            base = extra["capacity_1gib"]["f16"]["max_tokens"]
            out.append(f"| {name} ({extra['file']}) | {cap['bytes_per_token']:,} | {cap['max_tokens']:,} "
                       f"({cap['max_tokens'] / base:.2f}x) | {q['perplexity']:.4f} | {q['delta_ppl_vs_f32']:+.4f} "
                       f"| {100 * q['agreement_vs_f32']:.2f} % | {100 * err['k_rel_rms']:.2f} % / "
                       f"{100 * err['v_rel_rms']:.2f} % |")
    return out + [""]


def build_summary(results: Path) -> str:
    kv, rf, tt, wl, kq, kd, cc, pb = (_load(results, n) for n in (
        "kv_browser.json", "roofline.json", "ttft.json", "wllama.json", "kv_quality_window.json",
        "kv_quality_dtypes.json", "concurrency.json", "page_boot.json"))
    if kd:
        kd["later_runs"] = [{**later, "file": path.name} for path in sorted(results.glob("kv_quality_*_*.json"))
                            if (later := _load(results, path.name)) and later.get("benchmark") == "kv_quality_dtypes"
                            and later.get("tokens") == kd["tokens"]
                            and later["quality"].get("f32", {}).get("perplexity") == kd["quality"]["f32"]["perplexity"]]
    adapter = next((d.get("adapter") for d in (kv, rf, tt) if d), None)
    lines = ["# Benchmark results", "",
             "`npm run bench` (full) or `npm run bench -- --quick` (reduced, into results/quick/) reruns everything "
             "and regenerates this file and the plots.", "", f"Machine: {machine(adapter)}.", ""]
    for data, make, name in ((kv, seed_table, "kv_browser"), (rf, roofline_table, "roofline"),
                             (tt, ttft_table, "ttft"), (cc, lambda c: concurrency_table(c, pb), "concurrency"),
                             (wl, wllama_table, "wllama"),
                             (_load(results, "wllama_q4_k_m.json"),
                              lambda w: wllama_table(w, "Side by side with wllama on llama.cpp's Q4_K_M mix"),
                              "wllama_q4_k_m"),
                             (_load(results, "wllama_gemma3.json"),
                              lambda w: wllama_table(w, "Side by side with wllama and native llama.cpp on Gemma 3 270M"),
                              "wllama_gemma3"),
                             (_load(results, "wllama_2k.json"),
                              lambda w: wllama_table(w, "A 2,000-token prompt's time to first token, beside wllama"),
                              "wllama_2k"),
                             (kq, kv_quality_window_table, "kv_quality_window"),
                             (_load(results, "hybrid_kv.json"),
                              lambda h: hybrid_kv_table(h, _load(results, "hybrid_kv_wgpu.json")), "hybrid_kv"),
                             (_load(results, "structured.json"),
                              lambda s: structured_table(s, _load(results, "structured_wgpu.json")), "structured"),
                             (kd, kv_quality_dtypes_table, "kv_quality_dtypes")):
        lines += make(data) if data else [f"_{name}.json missing: run `python3 -m bench --only {name}`._", ""]
    plots = [p.name for p in sorted(results.glob("*.png"))]
    lines += ["Plots: " + ", ".join(f"[{p}]({p})" for p in plots), ""]
    return "\n".join(lines)


def results_page(summary: str, plots_link: str) -> str:
    """docs/results.md: `summary` from its "Machine:" line on under a generated header, plot links prefixed
    with `plots_link` (the results folder as seen from docs/)."""
    body = summary[summary.index("Machine: "):]
    body = re.sub(r"\]\((?!https?:)([^)/]+\.png)\)", rf"]({plots_link}/\1)", body)
    return ("# Benchmark results\n\n"
            f"Generated by `python3 -m bench --report` from `{plots_link.removeprefix('../')}/*.json`; "
            "edit bench/report/summary.py, not this file. How these figures come about and what they mean: "
            "[performance.md](performance.md).\n\n" + body.rstrip("\n") + "\n")

