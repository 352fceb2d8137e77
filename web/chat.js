// The chat: the conversation list, the composer, the streaming view of replies, and their persistence.
import { renderAlternatives, wireAlternatives } from "./alternatives.js";
import { chatColor, renderMemory } from "./block_map.js";
import { renderMarkdown } from "./markdown.js";
import { $, root } from "./page.js";
import { readSettingsForm, requestSettings, showChatSettings, wireFallbackSettings, wireGenerationSettings,
         wireMemorySettings } from "./settings.js";
import { ui } from "./state.js";
import * as store from "./store.js";

let saveTimer = null;  // the next save of the replies streaming now

function persist(id) {
  store.saveChat(id, { messages: ui.messages[id] || [], partialIds: ui.partialIds[id] || [],
                       settings: ui.settings[id] });
}

function saveStreamingSoon() {
  if (saveTimer) return;
  saveTimer = setTimeout(() => {
    saveTimer = null;
    for (const id of Object.keys(ui.partialIds)) if (ui.busy[id]) persist(id);
  }, 300);
}

async function restoreChats() {
  await store.openStore();
  const records = await store.loadRecords();
  for (const rec of records) {
    const msgs = rec.messages || [];
    if (rec.partial_ids && rec.partial_ids.length && msgs.length) msgs[msgs.length - 1].interrupted = true;
    ui.messages[rec.id] = msgs;
    if (rec.settings) ui.settings[rec.id] = rec.settings;
  }
  ui.worker.postMessage({ type: "restore", chats: records.map((r) => ({ id: r.id, title: r.title,
    checkpoint: r.checkpoint, before_reply: r.before_reply, partial_ids: r.partial_ids || [] })) });
  root.dataset.restored = String(records.length);
}

function renderChats() {
  const ul = $("chat-list");
  ul.replaceChildren();
  for (const c of ui.list) {
    const li = document.createElement("li");
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = c.title;
    b.dataset.chat = c.id;
    b.style.borderLeft = `4px solid ${chatColor(c.id)}`;
    if (ui.busy[c.id]) b.classList.add("busy");
    b.setAttribute("aria-current", String(c.id === ui.current));
    b.addEventListener("click", () => selectChat(c.id));
    li.append(b);
    ul.append(li);
  }
  const cur = ui.list.find((c) => c.id === ui.current);
  $("chat-title").textContent = cur ? cur.title : "No chat";
}

