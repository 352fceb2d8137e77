// UI thread: starts the worker (where Pyodide and all compute live) and renders what it posts.
"use strict";

const root = document.documentElement;
const $ = (id) => document.getElementById(id);
const STAGES = ["download", "python", "numpy", "engine", "gpu"];
const t0 = performance.now();

function showStage(stage, detail) {
  const index = STAGES.indexOf(stage);
  document.querySelectorAll("#stages li").forEach((li) => {
    const i = STAGES.indexOf(li.dataset.stage);
    li.classList.toggle("done", i < index);
    li.classList.toggle("active", i === index);
  });
  $("boot-progress").value = index;
  $("boot-detail").textContent = detail;
  root.dataset.stage = stage;
}

function showError(message, detail) {
  root.dataset.state = "error";
  root.dataset.error = message;
  $("boot").hidden = true;
  $("error").hidden = false;
  $("error-message").textContent = message;
  $("error-detail").textContent = detail || "";
}

function showNoWebGPU(message) {
  // Not fatal: the chat runs on the CPU fallback. The page says why and what to do.
  $("boot").hidden = true;
  $("gpu-notice").hidden = false;
  $("gpu-notice-message").textContent = message;
  root.dataset.webgpu = "unavailable";
  root.dataset.state = "ready";
}

function showReady(msg) {
  const bootMs = Math.round(performance.now() - t0);
  $("boot").hidden = true;
  $("device").hidden = false;
  $("adapter-name").textContent = msg.adapter.name;
  $("limit-max-buffer").textContent = msg.adapter.limits.maxBufferSize.toLocaleString() + " bytes";
  $("limit-max-binding").textContent = msg.adapter.limits.maxStorageBufferBindingSize.toLocaleString() + " bytes";
  $("adapter-features").textContent = msg.adapter.features.join(", ") || "(none)";
  $("selftest").textContent = `${msg.selftest.kernel} on ${msg.selftest.n.toLocaleString()} floats: ` +
    `max |GPU − numpy| = ${msg.selftest.max_abs_err}`;
  $("boot-time").textContent = `${(bootMs / 1000).toFixed(1)} s`;
  root.dataset.bootMs = String(bootMs);
  root.dataset.adapter = JSON.stringify(msg.adapter);
  root.dataset.selftest = JSON.stringify(msg.selftest);
  root.dataset.state = "ready";
}

// ------------------------------------------------------------------ persistence (IndexedDB)
// One record per chat: {id, title, messages, checkpoint, partial_ids}. The worker sends the exact
// token history (checkpoint) after every turn; the partial reply is saved while it streams, so a
// reload mid-generation keeps it (marked interrupted).

const store = {
  db: null,
  open() {
    return new Promise((resolve) => {
      let req;
      try { req = indexedDB.open("pagedkv", 1); } catch (err) { resolve(null); return; }
      req.onupgradeneeded = () => req.result.createObjectStore("chats", { keyPath: "id" });
      req.onsuccess = () => { store.db = req.result; resolve(store.db); };
      req.onerror = () => { console.warn("IndexedDB unavailable: chats will not survive a reload"); resolve(null); };
    });
  },
  tx(mode) { return store.db.transaction("chats", mode).objectStore("chats"); },
  all() {
    if (!store.db) return Promise.resolve([]);
    return new Promise((resolve) => { const r = store.tx("readonly").getAll(); r.onsuccess = () => resolve(r.result); r.onerror = () => resolve([]); });
  },
  put(record) { if (store.db) store.tx("readwrite").put(record); },
  delete(id) { if (store.db) store.tx("readwrite").delete(id); },
};

const saved = {};          // chat id -> its record as last written
const partialIds = {};     // chat id -> token ids of the reply streaming now
let saveTimer = null;

function saveChat(id) {
  const rec = saved[id];
  if (!rec) return;
  rec.messages = chat.messages[id] || [];
  rec.partial_ids = partialIds[id] || [];
  if (chat.settings[id]) rec.settings = chat.settings[id];
  store.put(JSON.parse(JSON.stringify(rec)));
}

function saveStreamingSoon() {
  if (saveTimer) return;
  saveTimer = setTimeout(() => {
    saveTimer = null;
    for (const id of Object.keys(partialIds)) if (chat.busy[id]) saveChat(id);
  }, 300);
}

