"""The disk tier's logic against the in-memory file store: names, dedup, LRU, budgets, bad files, quota."""
import hashlib

import pytest

from pagedkv.engine import run_sync
from pagedkv.kv.disk_tier import (BlockFileError, DiskKey, DiskTier, MemoryStore, StoreFull, TierBudgets,
                             block_chain, decode_block, encode_block, model_hash)

from pagedkv.kv.spec import KVSpec


def key_of(model: str, dtype: str, block_size: int, layers: int, kv_heads: int, head_dim: int) -> DiskKey:
    return DiskKey(model, KVSpec(layers, kv_heads, head_dim, block_size, dtype))


# f32, 4 tokens per block, 1 layer, 1 kv head of 16: 16 u32 per token -> 2 x 4 x 16 x 4 = 512 payload bytes.
LAYOUT = key_of("m1", "f32", 4, 1, 1, 16)
FILE = 72 + 16 + 512  # header + 4 token ids + payload


def payload(i: int) -> bytes:
    return bytes([i % 256]) * LAYOUT.payload_bytes


def tier(budget=10 * FILE, store=None) -> DiskTier:
    t = DiskTier(store if store is not None else MemoryStore(), LAYOUT, budget)
    run_sync(t.open())
    return t


def save_chat(t: DiskTier, tokens: list[int]) -> list[str]:
    hashes = block_chain(LAYOUT, tokens)
    for i, h in enumerate(hashes):
        run_sync(t.save(h, tokens[i * 4:(i + 1) * 4], payload(tokens[i * 4])))
    return hashes


def test_layout_sizes_and_key_cover_every_field():
    assert (LAYOUT.spec.token_u32s, LAYOUT.payload_bytes, LAYOUT.file_bytes) == (16, 512, FILE)
    f16 = key_of("smollm2", "f16", 16, 30, 3, 64)
    assert f16.payload_bytes // 16 == 23_040  # the model's f16 KV bytes per token
    keys = {key_of(*fields).hex for fields in [("m1", "f32", 4, 1, 1, 16), ("m2", "f32", 4, 1, 1, 16),
                                                 ("m1", "f16", 4, 1, 1, 16), ("m1", "f32", 8, 1, 1, 16),
                                                 ("m1", "f32", 4, 2, 1, 16), ("m1", "f32", 4, 1, 2, 16),
                                                 ("m1", "f32", 4, 1, 1, 32)]}
    assert len(keys) == 7
    with pytest.raises(ValueError, match="kv_dtype must be one of .*got 'f8'"):
        key_of("m1", "f8", 4, 1, 1, 16)
    with pytest.raises(ValueError, match="block_size must be a positive int, got 0"):
        key_of("m1", "f32", 0, 1, 1, 16)


def test_block_chain_is_sha256_of_parent_and_tokens():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    hashes = block_chain(LAYOUT, tokens)
    first = hashlib.sha256(bytes.fromhex(LAYOUT.hex) + bytes([1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0]))
    assert hashes[0] == first.digest()[:16].hex()
    assert len(hashes) == 2 and len(hashes[1]) == 32
    assert block_chain(LAYOUT, [1, 2, 3, 4, 0, 6, 7, 8])[0] == hashes[0]
    assert block_chain(LAYOUT, [1, 2, 3, 4, 0, 6, 7, 8])[1] != hashes[1]  # the chain, not the block alone
    assert block_chain(key_of("m2", "f32", 4, 1, 1, 16), tokens)[0] != hashes[0]
    with pytest.raises(ValueError, match="3 blocks of 4 tokens need 12 token ids, got 9"):
        block_chain(LAYOUT, tokens, 3)


def test_model_hash_names_config_and_shards():
    manifest = {"config": {"n_layers": 1}, "shards": [{"file": "a", "sha256": "ab"}]}
    other = {"config": {"n_layers": 1}, "shards": [{"file": "a", "sha256": "ac"}]}
    assert len(model_hash(manifest)) == 16 and model_hash(manifest) != model_hash(other)
    with pytest.raises(ValueError, match="lists no shards"):
        model_hash({"config": {}})


