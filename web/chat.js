// The chat: the conversation list, the composer, the streaming view of replies, and their persistence.
import { renderAlternatives, wireAlternatives } from "./alternatives.js";
import { chatColor, renderMemory } from "./block_map.js";
import { fillMessage, messageElement, queuedElement, renderForeignNote } from "./messages.js";
import { $, root } from "./page.js";
import { readSettingsForm, requestSettings, showChatSettings, wireFallbackSettings, wireGenerationSettings,
         wireMemorySettings } from "./settings.js";
import { followOtherTabs, keepOnLeave, listSavedChats, persist, restoreChats, saveStreamingSoon } from "./saved_chats.js";
import { listed, ui } from "./state.js";
import * as store from "./store.js";

function renderChats() {
  const ul = $("chat-list");
  ul.replaceChildren();
  for (const c of listed()) {
    const li = document.createElement("li");
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = c.title;
    b.dataset.chat = c.id;
    b.style.borderLeft = `4px solid ${chatColor(c.id)}`;
    if (ui.busy[c.id]) b.classList.add("busy");
    if (c.model) { b.classList.add("foreign"); b.title = `made with ${c.model}: read-only here`; }
    else if ((ui.modelInfo?.models || []).length > 1) { b.title = c.of; b.dataset.model = c.of; }  // several models
    b.setAttribute("aria-current", String(c.id === ui.current));
    b.addEventListener("click", () => selectChat(c.id));
    li.append(b);
    ul.append(li);
  }
  const cur = listed().find((c) => c.id === ui.current);
  $("chat-title").textContent = cur ? cur.title : "No chat";
}

// A chat answers one message at a time: from its Send (or Regenerate) until the reply ends it takes no other.
const answering = (id) => !!ui.busy[id] || ui.pending[id] !== undefined;

function renderMessages() {
  const msgs = ui.messages[ui.current] || [];
  const waiting = [ui.queued && ui.queued.chat === ui.current ? ui.queued.text : undefined,
                   ui.pending[ui.current]?.text].filter((text) => text !== undefined);
  $("messages").replaceChildren(...msgs.map(messageElement), ...waiting.map(queuedElement));
  const busy = answering(ui.current);
  const foreign = ui.foreign[ui.current];
  renderForeignNote(foreign, ui.modelInfo);
  $("stop").disabled = !busy;
  $("send").disabled = busy || !!ui.queued || !!foreign;
  $("rename-chat").disabled = !!foreign || !store.record(ui.current);  // a record of this model's, once it is in
  $("regenerate").disabled = busy || !!foreign || !ui.accepting || !msgs.length ||
    msgs[msgs.length - 1].role !== "assistant";
  $("alternatives").disabled = $("regenerate").disabled;
  renderAlternatives();
  root.dataset.generating = ui.busy[ui.current] ? "true" : "false";
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
  if (ui.handedBack[id] !== undefined) {
    handBack(id, ui.handedBack[id]);
    delete ui.handedBack[id];
  }
  renderChats();
  renderMessages();
  $("prompt").focus();
}

function send() {
  const text = $("prompt").value;
  // Not while the chat answers (or has a message the worker has not started on): the text stays in the box.
  if (!text.trim() || answering(ui.current) || ui.foreign[ui.current] || ui.queued) return;
  if (!ui.accepting) {
    // The model is still loading: the message waits in the chat, shown as pending, and goes when it is ready.
    ui.queued = { chat: ui.current, text };
    $("prompt").value = "";
    renderMessages();
    return;
  }
  if (!ui.current) return;
  sendTo(ui.current, text);
  $("prompt").value = "";
}

function sendTo(id, text) {
  ui.pending[id] = { text };  // shown as pending until the worker's turn-start (or chat-error hands it back)
  ui.engine.chats.send(id, text, requestSettings(), store.record(id)?.model);
  refresh(id);
}

