// "Show 3 alternatives": the worker samples 3 replies to the last user message as one request (n = 3
// parallel samples sharing the prompt's KV blocks). They stream side by side under the messages; "Keep this
// one" makes one the reply (the worker rewrites the token history to end with its exact ids). The current
// reply stays until then.
import { renderMarkdown } from "./markdown.js";
import { $, root } from "./page.js";
import { requestSettings } from "./settings.js";
import { ui } from "./state.js";

export function renderAlternatives() {
  const panel = $("alternatives-panel");
  const alt = ui.alternatives[ui.current];
  panel.hidden = !alt;
  if (!alt) return;
  panel.replaceChildren(...alt.texts.map((text, i) => {
    const section = document.createElement("section");
    section.className = "alternative";
    section.dataset.index = String(i);
    section.dataset.text = text;
    const body = document.createElement("div");
    body.innerHTML = renderMarkdown(text);  // no raw HTML: see markdown.js
    const keep = document.createElement("button");
    keep.type = "button";
    keep.className = "keep-alternative";
    keep.textContent = `Keep alternative ${i + 1}`;
    keep.disabled = alt.state === "streaming";
    keep.addEventListener("click", () =>
      ui.engine.chats.keepAlternative(ui.current, i));
    section.append(body, keep);
    return section;
  }));
}

// The worker's alt-* messages; the caller re-renders the chat after each.
export function onAltStart(msg) {
  ui.alternatives[msg.chat] = { texts: Array(msg.n).fill(""), state: "streaming" };
  ui.busy[msg.chat] = true;
}

export function onAltToken(msg) {
  ui.alternatives[msg.chat].texts[msg.index] += msg.text;
}

export function onAltEnd(msg) {
  Object.assign(ui.alternatives[msg.chat], { texts: msg.alternatives, state: msg.reason });
  ui.busy[msg.chat] = false;
  root.dataset.alternatives = JSON.stringify({ chat: msg.chat, ...msg });
}

export function onAltKept(msg) {
  const list = ui.messages[msg.chat] || [];
  if (list.length) list[list.length - 1].text = msg.content;
  delete ui.alternatives[msg.chat];
  root.dataset.altKept = JSON.stringify(msg);
}

export function wireAlternatives() {
  const button = document.createElement("button");
  button.id = "alternatives";
  button.type = "button";
  button.disabled = true;
  button.textContent = "Show 3 alternatives";
  button.addEventListener("click", () => {
    if (!button.disabled) {
      ui.engine.chats.alternatives(ui.current, requestSettings(), 3);
    }
  });
  $("regenerate").after(button);
  const panel = document.createElement("div");
  panel.id = "alternatives-panel";
  panel.className = "alternatives";
  panel.hidden = true;
  $("messages").after(panel);
}
