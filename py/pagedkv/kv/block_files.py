"""The disk tier's block files: one full block of KV per file, named by content hash (disk_tier.py keeps them).

A block's file name is `<layout key>-<chain hash>`: the layout key (DiskKey.hex) digests the model and its
KVSpec (model hash, KV dtype, block size, layers, kv heads, head_dim, and with KV groups the layers a page
holds), the chain hash digests every token up to the block's end (sha256, parent digest first), so a prefix
shared by two chats is one file, and a file written for another model or dtype is never looked up.

KV groups (groups.py): a model with sliding-window layers keeps one page per block per group, so each group has
a chain of its own: group 0's is seeded with the layout key, as a model without groups has it, group g's with
the digest of the layout key and `#g<g>` (`group_seed`). A file holds one page, the group's layers; its name
stays `<layout key>-<chain hash>` and the chain hash alone says which group it is for. The Python tuple hash of the GPU prefix cache
changes from one process to the next (string hashing is seeded), so the disk chain is its own sha256.

A file is a header (magic, version, layout key, chain hash, the block's token ids, payload length, sha256 of
the payload) and the payload: for each layer of the page (every layer, or one KV group's), K then V of the block in the GPU word layout of the KV dtype
(kv_dtype.pack_tokens), (block_size, token_u32s) little-endian u32 each. A file whose header or checksum
does not match what the lookup expects is deleted and its block recomputed, never used.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from .spec import KVSpec

MAGIC = b"PKVB"
VERSION = 1
_HEAD = struct.Struct("<4sI8s16sII32s")  # magic, version, layout key, chain hash, n tokens, payload len, sha256


def model_hash(manifest: dict) -> str:
    """Identity of a converted model: sha256 over its config and its shards' sha256 (hex, 16 chars)."""
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not shards:
        raise ValueError("the model manifest lists no shards; cannot name its KV on disk")
    h = hashlib.sha256(repr(sorted(manifest.get("config", {}).items())).encode())
    for shard in shards:
        h.update(str(shard["sha256"]).encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class DiskKey:
    """What a block's bytes depend on besides its tokens: the model (its content hash) and its KV spec."""

    model_hash: str
    spec: KVSpec

    def __post_init__(self) -> None:
        if not isinstance(self.model_hash, str) or not self.model_hash:
            raise ValueError(f"model_hash must be a non-empty str, got {self.model_hash!r}")
        if not isinstance(self.spec, KVSpec):
            raise ValueError(f"spec must be a KVSpec, got {self.spec!r}")
        self.spec.element  # a dtype the GPU layout knows (bf16 only sizes simulations)

    @property
    def hex(self) -> str:
        """16 hex chars naming this model + KV layout in file names."""
        s = self.spec
        ident = (self.model_hash, s.dtype, s.block_size, s.num_layers, s.num_kv_heads, s.head_dim)
        if s.layers_per_page is not None:  # KV groups: another payload (a page), so another key; none: as ever
            ident += (s.layers_per_page,)
        return hashlib.sha256(repr(ident).encode()).hexdigest()[:16]

    @property
    def num_groups(self) -> int:
        """KV groups (groups.py): pages per block of tokens, each group's file chain of its own."""
        return self.spec.num_layers // self.spec.page_layers

    @property
    def payload_bytes(self) -> int:
        """Bytes of one page's K and V (every layer, or a KV group's): 2 x layers x block_size x token_u32s x 4."""
        return self.spec.bytes_per_block

    @property
    def file_bytes(self) -> int:
        """Bytes of one block file, header included."""
        return _HEAD.size + 4 * self.spec.block_size + self.payload_bytes

    def file_name(self, chain_hash: str) -> str:
        return f"{self.hex}-{chain_hash}"


def chain_step(parent: bytes, block_token_ids) -> bytes:
    """The chain hash (16 bytes) of a block whose prefix's hash is `parent`: covers every token before it too.
    The disk tier's file names and the CPU tier's keys (kv_cpu_tier) are this chain, from different seeds."""
    return hashlib.sha256(parent + np.asarray(block_token_ids, dtype="<i4").tobytes()).digest()[:16]


def group_seed(key: DiskKey, group: int) -> bytes:
    """The chain's seed for KV group `group`: the layout key for group 0 (every model without groups), else the
    digest of the layout key and `#g<group>`."""
    if not 0 <= group < key.num_groups:
        raise ValueError(f"KV group {group} of a layout with {key.num_groups}")
    seed = bytes.fromhex(key.hex)
    return seed if group == 0 else hashlib.sha256(seed + f"#g{group}".encode()).digest()[:16]


def block_chain(key: DiskKey, token_ids, num_blocks: int | None = None, group: int = 0) -> list[str]:
    """Chain hashes (32 hex chars) of the first `num_blocks` full blocks of `token_ids` (all full ones
    by default) in KV group `group`; block i's hash covers every token of blocks 0..i, the layout and the group."""
    bs = key.spec.block_size
    n = len(token_ids) // bs if num_blocks is None else num_blocks
    if n * bs > len(token_ids):
        raise ValueError(f"{n} blocks of {bs} tokens need {n * bs} token ids, got {len(token_ids)}")
    parent = group_seed(key, group)
    out = []
    for i in range(n):
        parent = chain_step(parent, token_ids[i * bs:(i + 1) * bs])
        out.append(parent.hex())
    return out


def block_payloads(words: np.ndarray) -> list[bytes]:
    """Words (n, page layers, 2 (K, V), block_size, token_u32s) u32 of n pages -> one payload per page."""
    if words.dtype != np.uint32 or words.ndim != 5 or words.shape[2] != 2:
        raise ValueError(f"block words must be (n, page layers, 2, block_size, token_u32s) uint32, "
                         f"got {words.shape} {words.dtype}")
    return [np.ascontiguousarray(w, dtype="<u4").tobytes() for w in words]


def block_words(key: DiskKey, payloads: list[bytes]) -> np.ndarray:
    """Payloads of n pages -> words (n, page layers, 2, block_size, token_u32s) u32 (the inverse of block_payloads)."""
    for p in payloads:
        if len(p) != key.payload_bytes:
            raise ValueError(f"a block payload of {key.spec.dtype} KV is {key.payload_bytes} bytes, "
                             f"got {len(p)}")
    flat = np.frombuffer(b"".join(payloads), dtype="<u4").astype(np.uint32)
    return flat.reshape(len(payloads), key.spec.page_layers, 2, key.spec.block_size, key.spec.token_u32s)


class BlockFileError(ValueError):
    """A block file is not the block the lookup expects (corrupt, truncated, other layout or tokens)."""


def encode_block(key: DiskKey, chain_hash: str, token_ids, payload: bytes) -> bytes:
    """A block file: header + payload (see the module docstring)."""
    if len(payload) != key.payload_bytes:
        raise ValueError(f"a block payload of {key.spec.dtype} KV is {key.payload_bytes} bytes, "
                         f"got {len(payload)}")
    if len(token_ids) != key.spec.block_size:
        raise ValueError(f"a block holds {key.spec.block_size} token ids, got {len(token_ids)}")
    head = _HEAD.pack(MAGIC, VERSION, bytes.fromhex(key.hex), bytes.fromhex(chain_hash), key.spec.block_size,
                      len(payload), hashlib.sha256(payload).digest())
    return head + np.asarray(token_ids, dtype="<i4").tobytes() + bytes(payload)


def decode_block(key: DiskKey, chain_hash: str, token_ids, data: bytes) -> bytes:
    """The payload of a block file, after checking every header field and the checksum; BlockFileError
    names the first mismatch."""
    want = key.file_bytes
    if len(data) != want:
        raise BlockFileError(f"block file has {len(data)} bytes, a {key.spec.dtype} block file has {want}")
    magic, version, stored_key, chash, n_tokens, n_payload, digest = _HEAD.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise BlockFileError(f"not a version-{VERSION} block file (magic {magic!r}, version {version})")
    if stored_key.hex() != key.hex or chash.hex() != chain_hash:
        raise BlockFileError(f"block file is for layout {stored_key.hex()} / block {chash.hex()}, "
                             f"expected {key.hex} / {chain_hash}")
    tokens_end = _HEAD.size + 4 * n_tokens
    stored = np.frombuffer(data[_HEAD.size:tokens_end], dtype="<i4")
    if n_tokens != key.spec.block_size or stored.tolist() != list(token_ids):
        raise BlockFileError("block file holds other token ids than the prefix looked up")
    payload = data[tokens_end:]
    if n_payload != len(payload) or hashlib.sha256(payload).digest() != digest:
        raise BlockFileError("block file payload fails its sha256 check")
    return payload
