"""llama.cpp's greedy ids and top-1/top-2 margins on any GGUF (its server from the `xllamacpp` wheel), cached
under .cache/test-gguf/ keyed by the file's sha256, the prompt, the length and the wheel's version; and the
agreement of our ids with them under the near-tie rule."""
from __future__ import annotations

import hashlib
import json
import os
import urllib.request
from importlib.metadata import version
from pathlib import Path

import numpy as np

from gguf_models import CACHE
from llama_server import llama_server
from pagedkv.backends.numpy_ref import NumpyModel, PagedKVCache, greedy_reference
from pagedkv.model.convert import sha256_file
from pagedkv.model_runner import ForwardBatch

# llama.cpp's own batched / incremental paths flip argmaxes below this top-1/top-2 logit margin (the same rule
# as tests/test_numpy_ref.py); a difference of ids is accepted only where llama.cpp's margin is below it.
NEAR_TIE = 0.5


def llama_cpp_greedy(gguf: Path, prompt_ids: list[int], n: int) -> dict:
    """{"output_ids": n greedy ids, "margins": llama.cpp's top-1 minus top-2 logit at each of them, or None}."""
    key = json.dumps({"gguf": sha256_file(gguf), "prompt": prompt_ids, "n": n, "xllamacpp": version("xllamacpp")})
    path = CACHE / f"llama-ref-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if path.is_file():
        return json.loads(path.read_text())
    with llama_server(gguf) as origin:
        answer = _complete(origin, prompt_ids, n)
        ids = answer["tokens"]
        margins = dict(_margins(answer, ids))
    if len(ids) != n:
        raise RuntimeError(f"llama.cpp returned {len(ids)} ids, not {n}")
    # The server leaves out the probabilities of a token that ends inside a UTF-8 character (also when asked for
    # that token alone): its margin stays unknown (None), and the near-tie rule never excuses a difference there.
    ref = {"output_ids": ids, "margins": [margins.get(i) for i in range(n)]}
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # whole or absent for the suite's other lane
    tmp.write_text(json.dumps(ref))
    tmp.replace(path)
    return ref


def _complete(origin: str, prompt_ids: list[int], n: int) -> dict:
    body = {"prompt": prompt_ids, "n_predict": n, "temperature": 0, "n_probs": 2, "cache_prompt": False,
            "ignore_eos": True, "return_tokens": True, "post_sampling_probs": False}
    req = urllib.request.Request(origin + "/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        answer = json.loads(resp.read())
    if answer["tokens_evaluated"] != len(prompt_ids):
        raise RuntimeError(f"llama.cpp evaluated {answer['tokens_evaluated']} prompt tokens, not {len(prompt_ids)}")
    return answer


def _margins(answer: dict, ids: list[int]) -> list[tuple[int, float]]:
    """(position, top-1 minus top-2 logprob) of the ids the answer carries probabilities for, in order."""
    out, pos = [], 0
    for entry in answer["completion_probabilities"]:
        while pos < len(ids) and ids[pos] != entry["id"]:
            pos += 1
        if pos == len(ids):
            raise RuntimeError(f"llama.cpp reported probabilities of id {entry['id']}, which it did not generate")
        top = entry["top_logprobs"]
        out.append((pos, top[0]["logprob"] - top[1]["logprob"]))
        pos += 1
    return out


def first_divergence(ours: list[int], ref: dict) -> dict:
    """{"equal": bool, "position", "ours", "llama_cpp", "margin"} of the first id where ours differs."""
    for pos, (mine, theirs) in enumerate(zip(ours, ref["output_ids"])):
        if mine != theirs:
            return {"equal": False, "position": pos, "ours": mine, "llama_cpp": theirs, "margin": _margin(ref, pos)}
    known = [m for m in (_margin(ref, i) for i in range(len(ours))) if m is not None]
    return {"equal": True, "min_margin": min(known, default=None)}


def _margin(ref: dict, pos: int) -> float | None:
    margin = ref["margins"][pos]
    return None if margin is None else round(margin, 4)


def near_tie(margin: float | None) -> bool:
    """Whether llama.cpp itself could have picked the other id (its margin is known and below NEAR_TIE)."""
    return margin is not None and margin < NEAR_TIE


def forced_differences(rows: list, ref: dict, max_excused: int = 4) -> list[dict]:
    """The positions where our teacher-forced argmax (forced_rows.py's (argmax, margin) rows, after llama.cpp's
    own previous ids) is not llama.cpp's id; AssertionError unless each is a near tie on one side or the other
    (its margin, or ours between the two ids) and there are at most `max_excused` (more would be a bug hiding
    under the rule)."""
    assert len(rows) == len(ref["output_ids"]), (len(rows), ref)
    differ = [{"position": i, "ours": ours, "llama_cpp": theirs, "llama_cpp_margin": ref["margins"][i],
               "our_margin": round(margin, 4)}
              for i, ((ours, margin), theirs) in enumerate(zip(rows, ref["output_ids"])) if ours != theirs]
    assert all(near_tie(d["llama_cpp_margin"]) or near_tie(d["our_margin"]) for d in differ), differ
    assert len(differ) <= max_excused, differ
    return differ


def teacher_forced_logits(model: NumpyModel, prompt_ids: list[int], forced: list[int]) -> np.ndarray:
    """Our logits (len(forced), vocab) at each position of prompt + forced[:-1], prefilled in one batch: what we
    would pick from after llama.cpp's own previous tokens (each position is compared, not just the first
    divergence)."""
    ids = prompt_ids + forced[:-1]
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    blocks = -(-len(ids) // 16)
    kv = PagedKVCache.allocate(model.config, blocks, 16)
    batch = ForwardBatch(i32(ids), i32(range(len(ids))), i32(range(len(ids))), i32([0, len(ids)]),
                         i32([range(blocks)]), i32([len(ids)]))
    return model.forward(batch, kv, all_logits=True)[len(prompt_ids) - 1:]  # (len(forced), vocab)


def teacher_forced_ids(model: NumpyModel, prompt_ids: list[int], forced: list[int]) -> list[int]:
    """Our argmax at each position of prompt + forced[:-1] (teacher_forced_logits)."""
    return teacher_forced_logits(model, prompt_ids, forced).argmax(axis=1).tolist()


def agreement(model: NumpyModel, prompt_ids: list[int], ref: dict) -> dict:
    """Free-running greedy ids vs llama.cpp's (first divergence) and teacher-forced mismatches with margins: its
    top-1/top-2 margin ("margin") and ours between our id and its id ("our_margin")."""
    n = len(ref["output_ids"])
    logits = teacher_forced_logits(model, prompt_ids, ref["output_ids"])
    mismatches = [{"position": i, "ours": int(row.argmax()), "llama_cpp": b, "margin": _margin(ref, i),
                   "our_margin": round(float(row.max() - row[b]), 4)}
                  for i, (row, b) in enumerate(zip(logits, ref["output_ids"])) if int(row.argmax()) != b]
    return {"greedy": first_divergence(greedy_reference(model, prompt_ids, n), ref),
            "teacher_forced_mismatches": mismatches}