async function restoreChats(worker) {
  const records = await store.all();
  for (const rec of records) {
    saved[rec.id] = rec;
    const msgs = rec.messages || [];
    if (rec.partial_ids && rec.partial_ids.length && msgs.length) msgs[msgs.length - 1].interrupted = true;
    chat.messages[rec.id] = msgs;
    if (rec.settings) chat.settings[rec.id] = rec.settings;
  }
  worker.postMessage({ type: "restore", chats: records.map((r) => ({ id: r.id, title: r.title,
    checkpoint: r.checkpoint, before_reply: r.before_reply, partial_ids: r.partial_ids || [] })) });
  root.dataset.restored = String(records.length);
}

// ------------------------------------------------------------------ chat UI

const chat = { worker: null, list: [], current: null, messages: {}, busy: {}, pending: {}, settings: {} };

function chatColor(id) {
  const n = parseInt(String(id).replace(/\D+/g, ""), 10) || 0;
  return `hsl(${(n * 137) % 360} 65% 50%)`;
}

// Generation settings belong to a chat: the form shows the chat in view's, edits are saved with it
// (IndexedDB), and a new chat starts from the values the form holds.
const SETTING_FIELDS = { temperature: "set-temperature", top_p: "set-top-p", max_tokens: "set-max-tokens",
                         seed: "set-seed", system: "set-system" };

function readSettingsForm() {
  return Object.fromEntries(Object.entries(SETTING_FIELDS).map(([key, id]) => [key, $(id).value]));
}

function showChatSettings(id) {
  if (!chat.settings[id]) chat.settings[id] = readSettingsForm();
  for (const [key, field] of Object.entries(SETTING_FIELDS)) $(field).value = chat.settings[id][key] ?? "";
}

function settingsEdited() {
  if (!chat.current) return;
  chat.settings[chat.current] = readSettingsForm();
  saveChat(chat.current);
}

function settings() {
  const v = (id) => $(id).value;
  return { ...readSettingsForm(), priority: 1,
           fallback_url: v("set-fallback-url").trim(), fallback_model: v("set-fallback-model").trim(),
           fallback_mode: v("set-fallback-mode") };
}

// The fallback server is remembered in this browser (localStorage); empty URL = off, the default.
const FALLBACK_FIELDS = ["set-fallback-url", "set-fallback-model", "set-fallback-mode"];

function wireFallbackSettings() {
  let stored = {};
  try { stored = JSON.parse(localStorage.getItem("pagedkv.fallback") || "{}"); } catch (err) { stored = {}; }
  for (const id of FALLBACK_FIELDS) {
    if (typeof stored[id] === "string") $(id).value = stored[id];
    $(id).addEventListener("change", () => {
      const values = Object.fromEntries(FALLBACK_FIELDS.map((f) => [f, $(f).value.trim()]));
      try { localStorage.setItem("pagedkv.fallback", JSON.stringify(values)); } catch (err) { /* private mode */ }
    });
  }
}

function renderChats() {
  const ul = $("chat-list");
  ul.replaceChildren();
  for (const c of chat.list) {
    const li = document.createElement("li");
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = c.title;
    b.dataset.chat = c.id;
    b.style.borderLeft = `4px solid ${chatColor(c.id)}`;
    if (chat.busy[c.id]) b.classList.add("busy");
    b.setAttribute("aria-current", String(c.id === chat.current));
    b.addEventListener("click", () => selectChat(c.id));
    li.append(b);
    ul.append(li);
  }
  const cur = chat.list.find((c) => c.id === chat.current);
  $("chat-title").textContent = cur ? cur.title : "No chat";
}

