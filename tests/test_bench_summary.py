"""bench/summary.py's seed table: one row per (budget, KV dtype, allocator), the ledger line per dtype."""
from bench.summary import seed_table

ROW = {"max_context_tokens": 7500, "token_utilization_mean": 0.5, "token_utilization_p5": 0.25,
       "slot_efficiency": 0.995, "oom_rate": 0.0, "turns_failed": 0, "turns_started": 1630, "sessions_served": 400,
       "sessions": 400, "utilization_mean": 0.75, "preempt": False}


def entry(kv_dtype: str, bytes_per_token: int, kv_tokens: int, labels: tuple[str, ...]) -> dict:
    ledger = {"formula_tokens": kv_tokens + 5, "kv_tokens": kv_tokens, "bytes_per_token": bytes_per_token,
              "by_kind": {"weights": 96 << 20, "scratch": 14 << 20, "staging": 4 << 20,
                          "kv": kv_tokens * bytes_per_token}}
    capacity = {kind: {"max_context_tokens": kv_tokens, "fraction_of_formula": kv_tokens / (kv_tokens + 5)}
                for kind in ("contiguous", "paged")}
    return {"budget_mib": 1024, "kv_dtype": kv_dtype, "ledger": ledger, "capacity": capacity,
            "rows": {label: dict(ROW) for label in labels}}


def test_seed_table_has_a_dtype_column_and_a_ledger_line_per_dtype():
    kv = {"sessions": 400, "seed": 0, "warmup_s": 300, "budgets": [
        entry("f16", 23040, 41616, ("contiguous", "paged")),
        entry("int8", 12000, 80000, ("paged+prefix+preempt",))]}
    lines = seed_table(kv)
    assert "KV f16 and int8" in lines[2]
    assert lines[4].startswith("| budget | KV dtype | allocator |")
    ours = [line for line in lines if "| ours:" in line]
    assert ours == [
        "| 1024 MiB | f16 | ours: contiguous | 7,500 | 41,616 / 41,621 (100.0 %) | 50.0 % / 25.0 % | 99.5 % "
        "| 0.0 % (0 of 1,630 turns) | 400 of 400 |",
        "| 1024 MiB | f16 | ours: paged (no prefix cache) | 7,500 | 41,616 / 41,621 (100.0 %) | 50.0 % / 25.0 % "
        "| 99.5 % | 0.0 % (0 of 1,630 turns) | 400 of 400 |",
        "| 1024 MiB | int8 | ours: paged + prefix cache, waits / preempts instead of failing | 7,500 "
        "| 80,000 / 80,005 (100.0 %) | 50.0 % / 25.0 % | 99.5 % | 0.0 % (0 of 1,630 turns) | 400 of 400 |",
    ]
    ledgers = [line for line in lines if line.startswith("Ledger at")]
    assert ledgers == [
        "Ledger at 1024 MiB, KV f16: weights 96.0 MiB, scratch 14.0 MiB, staging 4.0 MiB, KV 914.4 MiB "
        "= 41,616 tokens at 23,040 B/token.",
        "Ledger at 1024 MiB, KV int8: weights 96.0 MiB, scratch 14.0 MiB, staging 4.0 MiB, KV 915.5 MiB "
        "= 80,000 tokens at 12,000 B/token.",
    ]


def test_seed_table_reads_a_single_dtype_report_written_before_the_dtype_column():
    old = entry("f16", 23040, 41616, ("contiguous",))
    del old["kv_dtype"]
    lines = seed_table({"sessions": 400, "seed": 0, "kv_dtype": "f16", "budgets": [old]})
    assert [line for line in lines if "| ours:" in line][0].startswith("| 1024 MiB | f16 | ours: contiguous |")
    assert "between warm-up (300 s)" in " ".join(lines)


def test_readme_results_section_is_replaced_from_its_machine_line_on():
    from bench.summary import readme_with_results

    readme = ("# P\n\nintro\n\n## Results\n\nOur words on how these were measured.\n\nMachine: old.\n\n### Old table\n\n"
              "| a |\n\nPlots: [old.png](bench/results/old.png)\n\n## Where third-party code lives\n\nrest\n")
    summary = ("# Benchmark results\n\nMachine: new, 2 cores.\n\n## New table\n\n| b |\n\n"
               "Plots: [roofline.png](roofline.png), [x](https://example.org/x.png)\n")
    out = readme_with_results(readme, summary)
    assert out == ("# P\n\nintro\n\n## Results\n\nOur words on how these were measured.\n\nMachine: new, 2 cores.\n\n"
                   "### New table\n\n| b |\n\nPlots: [roofline.png](bench/results/roofline.png), "
                   "[x](https://example.org/x.png)\n\n## Where third-party code lives\n\nrest\n")
    assert readme_with_results(out, summary) == out


def test_concurrency_table_lists_both_models_swap_rows_and_the_page_boot_line():
    from bench.summary import concurrency_table

    row = {"concurrency": 2, "new_tokens_each": 4, "batched_tok_s": 1.5, "one_at_a_time_tok_s": 0.75, "speedup": 2.0}
    cc = {"quick": True, "tiny": {"info": {"model": "tiny-random", "prompt_tokens": 32}, "rows": [row]},
          "swap_vs_recompute": [{"blocks": 4, "tokens": 64, "swap_round_trip_ms": 16.36, "recompute_ms": 33.86,
                                 "cheaper": "swap"}]}
    lines = concurrency_table(cc, {"cold_median_ms": 8432.0, "warm_median_ms": 8154.0, "runs": 3})
    assert "`python3 -m bench.concurrency --quick`" in lines[2]
    assert "| tiny-random | 32 | 4 | 2 | 1.50 | 0.75 | 2.00 |" in lines
    assert "| 4 | 64 | 16.4 | 33.9 | swap |" in lines
    assert any("cold (fresh browser profile) 8.4 s, warm (reload, HTTP cache) 8.2 s, median of 3" in x for x in lines)
    assert not any("smollm2" in x for x in lines)  # a model the run skipped gets no rows
    assert concurrency_table(cc, None)[-1] == ""  # without page_boot.json: no boot line
