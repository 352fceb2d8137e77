"""Restored chats and the ids the page reserves: a new chat never takes the id of a saved record."""
from __future__ import annotations

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from test_chat_service import of, service  # noqa: F401  (fixture)


def test_new_chats_skip_the_ids_of_records_that_were_not_restored(service):  # noqa: F811
    svc, posts = service
    empty = [[], [], ""]
    # chat-9 could not be read by the page and chat-zz was made by another model: neither is restored.
    svc.handle({"type": "restore", "chats": [{"id": "chat-2", "title": "Kept", "checkpoint": empty}],
                "reserved": ["chat-9", "chat-zz"]})
    assert of(posts, "chat-error") == []
    assert list(svc.chats) == ["chat-2"]
    assert svc.new_chat().chat_id == "chat-10"
    assert svc.new_chat().chat_id == "chat-11"


def test_without_reserved_ids_new_chats_follow_the_restored_ones(service):  # noqa: F811
    svc, _ = service
    svc.handle({"type": "restore", "chats": [{"id": "chat-3", "title": "Kept", "checkpoint": [[], [], ""]}]})
    assert svc.new_chat().chat_id == "chat-4"


def test_a_reply_cut_off_before_its_first_token_comes_back_as_an_empty_reply(service):  # noqa: F811
    svc, posts = service
    chat = svc.new_chat()
    chat.conversation.add_user("hi")
    messages, ids, text = chat.conversation.checkpoint()
    asked = [list(messages), list(ids), text]
    # The page saved the chat at the reply's start (streaming, no token yet), then the tab was reloaded.
    svc.handle({"type": "restore", "chats": [
        {"id": "chat-4", "title": "Cut", "checkpoint": asked, "partial_ids": [], "streaming": True},
        {"id": "chat-5", "title": "Asked", "checkpoint": asked, "partial_ids": []}]})
    assert of(posts, "chat-error") == []
    cut = svc.chats["chat-4"].conversation
    assert cut.messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]
    tok = svc.engine.tokenizer
    assert cut.ids == list(ids) + tok.encode("<|im_start|>assistant\n") + tok.encode("<|im_end|>\n")
    assert [p["checkpoint"][1] for p in of(posts, "chat-saved") if p["chat"] == "chat-4"] == [cut.ids]
    assert svc.chats["chat-5"].conversation.messages == [{"role": "user", "content": "hi"}]
