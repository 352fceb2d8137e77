"""A WebAssembly text (WAT) assembler for the small subset web/wasm/*.wat use; build.py runs it in CPython.

Why not wabt: the build stays CPython-only with no npm step. The subset: one module of an imported memory
(plain, or shared with a maximum: the threads proposal's limits) and functions (i32 / f32 / v128 params, locals and results) whose bodies are flat instruction lists
(`block $l` / `loop $l` / `if` ... `end`, no folded expressions). The output is byte-for-byte what
`wat2wasm` 1.0.39 writes for the same text (checked when linear.wat was written). Anything outside the
subset raises WatError naming the instruction and the function.

Relaxed SIMD (RELAXED: an instruction some browsers lack): `assemble(..., relaxed=False)` writes every function
that uses one as a single `unreachable`, so the same text gives a module every SIMD128 browser validates
(its callers must not reach those functions there: web/linear_wasm.js says which one loaded).
"""
from __future__ import annotations

import re
import struct

VALTYPES = {"i32": 0x7F, "f32": 0x7D, "v128": 0x7B}
# Plain opcodes: no immediates.
PLAIN = {
    "drop": b"\x1a", "return": b"\x0f", "unreachable": b"\x00",
    "i32.eqz": b"\x45", "i32.eq": b"\x46", "i32.ne": b"\x47", "i32.lt_u": b"\x49", "i32.gt_u": b"\x4b",
    "i32.le_u": b"\x4d", "i32.ge_u": b"\x4f", "i32.add": b"\x6a", "i32.sub": b"\x6b", "i32.mul": b"\x6c",
    "i32.and": b"\x71", "i32.or": b"\x72", "i32.shl": b"\x74", "i32.shr_u": b"\x76",
    "f32.add": b"\x92", "f32.sub": b"\x93", "f32.mul": b"\x94", "f32.div": b"\x95", "f32.max": b"\x97",
    "f32.gt": b"\x5e", "select": b"\x1b", "f32.sqrt": b"\x91", "f32.convert_i32_u": b"\xb3",
}
SIMD = {  # 0xFD-prefixed, no immediates
    "i8x16.splat": 0x0F, "i32x4.splat": 0x11, "f32x4.splat": 0x13, "v128.and": 0x4E, "v128.or": 0x50,
    "i8x16.shr_u": 0x6D, "i16x8.extend_low_i8x16_s": 0x87, "i16x8.extend_high_i8x16_s": 0x88,
    "i16x8.extend_low_i8x16_u": 0x89, "i16x8.extend_high_i8x16_u": 0x8A, "i32x4.extend_low_i16x8_s": 0xA7,
    "i32x4.extend_high_i16x8_s": 0xA8, "i32x4.extend_low_i16x8_u": 0xA9, "i32x4.extend_high_i16x8_u": 0xAA,
    "f32x4.add": 0xE4, "f32x4.sub": 0xE5, "f32x4.mul": 0xE6, "f32x4.convert_i32x4_s": 0xFA,
    "f32x4.convert_i32x4_u": 0xFB, "f32x4.abs": 0xE0, "f32x4.max": 0xE9, "f32x4.nearest": 0x6A,
    "i32x4.trunc_sat_f32x4_s": 0xF8, "i16x8.narrow_i32x4_s": 0x85, "i32x4.dot_i16x8_s": 0xBA, "i32x4.add": 0xAE,
    "f32x4.div": 0xE7, "i32x4.shl": 0xAB, "f32x4.neg": 0xE1, "f32x4.lt": 0x43, "f32x4.ge": 0x46,
    "v128.bitselect": 0x52, "i8x16.narrow_i16x8_s": 0x65,
}
RELAXED = {  # 0xFD-prefixed relaxed SIMD, no immediates (i7: the second operand's lanes must be 0..127)
    "i32x4.relaxed_dot_i8x16_i7x16_add_s": 0x113,
}
MEMORY = {"i32.load": (b"\x28", 2), "f32.load": (b"\x2a", 2), "i32.store": (b"\x36", 2), "f32.store": (b"\x38", 2),
          "v128.load": (b"\xfd\x00", 4), "v128.store": (b"\xfd\x0b", 4)}  # opcode, natural alignment (log2)
