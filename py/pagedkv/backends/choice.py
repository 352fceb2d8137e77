"""Which engine backend the page runs on: ?backend=auto (the default) | webgpu | cpu."""
from __future__ import annotations

from pagedkv.backends.webgpu.model_kernels import choose_family

BACKENDS = ("auto", "webgpu", "cpu")


def choose_backend(requested: str, adapter_name: str, fallback: bool) -> tuple[str, str]:
    """(backend, why) for ?backend=`requested` on the adapter named `adapter_name` whose isFallbackAdapter is
    `fallback`. auto takes the numpy path on a software adapter (the kernel family's own rule, so both agree on
    what a software adapter is): there WebGPU is a CPU emulation, and numpy in the tab decodes faster and
    finishes a chat turn sooner (docs/performance.md, bench/wllama.py measures both); WebGPU everywhere else."""
    if requested not in BACKENDS:
        raise ValueError(f"backend must be auto, webgpu or cpu, got {requested!r}")
    if requested != "auto":
        return requested, f"backend={requested} was asked for"
    family, why = choose_family("auto", adapter_name, fallback)
    if family == "cpu":
        return "cpu", f"{why}: numpy in the tab decodes faster there"
    return "webgpu", why
