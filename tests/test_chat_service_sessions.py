"""Sessions: the worker keeps only the engine's state of a chat the page owns. It opens a session from the page's
record (exact token history, a cut-off reply), opens an empty one at a new chat's first message, and keeps no
titles, no chat list and no ids of its own."""
from __future__ import annotations

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from test_chat_service import SETTINGS, in_fresh_loop, of, service  # noqa: F401  (fixture)


def test_a_reply_cut_off_before_its_first_token_comes_back_as_an_empty_reply(service):  # noqa: F811
    svc, posts = service
    chat = svc.open_session("chat-1")
    chat.conversation.add_user("hi")
    messages, ids, text = chat.conversation.checkpoint()
    asked = [list(messages), list(ids), text]
    # The page saved the chat at the reply's start (streaming, no token yet), then the tab was reloaded.
    svc.handle({"type": "open-sessions", "sessions": [
        {"id": "chat-4", "checkpoint": asked, "partial_ids": [], "streaming": True},
        {"id": "chat-5", "checkpoint": asked, "partial_ids": []}]})
    assert of(posts, "chat-error") == []
    cut = svc.sessions["chat-4"].conversation
    assert cut.messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]
    tok = svc.engine.tokenizer
    assert cut.ids == list(ids) + tok.encode("<|im_start|>assistant\n") + tok.encode("<|im_end|>\n")
    assert [p["checkpoint"][1] for p in of(posts, "session-saved") if p["chat"] == "chat-4"] == [cut.ids]
    assert [p["reply"] for p in of(posts, "session-saved") if p["chat"] == "chat-4"] == [""]
    assert svc.sessions["chat-5"].conversation.messages == [{"role": "user", "content": "hi"}]


def test_a_new_chats_first_message_opens_its_session_and_nothing_else_is_made(service):  # noqa: F811
    svc, posts = service
    svc.handle({"type": "open-sessions", "sessions": [{"id": "chat-2", "checkpoint": None}]})
    assert list(svc.sessions) == ["chat-2"] and svc.sessions["chat-2"].conversation.messages == []  # no turn yet

    async def scenario():
        svc.handle({"type": "send", "chat": "chat-9", "text": "hello", "settings": SETTINGS})
        await svc._loop_task

    in_fresh_loop(scenario)
    assert of(posts, "chat-error") == [] and list(svc.sessions) == ["chat-2", "chat-9"]
    saved = of(posts, "session-saved")
    # Saved at the turn's start (the user's message): the token history, no title; the reply's end (turn-end)
    # carries the history with the reply, in the one message that ends it (no session-saved follows it).
    assert [p["chat"] for p in saved] == ["chat-9"] and set(saved[-1]) == {"chat", "checkpoint", "before_reply"}
    end = of(posts, "turn-end")[-1]
    assert end["checkpoint"][1] == svc.sessions["chat-9"].conversation.ids
    assert end["before_reply"] == saved[-1]["checkpoint"]
    for gone in ("new-chat", "rename-chat", "restore"):  # the page makes, names and restores its chats itself
        svc.handle({"type": gone, "chat": "chat-2"})
    assert [e["message"] for e in of(posts, "chat-error")] == [
        f"ValueError: unknown message type {gone!r}" for gone in ("new-chat", "rename-chat", "restore")]
    assert of(posts, "chats") == []


def test_an_idle_session_is_replaced_by_the_record_the_page_sends(service):  # noqa: F811
    svc, _ = service
    first = svc.open_session("chat-1")
    first.conversation.add_user("one")
    other = svc.open_session("chat-x")
    other.conversation.add_user("two")
    messages, ids, text = other.conversation.checkpoint()
    svc.open_session("chat-1", {"checkpoint": [list(messages), list(ids), text]})
    assert svc.sessions["chat-1"].conversation.ids == other.conversation.ids
    assert svc.open_session("chat-1") is svc.sessions["chat-1"]  # no record: the session as it is


def test_forgetting_a_session_the_worker_never_opened_changes_nothing(service):  # noqa: F811
    svc, posts = service
    svc.handle({"type": "forget-session", "chat": "chat-404"})
    assert of(posts, "chat-error") == [] and svc.sessions == {}


def test_a_reply_cut_mid_character_comes_back_with_the_text_the_history_holds(service):  # noqa: F811
    # The stream showed nothing for a lone first byte of a character (it waits for the rest); the history's
    # lossy decode holds U+FFFD: session-saved carries that text, so the page's record says the same.
    svc, posts = service
    tok = svc.engine.tokenizer
    lead = tok.encode("日")[:1]
    assert tok.decode(lead) == "\ufffd"
    chat = svc.open_session("chat-1")
    chat.conversation.add_user("hi")
    messages, ids, text = chat.conversation.checkpoint()
    svc.open_sessions([{"id": "chat-2", "checkpoint": [list(messages), list(ids), text], "partial_ids": lead,
                        "streaming": True}])
    saved = [p for p in of(posts, "session-saved") if p["chat"] == "chat-2"]
    assert [p["reply"] for p in saved] == ["\ufffd"]
    assert svc.sessions["chat-2"].conversation.messages[-1] == {"role": "assistant", "content": "\ufffd"}