BLOCKS = {"block": b"\x02", "loop": b"\x03", "if": b"\x04"}


class WatError(ValueError):
    """Text outside the assembler's subset, or a name that does not resolve."""


def uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def sleb(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        done = (n == 0 and not byte & 0x40) or (n == -1 and byte & 0x40)
        out.append(byte | (0 if done else 0x80))
        if done:
            return bytes(out)


def _vec(items: list[bytes]) -> bytes:
    return uleb(len(items)) + b"".join(items)


def _name(text: str) -> bytes:
    return _vec([bytes([b]) for b in text.encode()])


def _parse(text: str):
    """S-expressions -> nested lists of atoms (strings; quoted strings keep their quotes)."""
    tokens = re.findall(r'\(|\)|"[^"]*"|[^\s()]+', re.sub(r";;[^\n]*", "", text))
    stack: list[list] = [[]]
    for tok in tokens:
        if tok == "(":
            stack.append([])
        elif tok == ")":
            if len(stack) == 1:
                raise WatError("unbalanced ')' in the module text")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(tok)
    if len(stack) != 1 or len(stack[0]) != 1:
        raise WatError("the text must be exactly one (module ...) form")
    return stack[0][0]


class _Func:
    def __init__(self, form: list) -> None:
        self.name = form[1]
        self.export = None
        self.params: list[tuple[str, str]] = []
        self.locals: list[tuple[str, str]] = []
        self.results: list[str] = []
        self.body: list[str] = []
        for item in form[2:]:
            if isinstance(item, str):
                self.body.append(item)
            elif item[0] == "export":
                self.export = item[1].strip('"')
            elif item[0] in ("param", "local"):
                (self.params if item[0] == "param" else self.locals).append((item[1], item[2]))
            elif item[0] == "result":
                self.results.append(item[1])
            else:
                raise WatError(f"{self.name}: unsupported form ({item[0]} ...); bodies are flat instructions")

    @property
    def relaxed(self) -> bool:
        """Whether the body uses a relaxed-SIMD instruction."""
        return any(op in RELAXED for op in self.body)

    @property
    def signature(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return tuple(t for _, t in self.params), tuple(self.results)

    def code(self, funcs: dict[str, int]) -> bytes:
        index = {name: i for i, (name, _) in enumerate(self.params + self.locals)}
        groups: list[list] = []
        for _, t in self.locals:
            if groups and groups[-1][1] == t:
                groups[-1][0] += 1
            else:
                groups.append([1, t])
        out = bytearray(_vec([uleb(n) + bytes([VALTYPES[t]]) for n, t in groups]))
        labels: list[str | None] = []
        body, pos = self.body, 0

        def arg(op: str) -> str:
            nonlocal pos
            if pos >= len(body):
                raise WatError(f"{self.name}: {op} needs an operand")
            pos += 1
            return body[pos - 1]

        def optional(prefix: str) -> str | None:
            nonlocal pos
            if pos < len(body) and body[pos].startswith(prefix):
                pos += 1
                return body[pos - 1]
            return None

        def lookup(table: dict, name: str, what: str) -> int:
            if name not in table:
                raise WatError(f"{self.name}: unknown {what} {name}")
            return table[name]

        while pos < len(body):
            op = arg("")
            if op in PLAIN:
                out += PLAIN[op]
            elif op in SIMD or op in RELAXED:
                out += b"\xfd" + uleb(SIMD.get(op) or RELAXED[op])
            elif op in ("local.get", "local.set", "local.tee"):
                out += bytes([0x20 + ("get", "set", "tee").index(op[6:])]) + uleb(lookup(index, arg(op), "local"))
            elif op == "i32.const":
                out += b"\x41" + sleb(int(arg(op), 0))
            elif op == "f32.const":
                out += b"\x43" + struct.pack("<f", float(arg(op)))
            elif op == "f32x4.extract_lane":
                out += b"\xfd" + uleb(0x1F) + bytes([int(arg(op))])
            elif op == "i8x16.shuffle":  # 16 byte-lane indices into the two operands' 32 bytes
                lanes = [int(arg(op)) for _ in range(16)]
                if any(not 0 <= lane < 32 for lane in lanes):
                    raise WatError(f"{self.name}: i8x16.shuffle lanes must be 0..31, got {lanes}")
                out += b"\xfd" + uleb(0x0D) + bytes(lanes)
            elif op in MEMORY:
                opcode, align = MEMORY[op]
                offset = optional("offset=")
                out += opcode + uleb(align) + uleb(int(offset[7:], 0) if offset else 0)
            elif op in BLOCKS:
                labels.append(optional("$"))
                out += BLOCKS[op] + b"\x40"
            elif op == "else":
                out += b"\x05"
            elif op == "end":
                if not labels:
                    raise WatError(f"{self.name}: 'end' without an open block")
                labels.pop()
                out += b"\x0b"
            elif op in ("br", "br_if"):
                target = arg(op)
                if target not in labels:
                    raise WatError(f"{self.name}: {op} to unknown label {target}")
                depth = len(labels) - 1 - max(i for i, lab in enumerate(labels) if lab == target)
                out += (b"\x0c" if op == "br" else b"\x0d") + uleb(depth)
            elif op == "call":
                out += b"\x10" + uleb(lookup(funcs, arg(op), "function"))
            else:
                raise WatError(f"{self.name}: instruction {op!r} is outside the assembler's subset")
        if labels:
            raise WatError(f"{self.name}: {len(labels)} block(s) not closed with 'end'")
        out += b"\x0b"
        return uleb(len(out)) + bytes(out)


def _limits(args: list, shared_pages: int | None) -> bytes:
    """A memory's limits: `min`, `min max` or `min max shared` (the threads proposal's flag 3); shared_pages
    makes a plain `min` shared with that maximum (the same text for Pyodide's memory and a shared one)."""
    if shared_pages is not None and len(args) == 1:
        args = [args[0], str(shared_pages), "shared"]
    if len(args) == 1:
        return b"\x00" + uleb(int(args[0]))
    if len(args) == 2:
        return b"\x01" + uleb(int(args[0])) + uleb(int(args[1]))
    if len(args) == 3 and args[2] == "shared":
        return b"\x03" + uleb(int(args[0])) + uleb(int(args[1]))
    raise WatError(f"unsupported memory limits {' '.join(map(str, args))!r}: min, min max or min max shared")


def assemble(text: str, shared_pages: int | None = None, relaxed: bool = True) -> bytes:
    """The binary module of a WAT text in the subset (see the module docstring). shared_pages: import the
    memory as a shared one of at most that many 64 KiB pages (web/linear_threads.js) instead of as written.
    relaxed=False: each function using a relaxed-SIMD instruction becomes `unreachable` (no local, no body)."""
    module = _parse(text)
    if not module or module[0] != "module":
        raise WatError("the text must start with (module")
    imports, funcs = [], []
    for form in module[1:]:
        if form[0] == "import" and form[3][0] == "memory":
            imports.append(_name(form[1].strip('"')) + _name(form[2].strip('"')) + b"\x02"
                           + _limits(form[3][1:], shared_pages))
        elif form[0] == "func":
            funcs.append(_Func(form))
            if not relaxed and funcs[-1].relaxed:
                funcs[-1].locals, funcs[-1].body = [], ["unreachable"]
        else:
            raise WatError(f"unsupported module form ({form[0]} ...)")
    sigs: list[tuple[str, ...]] = []
    for f in funcs:
        if f.signature not in sigs:
            sigs.append(f.signature)
    index = {f.name: i for i, f in enumerate(funcs)}
    types = [b"\x60" + _vec([bytes([VALTYPES[t]]) for t in params]) + _vec([bytes([VALTYPES[t]]) for t in results])
             for params, results in sigs]
    exports = [_name(f.export) + b"\x00" + uleb(i) for i, f in enumerate(funcs) if f.export]

    def section(sid: int, items: list[bytes]) -> bytes:
        body = _vec(items)
        return bytes([sid]) + uleb(len(body)) + body

    return (b"\x00asm\x01\x00\x00\x00" + section(1, types) + section(2, imports)
            + section(3, [uleb(sigs.index(f.signature)) for f in funcs]) + section(7, exports)
            + section(10, [f.code(index) for f in funcs]))
