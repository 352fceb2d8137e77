"""Every kernel's storage reads of other lanes' writes cross a storageBarrier() (tests/wgsl_barriers.py): the
emulators run a workgroup's lanes in order and NVIDIA orders storage at workgroupBarrier() too, so only the
source shows the race. The mutations remove a needed storageBarrier() from the real sampling kernels."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from pagedkv.backends.webgpu.device import ShaderLibrary
from pagedkv.backends.webgpu.native import SHADERS, repo_shaders
from pagedkv.backends.webgpu.shader_variants import VARIANTS
from wgsl_barriers import Kernel


def run_alone(coro):
    """asyncio.run in a thread of its own (Playwright's sync API may hold a loop in this one)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def sources(library: ShaderLibrary, names) -> dict[str, str]:
    async def read() -> dict[str, str]:
        return {name: await library.source(name) for name in names}

    return run_alone(read())


def mutated(name: str, old: str, new: str) -> str:
    """Kernel `name` with its includes expanded, read from shaders/ with `old` replaced once by `new`."""
    async def read(file: str) -> bytes:
        data = (SHADERS / file).read_bytes()
        if file == f"{name}.wgsl":
            text = data.decode()
            assert text.count(old) == 1, f"{old!r} is not once in {file}"
            data = text.replace(old, new).encode()
        return data

    manifest = {p.stem: {"file": p.name} for p in SHADERS.glob("*.wgsl")}
    return sources(ShaderLibrary(read, manifest), [name])[name]


def test_every_kernel_orders_its_storage_for_other_lanes():
    names = sorted({p.stem for p in SHADERS.glob("*.wgsl")} | set(VARIANTS))
    kernels = {name: Kernel(text) for name, text in sources(repo_shaders(), names).items()}
    kernels = {name: k for name, k in kernels.items() if k.entries}  # fragments (parts, includes) have none
    assert {"sample", "sample_shape", "sample_post", "argmax_gpu", "matvec_gpu_sg_f16_q4_1_rope_kv"} <= set(kernels)
    assert {name: [str(f) for f in k.findings()] for name, k in kernels.items() if k.findings()} == {}


SAMPLE_BARRIER = "  storageBarrier();\n  let total"


def test_sample_without_its_storage_barrier_fails():
    kernel = Kernel(mutated("sample", SAMPLE_BARRIER, "  let total"))
    # the top-p digit passes (after sum_f's barriers) and the id-order chunks read w that other lanes wrote
    assert sorted({(f.entry, f.buffer, f.function) for f in kernel.findings()}) == [
        ("main", "logits", "digit_masses"), ("main", "logits", "main"), ("main", "logits", "run4")]
    assert str(kernel.findings()[0]) == (
        "main: `logits[base + i]` in digit_masses() reads logits, written by other lanes with only "
        "workgroupBarrier() between: storageBarrier() is needed")


def test_sample_shape_without_its_min_p_barrier_fails():
    old = "        shaped[base + i] = DROPPED;\n      }\n    }\n    storageBarrier();\n"
    kernel = Kernel(mutated("sample_shape", old, old.replace("    storageBarrier();\n", "")))
    # top-k's digit counts after their first pass's barriers, then its id-order chunks
    assert sorted({(f.buffer, f.function) for f in kernel.findings()}) == [("shaped", "digit_counts"),
                                                                           ("shaped", "top_k")]


HEAD = """
@group(0) @binding(0) var<storage, read_write> a : array<f32>;
@group(0) @binding(1) var<storage, read> r : array<f32>;
var<workgroup> t : array<f32, 64>;
fn helper(i : u32) -> f32 { workgroupBarrier(); return r[i]; }
"""


@pytest.mark.parametrize("body, found", [
    ("a[lid] = 1.0; workgroupBarrier(); let x = a[63u - lid];", ["a[63u - lid]"]),
    ("a[lid] = 1.0; storageBarrier(); let x = a[63u - lid];", []),
    ("a[lid] = 1.0; let x = a[lid];", []),  # no barrier: the lane's own write
    ("a[lid] = 1.0; let x = helper(lid) + a[0];", ["a[0]"]),  # a callee's barrier counts
    ("a[lid] = 1.0; let u = workgroupUniformLoad(&t[0]); a[lid] += 2.0;", ["a[lid]"]),  # compound reads
    ("t[lid] = 1.0; workgroupBarrier(); let x = t[0];", []),  # workgroup memory: workgroupBarrier suffices
    # loop-carried: a write late in one trip, read early in the next, a barrier at the trip's end between
    ("for (var k = 0u; k < 4u; k++) { let x = a[k]; a[lid] = x; workgroupBarrier(); }", ["a[k]"]),
    ("loop { let x = a[0]; if (x > 0.0) { break; } storageBarrier(); a[lid] = x; }", []),
    ("a[lid] = 1.0; workgroupBarrier(); atomicAdd(&a[0], 1u);", []),  # atomics are coherent
    ("a[lid] = 1.0; workgroupBarrier(); a[lid] = 2.0;", []),  # write after write: not a read
])
def test_the_check_reads_barriers_loops_and_calls(body, found):
    kernel = Kernel(HEAD + "@compute @workgroup_size(64)\nfn main(@builtin(local_invocation_index) lid : u32) {\n"
                    + body + "\n}\n")
    assert kernel.entries == ["main"] and kernel.buffers == {"a"}
    assert [f.text for f in kernel.findings()] == found
