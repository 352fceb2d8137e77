"""The disk tier on the WebGPU backend in real headless Chromium (tiny model): whole blocks out and back in the
GPU word layout, and a reload over the same store that restores a chat's prefix and replies exactly as the
engine that never reloaded; the OPFS store listed while files are written and deleted. Cases run in the page's worker (tests/browser/disk_cases.py)."""
from __future__ import annotations

import pytest

from browser_pages import install_modules


@pytest.fixture(scope="module")
def worker(ready_page):
    return install_modules(ready_page, "engine_cases", "disk_cases")


def run(worker, call: str):
    return worker.py(f"import json, disk_cases as dc\njson.dumps(await dc.{call})")


@pytest.mark.parametrize("kv_dtype", ["f32", "f16", "int8", "int4-asym"])
def test_blocks_read_out_and_written_back(worker, kv_dtype):
    r = run(worker, f"blocks_round_trip({kv_dtype!r})")
    assert r["layers"] == {str(layer): {"read": True, "written": True, "nonzero": True} for layer in range(2)}
    assert r["shape"][:4] == [2, 2, 2, 8]


@pytest.mark.parametrize("kv_dtype", ["f16", "int4-asym"])
def test_reload_restores_prefix_and_replies_the_same(worker, kv_dtype):
    r = run(worker, f"reload_restores({kv_dtype!r})")
    assert r["reloaded"] == r["out2"] and len(r["out2"]) == 12
    # A: 40 + 12 tokens, then 72 + 12 (48 of them GPU prefix hits): 5 full blocks on disk. B: 4 blocks restored.
    assert r["a"] == {"prefill_tokens": 40 + 24, "disk_blocks": 5, "disk_restored_tokens": 0,
                      "disk_written_blocks": 5, "disk_corrupt_blocks": 0}
    assert r["b"] == {"prefill_tokens": 8, "disk_blocks": 5, "disk_restored_tokens": 64,
                      "disk_written_blocks": 0, "disk_corrupt_blocks": 0}


def test_corrupt_block_is_recomputed_on_the_gpu(worker):
    r = run(worker, "reload_restores('f16', corrupt=True)")
    assert r["reloaded"] == r["out2"]
    assert r["b"] == {"prefill_tokens": 56, "disk_blocks": 5, "disk_restored_tokens": 16,
                      "disk_written_blocks": 1, "disk_corrupt_blocks": 1}


def test_opfs_listing_survives_writes_and_deletes_in_flight(worker):
    r = run(worker, "opfs_listing_while_writing()")
    assert r == {"listings": 40, "grew": True, "stray": [], "sizes": [], "final": True}


def test_opfs_listing_is_tried_again_when_the_iterator_fails(worker):
    r = run(worker, "opfs_listing_retries_a_failing_iterator()")
    assert r["listed"] == {"a": 5}
    assert "NotFoundError" in r["raised"] and "an entry went" in r["raised"], r


def test_opfs_store_takes_its_directory_again_when_the_handle_fails(worker):
    r = run(worker, "opfs_store_outlives_its_directory()")
    assert r == {"after_write": {"b": 2}, "reopened_by_write": 1, "after_listing": {}, "reopened": 2}


def test_opfs_write_never_raises_when_its_file_is_deleted_meanwhile(worker):
    r = run(worker, "opfs_write_while_deleted()")
    assert r == {"raised": [], "sizes": []}
