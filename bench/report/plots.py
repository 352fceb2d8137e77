"""PNG plots from the benchmark JSON: KV utilization over time, the block map, TTFT per turn, the roofline,
the quality of bounded KV (window / sinks / eviction).

Written by `python3 -m bench` after a run and by `python3 -m bench --report`. Reads kv_browser.json,
ttft.json, roofline.json and kv_quality_window.json (each plot is skipped, with a note, when its JSON is
missing) and writes kv_utilization.png, kv_block_map.png, ttft_turns.png,
roofline.png and kv_quality_window.png next to them.
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROW_STYLE = {"contiguous": ("tab:red", "contiguous (2,048-slot reservation)"),
             "paged": ("tab:blue", "paged, no prefix cache"),
             "paged+prefix": ("tab:green", "paged + prefix cache"),
             "paged+prefix+preempt": ("tab:purple", "paged + prefix cache, preempting")}


def _load(results: Path, name: str) -> dict | None:
    path = results / name
    return json.loads(path.read_text()) if path.exists() else None


def kv_utilization(kv: dict, out: Path) -> None:
    budgets = kv["budgets"]
    fig, axes = plt.subplots(len(budgets), 1, figsize=(10, 3.2 * len(budgets)), squeeze=False)
    for ax, entry in zip(axes[:, 0], budgets):
        for label, row in entry["rows"].items():
            color, name = ROW_STYLE[label]
            t, used, held = np.array(row["series"], dtype=float).T  # (3, samples)
            ax.plot(t / 60, used * 100, color=color, label=f"{name}: allocated")
            ax.plot(t / 60, held * 100, color=color, ls=":", label=f"{name}: holding live/cached KV")
        warm = next(iter(entry["rows"].values()))["ticks_sampled"]
        ax.set_title(f"KV pool of a {entry['budget_mib']} MiB budget, {entry.get('kv_dtype', kv.get('kv_dtype'))} KV "
                     f"({entry['ledger']['kv_tokens']:,} token slots, "
                     f"{kv['sessions']} sessions, seed {kv['seed']}); {warm} s sampled for the table")
        ax.set_ylabel("% of KV slots")
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("simulated minutes")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, ncol=3, loc="lower center")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(out / "kv_utilization.png", dpi=110)
    plt.close(fig)


def kv_block_map(kv: dict, out: Path) -> None:
    entry = kv["budgets"][0]
    paged = "paged+prefix" if "paged+prefix" in entry["rows"] else "paged+prefix+preempt"  # --quick: short rows
    rows = [(label, entry["rows"][label]["block_map"]) for label in ("contiguous", paged)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, (label, bm) in zip(axes, rows):
        state = np.array(bm["state"], dtype=float)  # (blocks,): 0 free, 1 cached, 2 + filled slots
        bs = bm["block_size"]
        rgb = np.ones((len(state), 3))  # free: white
        rgb[state == 1] = 0.8  # cached (evictable) KV: grey
        alloc = state >= 2
        rgb[alloc] = plt.cm.viridis((state[alloc] - 2) / bs)[:, :3]  # share of the block's slots holding a token
        cols = int(np.ceil(np.sqrt(len(state) * 2)))
        padded = np.ones((-(-len(state) // cols) * cols, 3))
        padded[:len(state)] = rgb
        ax.imshow(padded.reshape(-1, cols, 3), aspect="auto", interpolation="nearest")
        used = state >= 2
        eff = (state[used] - 2).sum() / (used.sum() * bs) if used.any() else 1.0
        ax.set_title(f"{ROW_STYLE[label][1]}\n{used.sum():,} of {len(state):,} blocks allocated, "
                     f"{eff:.1%} of their slots hold a token", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"KV pool at the last arrival (t = {rows[0][1]['tick']} s), {entry['budget_mib']} MiB budget: "
                 "one cell per 16-slot block, allocated ones coloured by the share of their slots holding a token\n"
                 "(purple = reserved but empty, yellow = full); white = free, grey = cached prefix KV (paged)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "kv_block_map.png", dpi=110)
    plt.close(fig)


def ttft_turns(tt: dict, out: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (key, title) in zip(axes, (("webgpu", "WebGPU (SwiftShader)"), ("cpu_numpy", "numpy CPU (CPython)"))):
        for mode, color in (("off", "tab:red"), ("on", "tab:green")):
            rows = tt[key][mode]
            turns = [r["turn"] for r in rows]
            ax.plot(turns, [r["ttft_ms"] / 1e3 for r in rows], "o-", color=color,
                    label=f"prefix caching {mode}")
        for r in tt[key]["on"]:
            ax.annotate(f"{r['prompt_tokens'] - r['cached_tokens']} new\nof {r['prompt_tokens']}",
                        (r["turn"], r["ttft_ms"] / 1e3), fontsize=7, textcoords="offset points", xytext=(4, 4))
        ax.set_title(title)
        ax.set_xlabel("turn")
        ax.set_ylabel("time to first token (s)")
        ax.set_xticks(turns)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "ttft_turns.png", dpi=110)
    plt.close(fig)


def roofline(rf: dict, out: Path) -> None:
    rows = rf["roofline"]
    ctx = [r["context"] for r in rows]
    x = np.arange(len(ctx))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.bar(x - 0.2, [r["step_ms"] for r in rows], 0.4, label="measured decode step")
    a.bar(x + 0.2, [r["roofline_ms"] for r in rows], 0.4, label="bytes read / stream bandwidth")
    a.set_xticks(x, [f"{c:,}" for c in ctx])
    a.set_xlabel("context (tokens)")
    a.set_ylabel("ms per token")
    a.set_title(f"decode step vs its roofline ({rf['stream_read']['gb_s_best']:.2f} GB/s streaming read)")
    a.legend(fontsize=8)
    a.grid(alpha=0.3, axis="y")
    b.plot(ctx, [100 * r["fraction_of_roofline"] for r in rows], "o-", label="decode step: % of roofline (median)")
    b.plot(ctx, [100 * r["fraction_best_sample"] for r in rows], "o:", color="tab:blue",
           label="decode step: % of roofline (best sample)")
    ratios = [r["paged_over_contiguous"] for r in rf["attention_by_context"]]
    b.plot(ctx, [100 * r for r in ratios], "s--", label="attention kernel: paged / contiguous time (%)")
    b.set_xscale("log", base=2)
    b.set_xticks(ctx, [f"{c:,}" for c in ctx])
    b.set_xlabel("context (tokens)")
    b.set_ylabel("%")
    b.grid(alpha=0.3)
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "roofline.png", dpi=110)
    plt.close(fig)


QUALITY_FAMILIES = (  # name pattern -> (colour and marker, legend label)
    ("_no_sinks", ("tab:red", "o-"), "sliding window, no sinks"),
    ("_4_sinks_original_positions", ("tab:purple", "^"), "window + 4 sinks, original RoPE positions"),
    ("_4_sinks", ("tab:green", "s-"), "window + 4 sinks (StreamingLLM, shifted positions)"),
    ("h2o_", ("tab:blue", "D-"), "H2O eviction (4 sinks, half the budget recent)"),
)


def _quality_family(name: str) -> int:
    return next(i for i, (pattern, _, _) in enumerate(QUALITY_FAMILIES) if pattern in name)


def kv_quality_window(kq: dict, out: Path) -> None:
    rows = {name: row for name, row in kq["policies"].items() if name != "full_attention"}
    full = kq["policies"]["full_attention"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in ((axes[0], "ppl", "perplexity"), (axes[1], "agreement", "greedy agreement with full attention")):
        for i, (_, (color, style), family) in enumerate(QUALITY_FAMILIES):
            members = sorted((r["max_blocks_held"], r[key], n) for n, r in rows.items() if _quality_family(n) == i)
            if not members:
                continue
            ax.plot([m[0] for m in members], [m[1] for m in members], style, color=color, label=family)
            for x, y, n in members:
                ax.annotate(n.split("_")[1] if n.startswith("window") else n.split("_")[1].replace("pct", " %"),
                            (x, y), fontsize=7, textcoords="offset points", xytext=(4, 4))
        ax.axhline(full[key], color="black", ls="--", lw=1,
                   label=f"full attention ({full['max_blocks_held']} blocks): {full[key]:g}")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel(f"KV blocks held per conversation ({kq['block_size']} tokens each)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Bounded KV vs full attention: {kq['tokens_scored']:,} scored tokens of CPython's pydoc topics "
                 f"({kq['segments']} x {kq['segment_tokens']:,}), SmolLM2-135M, {kq['engine']}; "
                 "labels: window W tokens / H2O budget", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "kv_quality_window.png", dpi=110)
    plt.close(fig)


def make_all(results: Path) -> list[str]:
    """Write every plot whose JSON exists; returns the file names written."""
    written = []
    for source, makers in (("kv_browser.json", (kv_utilization, kv_block_map)), ("ttft.json", (ttft_turns,)),
                           ("roofline.json", (roofline,)), ("kv_quality_window.json", (kv_quality_window,))):
        data = _load(results, source)
        if data is None:
            print(f"plots: {source} missing in {results}; skipped")
            continue
        for make in makers:
            make(data, results)
            written.append(make.__name__ + ".png")
    return written

