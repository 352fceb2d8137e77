"""`python3 -m pagedkv generate|tokenize|complete`, run as a real subprocess (generate with --messages-json or a raw
--prompt; complete with a chat body or a legacy Completions one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from model_fixtures import (ROOT, real_weights, reference_greedy, tiny_bos_dir, tiny_dir, tiny_model,  # noqa: F401
                            tiny_weights)

from pagedkv.chat import ChatTemplate, Conversation
from pagedkv.model.tiny import write_tiny_model
from pagedkv.tokenizer import Tokenizer

GOLDEN = json.loads((Path(__file__).parent / "golden" / "llama_golden.json").read_text(encoding="utf-8"))
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "py")}
    return subprocess.run([sys.executable, "-m", "pagedkv", *args], capture_output=True, text=True, env=env, timeout=300)


def write_messages(tmp_path, messages, name="messages.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(messages), encoding="utf-8")
    return str(path)


def test_tokenize_json(tiny_dir):  # noqa: F811
    result = run_cli("tokenize", "--model", str(tiny_dir), "--text", "<|im_start|>user\nthe cat 42<|im_end|>", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"ids": [1, 475, 13, 119, 260, 272, 316, 35, 55, 53, 2]}
    plain = run_cli("tokenize", "--model", str(tiny_dir), "--text", "the cat")
    assert plain.stdout == "119 260 272 316\n"


def test_generate_greedy_json_matches_the_library(tiny_dir, tiny_weights, tiny_model, tmp_path):  # noqa: F811
    result = run_cli("generate", "--model", str(tiny_dir), "--messages-json", write_messages(tmp_path, CHAT),
                     "--max-tokens", "8", "--greedy", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert list(out) == ["prompt_ids", "output_ids", "text"]
    tok = Tokenizer.from_manifest(tiny_weights.manifest)
    prompt = Conversation(tok, ChatTemplate.from_manifest(tiny_weights.manifest, tok), CHAT).prompt_ids()
    assert out["prompt_ids"] == prompt
    expected = reference_greedy(tiny_model, prompt, 8)  # an independent prefill + decode loop
    assert out["output_ids"] == expected
    assert out["output_ids"] == [321, 321, 321, 321, 242, 242, 242, 242]
    assert out["text"] == tok.decode(expected)


def test_generate_seeded_sampling_is_reproducible(tiny_dir, tmp_path):  # noqa: F811
    args = ("generate", "--model", str(tiny_dir), "--messages-json", write_messages(tmp_path, CHAT), "--max-tokens", "10",
            "--temperature", "1.0", "--top-p", "0.95", "--json")  # fmt: skip
    a = json.loads(run_cli(*args, "--seed", "5").stdout)
    b = json.loads(run_cli(*args, "--seed", "5").stdout)
    c = json.loads(run_cli(*args, "--seed", "6").stdout)
    assert a == b
    assert a["output_ids"] != c["output_ids"]


@pytest.mark.parametrize(
    "content,message",
    [
        ("[{\"role\": \"user\", \"content\": \"hi\"", "is not valid JSON"),
        ('[{"role": "bot", "content": "hi"}]', "message 0 has unknown role 'bot'"),
        ('{"role": "user", "content": "hi"}', "messages must be a list"),
        ('[{"role": "user"}]', "message 0 lacks ['content']"),
    ],
)
def test_bad_messages_fail_cleanly(tiny_dir, tmp_path, content, message):  # noqa: F811
    path = tmp_path / "m.json"
    path.write_text(content, encoding="utf-8")
    result = run_cli("generate", "--model", str(tiny_dir), "--messages-json", str(path), "--json")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: messages file {path}") and message in result.stderr


def test_missing_inputs_and_conflicting_flags(tiny_dir, tmp_path):  # noqa: F811
    result = run_cli("generate", "--model", str(tiny_dir), "--messages-json", str(tmp_path / "absent.json"))
    assert (result.returncode, result.stdout) == (2, "") and "cannot read messages file" in result.stderr
    result = run_cli("generate", "--model", str(tmp_path / "nomodel"), "--messages-json", write_messages(tmp_path, CHAT))
    assert (result.returncode, result.stdout) == (2, "") and "no model manifest at" in result.stderr
    result = run_cli("generate", "--model", str(tiny_dir), "--messages-json", write_messages(tmp_path, CHAT),
                     "--greedy", "--temperature", "0.5")  # fmt: skip
    assert (result.returncode, result.stdout) == (2, "") and "--greedy and --temperature exclude each other" in result.stderr


def test_prompt_longer_than_context_fails_cleanly(tiny_dir, tmp_path):  # noqa: F811
    long_chat = [{"role": "user", "content": "zq " * 200}]  # tiny model context is 256 tokens
    result = run_cli("generate", "--model", str(tiny_dir), "--messages-json", write_messages(tmp_path, long_chat), "--json")
    assert (result.returncode, result.stdout) == (2, "")
    assert "the model context is 256; shorten the messages" in result.stderr


def test_real_model_default_path_greedy_matches_llama_cpp(real_weights, tmp_path):  # noqa: F811
    case = next(c for c in GOLDEN["cases"] if c["name"] == "code")  # no near-tie among its first 16 tokens
    result = run_cli("generate", "--messages-json", write_messages(tmp_path, case["messages"]), "--max-tokens", "16",
                     "--greedy", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["prompt_ids"] == case["prompt_ids"]
    assert out["output_ids"] == case["output_ids"][:16]
    assert out["text"] == "```python\ndef factorial(n):\n    if n == 0:"


def test_deeply_nested_json_fails_with_one_line(tiny_dir, tmp_path):  # noqa: F811
    path = tmp_path / "nested.json"
    path.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    result = run_cli("generate", "--model", str(tiny_dir), "--messages-json", str(path))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"error: messages file {path} is nested too deeply to read\n"


def test_generate_ignore_eos_gives_exactly_max_tokens(tiny_dir, tmp_path):  # noqa: F811
    args = ("generate", "--model", str(tiny_dir), "--messages-json", write_messages(tmp_path, CHAT), "--max-tokens", "40",
            "--greedy", "--json")
    plain, ignoring = (json.loads(run_cli(*args, *extra).stdout) for extra in ((), ("--ignore-eos",)))
    assert len(ignoring["output_ids"]) == 40  # bench/device/gpu.sh's decode figures count on it
    assert ignoring["output_ids"][:len(plain["output_ids"])] == plain["output_ids"]  # greedy: the same start


def test_complete_answers_an_openai_body_and_streams_sse(tiny_dir, tmp_path):  # noqa: F811
    """`complete` (pagedkv.api.Engine): the chat.completion for a body, its chunks as SSE ending in [DONE], and
    a refused body as OpenAI's error JSON with exit status 1."""
    body = {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
            "temperature": 0}
    path = tmp_path / "body.json"
    path.write_text(json.dumps(body))
    done = run_cli("complete", "--model", str(tiny_dir), "--body-json", str(path))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["object"] == "chat.completion" and out["usage"]["completion_tokens"] >= 1
    path.write_text(json.dumps({**body, "stream": True}))
    done = run_cli("complete", "--model", str(tiny_dir), "--body-json", str(path))
    lines = [line for line in done.stdout.splitlines() if line]
    assert done.returncode == 0 and lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == out["choices"][0]["message"]["content"]
    path.write_text(json.dumps({**body, "audio": {"voice": "alloy"}}))
    done = run_cli("complete", "--model", str(tiny_dir), "--body-json", str(path))
    assert done.returncode == 1 and json.loads(done.stdout)["error"]["param"] == "audio"
    assert "error 400: audio is not supported" in done.stderr
    # --also loads another model into the same budget; the body picks it by its directory's name
    other = tmp_path / "tiny-twin"
    write_tiny_model(other, seed=5)
    path.write_text(json.dumps({**body, "model": "tiny-twin"}))
    done = run_cli("complete", "--model", str(tiny_dir), "--also", str(other), "--body-json", str(path))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"] == "tiny-twin"


