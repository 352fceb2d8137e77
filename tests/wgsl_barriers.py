"""A static check of WGSL kernels for storage read after write across a workgroupBarrier() only.

workgroupBarrier() orders workgroup memory; a lane that reads a storage buffer other lanes of its workgroup
wrote needs storageBarrier() between the write and the read (WGSL's memory model). NVIDIA orders both with
either barrier, so a missing storageBarrier() never shows there, nor on lavapipe or SwiftShader (whose lanes
run in order): this reads the source instead.

The check follows each entry point's statements in program order, with every call expanded in place (storage
buffers are module-scope, so a callee's accesses are the caller's; WGSL has no recursion) and every loop body
taken twice (a write late in one trip, a read early in the next). A write to a read_write storage buffer is
"pending"; a workgroupBarrier() or workgroupUniformLoad() (an execution barrier that orders workgroup memory
only) marks every pending write as crossed; storageBarrier() clears them all. A read of a buffer whose write
crossed a workgroup-only barrier is a finding: the barrier says the author meant other lanes to see the write.
A read with no barrier since the write is the writing lane's own (the kernels' convention) and is not one.
Both branches of an `if` are taken in sequence (conservative: a write in one and a read in the other would be
reported). Atomics are exempt (they are coherent on their own).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_STORAGE_RW = re.compile(r"var\s*<\s*storage\s*,\s*read_write\s*>\s*(\w+)")
_FN = re.compile(r"\bfn\s+(\w+)\s*\(")
_COMPUTE = re.compile(r"@compute\b[^{;]*?\bfn\s+(\w+)")
_LOOP = re.compile(r"\b(for|loop|while)\b")
WORKGROUP_BARRIERS = ("workgroupBarrier", "workgroupUniformLoad")


@dataclass(frozen=True)
class Finding:
    entry: str  # the entry point
    buffer: str
    function: str  # the function whose statement reads
    text: str  # the read, as written

    def __str__(self) -> str:
        return (f"{self.entry}: `{self.text}` in {self.function}() reads {self.buffer}, written by other lanes "
                f"with only workgroupBarrier() between: storageBarrier() is needed")


def _close(text: str, start: int, open_: str, close: str) -> int:
    """The index just past the bracket that closes the one at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError(f"unbalanced {open_!r} at {start}")


class Kernel:
    """One WGSL module's functions and read_write storage buffers."""

    def __init__(self, source: str) -> None:
        self.text = _COMMENT.sub("", source)
        self.buffers = set(_STORAGE_RW.findall(self.text))
        self.bodies: dict[str, str] = {}
        for m in _FN.finditer(self.text):
            brace = self.text.index("{", _close(self.text, m.end() - 1, "(", ")"))
            self.bodies[m.group(1)] = self.text[brace + 1: _close(self.text, brace, "{", "}") - 1]
        self.entries = _COMPUTE.findall(self.text)
        names = "|".join(map(re.escape, sorted(self.bodies, key=len, reverse=True))) or "(?!)"
        buffers = "|".join(map(re.escape, sorted(self.buffers, key=len, reverse=True))) or "(?!)"
        self._token = re.compile(
            rf"\b(?P<sbar>storageBarrier)\s*\(|\b(?P<wbar>{'|'.join(WORKGROUP_BARRIERS)})\s*\("
            rf"|\b(?P<loop>for|loop|while)\b|(?P<atomic>\batomic\w*\s*\()"
            rf"|(?<![\w.])(?P<buf>{buffers})\s*(?=[\[.])|\b(?P<call>{names})\s*\(")

    def events(self, function: str, body: str | None = None) -> list[tuple]:
        """(kind, buffer, function, text) in program order: kind is read, write, wbar or sbar."""
        text = self.bodies[function] if body is None else body
        out: list[tuple] = []
        pos = 0
        while True:
            m = self._token.search(text, pos)
            if m is None:
                return out
            if m.group("sbar") or m.group("wbar"):
                out.append(("sbar" if m.group("sbar") else "wbar", None, function, m.group(0)))
                pos = m.end()
            elif m.group("atomic"):  # skip the atomic call's arguments
                pos = _close(text, m.end() - 1, "(", ")")
            elif m.group("loop"):
                brace = text.index("{", m.end())
                if m.group("loop") == "for":
                    brace = text.index("{", _close(text, text.index("(", m.end()), "(", ")"))
                end = _close(text, brace, "{", "}")
                header, body_ = text[m.end():brace], text[brace + 1: end - 1]
                trip = self.events(function, header) + self.events(function, body_)
                out += trip + trip
                pos = end
            elif m.group("call"):
                args_end = _close(text, m.end() - 1, "(", ")")
                out += self.events(function, text[m.end(): args_end - 1])  # arguments first
                out += self.events(m.group("call"))
                pos = args_end
            else:
                out.append(self._access(text, m, function))
                pos = m.end()

    def _access(self, text: str, m: re.Match, function: str) -> tuple:
        """A buffer access: a write when an assignment follows its index / member chain, else a read (a
        compound assignment, rw, reads and then writes)."""
        end = m.end()
        while end < len(text) and text[end] in "[.":
            if text[end] == "[":
                end = _close(text, end, "[", "]")
            else:
                end = re.compile(r"\.\s*\w+").match(text, end).end()
            while end < len(text) and text[end].isspace():
                end += 1
        rest = text[end:]
        kind = "write" if re.match(r"=(?!=)", rest) else "rw" if re.match(r"(<<|>>|[-+*/%&|^])=", rest) else "read"
        return (kind, m.group("buf"), function, text[m.start(): end].strip())

    def findings(self) -> list[Finding]:
        out = []
        for entry in self.entries:
            crossed: set[str] = set()  # written, then a workgroup-only barrier
            pending: set[str] = set()  # written since the last barrier
            for kind, buf, function, text in self.events(entry):
                if kind == "sbar":
                    crossed.clear()
                    pending.clear()
                elif kind == "wbar":
                    crossed |= pending
                    pending.clear()
                elif kind == "write":
                    pending.add(buf)
                else:
                    if buf in crossed and Finding(entry, buf, function, text) not in out:
                        out.append(Finding(entry, buf, function, text))
                    if kind == "rw":
                        pending.add(buf)
        return out
