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
