// Chats persist in IndexedDB, one record per chat: {id, title, model, messages, checkpoint, before_reply,
// partial_ids, settings}. The record is the chat's one owner: the page makes, names and deletes chats here; the
// worker keeps only a session per chat (the engine's state) and sends the exact token history (checkpoint,
// null until the first turn) as it changes (`session-saved`); token ids mean something only to the model that
// made them. The reply streaming now is saved while it streams (its token ids as partial_ids), so a reload
// keeps it.

let db = null;
let opening = null;  // openStore's one promise: the page opens the database once
const saved = new Map();  // chat id -> its record as last written
const deleted = new Set();  // chat ids deleted on this page (main.js drops what the worker still posts about them)
let highest = 0;  // the highest N of a "chat-N" id seen in the database or made here: a new chat takes N + 1

/** Open the database (once; later calls get the same answer): resolves to null, or to why chats cannot be
 *  saved in this browser (no IndexedDB, storage blocked, a private window that refuses it). */
export function openStore() {
  opening ??= new Promise((resolve) => {
    let req;
    try { req = indexedDB.open("pagedkv", 1); } catch (err) { resolve(String(err.message || err)); return; }
    req.onupgradeneeded = () => req.result.createObjectStore("chats", { keyPath: "id" });
    req.onsuccess = () => { db = req.result; resolve(null); };
    req.onerror = () => resolve(String(req.error?.message || req.error || "the database did not open"));
  });
  return opening;
}

function chats(mode) { return db.transaction("chats", mode).objectStore("chats"); }

const isInt = (x) => Number.isInteger(x) && x >= 0;
const isArrayOf = (xs, ok) => Array.isArray(xs) && xs.every(ok);
const isCheckpoint = (c) => Array.isArray(c) && c.length === 3 && typeof c[2] === "string" && isArrayOf(c[1], isInt) &&
  isArrayOf(c[0], (m) => m !== null && typeof m === "object" && typeof m.role === "string" && typeof m.content === "string");

/** Whether a stored record has the shape this page writes (anything else may be another version's, or damaged). */
function readable(rec) {
  return rec !== null && typeof rec === "object" && typeof rec.id === "string" && typeof rec.title === "string" &&
    (rec.checkpoint === null || isCheckpoint(rec.checkpoint)) && (rec.before_reply == null || isCheckpoint(rec.before_reply)) &&
    isArrayOf(rec.messages ?? [], (m) => m !== null && typeof m === "object" && (m.role === "user" || m.role === "assistant")
      && typeof m.text === "string") &&
    isArrayOf(rec.partial_ids ?? [], isInt) && (rec.model === undefined || typeof rec.model === "string") &&
    (rec.streaming === undefined || typeof rec.streaming === "boolean") &&
    (rec.settings === undefined || (rec.settings !== null && typeof rec.settings === "object"));
}

/** Every saved record, sorted: `readable` ones, `unreadable` ones (kept as they are, never written over). Read
 *  as the page opens, before any model is loaded: nothing is remembered as a chat's record yet. */
export function readRecords() {
  const sorted = { readable: [], unreadable: [] };
  if (!db) return Promise.resolve(sorted);
  return new Promise((resolve) => {
    const r = chats("readonly").getAll();
    r.onsuccess = () => {
      for (const rec of r.result) {
        (readable(rec) ? sorted.readable : sorted.unreadable).push(rec);
        noteId(rec?.id);  // no new chat takes the id of a record, readable or not, of any model
      }
      resolve(sorted);
    };
    r.onerror = () => resolve(sorted);
  });
}

/** readRecords, once `models` are loaded (the page's, and the others of a page of several): each readable
 *  record of one of them (a record without one is `defaultModel`'s) is remembered as its chat's record. */
export async function loadRecords(models, defaultModel) {
  const sorted = await readRecords();
  for (const rec of sorted.readable) {
    rec.model ??= defaultModel;
    if (models.includes(rec.model)) saved.set(rec.id, rec);
  }
  return sorted;
}

function noteId(id) {
  const n = Number(/^chat-(\d+)$/.exec(String(id))?.[1] ?? 0);
  if (n > highest) highest = n;
}

/** Make a chat of `model`: its record, written at once (no turn yet, so no token history). */
export function newChat(model) {
  highest += 1;
  const rec = { id: `chat-${highest}`, title: `Chat ${highest}`, model, messages: [], checkpoint: null,
                before_reply: null };
  saved.set(rec.id, rec);
  if (db) chats("readwrite").put(JSON.parse(JSON.stringify(rec)));
  return rec;
}

/** The chat's record as last written (undefined if it is not one of this model's, or was deleted). */
export function record(id) {
  return saved.get(id);
}

/** Give chat `id` a new title (at most 80 characters); false if it has no record here. */
export function renameChat(id, title) {
  const rec = saved.get(id);
  if (!rec) return false;
  rec.title = String(title).slice(0, 80);
  if (db) chats("readwrite").put(JSON.parse(JSON.stringify(rec)));
  return true;
}

/** The worker's session-saved message: the chat's exact token history as it stands now, into its record. */
export function rememberSession(msg) {
  const rec = saved.get(msg.chat);
  if (!rec) return false;
  rec.checkpoint = msg.checkpoint;
  rec.before_reply = msg.before_reply;
  return true;
}

/** Write a chat's record: its saved history with the page's messages, partial reply and settings. */
export function saveChat(id, { messages, partialIds, streaming, settings }) {
  const rec = saved.get(id);
  if (!rec) return;
  rec.messages = messages;
  rec.partial_ids = partialIds;
  rec.streaming = streaming;  // a reply was streaming: after a reload it shows as interrupted
  if (settings) rec.settings = settings;
  if (db) chats("readwrite").put(JSON.parse(JSON.stringify(rec)));
}

/** Whether chat `id` was deleted on this page (newChat never gives a new chat a used id). */
export function isDeleted(id) {
  return deleted.has(id);
}

export function deleteChat(id) {
  deleted.add(id);
  saved.delete(id);
  if (db) chats("readwrite").delete(id);
}