// Text the worker did not take goes back into the box (before what was typed since), or, when another chat is
// in view, into the box once its chat is opened again.
function handBack(id, text) {
  if (id !== ui.current) {
    ui.handedBack[id] = text;
    return;
  }
  const typed = $("prompt").value;
  $("prompt").value = typed ? `${text}\n${typed}` : text;
}

// A message queued while the model loaded goes to its chat (or, typed before any chat was listed, to the
// chat in view) once that chat is idle.
function sendQueued() {
  const target = ui.list.some((c) => c.id === ui.queued?.chat) ? ui.queued.chat : ui.current;
  if (!ui.accepting || !ui.queued || !target || answering(target)) return;
  const { text } = ui.queued;
  ui.queued = null;
  sendTo(target, text);
  refresh(target);
}

/** The page is ready: the chat can be used (a message sent before the model is loaded waits for it). */
export function showChatApp() {
  $("chat-app").hidden = false;
}

/** Saved chats are listed and readable at once, before Python starts (sending waits for the model). */
export async function showSavedChats() {
  if (!await listSavedChats() || !ui.list.length) return;
  showChatApp();
  selectChat(ui.current ?? ui.list[0].id);
}

function stopAccepting() {
  ui.accepting = false;
  root.dataset.model = "loading";
}

// ------------------------------------------------------------------ the worker's chat messages

export function onModelProgress(msg) {
  $("model-loading").hidden = false;
  stopAccepting();
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
  const tuned = msg.kernels_tuning;  // the gpu family's first-boot tuning (py/pagedkv/backends/webgpu/tuning.py)
  const kernels = $("adapter-kernels");
  kernels.dataset.family ??= kernels.textContent;  // boot.js's "family (why)", once per page
  // each projection's matvec: threads x groups of 8 rows a workgroup (ROW_GROUPS, matvec_gpu_main.wgsl)
  // (" whole": its lanes take whole 32-weight blocks, WHOLE_BLOCKS)
  const whole = new Set(tuned?.choice.matvec_whole ?? []);
  const slots = Object.entries(tuned?.choice.matvec_slots ?? {}).map(
    ([slot, [t, g]]) => `${slot} ${t}x${g}${whole.has(slot) ? " whole" : ""}`);
  kernels.textContent = kernels.dataset.family + (tuned ? `; tuned (${tuned.source}): matvec ${tuned.choice.matvec} ` +
    `threads, matmul ${tuned.choice.matmul[0]} threads x ${tuned.choice.matmul[1]} along rows x ` +
    `${tuned.choice.matmul[2] ?? 4} tokens a thread, decode attention ` +
    `split for ${tuned.choice.split} workgroups; per projection (threads x row groups): ${slots.join(", ")}` : "");
  // the CPU path: its kernels, threads and activations (cpu_models.py); the Backend row keeps boot.js's words
  $("adapter-cpu-kernels").textContent = msg.cpu_linear || "(none: not the CPU path)";
  $("mem-kv-dtype").disabled = msg.backend === "cpu";  // the numpy fallback keeps f32 K/V
  $("mem-kv-dtype").title = msg.backend === "cpu" ? "the CPU fallback keeps f32 KV" : "";
  if (msg.kv_dtype && msg.backend !== "cpu") $("mem-kv-dtype").value = msg.kv_dtype;
  const picker = $("new-chat-model");  // ?models=a,b: a new chat talks to the model picked here
  picker.replaceChildren(...(msg.models || []).map((m) => new Option(m, m)));
  picker.hidden = (msg.models || []).length < 2;
  restoreChats().then(acceptChats);
  const loaded = `loaded in ${(msg.load_ms / 1000).toFixed(1)} s`;
  // Why this backend (backends/choice.py): auto's CPU on a software adapter is the faster path, not a fallback.
  const models = (msg.models || []).length > 1 ? msg.models.join(" + ") : msg.model;
  // A base model's file has no chat template: its family's turn format stands in (model/families/), and we say so.
  const turns = msg.chat_template ? `; chat template: ${msg.chat_template}` : "";
  $("chat-status").textContent = `${models} on the ${msg.backend} backend (${msg.backend_reason}), ${loaded}${turns}`;
  $("model-detail").textContent = `${msg.model}: ${loaded}`;  // no stage of the load is still going
}

