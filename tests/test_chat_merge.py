"""web/merge.js under Node: how a chat's record is merged when two tabs wrote it (store.js calls it when the
stored version is not this tab's own last write). Checkpoints are [messages, ids, text] as the worker sends."""
from __future__ import annotations

import json

import pytest

from node_run import node_runner

RUNNER = """
import { mergeRecords } from "./merge.js";
const [base, stored, ours, tab] = JSON.parse(process.argv[2]);
console.log(JSON.stringify(mergeRecords(base, stored, ours, tab)));
"""

HEAD = [[], [1, 2], "<s>"]  # the template's head (a system prompt): before every turn


def turn(user: str, reply: str, ids: list[int]) -> tuple[list, list, list[int], str]:
    """A finished turn: the page's two messages, the checkpoint's two, its ids and text."""
    return ([{"role": "user", "text": user}, {"role": "assistant", "text": reply}],
            [{"role": "user", "content": user}, {"role": "assistant", "content": reply}], ids, f"[{user}|{reply}]")


def record(*turns, streaming=None, version=1, title="Chat 1", tab=None) -> dict:
    """A record of finished `turns`, and (streaming=(user, partial, ids, text)) a reply streaming after them."""
    messages, ck_messages, ids, text = [], [], list(HEAD[1]), HEAD[2]
    for m, cm, i, t in turns:
        messages += m
        ck_messages += cm
        ids += i
        text += t
    rec = {"id": "chat-1", "title": title, "model": "m", "messages": messages, "checkpoint": [ck_messages, ids, text],
           "before_reply": None, "partial_ids": [], "streaming": False, "version": version}
    if streaming:
        user, partial, uids, utext = streaming
        rec.update(turn_at=len(messages), turn_base=rec["checkpoint"], turn_tab=tab, streaming=True, partial_ids=[9],
                   messages=messages + [{"role": "user", "text": user}, {"role": "assistant", "text": partial}],
                   checkpoint=[ck_messages + [{"role": "user", "content": user}], ids + uids, text + utext])
    return rec


@pytest.fixture(scope="module")
def merge(tmp_path_factory):
    run = node_runner(tmp_path_factory, ["merge.js"], RUNNER, timeout_s=30)
    return lambda base, stored, ours, tab="me": run(json.dumps([base, stored, ours, tab]))


T1 = turn("hi", "hello", [10, 11])
A = turn("a?", "aa", [20, 21])
B = turn("b?", "bb", [30, 31, 32])


def test_two_finished_turns_from_one_base_are_both_kept_theirs_first(merge):
    merged = merge(record(T1), record(T1, A, version=5), record(T1, B))
    assert [m["text"] for m in merged["messages"]] == ["hi", "hello", "a?", "aa", "b?", "bb"]
    assert merged["checkpoint"] == record(T1, A, B)["checkpoint"]
    assert merged["checkpoint"][1] == [1, 2, 10, 11, 20, 21, 30, 31, 32]
    assert merged["streaming"] is False and merged["version"] == 5 and "turn_at" not in merged


def test_a_reply_streaming_here_stays_last_after_the_other_tabs_turn(merge):
    ours = record(T1, streaming=("b?", "b", [30], "[b?|"), tab="me")
    merged = merge(record(T1), record(T1, A, version=3), ours)
    assert [m["text"] for m in merged["messages"]] == ["hi", "hello", "a?", "aa", "b?", "b"]
    assert merged["turn_at"] == 4 and merged["turn_base"] == record(T1, A)["checkpoint"]
    assert merged["checkpoint"][1] == [1, 2, 10, 11, 20, 21, 30] and merged["checkpoint"][2].endswith("[a?|aa][b?|")
    assert merged["streaming"] is True and merged["partial_ids"] == [9] and merged["turn_tab"] == "me"


def test_the_other_tabs_streaming_turn_stays_last_but_this_tabs_own_old_copy_is_dropped(merge):
    theirs_streaming = record(T1, A, streaming=("c?", "c", [40], "[c?|"), tab="other", version=7)
    merged = merge(record(T1), theirs_streaming, record(T1, B))
    assert [m["text"] for m in merged["messages"]] == ["hi", "hello", "a?", "aa", "b?", "bb", "c?", "c"]
    assert merged["turn_at"] == 6 and merged["checkpoint"][1] == [1, 2, 10, 11, 20, 21, 30, 31, 32, 40]
    # The same streaming turn, put there earlier by the other tab's merge, but started here: this tab's finished
    # turn replaces it.
    mine_old = record(T1, A, streaming=("b?", "b", [30], "[b?|"), tab="me", version=7)
    base = record(T1, streaming=("b?", "b", [30], "[b?|"), tab="me")
    merged = merge(base, mine_old, record(T1, B))
    assert [m["text"] for m in merged["messages"]] == ["hi", "hello", "a?", "aa", "b?", "bb"]
    assert merged["streaming"] is False and merged["checkpoint"] == record(T1, A, B)["checkpoint"]


def test_histories_that_do_not_add_up_are_not_merged(merge):
    # A Regenerate here rewrote the reply the base held; the first turns of an empty chat have no base to split at.
    regenerated = record(turn("hi", "other", [10, 12]))
    assert merge(record(T1), record(T1, A, version=2), regenerated) is None
    assert merge(None, record(A, version=2), record(B)) is None


def test_a_rename_here_wins_else_the_stored_title_stands(merge):
    assert merge(record(T1), record(T1, A, title="Theirs", version=2), record(T1, title="Mine"))["title"] == "Mine"
    assert merge(record(T1), record(T1, A, title="Theirs", version=2), record(T1))["title"] == "Theirs"


def test_settings_merge_one_by_one_so_an_edit_in_each_tab_is_kept(merge):
    # Both tabs started from the defaults; this tab changed the temperature, the other the max tokens.
    defaults = {"temperature": "0.7", "max_tokens": "256"}
    base, stored, ours = record(T1), record(T1, A, version=2), record(T1)
    base["settings"] = defaults
    stored["settings"] = {**defaults, "max_tokens": "4"}
    ours["settings"] = {**defaults, "temperature": "0"}
    assert merge(base, stored, ours)["settings"] == {"temperature": "0", "max_tokens": "4"}
    # An unchanged setting here never overrides the stored one, even where this tab's old value differs from it.
    ours["settings"] = dict(defaults)
    assert merge(base, stored, ours)["settings"] == {"temperature": "0.7", "max_tokens": "4"}
