"""`python3 -m pagedkv generate --gguf FILE` (CPU) and `npm run generate -- --gguf FILE`'s argument checks:
conversion on first use into a cache keyed by the file's sha256, reuse while current, named errors."""
from __future__ import annotations

import json

import pytest
from gguf import GGUFValueType as V
from gguf_files import write_small_gguf
from gguf_models import tiny_gguf
from model_fixtures import gguf_path  # noqa: F401  (pytest fixture)

from pagedkv import cli, generate
from pagedkv.backends.numpy_ref import NumpyModel, greedy_reference
from pagedkv.model.convert import sha256_file
from pagedkv.model.weights import ModelWeights


@pytest.fixture()
def messages(tmp_path):
    path = tmp_path / "chat.json"
    path.write_text(json.dumps([{"role": "user", "content": "What is the capital of France?"}]))
    return str(path)


def test_generate_converts_a_gguf_once_and_prints_the_reference_ids(gguf_path, tmp_path, messages, capsys):  # noqa: F811
    path = tiny_gguf("tiny-qwen2", gguf_path)
    args = ["generate", "--gguf", str(path), "--gguf-cache", str(tmp_path / "cache"), "--messages-json", messages,
            "--max-tokens", "5", "--json"]
    assert cli.main(args) == 0
    got = json.loads(capsys.readouterr().out)
    model_dir = tmp_path / "cache" / sha256_file(path)
    shard = next(model_dir.glob("shard-*.bin"))
    first = shard.stat().st_mtime_ns
    weights = ModelWeights.load(model_dir)
    assert weights.config.architecture == "qwen2"
    assert got["output_ids"] == greedy_reference(NumpyModel(weights), got["prompt_ids"], 5)
    assert cli.main(args) == 0  # the second run reuses the conversion
    assert json.loads(capsys.readouterr().out) == got and shard.stat().st_mtime_ns == first
    assert cli.main(["tokenize", "--gguf", str(path), "--gguf-cache", str(tmp_path / "cache"), "--text", "Paris",
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ids": [38634]}  # SmolLM2's vocabulary has "Paris"


def test_a_missing_or_foreign_gguf_is_one_error_line(tmp_path, messages, capsys):
    missing = tmp_path / "missing.gguf"
    assert cli.main(["generate", "--gguf", str(missing), "--messages-json", messages]) == 2
    assert capsys.readouterr().err == f"error: GGUF file {missing} does not exist\n"
    text = tmp_path / "text.gguf"
    text.write_text("hello")
    assert generate.main(["--gguf", str(text), "--messages-json", messages]) == 2  # before any browser starts
    assert capsys.readouterr().err == "error: text.gguf is not a GGUF file: it starts with b'hell', not b'GGUF'\n"


def test_model_and_gguf_exclude_each_other(tmp_path, messages, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["generate", "--model", str(tmp_path), "--gguf", str(tmp_path / "m.gguf"), "--messages-json", messages])
    assert exc.value.code == 2
    assert "argument --gguf: not allowed with argument --model" in capsys.readouterr().err


@pytest.mark.parametrize("metadata,problem", [
    ({"llama.block_count": (1_000_000, V.UINT32)},
     "llama.block_count is 1,000,000 (an integer); expected the number of layers the tensor table holds: 2 "
     "(blk.0..blk.1)"),
    ({"llama.attention.head_count": ("four", V.STRING)},
     "llama.attention.head_count is 'four' (a string); expected a positive integer"),
])
def test_a_hostile_gguf_is_one_error_line(tmp_path, messages, capsys, metadata, problem):
    path = tmp_path / "hostile.gguf"
    write_small_gguf(path, metadata)
    args = ["generate", "--gguf", str(path), "--gguf-cache", str(tmp_path / "cache"), "--messages-json", messages]
    assert cli.main(args) == 2
    assert capsys.readouterr().err == f"error: hostile.gguf: {problem}\n"
    assert not (tmp_path / "cache" / sha256_file(path)).exists()
