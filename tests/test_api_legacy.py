"""OpenAI's legacy Completions through pagedkv.api.Engine (tiny model, CPU backend): `engine.completions.create`
continues a prompt with no chat template (its ids are the tokenizer's, BOS as the model's file says, or token ids
as given), answers `text_completion` objects and streamed pieces whose text joins to the same greedy reply, ends
at max_tokens ("length", 16 by default as OpenAI's), an end token or a stop string ("stop"), and refuses what it
cannot do with a 400 naming the field."""
from __future__ import annotations

import pytest

from model_fixtures import tiny_bos_dir, tiny_dir  # noqa: F401  (fixtures)
from pagedkv.api import ApiError, Engine
from pagedkv.completions import LEGACY_MAX_TOKENS, parse_request
from pagedkv.engine import run_sync
from pagedkv.sampling import SamplingParams

PROMPT = "the cat"
PROMPT_IDS = [119, 260, 272, 316]  # the tiny tokenizer's ids of "the cat" (test_cli.py's tokenize)


@pytest.fixture(scope="module")
def engine(tiny_dir):
    return Engine([tiny_dir], budget_mib=64)


def reference(engine, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], str, str]:
    """The greedy continuation from LLMEngine directly (no API layer): ids, the text the API must give, and its
    finish_reason."""
    req = run_sync(engine.llm.generate(list(prompt_ids), SamplingParams(max_tokens=max_tokens)))
    ids = [t for t in req.output_ids if t not in engine.llm.default_stop_ids]
    return req.output_ids, engine.services[engine.model_id].tokenizer.decode(ids), req.finish_reason


def test_a_prompt_is_its_tokens_with_no_template_and_answers_a_text_completion(engine):
    tokenizer = engine.services[engine.model_id].tokenizer
    assert tokenizer.encode(PROMPT) == PROMPT_IDS and not tokenizer.add_bos
    ids, text, reason = reference(engine, PROMPT_IDS, 12)
    out = engine.completions.create(model=engine.model_id, prompt=PROMPT, max_tokens=12, temperature=0)
    assert out == {"id": out["id"], "object": "text_completion", "created": out["created"], "model": "tiny-random",
                   "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": reason}],
                   "usage": {"prompt_tokens": 4, "completion_tokens": len(ids), "total_tokens": 4 + len(ids),
                             "prompt_tokens_details": {"cached_tokens": 0}},
                   "system_fingerprint": None}
    assert out["id"].startswith("cmpl-") and text
    # The same prompt as token ids, or as OpenAI's batch of one: the same continuation.
    for prompt in (PROMPT_IDS, [PROMPT_IDS], [PROMPT]):
        again = engine.completions.create(model=engine.model_id, prompt=prompt, max_tokens=12, temperature=0,
                                          echo=False, best_of=1, suffix=None)
        assert again["choices"][0]["text"] == text and again["usage"]["prompt_tokens"] == 4


def test_bos_is_added_as_the_models_file_says(tiny_bos_dir):  # noqa: F811
    engine = Engine([tiny_bos_dir], budget_mib=64)
    service = engine.services["tiny-bos"]
    assert service.tokenizer.add_bos and service.tokenizer.bos_token_id == 1
    assert service.prompt_ids(parse_request({"model": "tiny-bos", "prompt": PROMPT}, ["tiny-bos"], legacy=True)) \
        == [1, *PROMPT_IDS]
    # token ids are the caller's own: nothing is added to them
    assert service.prompt_ids(parse_request({"model": "tiny-bos", "prompt": PROMPT_IDS}, ["tiny-bos"],
                                            legacy=True)) == PROMPT_IDS
    _, text, _ = reference(engine, [1, *PROMPT_IDS], 6)
    out = engine.completions.create(model="tiny-bos", prompt=PROMPT, max_tokens=6, temperature=0)
    assert out["choices"][0]["text"] == text and out["usage"]["prompt_tokens"] == 5
    # An empty prompt is BOS alone here; without BOS it is a 400 (next test).
    assert engine.completions.create(model="tiny-bos", prompt="", max_tokens=2)["usage"]["prompt_tokens"] == 1


