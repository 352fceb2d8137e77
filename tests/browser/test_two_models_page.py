"""Two models in one engine in the tab (web/examples/two-models.html on the CPU path: tiny-random writes,
tiny-random-wide, 4x its KV width, reviews while the draft streams): both stream at once from one budget and
one pool of pages; the writer's greedy draft is the one it writes alone; stats() shows the pool and each
model's pages; unload ends the reviewer and gives its pages back; the chat page's model stays."""
from __future__ import annotations

PAGE = "/examples/two-models.html?writer=tiny-random&reviewer=tiny-random-wide&backend=cpu&budget_mib=16"


def opened(browser, url: str, openai: bool = False):
    """A page of the example at `url` whose engine is ready; with openai, /vendor/openai/ served to it."""
    from test_api_page import serve_openai

    page = browser.new_page()
    try:
        if openai:
            page.route("**/vendor/openai/**", serve_openai)
        page.goto(url)
        page.wait_for_selector("html[data-engine=ready]", state="attached", timeout=240_000)
    except BaseException:
        page.close()
        raise
    return page

AFTER = """async () => {
  const e = window.engine;
  const draft = document.getElementById("draft").textContent;
  const topic = document.getElementById("topic").value;
  const alone = await e.chat.completions.create({ model: "tiny-random", max_tokens: 96, temperature: 0,
      messages: [{ role: "user", content: `Write a short paragraph about ${topic}.` }] });
  const order = [];  // which model each chunk came from, two requests started together
  const run = async (model) => {
    for await (const c of await e.chat.completions.create({ model, stream: true, max_tokens: 24, temperature: 0,
        messages: [{ role: "user", content: "count to ten" }] })) order.push(model);
  };
  await Promise.all([run("tiny-random"), run("tiny-random-wide")]);
  const stats = await e.stats();
  const listed = (await e.models.list()).data.map((m) => m.id);
  await e.unload("tiny-random-wide");
  const after = await e.stats();
  const listedAfter = (await e.models.list()).data.map((m) => m.id);
  const errors = [];
  for (const [what, fn] of [["gone", () => e.chat.completions.create({ model: "tiny-random-wide",
                                                                       messages: [{ role: "user", content: "hi" }] })],
                            ["first", () => e.unload("tiny-random")]]) {
    try { await fn(); errors.push([what, 0]); } catch (err) { errors.push([what, err.status]); }
  }
  const loads = [];
  for (const model of ["nope", "tiny-random"]) {
    try { await e.load(model); loads.push([model, 0]); } catch (err) { loads.push([model, err.status]); }
  }
  const reviewerAgain = {};  // loaded again at run time: its weights take pages of the budget again
  await e.load("tiny-random-wide");
  const again = await e.chat.completions.create({ model: "tiny-random-wide", max_tokens: 4, temperature: 0,
                                                   messages: [{ role: "user", content: "hi" }] });
  reviewerAgain.finish = again.choices[0].finish_reason;
  reviewerAgain.pool = (await e.stats()).pool;
  reviewerAgain.listed = (await e.models.list()).data.map((m) => m.id);
  return { draft, review: document.getElementById("review").textContent, loads, reviewerAgain,
           alone: alone.choices[0].message.content, stats, listed, after, order,
           listedAfter, errors };
}"""


