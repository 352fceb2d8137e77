"""build.py's wasm step: web/wasm/*.wat assembled by wabt's wat2wasm (node_modules/wabt, pinned by
package-lock.json and by its sha256 in build.WAT2WASM), the text turned into its variants first (without_relaxed,
with_shared_memory). The built modules themselves run in tests/test_cpu_wasm_wasmtime.py."""
import shutil

import pytest

import build

RELAXED = """(module
  (import "env" "memory" (memory 1))
  ;; a comment with ( parentheses and i32x4.relaxed_dot_i8x16_i7x16_add_s in it
  (; a block comment ( too ;)
  (func $dot (export "dot") (param $p i32) (result i32) (local $z v128)
    local.get $p local.get $p v128.load local.get $p v128.load offset=16 local.get $z
    i32x4.relaxed_dot_i8x16_i7x16_add_s v128.store offset=32 i32.const 7)
  (func $two (export "two") (param $a f32) (result f32) local.get $a f32.const 2.5 f32.mul)
)"""
# RELAXED's $two body as wat2wasm writes it: size 10, no locals, local.get 0, f32.const 2.5, f32.mul, end
TWO = bytes.fromhex("0a0020004300002040940b")


def test_relaxed_functions_keep_their_signature_and_become_unreachable():
    plain = build.without_relaxed(RELAXED)
    assert '(func $dot (export "dot") (param $p i32) (result i32) unreachable)' in plain
    assert [line for line in plain.splitlines() if "relaxed_dot" in line] == RELAXED.splitlines()[2:3]  # the comment
    assert plain.endswith('(func $two (export "two") (param $a f32) (result f32) local.get $a f32.const 2.5 f32.mul)\n)')
    full, reduced = build.wat2wasm(RELAXED, "r.wat", ("relaxed-simd",)), build.wat2wasm(plain, "r.wat")
    assert bytes.fromhex("fd9302") in full and bytes.fromhex("fd9302") not in reduced  # the instruction: 0xfd 0x113
    assert bytes.fromhex("0300000b") in reduced  # $dot's body: size 3, no local groups, unreachable, end
    assert TWO in full and TWO in reduced


def test_a_relaxed_instruction_in_a_plain_module_is_refused_by_wat2wasm():
    with pytest.raises(build.BuildError, match=r"wat2wasm refused r\.wat:\n.*r\.wat:7:5: .*relaxed"):
        build.wat2wasm(RELAXED, "r.wat")


def test_the_shared_variant_imports_a_shared_memory_of_4_gib():
    text = '(module (import "env" "memory" (memory 1)))'
    shared = build.with_shared_memory(text)
    assert shared == '(module (import "env" "memory" (memory 1 65536 shared)))'
    # memory import: kind 2, flags 3 (a maximum, shared), min 1, max 65536 in LEB128; threads must be enabled
    assert b"\x03env\x06memory\x02\x03\x01\x80\x80\x04" in build.wat2wasm(shared, "s.wat", ("threads",))
    assert b"\x03env\x06memory\x02\x00\x01" in build.wat2wasm(text, "p.wat")
    with pytest.raises(build.BuildError, match="memories may not be shared"):
        build.wat2wasm(shared, "s.wat")
    for bad, count in (("(module)", 0), (text[:-1] + ' (import "env" "memory" (memory 2)))', 2)):
        with pytest.raises(build.BuildError, match=rf"exactly one plain memory, .* found {count}"):
            build.with_shared_memory(bad)


def test_wat2wasm_missing_or_tampered_says_run_npm_ci(tmp_path):
    with pytest.raises(build.BuildError, match=r"wabt/bin/wat2wasm is missing: run `npm ci`"):
        build.wat2wasm(RELAXED, "r.wat", node_modules=tmp_path)
    tool = tmp_path / build.WAT2WASM[0]
    tool.parent.mkdir(parents=True)
    shutil.copy(build.NODE_MODULES / build.WAT2WASM[0], tool)
    with tool.open("a") as f:
        f.write("\n")
    with pytest.raises(build.BuildError, match=r"(?s)sha256 mismatch for npm file wabt/bin/wat2wasm.*run `npm ci`"):
        build.wat2wasm(RELAXED, "r.wat", node_modules=tmp_path)


def test_the_build_writes_each_module_with_its_sha256(tmp_path):
    built = build.build_wasm(tmp_path)
    assert sorted(built) == ["linear", "linear_relaxed", "linear_relaxed_shared", "linear_shared"]
    for name, entry in built.items():
        data = (tmp_path / "wasm" / entry["file"]).read_bytes()
        assert entry == {"file": f"{name}.wasm", "sha256": build.sha256_bytes(data), "bytes": len(data)}
        assert data.startswith(b"\0asm\x01\0\0\0")
    assert not list((tmp_path / "wasm").glob("*.wat"))