def test_streamed_pieces_join_to_the_same_text_and_end_with_usage(engine):
    ids, text, reason = reference(engine, PROMPT_IDS, 16)
    chunks = list(engine.completions.create(model=engine.model_id, prompt=PROMPT, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["id"].startswith("cmpl-")
    body = [c["choices"][0] for c in chunks[:-1]]
    assert all(set(c) == {"text", "index", "logprobs", "finish_reason"} for c in body)
    assert "".join(c["text"] for c in body) == text
    assert [c["finish_reason"] for c in body] == [None] * (len(body) - 1) + [reason]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(ids)


def test_max_tokens_defaults_to_openais_16_and_ends_with_length(engine):
    ids, text, reason = reference(engine, PROMPT_IDS, LEGACY_MAX_TOKENS)
    assert (len(ids), reason) == (16, "length")  # the tiny model draws no end token here: the limit ends it
    out = engine.completions.create(model=engine.model_id, prompt=PROMPT, temperature=0)
    assert out["choices"][0]["text"] == text and out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 16


def test_a_stop_string_cuts_the_text_and_frees_the_blocks(engine):
    _, text, _ = reference(engine, PROMPT_IDS, 16)
    stop = text[3:6]
    assert len(text) > 6 and stop
    out = engine.completions.create(model=engine.model_id, prompt=PROMPT, max_tokens=16, temperature=0, stop=stop)
    assert out["choices"][0] == {"text": text[:text.find(stop)], "index": 0, "logprobs": None,
                                 "finish_reason": "stop"}
    assert engine.llm.stats()["used_blocks"] == 0 and not engine.llm.has_unfinished


def test_n_seeded_samples_repeat(engine):
    body = dict(model=engine.model_id, prompt=PROMPT, max_tokens=6, temperature=0.9, seed=3, n=2)
    out = engine.completions.create(**body)
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert engine.completions.create(**body)["choices"] == out["choices"]


@pytest.mark.parametrize("body,param,words", [
    ({"model": "M"}, "prompt", "prompt is required"),
    ({"model": "M", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}, "messages",
     "Chat Completions field"),
    ({"model": "M", "prompt": 5}, "prompt", "a string or a non-empty list of token ids"),
    ({"model": "M", "prompt": []}, "prompt", "a string or a non-empty list of token ids"),
    ({"model": "M", "prompt": [1, "a"]}, "prompt", "a string or a non-empty list of token ids"),
    ({"model": "M", "prompt": [1, True]}, "prompt", "a string or a non-empty list of token ids"),
    ({"model": "M", "prompt": ["a", "b"]}, "prompt", "holds 2 prompts"),
    ({"model": "M", "prompt": "hi", "echo": True}, "echo", "only false"),
    ({"model": "M", "prompt": "hi", "suffix": "end"}, "suffix", "fill-in-the-middle"),
    ({"model": "M", "prompt": "hi", "best_of": 2}, "best_of", "only 1"),
    ({"model": "M", "prompt": "hi", "best_of": True}, "best_of", "only 1"),
    ({"model": "M", "prompt": "hi", "logprobs": 6}, "logprobs", "between 0 and 5"),
    ({"model": "M", "prompt": "hi", "logprobs": True}, "logprobs", "must be an integer"),
    ({"model": "M", "prompt": "hi", "top_logprobs": 2}, "top_logprobs", "unknown field"),
    ({"model": "M", "prompt": "hi", "max_completion_tokens": 4}, "max_completion_tokens", "has max_tokens"),
    ({"model": "M", "prompt": "hi", "pagedkv": {"session": "s"}}, "pagedkv", "no session"),
    ({"model": "M", "prompt": "hi", "temperature": -1}, "temperature", "between 0 and 2"),
])
def test_bad_legacy_bodies_are_400_naming_the_field(body, param, words):
    with pytest.raises(ApiError) as err:
        parse_request(body, ["M"], legacy=True)
    assert (err.value.status, err.value.param) == (400, param) and words in err.value.message
    assert err.value.body()["error"]["param"] == param


def test_a_chat_body_with_a_prompt_says_where_it_belongs():
    body = {"model": "M", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(ApiError) as err:
        parse_request(body, ["M"])
    assert (err.value.status, err.value.param) == (400, "prompt") and "/v1/completions" in err.value.message


def test_prompts_the_model_cannot_take_are_400(engine):
    cases = [({"prompt": ""}, "adds no BOS token"),  # the tiny vocabulary adds none: nothing to continue
             ({"prompt": [5, 512]}, "token id 512; tiny-random's ids are 0..511"),
             ({"prompt": "word " * 300}, "tokens; tiny-random's context is 256"),
             ({"prompt": PROMPT, "max_tokens": 256}, "max_tokens 256 + the prompt's 4 tokens")]
    for fields, words in cases:
        with pytest.raises(ApiError) as err:
            engine.completions.create(model=engine.model_id, **fields)
        assert err.value.status == 400 and words in err.value.message, err.value.message
        assert err.value.param == ("max_tokens" if "max_tokens" in fields else "prompt")
    assert not engine.llm.has_unfinished