def test_two_models_stream_at_once_from_one_pool(browser, base_url):
    page = opened(browser, base_url + PAGE)
    try:
        page.click("#go button")
        page.wait_for_selector("html[data-done='1']", state="attached", timeout=240_000)
        got = page.evaluate(AFTER)
        assert got["draft"] and got["review"]
        assert got["draft"] == got["alone"]  # the reviewer's traffic does not change the writer's greedy text
        assert got["listed"] == ["tiny-random", "tiny-random-wide"]
        order = got["order"]  # interleaved: each model streamed before the other's last chunk
        assert order.index("tiny-random-wide") < len(order) - 1 - order[::-1].index("tiny-random")
        assert order.index("tiny-random") < len(order) - 1 - order[::-1].index("tiny-random-wide")
        stats, pool = got["stats"], got["stats"]["pool"]
        assert stats["tiny-random"]["steps"] > 0 and stats["tiny-random-wide"]["steps"] > 0
        assert (pool["models"]["tiny-random"]["block_size"], pool["models"]["tiny-random-wide"]["block_size"]) == (64, 16)
        wide_weights = pool["models"]["tiny-random-wide"]["weights_pages"]
        assert pool["reserved_pages"] == pool["models"]["tiny-random"]["weights_pages"] + wide_weights
        assert stats["tiny-random"]["used_blocks"] == 0 and stats["tiny-random"]["running"] == 0
        assert got["after"]["pool"]["reserved_pages"] == pool["reserved_pages"] - wide_weights
        assert list(got["after"]["pool"]["models"]) == got["listedAfter"] == ["tiny-random"]
        assert got["errors"] == [["gone", 404], ["first", 400]]
        assert got["loads"] == [["nope", 404], ["tiny-random", 400]]
        again = got["reviewerAgain"]
        assert again["listed"] == ["tiny-random", "tiny-random-wide"] and again["finish"] in ("stop", "length")
        assert again["pool"]["reserved_pages"] == pool["reserved_pages"]  # its weights' pages, taken again
    finally:
        page.close()


WEBGPU_AFTER = """async () => {
  const e = window.engine;
  const topic = document.getElementById("topic").value;
  const alone = await e.chat.completions.create({ model: "tiny-random", max_tokens: 96, temperature: 0,
      messages: [{ role: "user", content: `Write a short paragraph about ${topic}.` }] });
  const stats = await e.stats();
  await e.unload("tiny-random-wide");
  const after = await e.stats();
  const loads = [];
  for (const model of ["nope", "tiny-random-wide"]) {
    try { await e.load(model); loads.push([model, 0]); } catch (err) { loads.push([model, err.status]); }
  }
  const again = await e.chat.completions.create({ model: "tiny-random-wide", max_tokens: 4, temperature: 0,
                                                   messages: [{ role: "user", content: "hi" }] });
  return { draft: document.getElementById("draft").textContent, review: document.getElementById("review").textContent,
           alone: alone.choices[0].message.content, info: e.info, stats, after, loads,
           again: again.choices[0].finish_reason, listed: (await e.models.list()).data.map((m) => m.id) };
}"""


def test_two_models_on_webgpu_share_one_page_buffer(browser, base_url):
    """The same example on the WebGPU backend (SwiftShader): one ledger, one buffer of pages both models' KV
    views (the wide model 16 tokens a page, the narrow one 64); the writer's greedy draft is its text alone;
    unloading the reviewer frees its GPU buffers, and loading it again at run time takes them back."""
    page = opened(browser, base_url + PAGE.replace("backend=cpu", "backend=webgpu"))
    try:
        page.click("#go button")
        page.wait_for_selector("html[data-done='1']", state="attached", timeout=240_000)
        got = page.evaluate(WEBGPU_AFTER)
        assert got["info"]["backend"] == "webgpu" and got["info"]["page_bytes"] > 0
        assert got["draft"] and got["review"] and got["draft"] == got["alone"]
        pool = got["stats"]["pool"]
        assert (pool["models"]["tiny-random"]["block_size"], pool["models"]["tiny-random-wide"]["block_size"]) == (64, 16)
        assert pool["reserved_pages"] == 0 and pool["pages"] == got["info"]["num_blocks"] >= 2
        assert got["stats"]["tiny-random-wide"]["steps"] > 0
        assert list(got["after"]["pool"]["models"]) == ["tiny-random"]
        assert got["loads"] == [["nope", 404], ["tiny-random-wide", 0]] and got["again"] in ("stop", "length")
        assert got["listed"] == ["tiny-random", "tiny-random-wide"]
    finally:
        page.close()


