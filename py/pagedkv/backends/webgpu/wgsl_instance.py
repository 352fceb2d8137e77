"""A name-prefixed instance of WGSL parts: the same decoder twice in one kernel.

A kernel that multiplies two weight matrices in one dispatch (ffn_gpu_main.wgsl: gate | up, then down) needs
two decoders, possibly of two weight types, whose parts (<type>_weights.wgsl, gpu_<type>_words.wgsl, ...)
each declare `qs`, `word_dot`, `WORDS_PER_BLOCK` and bind @binding(0..4). instance() renames every name a
part declares at module scope (bindings, functions, constants, overrides, structs, aliases) to prefix + name
and moves its bindings up by an offset, so the second copy sits beside the first: `down_word_dot` reads
`down_qs` at @binding(16). What the kernel does not call (the copy's `down_x`, its epilogue) is not part of
its entry point: WGSL leaves it out of the pipeline and of the bind group layout.

Text in, text out: the parts are written with module-scope declarations at the start of a line (the repo's
WGSL style), which is what is parsed here; a struct field named like a module-scope name would be renamed
at its declaration but not where it is read (`.name`), so that is refused.
"""
from __future__ import annotations

import re

# a module-scope declaration: at the start of a line, after any attributes (@group(0) @binding(1))
_DECLARATION = re.compile(r"^(?:@\w+(?:\([^)]*\))?\s+)*(?:fn|var(?:<[^>]*>)?|const|override|struct|alias)\s+(\w+)",
                          re.MULTILINE)
_STRUCT = re.compile(r"^struct\s+\w+\s*\{(.*?)^\}", re.MULTILINE | re.DOTALL)
_FIELD = re.compile(r"^\s+(\w+)\s*:", re.MULTILINE)
_BINDING = re.compile(r"@binding\((\d+)\)")


def declared_names(text: str) -> list[str]:
    """The names `text` declares at module scope, in order."""
    return list(dict.fromkeys(_DECLARATION.findall(text)))


def instance(text: str, prefix: str, binding_offset: int) -> str:
    """`text` with every module-scope name renamed prefix + name (not after a `.`: member reads keep their
    field names) and every @binding(n) moved to n + binding_offset."""
    names = declared_names(text)
    fields = {field for body in _STRUCT.findall(text) for field in _FIELD.findall(body)}
    clash = sorted(fields & set(names))
    if clash:
        raise ValueError(f"cannot instance WGSL parts under {prefix!r}: struct fields {clash} are named like "
                         "module-scope declarations; rename the fields")
    if names:
        pattern = re.compile(r"(?<![\w.])(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")\b")
        text = pattern.sub(lambda m: prefix + m.group(1), text)
    return _BINDING.sub(lambda m: f"@binding({int(m.group(1)) + binding_offset})", text)
