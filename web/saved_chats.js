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

// Saved chats go back to the worker with their exact token history, if this model made them. Another
// model's chats are listed read-only (their token ids mean nothing to this one); a record this page cannot
// read is left as it is, with a note. The worker never gives a new chat the id of either.
export async function restoreChats() {
  await store.openStore();
  const model = ui.modelInfo.model;
  const { readable, unreadable } = await store.loadRecords(model, ui.modelInfo.default_model);
  const mine = readable.filter((rec) => rec.model === model);
  for (const rec of readable) {
    const msgs = rec.messages || [];
    if ((rec.partial_ids?.length || rec.streaming) && msgs.length) msgs[msgs.length - 1].interrupted = true;
    ui.messages[rec.id] = msgs;
    if (rec.settings) ui.settings[rec.id] = rec.settings;
    if (rec.model !== model) ui.foreign[rec.id] = { id: rec.id, title: rec.title, model: rec.model };
  }
  const reserved = [...Object.keys(ui.foreign), ...unreadable.map((rec) => String(rec.id))];
  ui.worker.postMessage({ type: "restore", reserved, chats: mine.map((r) => ({ id: r.id, title: r.title,
    checkpoint: r.checkpoint, before_reply: r.before_reply, partial_ids: r.partial_ids || [],
    streaming: !!r.streaming })) });
  const n = unreadable.length;
  $("store-note").hidden = !n;
  $("store-note").textContent = n ? `${n} saved chat${n > 1 ? "s" : ""} could not be read (left as stored)` : "";
  root.dataset.restored = String(mine.length);
}