def test_shared_prefix_is_stored_once_and_lru_follows_use():
    t = tier()
    a = save_chat(t, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    b = save_chat(t, [1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22, 23])
    assert a[:2] == b[:2] and a[2] != b[2]
    assert t.num_blocks == 4 and t.num_bytes == 4 * FILE and t.num_written == 4
    assert t.lru_names() == [LAYOUT.file_name(h) for h in (a[2], a[0], a[1], b[2])]  # a re-save touches
    t.touch([a[2]])
    assert t.lru_names()[-1] == LAYOUT.file_name(a[2])
    assert t.present_run(a) == 3 and t.present_run(a + ["0" * 32], 1) == 2


def test_budget_evicts_least_recently_used_first():
    t = tier(budget=3 * FILE)
    a = save_chat(t, [1, 2, 3, 4, 5, 6, 7, 8])
    t.touch([a[0]])
    b = save_chat(t, [9, 9, 9, 9, 8, 8, 8, 8])
    # Budget 3 files: a[1] (least recent) went for b[1].
    assert t.lru_names() == [LAYOUT.file_name(h) for h in (a[0], b[0], b[1])]
    assert t.num_bytes == 3 * FILE
    run_sync(t.set_budget(FILE))
    assert t.lru_names() == [LAYOUT.file_name(b[1])]
    assert run_sync(t.save("ab" * 16, [1, 1, 1, 1], payload(1))) is True  # replaces b[1]
    assert t.lru_names() == [LAYOUT.file_name("ab" * 16)]
    assert run_sync(DiskTier(MemoryStore(), LAYOUT, FILE - 1).save("ab" * 16, [1] * 4, payload(1))) is False


def test_reload_finds_files_and_loads_the_prefix_back():
    store = MemoryStore()
    store.files["otherlayout-x"] = b"1234"
    t = tier(store=store)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    hashes = save_chat(t, tokens)
    again = tier(store=store)  # the page reloaded
    assert again.num_blocks == 3 and again.num_bytes == 3 * FILE + 4
    assert again.lru_names()[0] == "otherlayout-x"  # foreign files go first
    assert again.present_run(hashes) == 3
    assert run_sync(again.load(hashes, tokens, start=1)) == [payload(5), payload(9)]
    assert again.num_read == 2 and again.num_corrupt == 0


def test_a_file_another_tab_deleted_is_missing_not_corrupt():
    store = MemoryStore()
    t = tier(store=store)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    hashes = save_chat(t, tokens)
    del store.files[LAYOUT.file_name(hashes[1])]  # the other tab's tier evicted it
    assert run_sync(t.load(hashes, tokens)) == [payload(1)]
    assert (t.num_read, t.num_corrupt, t.notes) == (1, 0, [])
    assert t.lru_names() == [LAYOUT.file_name(hashes[2]), LAYOUT.file_name(hashes[0])]  # block 0 was just used


@pytest.mark.parametrize("damage, message", [
    (lambda d: d[:-1], "block file has 599 bytes, a f32 block file has 600"),
    (lambda d: d[:200] + bytes([d[200] ^ 1]) + d[201:], "payload fails its sha256 check"),
    (lambda d: b"XXXX" + d[4:], "not a version-1 block file"),
    (lambda d: d[:80] + bytes([9]) + d[81:], "other token ids"),
])
def test_corrupt_or_truncated_file_is_deleted_and_never_used(damage, message):
    t = tier()
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    hashes = save_chat(t, tokens)
    name = LAYOUT.file_name(hashes[1])
    t.store.files[name] = damage(t.store.files[name])
    assert run_sync(t.load(hashes, tokens)) == [payload(1)]  # stops at the bad block: 1 and 2 recompute
    assert t.num_corrupt == 1 and message in t.notes[0] and "recomputing it" in t.notes[0]
    assert name not in t.store.files and not t.has(hashes[1]) and t.has(hashes[2])


def test_file_of_another_layout_or_block_is_refused():
    data = encode_block(LAYOUT, "cd" * 16, [1, 2, 3, 4], payload(7))
    assert decode_block(LAYOUT, "cd" * 16, [1, 2, 3, 4], data) == payload(7)
    with pytest.raises(BlockFileError, match="expected .* / " + "ab" * 16):
        decode_block(LAYOUT, "ab" * 16, [1, 2, 3, 4], data)
    other = key_of("m2", "f32", 4, 1, 1, 16)
    with pytest.raises(BlockFileError, match=f"for layout {LAYOUT.hex} / block {'cd' * 16}, expected {other.hex}"):
        decode_block(other, "cd" * 16, [1, 2, 3, 4], data)
    with pytest.raises(ValueError, match="payload of f32 KV is 512 bytes, got 511"):
        encode_block(LAYOUT, "cd" * 16, [1, 2, 3, 4], payload(7)[:-1])


def test_store_full_degrades_with_a_note():
    t = tier(store=MemoryStore(quota_bytes=2 * FILE + 10))
    hashes = save_chat(t, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])  # the third write hits the quota
    assert t.num_blocks == 2 and t.budget_bytes == 2 * FILE and t.num_written == 2
    assert len(t.notes) == 1 and t.notes[0].startswith("disk full (quota of 1210 bytes exceeded")
    assert run_sync(t.save("ab" * 16, [5, 5, 5, 5], payload(5))) is True  # now replaces the LRU block
    assert not t.has(hashes[0]) and t.has(hashes[1]) and t.has("ab" * 16)
    with pytest.raises(StoreFull, match="quota of 10 bytes exceeded writing x"):
        run_sync(MemoryStore(quota_bytes=10).write("x", b"12345678901"))