// Markdown for replies: everything is HTML-escaped FIRST, then a few tags of our own are added
// (code blocks, inline code, bold, lists, paragraphs); no attribute ever comes from the text.
function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function inlineMarkdown(escaped) {
  return escaped.replace(/`([^`]+)`/g, "<code>$1</code>").replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>");
}

function blockMarkdown(text) {
  let html = "";
  let list = null;
  for (const line of escapeHtml(text).split("\n")) {
    const item = line.match(/^\s*([-*]|\d+\.)\s+(.*)$/);
    if (item) {
      const type = /\d/.test(item[1]) ? "ol" : "ul";
      if (list !== type) { if (list) html += `</${list}>`; html += `<${type}>`; list = type; }
      html += `<li>${inlineMarkdown(item[2])}</li>`;
      continue;
    }
    if (list) { html += `</${list}>`; list = null; }
    if (line.trim()) html += `<p>${inlineMarkdown(line)}</p>`;
  }
  return list ? html + `</${list}>` : html;
}

function renderMarkdown(text) {
  // Split on ``` fences: odd pieces are code (an unclosed fence while streaming is code too).
  return text.split("```").map((piece, i) => (i % 2
    ? `<pre><code>${escapeHtml(piece.replace(/^[^\n]*\n/, ""))}</code></pre>`
    : blockMarkdown(piece))).join("");
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
  const ol = $("messages");
  ol.replaceChildren(...(chat.messages[chat.current] || []).map(messageElement));
  const busy = !!chat.busy[chat.current];
  const msgs = chat.messages[chat.current] || [];
  $("stop").disabled = !busy;
  $("send").disabled = busy;
  $("regenerate").disabled = busy || !msgs.length || msgs[msgs.length - 1].role !== "assistant";
  $("alternatives").disabled = $("regenerate").disabled;
  renderAlternatives();
  root.dataset.generating = busy ? "true" : "false";
}

function selectChat(id) {
  chat.current = id;
  root.dataset.chat = id;
  if (id) showChatSettings(id);
  renderChats();
  renderMessages();
  $("prompt").focus();
}

function send() {
  const text = $("prompt").value;
  if (!text.trim() || !chat.current || chat.busy[chat.current]) return;
  chat.pending[chat.current] = text;
  chat.worker.postMessage({ type: "send", chat: chat.current, text, settings: settings() });
  $("prompt").value = "";
}

function drawBlockMap(mem) {
  const canvas = $("block-map");
  const n = mem.cells.length;
  const cols = Math.ceil(Math.sqrt(n * 2));
  const rows = Math.ceil(n / cols);
  const size = Math.max(2, Math.floor(Math.min(canvas.clientWidth || 320, 640) / cols));
  canvas.width = cols * size;
  canvas.height = rows * size;
  const g = canvas.getContext("2d");
  g.fillStyle = "#fff";
  g.fillRect(0, 0, canvas.width, canvas.height);
  const colors = mem.owners.map(chatColor);
  const gap = size > 3 ? 1 : 0;
  for (let i = 0; i < n; i++) {
    const c = mem.cells.charCodeAt(i);  // see ChatService.memory_snapshot
    g.fillStyle = c === 102 ? "#f2f2f2" : c === 99 ? "#c9c9c9" : c === 115 ? "#7a4cc2" : colors[c - 0x100];
    g.fillRect((i % cols) * size, Math.floor(i / cols) * size, size - gap, size - gap);
  }
  canvas.setAttribute("aria-label", `Block map: ${mem.used_blocks} used, ${mem.cached_blocks} cached, ` +
    `${mem.free_blocks} free of ${mem.total_blocks} blocks`);
}

function renderMemory(mem) {
  drawBlockMap(mem);
  const pct = (x) => `${(100 * x).toFixed(1)} %`;
  const facts = [
    ["Model", mem.model],
    ["Blocks", `${mem.used_blocks} used · ${mem.cached_blocks} cached · ${mem.free_blocks} free / ${mem.total_blocks} (× ${mem.block_size} tokens)`],
    ["Utilization", pct(mem.utilization)],
    ["Slot efficiency", pct(mem.slot_efficiency)],
    ["Sharing factor", mem.sharing_factor.toFixed(2)],
    ["Tokens stored", mem.tokens_stored.toLocaleString()],
    ["Prefix-cache hit rate", pct(mem.prefix_hit_rate)],
    ["Tokens / s", mem.tokens_per_s.toFixed(1)],
    ["Blocks per chat", Object.entries(mem.per_chat_blocks).map(([k, v]) => `${k}: ${v}`).join(", ") || "–"],
    ["Preemptions", `swap ${mem.engine.preemptions.swap} · recompute ${mem.engine.preemptions.recompute}`],
  ];
  const info = JSON.parse(root.dataset.modelInfo || "{}");
  if (info.bytes_per_token) {
    facts.push(["KV bytes / token", `${info.bytes_per_token.toLocaleString()} B (${info.kv_dtype || "f32"}) · ` +
      `${(info.bytes_per_token * mem.block_size / 1024).toFixed(0)} KiB per block`]);
  }
  if (mem.ledger) {
    const mib = (b) => (b / 2 ** 20).toFixed(1);
    const kinds = Object.entries(mem.ledger.by_kind || {}).map(([k, b]) => `${k} ${mib(b)}`).join(" · ");
    facts.push(["GPU budget", `${mib(mem.ledger.used_bytes)} of ${mib(mem.ledger.budget_bytes)} MiB` +
      (kinds ? ` (${kinds} MiB)` : "")]);
  }
  const dl = $("memory-facts");
  dl.replaceChildren(...facts.flatMap(([k, v]) => {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    return [dt, dd];
  }));
  root.dataset.memory = JSON.stringify({ used: mem.used_blocks, cached: mem.cached_blocks, free: mem.free_blocks,
    total: mem.total_blocks, per_chat: mem.per_chat_blocks, owners: mem.owners });
}

