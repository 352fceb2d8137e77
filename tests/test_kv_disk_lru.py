"""The disk tier's LRU order survives a reload (the index file), against the in-memory file store."""
from pagedkv.engine import run_sync
from pagedkv.kv.disk_tier import DiskTier, MemoryStore
from test_kv_disk import FILE, LAYOUT, save_chat, tier


def test_reload_keeps_the_lru_order_and_evicts_the_oldest_first():
    store = MemoryStore()
    t = tier(store=store)
    a = save_chat(t, [1, 2, 3, 4, 5, 6, 7, 8])
    b = save_chat(t, [9, 9, 9, 9, 8, 8, 8, 8])
    t.touch([a[1]])  # a[1] is the most recent now
    run_sync(t.flush())
    assert store.files[t.index_name] == "".join(h + "\n" for h in [a[0], b[0], b[1], a[1]]).encode()
    again = tier(store=store)  # the page reloaded
    lru = [LAYOUT.file_name(h) for h in (a[0], b[0], b[1], a[1])]
    assert again.lru_names() == lru and sorted(lru) != lru  # not the name order a reload used to give
    assert again.num_blocks == 4 and again.num_bytes == 4 * FILE  # the index is beside the budget
    run_sync(again.set_budget(2 * FILE))  # the two least recently used go, not the first two by name
    assert again.lru_names() == [LAYOUT.file_name(h) for h in (b[1], a[1])]


def test_blocks_written_after_the_last_flush_count_as_the_most_recent():
    store = MemoryStore()
    store.files["otherlayout-x"] = b"1234"
    t = tier(store=store)
    a = save_chat(t, [1, 2, 3, 4, 5, 6, 7, 8])
    run_sync(t.flush())
    run_sync(t.flush())  # nothing changed: no write
    b = save_chat(t, [9, 9, 9, 9])  # not flushed: the page closed first
    t.touch([a[0]])
    again = tier(store=store)
    assert again.lru_names() == ["otherlayout-x"] + [LAYOUT.file_name(h) for h in (a[0], a[1], b[0])]


def test_a_damaged_index_is_noted_and_ignored():
    store = MemoryStore()
    t = tier(store=store)
    a = save_chat(t, [1, 2, 3, 4, 5, 6, 7, 8])
    store.files[t.index_name] = b"not a hash\n"
    again = tier(store=store)
    assert again.lru_names() == sorted(LAYOUT.file_name(h) for h in a)
    assert again.notes == [f"{t.index_name} is not a list of block hashes; the disk's LRU order is lost"]
    store.files[t.index_name] = b"\xff\xfe"
    assert tier(store=store).notes == again.notes


def test_a_full_store_notes_the_unsaved_order_once_and_clear_deletes_the_index():
    store = MemoryStore(quota_bytes=2 * FILE)
    t = DiskTier(store, LAYOUT, 10 * FILE)
    run_sync(t.open())
    a = save_chat(t, [1, 2, 3, 4, 5, 6, 7, 8])
    run_sync(t.flush())
    t.touch([a[0]])
    run_sync(t.flush(force=True))
    assert len(t.notes) == 1 and t.notes[0].startswith("the disk's LRU order was not saved (quota of")
    assert t.index_name not in store.files
    store.quota_bytes = None
    run_sync(t.flush(force=True))  # the failed write is tried again
    assert store.files[t.index_name] == "".join(h + "\n" for h in reversed(a)).encode()
    assert run_sync(t.clear()) == 2 and store.files == {}


def test_the_index_is_written_at_most_once_an_interval_unless_forced():
    store, now = MemoryStore(), [100.0]
    t = DiskTier(store, LAYOUT, 10 * FILE, index_interval_s=10.0, clock=lambda: now[0])
    run_sync(t.open())
    a = save_chat(t, [1, 2, 3, 4, 5, 6, 7, 8])
    run_sync(t.flush())  # the first write is not held back
    first = store.files[t.index_name]
    t.touch([a[0]])
    now[0] = 109.9
    run_sync(t.flush())
    assert store.files[t.index_name] == first and t.num_index_writes == 1  # 9.9 s after the last write
    now[0] = 110.0
    run_sync(t.flush())
    assert store.files[t.index_name] == "".join(h + "\n" for h in (a[1], a[0])).encode()
    t.touch([a[1]])
    run_sync(t.flush(force=True))  # a turn ended: written at once
    assert store.files[t.index_name] == first and t.num_index_writes == 3
    run_sync(t.flush(force=True))  # nothing changed since: no write
    assert t.num_index_writes == 3