class LosingStore(MemoryStore):
    """A store whose writes of the names in `lost` fail as OpfsStore's does when the file keeps going (or
    staying locked) as it is written (another tab, or this tab forgetting a deleted chat's blocks)."""

    def __init__(self, lost) -> None:
        super().__init__()
        self.lost = set(lost)

    async def write(self, name, data):
        if any(part in name for part in self.lost):
            raise OSError(f"{name} could not be written: it went or stayed locked, 3 tries")
        await super().write(name, data)


def test_a_file_lost_as_it_is_written_is_a_note_not_an_error():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    hashes = block_chain(LAYOUT, tokens)
    store = LosingStore([hashes[1], ".lru"])
    t = tier(store=store)
    assert [run_sync(t.save(h, tokens[i * 4:(i + 1) * 4], payload(i))) for i, h in enumerate(hashes)] == [True, False]
    assert t.num_blocks == 1 and not t.has(hashes[1]) and t.num_written == 1
    assert t.notes == [f"block {hashes[1]} was not written ({LAYOUT.file_name(hashes[1])} could not be written: it "
                       "went or stayed locked, 3 tries); it is recomputed after a reload"]
    for _ in range(2):  # the index's order: one note, still to be written
        run_sync(t.flush(force=True))
    assert t.notes[1:] == [f"the disk's LRU order was not saved ({t.index_name} could not be written: it went or "
                           "stayed locked, 3 tries)"]
    store.lost.clear()
    run_sync(t.flush(force=True))
    assert store.files[t.index_name] == (hashes[0] + "\n").encode()


def test_forget_deletes_only_blocks_no_other_chat_references():
    t = tier()
    a_tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    b_tokens = [1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22, 23, 24]
    a, b = save_chat(t, a_tokens), save_chat(t, b_tokens)
    t.refer("chat-a", a_tokens)
    t.refer("chat-b", b_tokens)
    assert run_sync(t.forget("chat-a")) == 1
    assert not t.has(a[2]) and all(t.has(h) for h in b)
    assert run_sync(t.forget("chat-b")) == 3 and t.num_blocks == 0
    assert run_sync(t.forget("never-seen")) == 0


def test_clear_keeps_other_layouts():
    store = MemoryStore()
    store.files["otherlayout-x"] = b"1234"
    t = tier(store=store)
    save_chat(t, [1, 2, 3, 4, 5, 6, 7, 8])
    assert run_sync(t.clear()) == 2 and list(store.files) == ["otherlayout-x"]


def test_tier_budgets_in_blocks():
    budgets = TierBudgets(gpu_bytes=5 * 512 + 1, cpu_bytes=2 * 512, disk_bytes=3 * FILE - 1)
    assert budgets.num_blocks(LAYOUT) == {"gpu": 5, "cpu": 2, "disk": 2}
    with pytest.raises(ValueError, match="disk_bytes must be a non-negative int, got -1"):
        TierBudgets(1, 1, -1)