function onChatMessage(msg) {
  switch (msg.type) {
    case "model-progress":
      $("model-loading").hidden = false;
      root.dataset.model = "loading";
      $("model-progress").max = msg.total;
      $("model-progress").value = msg.loaded;
      $("model-detail").textContent = `${msg.model}: ${msg.detail}` +
        (msg.total > 1 ? ` (${(msg.loaded / 2 ** 20).toFixed(1)} of ${(msg.total / 2 ** 20).toFixed(1)} MiB)` : "");
      return true;
    case "model-ready":
      $("model-loading").hidden = true;
      $("chat-app").hidden = false;
      root.dataset.model = "ready";
      root.dataset.modelInfo = JSON.stringify(msg);
      $("mem-kv-dtype").disabled = msg.backend === "cpu";  // the numpy fallback keeps f32 K/V
      $("mem-kv-dtype").title = msg.backend === "cpu" ? "the CPU fallback keeps f32 KV" : "";
      if (msg.kv_dtype && msg.backend !== "cpu") $("mem-kv-dtype").value = msg.kv_dtype;
      store.open().then(() => restoreChats(chat.worker));
      $("chat-status").textContent = `${msg.model} on the ${msg.backend} backend` +
        (msg.backend === "cpu" ? " (CPU fallback: slow)" : "") + `, loaded in ${(msg.load_ms / 1000).toFixed(1)} s`;
      return true;
    case "model-error":
      root.dataset.model = "error";
      $("model-detail").textContent = `Could not load ${msg.model}: ${msg.message}`;
      return true;
    case "chats":
      chat.list = msg.chats;
      if (chat.openNewest && chat.list.length) chat.current = chat.list[chat.list.length - 1].id;
      chat.openNewest = false;
      if (!chat.list.some((c) => c.id === chat.current)) chat.current = chat.list.length ? chat.list[0].id : null;
      selectChat(chat.current);
      return true;
    case "turn-start": {
      const list = (chat.messages[msg.chat] ||= []);
      if (!msg.regenerate) list.push({ role: "user", text: chat.pending[msg.chat] || "" });
      list.push({ role: "assistant", text: "", engine: msg.engine });
      delete chat.pending[msg.chat];
      partialIds[msg.chat] = [];
      chat.busy[msg.chat] = true;
      root.dataset.lastStart = JSON.stringify(msg);
      renderChats();
      if (msg.chat === chat.current) renderMessages();
      return true;
    }
    case "token": {
      const list = chat.messages[msg.chat];
      list[list.length - 1].text += msg.text;
      (partialIds[msg.chat] ||= []).push(...msg.ids);
      if (partialIds[msg.chat].length === msg.ids.length) saveChat(msg.chat);  // first token: save at once
      else saveStreamingSoon();
      if (msg.chat === chat.current) fillMessage($("messages").lastElementChild, list[list.length - 1]);
      return true;
    }
    case "turn-end": {
      const list = chat.messages[msg.chat] || [];
      if (list.length) Object.assign(list[list.length - 1], { text: msg.content,
        interrupted: msg.reason === "abort" || msg.reason === "error" });
      chat.busy[msg.chat] = false;
      delete partialIds[msg.chat];
      root.dataset.lastTurn = JSON.stringify(msg);
      renderChats();
      if (msg.chat === chat.current) renderMessages();
      return true;
    }
    case "chat-saved":
      saved[msg.chat] = { id: msg.chat, title: msg.title, checkpoint: msg.checkpoint, before_reply: msg.before_reply };
      saveChat(msg.chat);
      return true;
    case "chat-error":
      // A refused message is not lost: its text goes back into the box (the history was left unchanged).
      if (msg.chat && chat.pending[msg.chat] !== undefined) {
        if (msg.chat === chat.current && !$("prompt").value) $("prompt").value = chat.pending[msg.chat];
        delete chat.pending[msg.chat];
      }
      // falls through
    case "engine-error":
      $("chat-status").textContent = msg.message;
      root.dataset.chatError = msg.message;
      return true;
    case "memory":
      renderMemory(msg);
      return true;
    default:
      return onAlternativesMessage(msg);
  }
}

