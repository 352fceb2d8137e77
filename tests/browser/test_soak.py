"""The soak's short form (harness/soak.py, bench/soak.py's driver): random Send / Stop / Regenerate / Delete / New chat /
switch / reload, two quick Sends, a Delete as a reply starts and a reload as one ends, on the tiny model; then nothing
lost, nothing left behind."""
from __future__ import annotations

from harness.soak import KINDS, MODEL_QUERY, run_soak
from browser_pages import open_and_boot, wait_model


def test_a_short_soak_loses_nothing_and_leaks_no_block(browser, base_url):
    booted = open_and_boot(browser, base_url + MODEL_QUERY)
    try:
        wait_model(booted)
        result = run_soak(booted.page, turns=24, seed=3, reload_every=8)  # room for both kinds of reload
    finally:
        booted.page.close()
    figures = {k: result[k] for k in ("errors", "chats_lost", "history_mismatches", "blocks_leaked")}
    clean = {"errors": 0, "chats_lost": 0, "history_mismatches": 0, "blocks_leaked": 0}
    assert figures == clean, (result["error_messages"], result)
    assert result["details"]["chats_back_after_delete"] == [], result
    assert result["turns"] == 24
    assert all(result["actions"][kind] >= 1 for kind in KINDS), result["actions"]
