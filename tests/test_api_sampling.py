"""OpenAI's sampling controls and log-probs through pagedkv.api.Engine (tiny model, CPU backend): presence and
frequency penalties and logit_bias give the ids of a numpy oracle that applies OpenAI's rule to the reference
forward's logits; top_k / min_p draw what the engine's own sampler draws; logprobs (chat and legacy shapes, streamed
and not) are log_softmax of the reference logits, best first; neutral values change nothing; bad values are 400s
naming the field."""
from __future__ import annotations

import numpy as np
import pytest

from model_fixtures import tiny_dir, tiny_model, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.api import ApiError, Engine
from pagedkv.backends.numpy_ref import PagedKVCache
from pagedkv.completions import parse_request
from pagedkv.engine import run_sync
from pagedkv.model_runner import ForwardBatch
from pagedkv.sampling import SamplingParams
from pagedkv.slices import run_slices

PROMPT_IDS = [119, 260, 272, 316]  # "the cat" in the tiny vocabulary (test_api_legacy.py)


@pytest.fixture(scope="module")
def engine(tiny_dir):
    return Engine([tiny_dir], budget_mib=64)


def oracle(model, prompt: list[int], n: int, adjust=lambda row, out: row) -> tuple[list[int], list[np.ndarray]]:
    """Greedy ids of one sequence on the reference forward, each row's logits first passed through
    adjust(row f64, output ids so far); returns the ids and the raw rows (vocab,) they came from."""
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    blocks = -(-(len(prompt) + n) // 16)
    kv = PagedKVCache.allocate(model.config, blocks, 16)
    table = i32([np.arange(blocks)])
    batch = ForwardBatch(i32(prompt), i32(range(len(prompt))), i32(range(len(prompt))), i32([0, len(prompt)]),
                         table, i32([len(prompt)]))
    out, rows = [], []
    for _ in range(n):
        row = model.forward(batch, kv)[0]
        rows.append(row)
        out.append(int(np.argmax(adjust(row.astype(np.float64), out))))
        p = len(prompt) + len(out) - 1
        batch = ForwardBatch(i32([out[-1]]), i32([p]), i32([p]), i32([0, 1]), table, i32([p + 1]))
    return out, rows


def openai_rule(bias: dict[int, float], presence: float, frequency: float):
    """OpenAI's penalties written out: logit[t] += bias[t] - presence * (count[t] > 0) - frequency * count[t]."""
    def adjust(row, out):
        row = row.copy()
        for t, b in bias.items():
            row[t] += b
        for t in set(out):
            row[t] -= presence + frequency * out.count(t)
        return row
    return adjust


def until_stop(engine, ids: list[int]) -> list[int]:
    """`ids` up to and with the first end-of-generation id (where the engine stops)."""
    stops = engine.llm.default_stop_ids
    end = next((i for i, t in enumerate(ids) if t in stops), len(ids) - 1)
    return ids[:end + 1]


def text_of(engine, ids: list[int]) -> str:
    return engine.services[engine.model_id].tokenizer.decode([t for t in ids if t not in engine.llm.default_stop_ids])


def test_penalties_and_bias_give_the_oracles_ids(engine, tiny_model):
    plain, _ = oracle(tiny_model, PROMPT_IDS, 16)
    rule = openai_rule({5: 3.0, 59: -100.0}, 1.5, 0.7)
    want = until_stop(engine, oracle(tiny_model, PROMPT_IDS, 16, rule)[0])
    assert plain[:4] == [254, 59, 59, 59] and want != until_stop(engine, plain)  # the penalties matter here
    out = engine.completions.create(model=engine.model_id, prompt=PROMPT_IDS, max_tokens=16, temperature=0,
                                    presence_penalty=1.5, frequency_penalty=0.7, logit_bias={"5": 3.0, "59": -100})
    assert out["choices"][0]["text"] == text_of(engine, want)
    assert out["usage"]["completion_tokens"] == len(want)
    # negative penalties encourage repeats: the oracle's ids again, the chat endpoint's too
    rule = openai_rule({}, -1.0, -0.5)
    want = until_stop(engine, oracle(tiny_model, PROMPT_IDS, 10, rule)[0])
    out = engine.completions.create(model=engine.model_id, prompt=PROMPT_IDS, max_tokens=10, temperature=0,
                                    presence_penalty=-1.0, frequency_penalty=-0.5)
    assert out["choices"][0]["text"] == text_of(engine, want)


def test_top_k_and_min_p_draw_what_the_engines_sampler_draws(engine):
    body = dict(model=engine.model_id, prompt=PROMPT_IDS, max_tokens=12, temperature=1.3, seed=11)
    texts = {}
    for extra, params in (({"top_k": 3}, {"top_k": 3}), ({"min_p": 0.6}, {"min_p": 0.6}),
                          ({"top_k": -1, "min_p": 0.0}, {}), ({"top_k": 0}, {})):
        want = run_sync(engine.llm.generate(list(PROMPT_IDS), SamplingParams(
            temperature=1.3, seed=11, max_tokens=12, **params))).output_ids
        texts[str(extra)] = engine.completions.create(**body, **extra)["choices"][0]["text"]
        assert texts[str(extra)] == text_of(engine, want), extra
    free = engine.completions.create(**body)["choices"][0]["text"]
    assert free == texts[str({"top_k": 0})] != texts[str({"top_k": 3})] != texts[str({"min_p": 0.6})]
    greedy = engine.completions.create(**dict(body, temperature=0))["choices"][0]["text"]
    assert engine.completions.create(**body, top_k=1)["choices"][0]["text"] == greedy  # top_k 1: the argmax
    assert engine.completions.create(**body, min_p=1.0)["choices"][0]["text"] == greedy  # only the best passes


def rounded(entry: dict) -> dict:
    """A chat logprobs entry with its values to 4 decimals (a cached prefix computes its rows apart by ~1e-7)."""
    top = {"top_logprobs": [rounded(t) for t in entry["top_logprobs"]]} if "top_logprobs" in entry else {}
    return dict(entry, logprob=round(entry["logprob"], 4), **top)


def test_chat_logprobs_are_log_softmax_of_the_reference_logits(engine, tiny_model):
    service = engine.services[engine.model_id]
    tokenizer = service.tokenizer
    messages = [{"role": "user", "content": "the cat"}]
    body = dict(model=engine.model_id, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5)
    out = engine.chat.completions.create(**body)
    logprobs = out["choices"][0]["logprobs"]
    assert logprobs["refusal"] is None and set(out["choices"][0]) == {"index", "message", "logprobs", "finish_reason"}
    prompt = parse_request(body, [engine.model_id])
    ids, rows = oracle(tiny_model, run_slices(service._conversation(prompt)).prompt_ids(), 8)
    ids = until_stop(engine, ids)
    assert len(logprobs["content"]) == len(ids) == out["usage"]["completion_tokens"]
    for entry, token, row in zip(logprobs["content"], ids, rows):
        want = row.astype(np.float64) - np.log(np.exp(row.astype(np.float64) - row.max()).sum()) - row.max()
        best = np.argsort(-want, kind="stable")[:5]
        raw = tokenizer.token_bytes(token)
        assert entry["bytes"] == list(raw) and entry["token"] == raw.decode("utf-8", errors="replace")
        assert entry["logprob"] == pytest.approx(want[token], abs=1e-4)
        assert [t["bytes"] for t in entry["top_logprobs"]] == [list(tokenizer.token_bytes(t)) for t in best]
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx(want[best].tolist(), abs=1e-4)
        tops = [t["logprob"] for t in entry["top_logprobs"]]
        assert tops == sorted(tops, reverse=True) and entry["top_logprobs"][0]["bytes"] == entry["bytes"]  # greedy
    # streamed: each chunk carries its tokens' entries; together the same as the completion's
    chunks = list(engine.chat.completions.create(**body, stream=True))
    streamed = [e for c in chunks for ch in c["choices"] if ch["logprobs"] for e in ch["logprobs"]["content"]]
    assert [rounded(e) for e in streamed] == [rounded(e) for e in logprobs["content"]]  # the prompt now cached
    assert chunks[0]["choices"][0]["logprobs"] is None  # the role chunk holds no token
    # logprobs without top_logprobs: each token's own, no alternatives
    bare = engine.chat.completions.create(**dict(body, top_logprobs=None))["choices"][0]["logprobs"]["content"]
    assert [rounded(e) for e in bare] == [rounded(dict(e, top_logprobs=[])) for e in logprobs["content"]]


def test_legacy_logprobs_list_tokens_offsets_and_top_dicts(engine, tiny_model):
    tokenizer = engine.services[engine.model_id].tokenizer
    out = engine.completions.create(model=engine.model_id, prompt=PROMPT_IDS, max_tokens=6, temperature=0,
                                    logprobs=3)
    ids, rows = oracle(tiny_model, PROMPT_IDS, 6)
    lp = out["choices"][0]["logprobs"]
    pieces = [tokenizer.token_bytes(t).decode("utf-8", errors="replace") for t in ids]
    assert lp["tokens"] == pieces
    assert lp["text_offset"] == [sum(map(len, pieces[:i])) for i in range(len(pieces))]
    for token, logprob, top, row in zip(ids, lp["token_logprobs"], lp["top_logprobs"], rows):
        want = row.astype(np.float64) - row.max()
        want -= np.log(np.exp(want).sum())
        assert logprob == pytest.approx(want[token], abs=1e-4)
        best = np.argsort(-want, kind="stable")[:3]
        names = [tokenizer.token_bytes(t).decode("utf-8", errors="replace") for t in best]
        assert top == pytest.approx({n: float(want[t]) for n, t in reversed(list(zip(names, best)))}, abs=1e-4)
    chunks = list(engine.completions.create(model=engine.model_id, prompt=PROMPT_IDS, max_tokens=6, temperature=0,
                                            logprobs=3, stream=True))
    assert [t for c in chunks for ch in c["choices"] if ch["logprobs"] for t in ch["logprobs"]["text_offset"]] \
        == lp["text_offset"]


def test_neutral_values_change_nothing(engine):
    base = dict(model=engine.model_id, messages=[{"role": "user", "content": "the cat"}], max_tokens=8,
                temperature=0)
    plain = engine.chat.completions.create(**base)["choices"][0]
    neutral = engine.chat.completions.create(**base, presence_penalty=0, frequency_penalty=0.0, logit_bias={},
                                             logprobs=False, top_k=0, min_p=0)["choices"][0]
    assert neutral == plain and plain["logprobs"] is None


def test_a_bias_outside_the_vocabulary_is_400(engine):
    with pytest.raises(ApiError) as err:
        engine.chat.completions.create(model=engine.model_id, messages=[{"role": "user", "content": "hi"}],
                                       logit_bias={"512": 1})
    assert (err.value.status, err.value.param) == (400, "logit_bias") and "0..511" in err.value.message
    assert not engine.llm.has_unfinished


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("extra,param,words", [
    ({"presence_penalty": 2.5}, "presence_penalty", "between -2 and 2"),
    ({"frequency_penalty": -3}, "frequency_penalty", "between -2 and 2"),
    ({"frequency_penalty": "0.5"}, "frequency_penalty", "must be a number"),
    ({"logit_bias": [1, 2]}, "logit_bias", "an object mapping token ids"),
    ({"logit_bias": {"dog": 1}}, "logit_bias", "keys must be token ids"),
    ({"logit_bias": {"-4": 1}}, "logit_bias", "keys must be token ids"),
    ({"logit_bias": {"4": 101}}, "logit_bias", "between -100 and 100"),
    ({"logit_bias": {"4": True}}, "logit_bias", "between -100 and 100"),
    ({"logit_bias": {"4": 1, 4: 2}}, "logit_bias", "names token 4 twice"),
    ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias", "at most 300"),
    ({"top_k": -2}, "top_k", "at least -1"),
    ({"top_k": 2.5}, "top_k", "must be an integer"),
    ({"min_p": 1.5}, "min_p", "between 0 and 1"),
    ({"logprobs": 3}, "logprobs", "true or false"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "between 0 and 20"),
    ({"top_logprobs": 2}, "top_logprobs", "only allowed with logprobs: true"),
    ({"logprobs": False, "top_logprobs": 0}, "top_logprobs", "only allowed with logprobs: true"),
])
def test_bad_sampling_controls_are_400_naming_the_field(extra, param, words):
    with pytest.raises(ApiError) as err:
        parse_request({"model": "M", "messages": HI, **extra}, ["M"])
    assert (err.value.status, err.value.param) == (400, param) and words in err.value.message