// ------------------------------------------------------------------ "show 3 alternatives"
// The worker samples 3 replies to the last user message as one request (n = 3 parallel samples sharing the
// prompt's KV blocks). They stream side by side under the messages; "Keep this one" makes one the reply
// (the worker rewrites the token history to end with its exact ids). The current reply stays until then.
const alternatives = {};  // chat id -> {texts, state: "streaming" | "done" | "abort"}

function renderAlternatives() {
  const panel = $("alternatives-panel");
  const alt = alternatives[chat.current];
  panel.hidden = !alt;
  if (!alt) return;
  panel.replaceChildren(...alt.texts.map((text, i) => {
    const section = document.createElement("section");
    section.className = "alternative";
    section.dataset.index = String(i);
    section.dataset.text = text;
    const body = document.createElement("div");
    body.innerHTML = renderMarkdown(text);  // escaped first: see renderMarkdown
    const keep = document.createElement("button");
    keep.type = "button";
    keep.className = "keep-alternative";
    keep.textContent = `Keep alternative ${i + 1}`;
    keep.disabled = alt.state === "streaming";
    keep.addEventListener("click", () =>
      chat.worker.postMessage({ type: "keep-alternative", chat: chat.current, index: i }));
    section.append(body, keep);
    return section;
  }));
}

function onAlternativesMessage(msg) {
  switch (msg.type) {
    case "alt-start":
      alternatives[msg.chat] = { texts: Array(msg.n).fill(""), state: "streaming" };
      chat.busy[msg.chat] = true;
      break;
    case "alt-token":
      alternatives[msg.chat].texts[msg.index] += msg.text;
      break;
    case "alt-end":
      Object.assign(alternatives[msg.chat], { texts: msg.alternatives, state: msg.reason });
      chat.busy[msg.chat] = false;
      root.dataset.alternatives = JSON.stringify({ chat: msg.chat, ...msg });
      break;
    case "alt-kept": {
      const list = chat.messages[msg.chat] || [];
      if (list.length) list[list.length - 1].text = msg.content;
      delete alternatives[msg.chat];
      root.dataset.altKept = JSON.stringify(msg);
      break;
    }
    default:
      return false;
  }
  renderChats();
  if (msg.chat === chat.current) renderMessages();
  return true;
}

function wireAlternatives(worker) {
  const button = document.createElement("button");
  button.id = "alternatives";
  button.type = "button";
  button.disabled = true;
  button.textContent = "Show 3 alternatives";
  button.addEventListener("click", () => {
    if (!button.disabled) worker.postMessage({ type: "alternatives", chat: chat.current, settings: settings(), n: 3 });
  });
  $("regenerate").after(button);
  const panel = document.createElement("div");
  panel.id = "alternatives-panel";
  panel.className = "alternatives";
  panel.hidden = true;
  $("messages").after(panel);
}

