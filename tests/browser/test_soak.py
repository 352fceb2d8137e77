"""The soak's short form (harness/soak.py, bench/soak.py's driver): random Send / Stop / Regenerate / Delete / New chat /
switch / reload, two quick Sends, a Delete as a reply starts and a reload as one ends, on the tiny model; then nothing
lost, nothing left behind. Then issue 49's three actions (two tabs sending at once, a full quota, a reload under CPU
load) between Sends, each once."""
from __future__ import annotations

from harness.soak import ISSUE_49, KINDS, MODEL_QUERY, run_soak
from browser_pages import open_and_boot, wait_model


def test_a_short_soak_loses_nothing_and_leaks_no_block(browser, base_url):
    booted = open_and_boot(browser, base_url + MODEL_QUERY)
    kinds = tuple(k for k in KINDS if k not in ISSUE_49)
    try:
        wait_model(booted)
        result = run_soak(booted.page, turns=24, seed=3, reload_every=8, kinds=kinds)  # room for both reloads
    finally:
        booted.page.close()
    figures = {k: result[k] for k in ("errors", "chats_lost", "history_mismatches", "blocks_leaked")}
    clean = {"errors": 0, "chats_lost": 0, "history_mismatches": 0, "blocks_leaked": 0}
    assert figures == clean, (result["error_messages"], result)
    assert result["details"]["chats_back_after_delete"] == [], result
    assert result["turns"] == 24
    assert all(result["actions"][kind] >= 1 for kind in kinds), result["actions"]


def test_two_tabs_a_full_quota_and_a_reload_under_load_lose_nothing(browser, base_url):
    context = browser.new_context()  # its own storage, and room for the second tab of `two_tabs`
    booted = open_and_boot(context, base_url + MODEL_QUERY)
    try:
        wait_model(booted)
        # Each of the three at least once, with Sends (two tabs open a chat that holds a turn), and New chat, switch
        # and Delete (for when a chat has no room for another turn).
        result = run_soak(booted.page, turns=8, seed=1, reload_every=0,
                          kinds=("send", "new_chat", "switch", "delete", *ISSUE_49))
    finally:
        context.close()
    figures = {k: result[k] for k in ("errors", "chats_lost", "history_mismatches", "blocks_leaked", "turns_lost",
                                      "disk_blocks_missed")}
    assert figures == dict.fromkeys(figures, 0), (result["error_messages"], result)
    assert all(result["actions"][kind] >= 1 for kind in ISSUE_49), result["actions"]
    assert result["disk_blocks_checked"] >= 1, result
