"""createEngine with a GGUF File beside a built-in model (pagedkv.js, CPU path): the worker converts and stores
the file as the page's "Open GGUF" does, names it gguf:<file name>, and loads both into one engine and one
budget; the file's greedy reply is the CPython reference's on the same file (f32 activations, as the reference
computes). A malformed file rejects createEngine with the reader's error."""
from __future__ import annotations

from test_gguf_page import FILE_NAME, MAX_TOKENS, PROMPT, reference, tiny_gguf  # noqa: F401  (fixtures)

from pagedkv.tokenizer import Tokenizer


def reply_text(reference: dict) -> str:  # noqa: F811
    """The CPython reference's greedy reply on the same file, as the API returns it (no end token)."""
    tokenizer = Tokenizer.from_manifest(reference["manifest"])
    stops = tokenizer.eog_ids | {tokenizer.eos_token_id, tokenizer.find_token("<|im_end|>")}
    return tokenizer.decode([t for t in reference["reply"] if t not in stops])


CREATE = """async ([name, bytes, max_tokens, prompt]) => {
  const { createEngine } = await import("/pagedkv.js");
  const stages = new Set();
  let e;
  try {
    e = await createEngine({ models: [new File([new Uint8Array(bytes)], name), "tiny-random"], backend: "cpu",
                             budgetMiB: 32, params: { activations: "f32" }, onProgress: (p) => stages.add(p.stage) });
  } catch (err) {
    return { error: String(err.message || err) };
  }
  const ask = (model) => e.chat.completions.create({ model, max_tokens, temperature: 0,
                                                     messages: [{ role: "user", content: prompt }] });
  const [file, tiny] = await Promise.all([ask(e.model), ask("tiny-random")]);
  return { model: e.model, listed: (await e.models.list()).data.map((m) => m.id), stages: [...stages],
           text: file.choices[0].message.content, tiny: tiny.choices[0].finish_reason,
           pool: (await e.stats()).pool };
}"""


def test_a_gguf_file_beside_a_built_in_model(browser, base_url, tiny_gguf, reference):  # noqa: F811
    want = reply_text(reference)
    page = browser.new_page()
    try:
        page.goto(base_url + "/examples/api.html?model=tiny-random&backend=cpu")
        got = page.evaluate(CREATE, [FILE_NAME, list(tiny_gguf.read_bytes()), MAX_TOKENS, PROMPT])
        assert "error" not in got, got
        assert got["model"] == f"gguf:{FILE_NAME}" and got["listed"] == [f"gguf:{FILE_NAME}", "tiny-random"]
        assert {"gguf-convert", "gguf-store"} <= set(got["stages"])
        assert got["text"] == want
        assert got["tiny"] in ("stop", "length") and got["pool"]["reserved_pages"] > 0
        bad = page.evaluate(CREATE, ["broken.gguf", list(b"GGUF" + bytes(60)), MAX_TOKENS, PROMPT])
        assert "error" in bad and "broken.gguf" in bad["error"], bad
    finally:
        page.close()