function wireMemorySettings() {
  const params = new URLSearchParams(location.search);
  if (params.get("budget_mib")) $("mem-budget").value = params.get("budget_mib");
  if (params.get("block_size")) $("mem-block-size").value = params.get("block_size");
  if (params.get("max_context")) $("mem-max-context").value = params.get("max_context");
  if (params.get("kv_dtype")) $("mem-kv-dtype").value = params.get("kv_dtype");
  $("memory-form").addEventListener("submit", (e) => {
    e.preventDefault();
    // Pool geometry is fixed when the engine starts: rebuild by restarting it with the new settings.
    // Chats live in IndexedDB with their exact token history, so they come back and re-prefill.
    params.set("budget_mib", $("mem-budget").value);
    params.set("block_size", $("mem-block-size").value);
    if (!$("mem-kv-dtype").disabled) params.set("kv_dtype", $("mem-kv-dtype").value);
    if ($("mem-max-context").value) params.set("max_context", $("mem-max-context").value);
    else params.delete("max_context");
    location.search = params.toString();
  });
}

function wireChatUI(worker) {
  wireMemorySettings();
  wireAlternatives(worker);
  wireFallbackSettings();
  chat.worker = worker;
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  for (const id of Object.values(SETTING_FIELDS)) $(id).addEventListener("input", settingsEdited);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); }
  });
  $("stop").addEventListener("click", () => worker.postMessage({ type: "stop", chat: chat.current }));
  $("regenerate").addEventListener("click", () => {
    const msgs = chat.messages[chat.current] || [];
    if (!msgs.length || msgs[msgs.length - 1].role !== "assistant" || chat.busy[chat.current]) return;
    msgs.pop();  // the worker drops the same reply from the token history
    renderMessages();
    worker.postMessage({ type: "regenerate", chat: chat.current, settings: settings() });
  });
  $("new-chat").addEventListener("click", () => {
    chat.openNewest = true;  // the chat the worker creates becomes the one in view
    worker.postMessage({ type: "new-chat" });
  });
  $("delete-chat").addEventListener("click", () => {
    if (chat.current && confirm("Delete this chat?")) {
      store.delete(chat.current);
      delete saved[chat.current];
      worker.postMessage({ type: "delete-chat", chat: chat.current });
    }
  });
  $("rename-chat").addEventListener("click", () => {
    const title = chat.current && prompt("New name", $("chat-title").textContent);
    if (title) worker.postMessage({ type: "rename-chat", chat: chat.current, title });
  });
}

function start() {
  if (!window.crossOriginIsolated) {
    console.warn("page is not cross-origin isolated; serve it with `python3 build.py serve`");
  }
  let worker;
  try {
    worker = new Worker("worker.js" + location.search);
  } catch (err) {
    showError(`Could not start the worker: ${err.message}`);
    return;
  }
  const pending = new Map();
  let nextId = 1;
  // window.pagedkv.exec(code): run Python in the worker; resolves to the JSON text of its last expression.
  window.pagedkv = {
    exec(code) {
      const id = nextId++;
      return new Promise((resolve, reject) => {
        pending.set(id, { resolve, reject });
        worker.postMessage({ type: "exec", id, code });
      });
    },
  };
  worker.onmessage = (event) => {
    const msg = event.data;
    if (msg.type === "exec-result") {
      const p = pending.get(msg.id);
      pending.delete(msg.id);
      if (msg.ok) p.resolve(msg.json); else p.reject(new Error(msg.error));
    } else if (msg.type === "progress") showStage(msg.stage, msg.detail);
    else if (msg.type === "ready") showReady(msg);
    else if (msg.type === "error") showError(msg.message, msg.detail);
    else if (msg.type === "no-webgpu") showNoWebGPU(msg.message);
    else if (onChatMessage(msg)) { /* handled */ }
    else if (msg.type === "device-lost") {
      root.dataset.device = "lost";
      if (msg.recovering) $("chat-status").textContent = `The GPU device was lost (${msg.reason}): rebuilding the engine; every chat goes on from its token history.`;
      else showError(`The GPU device was lost (${msg.reason}). Reload the page to restart.`);
    } else if (msg.type === "device-restored") {
      root.dataset.device = "restored";
      root.dataset.model = "ready";
      $("model-loading").hidden = true;
      $("chat-status").textContent = `The GPU device was lost and rebuilt in ${(msg.rebuild_ms / 1000).toFixed(1)} s ` +
        `(${msg.num_blocks} KV blocks); ${msg.resumed} reply(ies) resumed from their token history.`;
    }
  };
  wireChatUI(worker);
  worker.onerror = (event) => {
    event.preventDefault();
    showError(`The engine worker failed: ${event.message || "unknown error"}`);
  };
}

start();