export function onModelError(msg) {
  ui.accepting = false;
  root.dataset.model = "error";
  $("model-detail").textContent = `Could not load ${msg.model}: ${msg.message}`;
  if (ui.queued) {  // no model will answer it: the text goes back into the box
    if (!$("prompt").value) $("prompt").value = ui.queued.text;
    ui.queued = null;
    renderMessages();
  }
}

export function onDeviceRestored(msg) {
  root.dataset.device = "restored";
  root.dataset.model = "ready";
  ui.accepting = true;
  $("model-loading").hidden = true;
  $("chat-status").textContent = `The GPU device was lost and rebuilt in ${(msg.rebuild_ms / 1000).toFixed(1)} s ` +
    `(${msg.num_blocks} KV blocks); ${msg.resumed} reply(ies) resumed from their token history.`;
  sendQueued();
}

// The saved chats are open in the worker (restoreChats): messages go to it at once from now on.
function acceptChats() {
  if (!listed().some((c) => c.id === ui.current)) ui.current = ui.list.length ? ui.list[0].id : null;
  ui.accepting = true;
  selectChat(ui.current);
  sendQueued();
  if (ui.newChatWanted) newChat();
}

// The page makes the chat (its record in IndexedDB); the worker opens its session at its first message.
function newChat() {
  ui.newChatWanted = false;
  const several = (ui.modelInfo.models || []).length > 1;  // ?models=: the new chat's model is the one picked
  const rec = store.newChat(several ? $("new-chat-model").value : ui.modelInfo.model);
  ui.list.push({ id: rec.id, title: rec.title, of: rec.model });
  selectChat(rec.id);
}

export function onTurnStart(msg) {
  const list = (ui.messages[msg.chat] ||= []);
  store.beginTurn(msg.chat, list.length, !!msg.regenerate);  // what came before it can take another tab's turns
  if (!msg.regenerate) list.push({ role: "user", text: ui.pending[msg.chat]?.text ?? "" });
  list.push({ role: "assistant", text: "", engine: msg.engine });
  delete ui.pending[msg.chat];
  ui.partialIds[msg.chat] = [];
  ui.partialSaved[msg.chat] = false;
  ui.busy[msg.chat] = true;
  root.dataset.lastStart = JSON.stringify(msg);
  refresh(msg.chat);
}

export function onToken(msg) {
  const list = ui.messages[msg.chat];
  list[list.length - 1].text += msg.text;
  (ui.partialIds[msg.chat] ||= []).push(...msg.ids);
  // The first token is saved at once, later ones at most every 300 ms (a server's tokens carry no ids).
  if (!ui.partialSaved[msg.chat]) {
    ui.partialSaved[msg.chat] = true;
    persist(msg.chat);
  } else {
    saveStreamingSoon();
  }
  if (msg.chat === ui.current) fillMessage($("messages").lastElementChild, list[list.length - 1]);
}

export function onTurnEnd(msg) {
  const list = ui.messages[msg.chat] || [];
  if (list.length) Object.assign(list[list.length - 1], { text: msg.content,
    interrupted: msg.reason === "abort" || msg.reason === "error" });
  ui.busy[msg.chat] = false;
  delete ui.partialIds[msg.chat];
  // The end carries the history with the reply (the worker's session record): the reply and its token
  // history are written in one write, begun before anything else can happen (a reload right after the end
  // keeps the whole reply; store.js keeps a write the page leaves before it lands).
  if (msg.checkpoint !== undefined) {
    store.rememberSession(msg);
    persist(msg.chat);
  }
  root.dataset.lastTurn = JSON.stringify(msg);
  refresh(msg.chat);
  sendQueued();
}