def test_generate_prompt_is_its_tokens_with_no_template(tiny_dir, tiny_bos_dir, tiny_model):  # noqa: F811
    """--prompt: the text's ids as they are (BOS only where the file says), continued greedily as the legacy
    Completions API continues it."""
    result = run_cli("generate", "--model", str(tiny_dir), "--prompt", "the cat", "--max-tokens", "6", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["prompt_ids"] == [119, 260, 272, 316]  # test_tokenize_json's "the cat": no template, no BOS
    assert out["output_ids"] == reference_greedy(tiny_model, [119, 260, 272, 316], 6) == [254, 59, 59, 59, 25, 25]
    from pagedkv.api import Engine

    api = Engine([tiny_dir], budget_mib=64).completions.create(model="tiny-random", prompt="the cat", max_tokens=6,
                                                                temperature=0)
    assert out["text"] == api["choices"][0]["text"]
    bos = json.loads(run_cli("generate", "--model", str(tiny_bos_dir), "--prompt", "the cat", "--max-tokens", "2",
                             "--json").stdout)
    assert bos["prompt_ids"] == [1, 119, 260, 272, 316]


def test_generate_takes_messages_or_a_prompt_not_both(tiny_dir, tmp_path):  # noqa: F811
    both = run_cli("generate", "--model", str(tiny_dir), "--prompt", "hi", "--messages-json",
                   write_messages(tmp_path, CHAT))
    assert (both.returncode, both.stdout) == (2, "")
    assert "argument --messages-json: not allowed with argument --prompt" in both.stderr
    neither = run_cli("generate", "--model", str(tiny_dir))
    assert (neither.returncode, neither.stdout) == (2, "")
    assert "one of the arguments --messages-json --prompt is required" in neither.stderr
    empty = run_cli("generate", "--model", str(tiny_dir), "--prompt", "")
    assert (empty.returncode, empty.stdout) == (2, "")
    assert empty.stderr == "error: --prompt is empty and the model adds no BOS token: give some text to continue\n"
    long = run_cli("generate", "--model", str(tiny_dir), "--prompt", "zq " * 200)
    assert (long.returncode, long.stdout) == (2, "") and "context is 256; shorten the prompt" in long.stderr


def test_complete_answers_a_legacy_completions_body(tiny_dir, tmp_path):  # noqa: F811
    """A body with a prompt and no messages is a legacy Completions request: a text_completion, or its pieces as
    server-sent events; with both fields it is a chat body, refused naming prompt."""
    body = {"model": "tiny-random", "prompt": "the cat", "max_tokens": 6, "temperature": 0}
    path = tmp_path / "body.json"
    path.write_text(json.dumps(body))
    done = run_cli("complete", "--model", str(tiny_dir), "--body-json", str(path))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["object"], out["id"][:5], out["choices"][0]["finish_reason"]) == ("text_completion", "cmpl-", "length")
    assert out["usage"]["prompt_tokens"] == 4 and out["usage"]["completion_tokens"] == 6
    path.write_text(json.dumps({**body, "stream": True}))
    done = run_cli("complete", "--model", str(tiny_dir), "--body-json", str(path))
    lines = [line for line in done.stdout.splitlines() if line]
    assert done.returncode == 0 and lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks) == out["choices"][0]["text"]
    path.write_text(json.dumps({**body, "messages": CHAT}))
    done = run_cli("complete", "--model", str(tiny_dir), "--body-json", str(path))
    assert done.returncode == 1 and json.loads(done.stdout)["error"]["param"] == "prompt"
