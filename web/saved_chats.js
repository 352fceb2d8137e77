// The chats' persistence: what the page writes to IndexedDB while chats change, and how saved chats come
// back after a reload.
import { $, root } from "./page.js";
import { ui } from "./state.js";
import * as store from "./store.js";

let saveTimer = null;  // the next save of the replies streaming now

export function persist(id) {
  store.saveChat(id, { messages: ui.messages[id] || [], partialIds: ui.partialIds[id] || [],
                       streaming: !!ui.partialIds[id], settings: ui.settings[id] });
}

export function saveStreamingSoon() {
  if (saveTimer) return;
  saveTimer = setTimeout(() => {
    saveTimer = null;
    for (const id of Object.keys(ui.partialIds)) if (ui.busy[id]) persist(id);
  }, 300);
}

// A chat's id is "chat-N", N counting up as the page makes chats (store.newChat never reuses one): the list's order.
const created = (rec) => Number(/-(\d+)$/.exec(rec.id)?.[1] ?? Infinity);
const byCreation = (a, b) => created(a) - created(b) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);

function showRecord(rec) {
  const msgs = rec.messages || [];
  if ((rec.partial_ids?.length || rec.streaming) && msgs.length) msgs[msgs.length - 1].interrupted = true;
  ui.messages[rec.id] = msgs;
  if (rec.settings) ui.settings[rec.id] = rec.settings;
}

const listEntry = (rec) => ({ id: rec.id, title: rec.title, of: rec.model });

// Said at once, before any chat is made: a person must know their chats will not survive a reload.
function showSaveNotice(problem) {
  $("save-notice").hidden = !problem;
  $("save-notice").textContent = problem ? "Chats cannot be saved in this browser, so they will be lost when " +
    `this page reloads or closes (IndexedDB: ${problem.replace(/\.$/, "")}).` : "";
  root.dataset.store = problem ? "unavailable" : "open";
}

/** The saved chats, listed and readable as the page opens, before Python starts; a message sent to one waits
 *  for the model, as every message does. Which of them the model can go on with is known at model-ready
 *  (restoreChats). Resolves to whether it listed them (not when the model was quicker). */
export async function listSavedChats() {
  showSaveNotice(await store.openStore());
  const { readable } = await store.readRecords();
  if (ui.modelInfo) return false;
  readable.sort(byCreation).forEach(showRecord);
  ui.list = readable.map(listEntry);
  root.dataset.saved = String(readable.length);
  return true;
}

// The worker opens a session for each saved chat this model made, from its exact token history. Another
// model's chats are listed read-only (their token ids mean nothing to this one); a record this page cannot
// read is left as it is, with a note. With no chat of this model, a new one is made.
export async function restoreChats() {
  showSaveNotice(await store.openStore());
  const model = ui.modelInfo.model;
  const loaded = ui.modelInfo.models || [model];  // ?models=: chats of every loaded model go on here
  const { readable, unreadable } = await store.loadRecords(loaded, ui.modelInfo.default_model);
  readable.sort(byCreation);
  const mine = readable.filter((rec) => loaded.includes(rec.model) && !store.isDeleted(rec.id));
  for (const rec of readable) {
    showRecord(rec);
    if (!loaded.includes(rec.model)) ui.foreign[rec.id] = { id: rec.id, title: rec.title, model: rec.model };
  }
  ui.list = mine.map(listEntry);
  if (!ui.list.length) ui.list.push(listEntry(store.newChat(model)));
  if (ui.queued && ui.foreign[ui.queued.chat]) {  // typed into a chat this model cannot go on: back into the box
    $("prompt").value = [ui.queued.text, $("prompt").value].filter(Boolean).join("\n");
    ui.queued = null;
  }
  ui.engine.chats.open(mine.map((r) => ({ id: r.id, checkpoint: r.checkpoint,
    before_reply: r.before_reply, partial_ids: r.partial_ids || [], streaming: !!r.streaming, model: r.model })));
  const n = unreadable.length;
  $("store-note").hidden = !n;
  $("store-note").textContent = n ? `${n} saved chat${n > 1 ? "s" : ""} could not be read (left as stored)` : "";
  root.dataset.restored = String(mine.length);
}