OFFICIAL_TWO = """async () => {
  const { OpenAI } = await import("/vendor/openai/client.mjs");
  const e = window.engine;
  const client = new OpenAI({ baseURL: location.origin + "/v1", apiKey: "unused", fetch: e.fetch,
                              dangerouslyAllowBrowser: true, maxRetries: 0 });
  const ask = (model) => ({ model, messages: [{ role: "user", content: "hello there" }], max_tokens: 24,
                            temperature: 0 });
  const alone = (await client.chat.completions.create(ask("tiny-random"))).choices[0].message.content;
  const streamed = async (model) => {
    let text = "";
    for await (const c of await client.chat.completions.create({ ...ask(model), stream: true })) {
      text += c.choices[0]?.delta?.content ?? "";
    }
    return text;
  };
  const [writer, reviewer] = await Promise.all([streamed("tiny-random"), streamed("tiny-random-wide")]);
  let tooLong = null;
  try {
    await client.chat.completions.create({ ...ask("tiny-random-wide"), max_tokens: 100000 });
  } catch (err) { tooLong = { name: err.constructor.name, status: err.status, param: err.param ?? null }; }
  return { ids: (await client.models.list()).data.map((m) => m.id), alone, writer, reviewer, tooLong };
}"""


def test_the_official_openai_client_streams_two_models_at_once(browser, base_url):
    from test_api_page import OPENAI

    assert (OPENAI / "client.mjs").is_file(), "npm ci installs the openai devDependency"
    page = opened(browser, base_url + PAGE, openai=True)
    try:
        got = page.evaluate(OFFICIAL_TWO)
        assert got["ids"] == ["tiny-random", "tiny-random-wide"]
        assert got["writer"] == got["alone"] and got["reviewer"]  # unchanged by the other model's stream
        assert got["tooLong"] == {"name": "BadRequestError", "status": 400, "param": "max_tokens"}
    finally:
        page.close()


SMOLLM2 = "smollm2-135m-instruct"
REAL_PAIR = f"/examples/two-models.html?writer={SMOLLM2}&reviewer=tiny-random&backend=cpu&budget_mib=1024"
OFFICIAL_REAL = """async () => {
  const { OpenAI } = await import("/vendor/openai/client.mjs");
  const client = new OpenAI({ baseURL: location.origin + "/v1", apiKey: "unused", fetch: window.engine.fetch,
                              dangerouslyAllowBrowser: true, maxRetries: 0 });
  const ask = (model, extra = {}) => ({ model, max_tokens: 24, temperature: 0, ...extra,
      messages: [{ role: "user", content: "Explain what a hash table is in two sentences." }] });
  const alone = (await client.chat.completions.create(ask("smollm2-135m-instruct"))).choices[0].message.content;
  const streamed = async (model) => {
    let text = "";
    for await (const c of await client.chat.completions.create({ ...ask(model), stream: true })) {
      text += c.choices[0]?.delta?.content ?? "";
    }
    return text;
  };
  const [smol, tiny] = await Promise.all([streamed("smollm2-135m-instruct"), streamed("tiny-random")]);
  const words = alone.split(" ");
  const stop = " " + words[Math.floor(words.length / 2)];  // a word from the middle of the reply
  const cut = await client.chat.completions.create(ask("smollm2-135m-instruct", { stop: [stop] }));
  let cutStreamed = "";
  for await (const c of await client.chat.completions.create({ ...ask("smollm2-135m-instruct", { stop }),
                                                               stream: true })) {
    cutStreamed += c.choices[0]?.delta?.content ?? "";
  }
  return { alone, smol, tiny, stop, cut: cut.choices[0].message.content, reason: cut.choices[0].finish_reason,
           cutStreamed };
}"""


def test_smollm2_beside_another_model_through_the_official_client(browser, base_url):
    """The real model and a second one in one engine (CPU path) through the official openai client: SmolLM2's
    greedy reply is the same alone and while the other model streams; a stop string from the middle of it cuts
    the reply right before its first occurrence (finish_reason "stop"), streamed and not."""
    page = opened(browser, base_url + REAL_PAIR, openai=True)
    try:
        got = page.evaluate(OFFICIAL_REAL)
        assert got["alone"].startswith("A hash table") and got["smol"] == got["alone"] and got["tiny"]
        assert len(got["stop"]) > 1 and got["reason"] == "stop"
        assert got["cut"] == got["cutStreamed"] == got["alone"][: got["alone"].index(got["stop"])]
    finally:
        page.close()
