// How a chat's messages look: a message (replies rendered from Markdown), one waiting for the model, and the
// note on a chat another model made.
import { renderMarkdown } from "./markdown.js";
import { $ } from "./page.js";

export function fillMessage(li, m) {
  li.dataset.text = m.text;  // the raw text, for tools and tests
  if (m.role === "assistant") li.innerHTML = renderMarkdown(m.text);  // no raw HTML: see markdown.js
  else li.textContent = m.text;
  if (m.engine) li.dataset.engine = m.engine.kind;
  if (m.engine && m.engine.kind === "remote") {
    const badge = document.createElement("p");
    badge.className = "engine-badge";
    badge.textContent = `served remotely by ${m.engine.model} @ ${m.engine.origin}`;
    if (m.engine.reason) badge.title = `Why: ${m.engine.reason}`;
    li.append(badge);
  }
}

export function messageElement(m) {
  const li = document.createElement("li");
  li.className = `msg ${m.role}` + (m.interrupted ? " interrupted" : "");
  fillMessage(li, m);
  return li;
}

export function queuedElement(text) {
  const li = document.createElement("li");
  li.className = "msg user pending";
  li.dataset.text = text;
  li.textContent = text;
  return li;
}

export function renderForeignNote(foreign, modelInfo) {
  const note = $("chat-note");
  note.hidden = !foreign;
  if (!foreign) return;
  const params = new URLSearchParams(location.search);
  params.set("model", foreign.model);
  const link = document.createElement("a");
  link.href = `?${params}`;
  link.textContent = `Open the page with ${foreign.model}`;
  note.replaceChildren(`This chat was made with ${foreign.model}; this page runs ${modelInfo.model}, whose ` +
    "tokens differ, so it is read-only here. ", link, " to go on with it.");
}
