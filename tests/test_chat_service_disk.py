"""The chat service with the disk tier under CPython: chats name the blocks their history holds, deleting a
chat deletes the block files only it referenced, and a service whose sessions are opened over the same store (a reload)
restores the history instead of prefilling it."""
from __future__ import annotations

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.chat import ChatTemplate
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.kv.disk_tier import DiskKey, DiskTier, MemoryStore, block_chain, model_hash
from pagedkv.tokenizer import Tokenizer
from pagedkv_app.chat_service import ChatService
from test_chat_service import SETTINGS, in_fresh_loop, of, saves


def disk_service(weights, store):
    tok = Tokenizer.from_manifest(weights.manifest)
    backend = CpuBackend(weights, num_blocks=32, block_size=16)
    engine = LLMEngine(backend, tok, EngineConfig())
    posts = []
    svc = ChatService(engine, ChatTemplate.from_manifest(weights.manifest, tok),
                      lambda kind, **p: posts.append((kind, p)), model_name="tiny-random")
    return svc, posts, DiskTier(store, DiskKey(model_hash(weights.manifest), backend.kv_spec), 1 << 30)


def test_delete_removes_only_the_chats_own_block_files_and_a_reload_restores(tiny_weights):
    store = MemoryStore()
    svc, posts, tier = disk_service(tiny_weights, store)
    system = {**SETTINGS, "system": "You answer every question about fruit and boats with care and detail."}

    async def scenario():
        await tier.open()
        svc.engine.attach_disk(tier)
        a, b = svc.open_session("chat-1"), svc.open_session("chat-2")
        svc.send(a.session_id, "tell me about apples and pears", system)
        await svc._loop_task
        svc.send(b.session_id, "tell me about boats and rivers", system)
        await svc._loop_task
        return a, b

    a, b = in_fresh_loop(scenario)
    layout = tier.key
    a_files = {layout.file_name(h) for h in block_chain(layout, a.conversation.ids)}
    b_files = {layout.file_name(h) for h in block_chain(layout, b.conversation.ids)}
    shared = a_files & b_files
    assert len(shared) >= 1 and b_files - shared  # the system prompt's blocks, then each chat's own
    assert a_files | b_files <= set(store.files)
    saved = saves(posts)

    async def delete_b():
        svc.forget_session(b.session_id)
        await svc._disk_task

    in_fresh_loop(delete_b)
    assert a_files <= set(store.files) and not (b_files - shared) & set(store.files)

    # The reload: a new service and engine over the same store restore chat A and continue it.
    svc2, posts2, tier2 = disk_service(tiny_weights, store)
    record = [p for p in saved if p["chat"] == a.session_id][-1]

    async def reload():
        await tier2.open()
        svc2.engine.attach_disk(tier2)
        svc2.open_sessions([{"id": a.session_id, "checkpoint": record["checkpoint"]}])
        svc2.send(a.session_id, "and cherries?", system)
        await svc2._loop_task

    in_fresh_loop(reload)
    restored = (len(a.conversation.ids) - 1) // 16 * 16  # the reply's last token was never computed
    stats = svc2.engine.stats()
    assert stats["disk_restored_tokens"] == stats["last_disk_restored_tokens"] == restored > 0
    assert of(posts2, "turn-end")[-1]["cached_tokens"] == restored
    assert of(posts2, "turn-start")[-1]["cached_tokens"] == restored  # said at the start too (it said 0)
    assert svc2.memory_snapshot()["engine"]["disk_blocks"] == tier2.num_blocks


def test_flush_disk_message_writes_back_what_the_store_lost(tiny_weights):
    """`flush-disk` (the page hidden or left): every full block of a chat's history the disk tier lacks is
    written, here the chat's files another tab of the origin deleted; answered by `disk-flushed`. Without a
    disk tier the message does nothing."""
    store = MemoryStore()
    svc, posts, tier = disk_service(tiny_weights, store)

    async def chat():
        await tier.open()
        svc.engine.attach_disk(tier)
        svc.send(svc.open_session("chat-1").session_id, "tell me about apples and pears and plums", SETTINGS)
        await svc._loop_task

    in_fresh_loop(chat)
    ids = svc.sessions["chat-1"].conversation.ids
    files = {tier.key.file_name(h) for h in block_chain(tier.key, ids, (len(ids) - 1) // 16)}
    assert len(files) >= 2 and files <= set(store.files)
    gone = sorted(files)[:2]
    for name in gone:
        del store.files[name]

    async def flush():
        svc.handle({"type": "flush-disk"})
        return await svc._flush_task

    assert in_fresh_loop(flush) == 2
    assert files <= set(store.files)
    flushed = of(posts, "disk-flushed")[-1]
    assert flushed["written"] == 2 and flushed["ms"] >= 0
    assert of(posts, "memory")[-1]["engine"]["disk_blocks"] == tier.num_blocks

    plain, plain_posts, _ = disk_service(tiny_weights, MemoryStore())  # no tier attached
    plain.handle({"type": "flush-disk"})
    assert plain._flush_task is None and not of(plain_posts, "chat-error")