export function onSessionSaved(msg) {
  if (!store.rememberSession(msg)) return;
  if (msg.reply !== undefined) {  // a reply cut off by a reload, as the history holds it (its last character may
    const list = (ui.messages[msg.chat] ||= []);  // have been cut mid-way: U+FFFD, where the stream showed nothing)
    if (list[list.length - 1]?.role !== "assistant") list.push({ role: "assistant", text: "", interrupted: true });
    list[list.length - 1].text = msg.reply;
    refresh(msg.chat);
  }
  persist(msg.chat);
}

export function onChatError(msg) {
  // A chat's Send or Regenerate is answered by its turn-start or by this refusal (the worker left the history
  // unchanged): a refused message's text goes back into the box, a refused Regenerate's reply back in view.
  const refused = msg.chat ? ui.pending[msg.chat] : undefined;
  if (refused !== undefined) {
    delete ui.pending[msg.chat];
    if (refused.reply) ui.messages[msg.chat].push(refused.reply);
    if (refused.text !== undefined) handBack(msg.chat, refused.text);
    refresh(msg.chat);
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

let flushes = 0;

export function onDiskFlushed(msg) {
  // How many block files the last flush wrote, and how many flushes there were (tests and tools read it; the
  // memory panel follows with `memory`).
  root.dataset.diskFlushed = JSON.stringify({ written: msg.written, ms: msg.ms, flushes: ++flushes });
}

// Hidden (another tab, minimised) or left (reload, close): the disk tier writes now what it lacks of every chat,
// so a reload right after a reply restores all of it. Only with a model in (before, nothing is cached).
function flushDiskOnHide(engine) {
  const flush = () => { if (ui.modelInfo) engine.chats.flushDisk(); };
  document.addEventListener("visibilitychange", () => { if (document.visibilityState === "hidden") flush(); });
  window.addEventListener("pagehide", flush);
}

// ------------------------------------------------------------------ wiring

export function wireChatUI(engine) {
  ui.engine = engine;
  followOtherTabs(refresh);
  keepOnLeave();
  flushDiskOnHide(engine);
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
  $("stop").addEventListener("click", () => engine.chats.stop(ui.current));
  $("regenerate").addEventListener("click", () => {
    const msgs = ui.messages[ui.current] || [];
    if (!msgs.length || msgs[msgs.length - 1].role !== "assistant" || answering(ui.current)) return;
    ui.pending[ui.current] = { reply: msgs.pop() };  // the worker drops the same reply from the token history
    renderMessages();
    engine.chats.regenerate(ui.current, requestSettings());
  });
  $("new-chat").addEventListener("click", () => {
    // Before the model is in, which chats are its own (and their ids) is not known yet: it waits.
    if (ui.accepting) newChat();
    else ui.newChatWanted = true;
  });
  $("delete-chat").addEventListener("click", () => {
    const id = ui.current;
    if (!id || !confirm("Delete this chat?")) return;
    // Gone at once, streaming or not; what the worker still says about it is dropped (main.js, store.js).
    store.deleteChat(id);
    if (!ui.foreign[id]) engine.chats.forget(id);  // else the worker never had it
    ui.list = ui.list.filter((c) => c.id !== id);
    for (const perChat of [ui.foreign, ui.messages, ui.busy, ui.pending, ui.handedBack, ui.settings, ui.partialIds,
                           ui.partialSaved, ui.alternatives]) delete perChat[id];
    if (ui.queued?.chat === id) ui.queued = null;  // its words go with it, as a message sent to it does
    selectChat(listed().length ? listed()[0].id : null);
  });
  $("rename-chat").addEventListener("click", () => {
    const id = ui.current;
    const title = id && prompt("New name", $("chat-title").textContent);
    if (!title || !store.renameChat(id, title)) return;
    ui.list = ui.list.map((c) => (c.id === id ? { ...c, title: store.record(id).title } : c));
    renderChats();
  });
}
