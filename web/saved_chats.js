// The chats' persistence: what the page writes to IndexedDB while chats change, how saved chats come
// back after a reload, and how a chat open in two tabs stays one (store.js merges; this shows the result).
import { $, root } from "./page.js";
import { showChatSettings } from "./settings.js";
import { ui } from "./state.js";
import * as store from "./store.js";

let saveTimer = null;  // the next save of the replies streaming now
let writes = 0;  // records written by this tab: tests wait on data-chats-written
let refresh = () => {};  // chat.js's re-render of a chat (set by followOtherTabs)

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

/** A page that goes (a reload, a close) keeps what it has not written: the replies streaming now as they
 *  stand, and every write still on its way (store.keepUnwritten; the next page writes them first). */
export function keepOnLeave() {
  window.addEventListener("pagehide", () => {
    for (const id of Object.keys(ui.partialIds)) if (ui.busy[id]) persist(id);
    store.keepUnwritten();
  });
}

// Said at once, before any chat is made: a person must know their chats will not survive a reload.
function showSaveNotice(problem) {
  if (store.memoryOnlyReason()) return;  // the quota note stands (showQuotaFull)
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

// Whether chat `id` has nothing on its way: no reply streaming, nothing sent or queued that has not started.
const idle = (id) => !ui.busy[id] && ui.pending[id] === undefined && ui.queued?.chat !== id;

// Take a record another tab added turns to: shown here, and the worker's session reopened from its exact token
// history, so this tab's next message follows both tabs' turns. Only a record no reply streams in, and only
// while this tab's chat is idle with nothing unwritten: otherwise this tab's next write merges, and the
// merge is taken then.
function takeRecord(id, rec) {
  if (!idle(id) || rec.streaming || !store.unchangedSinceWrite(id, ui.messages[id] || [])) return;
  const mine = { ...rec, partial_ids: [], streaming: false };
  delete mine.turn_at;
  delete mine.turn_base;
  delete mine.turn_tab;
  store.adopt(mine);
  ui.messages[id] = mine.messages.map((m) => ({ ...m }));
  if (mine.settings) {
    ui.settings[id] = mine.settings;
    if (id === ui.current) showChatSettings(id);  // the form is what the next send reads: never a stale copy
  }
  ui.list = ui.list.map((c) => (c.id === id ? { ...c, title: mine.title } : c));
  ui.engine.chats.open([{ id, checkpoint: mine.checkpoint, before_reply: mine.before_reply, partial_ids: [],
                          streaming: false, model: mine.model }]);
  root.dataset.fromOtherTab = JSON.stringify({ chat: id, version: rec.version, messages: mine.messages.length });
  refresh(id);
}

// This tab's version of a chat that could not be merged with another tab's: a chat of its own, said so.
function keepCopy(id, copied) {
  ui.messages[copied.id] = copied.messages.map((m) => ({ ...m }));
  ui.list.push(listEntry(copied));
  ui.engine.chats.open([{ id: copied.id, checkpoint: copied.checkpoint, before_reply: copied.before_reply,
                          partial_ids: [], streaming: false, model: copied.model }]);
  $("store-note").hidden = false;
  $("store-note").textContent = `"${store.record(id)?.title ?? id}" was changed in another tab in a way that ` +
    `cannot be joined with this tab's turns; this tab's version is kept as "${copied.title}".`;
  refresh(copied.id);
}

// Chats stay in this tab when the storage quota is full: said at once, with what to free.
function showQuotaFull(reason) {
  $("save-notice").hidden = false;
  $("save-notice").textContent = "Chats are kept in this tab only, not saved: the browser's storage quota for " +
    `this site is full (IndexedDB: ${reason.replace(/\.$/, "")}). Remove saved models (Models) or chats, or ` +
    "give the site more space, then reload to save again.";
  root.dataset.store = "full";
}

/** Follow what other tabs write to the chats open here, and say when records cannot be written
 *  (`rerender(id)`: chat.js's re-render of a chat). */
export function followOtherTabs(rerender) {
  refresh = rerender;
  store.listen({
    merged: (id, rec, copied) => {
      if (copied) keepCopy(id, copied);
      takeRecord(id, rec);
    },
    written: (id) => { root.dataset.chatsWritten = JSON.stringify({ chat: id, writes: ++writes }); },
    full: showQuotaFull,
  });
}
