// Two models in one engine, one GPU budget and one KV pool: ?writer= and ?reviewer= (model ids; the same id
// for both roles loads it once), ?backend= and ?budget_mib= as the chat page takes them.
import { createEngine } from "../pagedkv.js";

const q = new URLSearchParams(location.search);
const writer = q.get("writer") ?? "smollm2-135m-instruct";
const reviewer = q.get("reviewer") ?? writer;
const $ = (id) => document.getElementById(id);
const engine = await createEngine({
  models: [...new Set([writer, reviewer])], backend: q.get("backend") ?? undefined,
  budgetMiB: q.get("budget_mib") ?? undefined,
  onProgress: (p) => { $("status").textContent = p.text; },
});
$("status").textContent = `writer ${writer} and reviewer ${reviewer} are ready`;
window.engine = engine;  // for tools and tests
document.documentElement.dataset.engine = "ready";

async function stream(model, content, out, maxTokens) {
  const chunks = await engine.chat.completions.create({
    model, stream: true, max_tokens: maxTokens, temperature: 0, messages: [{ role: "user", content }] });
  for await (const chunk of chunks) out.textContent += chunk.choices[0]?.delta.content ?? "";
}

const critique = () => stream(reviewer, `Critique this draft in two sentences:\n${$("draft").textContent}`,
                              $("review"), 64);

$("go").addEventListener("submit", async (event) => {
  event.preventDefault();
  delete document.documentElement.dataset.done;
  $("draft").textContent = $("review").textContent = "";
  let review = null;  // the reviewer starts on the draft's first words while the writer goes on
  const draft = stream(writer, `Write a short paragraph about ${$("topic").value}.`, $("draft"), 96);
  const early = setInterval(() => {
    if (review === null && $("draft").textContent.split(/\s+/).length > 8) review = critique();
  }, 20);
  await draft;
  clearInterval(early);
  await (review ?? critique());
  document.documentElement.dataset.done = "1";
});
