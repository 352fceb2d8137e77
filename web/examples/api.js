// The smallest client of /pagedkv.js: ?model= (default SmolLM2-135M) and ?backend= as the chat page takes them.
import { createEngine } from "../pagedkv.js";

const params = new URLSearchParams(location.search);
const status = document.getElementById("status");
const engine = await createEngine({
  model: params.get("model") ?? undefined,
  backend: params.get("backend") ?? undefined,
  onProgress: (p) => { status.textContent = p.text; },
});
status.textContent = `${engine.model} is ready`;
window.engine = engine;  // for tools and tests
document.documentElement.dataset.engine = "ready";

document.getElementById("ask").addEventListener("submit", async (event) => {
  event.preventDefault();
  const answer = document.getElementById("answer");
  answer.textContent = "";
  const stream = await engine.chat.completions.create({
    model: engine.model, stream: true, max_tokens: 64,
    messages: [{ role: "user", content: document.getElementById("question").value }],
  });
  for await (const chunk of stream) answer.textContent += chunk.choices[0]?.delta.content ?? "";
});