function fillMessage(li, m) {
  li.dataset.text = m.text;  // the raw text, for tools and tests
  if (m.role === "assistant") li.innerHTML = renderMarkdown(m.text);  // escaped first: see renderMarkdown
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

function messageElement(m) {
  const li = document.createElement("li");
  li.className = `msg ${m.role}` + (m.interrupted ? " interrupted" : "");
  fillMessage(li, m);
  return li;
}

function renderMessages() {
  const msgs = ui.messages[ui.current] || [];
  $("messages").replaceChildren(...msgs.map(messageElement));
  const busy = !!ui.busy[ui.current];
  $("stop").disabled = !busy;
  $("send").disabled = busy;
  $("regenerate").disabled = busy || !msgs.length || msgs[msgs.length - 1].role !== "assistant";
  $("alternatives").disabled = $("regenerate").disabled;
  renderAlternatives();
  root.dataset.generating = busy ? "true" : "false";
}

/** Re-render after a change to chat `id` (the list always; the messages when it is in view). */
export function refresh(id) {
  renderChats();
  if (id === ui.current) renderMessages();
}

function selectChat(id) {
  ui.current = id;
  root.dataset.chat = id;
  if (id) showChatSettings(id);
  renderChats();
  renderMessages();
  $("prompt").focus();
}

function send() {
  const text = $("prompt").value;
  if (!text.trim() || !ui.current || ui.busy[ui.current]) return;
  ui.pending[ui.current] = text;
  ui.worker.postMessage({ type: "send", chat: ui.current, text, settings: requestSettings() });
  $("prompt").value = "";
}

// ------------------------------------------------------------------ the worker's chat messages

export function onModelProgress(msg) {
  $("model-loading").hidden = false;
  root.dataset.model = "loading";
  $("model-progress").max = msg.total;
  $("model-progress").value = msg.loaded;
  $("model-detail").textContent = `${msg.model}: ${msg.detail}` +
    (msg.total > 1 ? ` (${(msg.loaded / 2 ** 20).toFixed(1)} of ${(msg.total / 2 ** 20).toFixed(1)} MiB)` : "");
}

export function onModelReady(msg) {
  ui.modelInfo = msg;
  $("model-loading").hidden = true;
  $("chat-app").hidden = false;
  root.dataset.model = "ready";
  root.dataset.modelInfo = JSON.stringify(msg);
  $("mem-kv-dtype").disabled = msg.backend === "cpu";  // the numpy fallback keeps f32 K/V
  $("mem-kv-dtype").title = msg.backend === "cpu" ? "the CPU fallback keeps f32 KV" : "";
  if (msg.kv_dtype && msg.backend !== "cpu") $("mem-kv-dtype").value = msg.kv_dtype;
  restoreChats();
  $("chat-status").textContent = `${msg.model} on the ${msg.backend} backend` +
    (msg.backend === "cpu" ? " (CPU fallback: slow)" : "") + `, loaded in ${(msg.load_ms / 1000).toFixed(1)} s`;
}

export function onModelError(msg) {
  root.dataset.model = "error";
  $("model-detail").textContent = `Could not load ${msg.model}: ${msg.message}`;
}

export function onChats(msg) {
  ui.list = msg.chats;
  if (ui.openNewest && ui.list.length) ui.current = ui.list[ui.list.length - 1].id;
  ui.openNewest = false;
  if (!ui.list.some((c) => c.id === ui.current)) ui.current = ui.list.length ? ui.list[0].id : null;
  selectChat(ui.current);
}

export function onTurnStart(msg) {
  const list = (ui.messages[msg.chat] ||= []);
  if (!msg.regenerate) list.push({ role: "user", text: ui.pending[msg.chat] || "" });
  list.push({ role: "assistant", text: "", engine: msg.engine });
  delete ui.pending[msg.chat];
  ui.partialIds[msg.chat] = [];
  ui.busy[msg.chat] = true;
  root.dataset.lastStart = JSON.stringify(msg);
  refresh(msg.chat);
}

export function onToken(msg) {
  const list = ui.messages[msg.chat];
  list[list.length - 1].text += msg.text;
  (ui.partialIds[msg.chat] ||= []).push(...msg.ids);
  if (ui.partialIds[msg.chat].length === msg.ids.length) persist(msg.chat);  // first token: save at once
  else saveStreamingSoon();
  if (msg.chat === ui.current) fillMessage($("messages").lastElementChild, list[list.length - 1]);
}

export function onTurnEnd(msg) {
  const list = ui.messages[msg.chat] || [];
  if (list.length) Object.assign(list[list.length - 1], { text: msg.content,
    interrupted: msg.reason === "abort" || msg.reason === "error" });
  ui.busy[msg.chat] = false;
  delete ui.partialIds[msg.chat];
  root.dataset.lastTurn = JSON.stringify(msg);
  refresh(msg.chat);
}

export function onChatSaved(msg) {
  store.rememberSaved(msg);
  persist(msg.chat);
}

export function onChatError(msg) {
  // A refused message is not lost: its text goes back into the box (the history was left unchanged).
  if (msg.chat && ui.pending[msg.chat] !== undefined) {
    if (msg.chat === ui.current && !$("prompt").value) $("prompt").value = ui.pending[msg.chat];
    delete ui.pending[msg.chat];
  }
  onEngineError(msg);
}

export function onEngineError(msg) {
  $("chat-status").textContent = msg.message;
  root.dataset.chatError = msg.message;
}

export function onMemory(msg) {
  renderMemory(msg, ui.modelInfo);
}

// ------------------------------------------------------------------ wiring

export function wireChatUI(worker) {
  ui.worker = worker;
  wireMemorySettings();
  wireAlternatives();
  wireFallbackSettings();
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  wireGenerationSettings(() => {
    if (!ui.current) return;
    ui.settings[ui.current] = readSettingsForm();
    persist(ui.current);
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); }
  });
  $("stop").addEventListener("click", () => worker.postMessage({ type: "stop", chat: ui.current }));
  $("regenerate").addEventListener("click", () => {
    const msgs = ui.messages[ui.current] || [];
    if (!msgs.length || msgs[msgs.length - 1].role !== "assistant" || ui.busy[ui.current]) return;
    msgs.pop();  // the worker drops the same reply from the token history
    renderMessages();
    worker.postMessage({ type: "regenerate", chat: ui.current, settings: requestSettings() });
  });
  $("new-chat").addEventListener("click", () => {
    ui.openNewest = true;  // the chat the worker creates becomes the one in view
    worker.postMessage({ type: "new-chat" });
  });
  $("delete-chat").addEventListener("click", () => {
    if (ui.current && confirm("Delete this chat?")) {
      store.deleteChat(ui.current);
      worker.postMessage({ type: "delete-chat", chat: ui.current });
    }
  });
  $("rename-chat").addEventListener("click", () => {
    const title = ui.current && prompt("New name", $("chat-title").textContent);
    if (title) worker.postMessage({ type: "rename-chat", chat: ui.current, title });
  });
}
