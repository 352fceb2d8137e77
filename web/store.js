// Chats persist in IndexedDB, one record per chat: {id, title, model, messages, checkpoint, before_reply,
// partial_ids, settings, version}. The record is the chat's one owner: the page makes, names and deletes chats here; the
// worker keeps only a session per chat (the engine's state) and sends the exact token history (checkpoint,
// null until the first turn) as it changes (`session-saved`); token ids mean something only to the model that
// made them. The reply streaming now is saved while it streams (its token ids as partial_ids), so a reload
// keeps it.
//
// Two tabs may hold the same chat, each with its own engine. Every write reads the stored record in the same
// IndexedDB transaction (transactions on one store run one at a time, across tabs) and, when another tab wrote
// since, writes a merge instead (merge.js): what this tab added since its last write goes after what is stored.
// Each write bumps `version` and is announced on a BroadcastChannel, so the other tab shows the turn.
//
// A page that goes (a reload, a close) while a write is on its way loses it: IndexedDB drops the transaction of
// a page that is gone (a write reads the stored record and puts in its callback, which never runs then; a
// deletion is one request, which lands). On pagehide every write that has not landed is kept in localStorage,
// which stores at once (keepUnwritten: the chat's newest record), and the next page to open the database
// writes it before it reads any record (recoverUnwritten), merged as any write is.
import { mergeRecords } from "./merge.js";

let db = null;
let opening = null;  // openStore's one promise: the page opens the database once
const saved = new Map();  // chat id -> its record as last written
const deleted = new Set();  // chat ids deleted on this page (main.js drops what the worker still posts about them)
let highest = 0;  // the highest N of a "chat-N" id seen in the database or made here: a new chat takes N + 1
// chat id -> {version, base, plain}: the stored version this tab last wrote or took, this tab's own record at
// that moment (a merge appends what the tab added since `base`), and whether that stored version is `base`
// itself (false after a merge this tab has not taken: the stored one holds another tab's turns too).
const synced = new Map();
let memoryOnly = null;  // why records are no longer written (a full quota), or null
const channel = typeof BroadcastChannel === "function" ? new BroadcastChannel("pagedkv-chats") : null;
const copy = (rec) => JSON.parse(JSON.stringify(rec));
const TAB = Math.random().toString(36).slice(2);  // this tab, as the record's streaming turn names it
const UNWRITTEN = "pagedkv-unwritten:";  // localStorage key of a chat's write kept at pagehide (+ the chat id)
const writing = new Map();  // chat id -> its writes begun and not yet stored or failed
const kept = new Set();  // chat ids keepUnwritten put in localStorage (a page kept by the back/forward cache)

/** Open the database (once; later calls get the same answer): resolves to null, or to why chats cannot be
 *  saved in this browser (no IndexedDB, storage blocked, a private window that refuses it). */
export function openStore() {
  opening ??= new Promise((resolve) => {
    let req;
    try { req = indexedDB.open("pagedkv", 1); } catch (err) { resolve(String(err.message || err)); return; }
    req.onupgradeneeded = () => req.result.createObjectStore("chats", { keyPath: "id" });
    req.onsuccess = () => { db = req.result; recoverUnwritten().then(() => resolve(null)); };
    req.onerror = () => resolve(String(req.error?.message || req.error || "the database did not open"));
  });
  return opening;
}

function chats(mode) { return db.transaction("chats", mode).objectStore("chats"); }

function begun(id) {
  writing.set(id, (writing.get(id) ?? 0) + 1);
}

function landed(id) {  // a write of chat `id` is over: stored or failed
  const left = (writing.get(id) ?? 1) - 1;
  if (left > 0) { writing.set(id, left); return; }
  writing.delete(id);
  if (kept.delete(id)) {  // kept at a pagehide, and the page came back (the back/forward cache): it landed
    try { localStorage.removeItem(UNWRITTEN + id); } catch (err) { /* storage refused: recovery merges it */ }
  }
}

/** pagehide: every write of a chat that has not landed (it may land still), kept in localStorage as the chat's
 *  newest record with this tab's base for a merge and the tab's name; the next page that opens the store
 *  writes it. */
export function keepUnwritten() {
  for (const id of writing.keys()) {
    const rec = saved.get(id);
    if (!rec) continue;  // deleted since
    try {
      localStorage.setItem(UNWRITTEN + id, JSON.stringify({ rec, synced: synced.get(id) ?? null, tab: TAB }));
      kept.add(id);
    } catch (err) { /* no localStorage, or it is full: this write may still land */ }
  }
}

// What a page that went kept (keepUnwritten), written before the records are read: a record as that tab's
// write of it, merged with what another tab stored since (a chat stored once and gone since was deleted:
// it stays deleted).
async function recoverUnwritten() {
  let keys;
  try { keys = Object.keys(localStorage).filter((k) => k.startsWith(UNWRITTEN)); } catch (err) { return; }
  for (const key of keys) {
    const id = key.slice(UNWRITTEN.length);
    let entry = null;
    try { entry = JSON.parse(localStorage.getItem(key)); } catch (err) { /* damaged: dropped */ }
    if (entry?.rec && readable(entry.rec) && entry.rec.id === id) {
      saved.set(id, entry.rec);
      if (entry.synced) synced.set(id, entry.synced);
      await write(id, { revive: !entry.synced, tab: entry.tab });
      saved.delete(id);
      synced.delete(id);
    }
    try { localStorage.removeItem(key); } catch (err) { /* left: written again (merged) next time */ }
  }
}

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
    (rec.version === undefined || isInt(rec.version)) && (rec.turn_at === undefined || isInt(rec.turn_at)) &&
    (rec.turn_base == null || isCheckpoint(rec.turn_base)) &&
    (rec.turn_tab === undefined || typeof rec.turn_tab === "string") &&
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
    if (models.includes(rec.model)) take(rec);
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
  write(rec.id);
  return rec;
}

// This tab's copy of the chat is now the stored record `rec`.
function take(rec) {
  saved.set(rec.id, rec);
  synced.set(rec.id, { version: rec.version ?? 0, base: copy(rec), plain: true });
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
  write(id);
  return true;
}

/** The worker's session-saved message: the chat's exact token history as it stands now, into its record. */
export function rememberSession(msg) {
  const rec = saved.get(msg.chat);
  if (!rec) return false;
  rec.checkpoint = msg.checkpoint;
  rec.before_reply = msg.before_reply;
  if (rec.turn_at !== undefined && rec.turn_base === null) rec.turn_base = msg.checkpoint;  // a Regenerate's
  return true;
}

/** A reply starts in chat `id` after its first `at` messages: what the record holds before them is the part a
 *  merge may put another tab's turns after (the reply, and a new user message, stay last). A Regenerate
 *  starts from the history its session-saved is about to send. */
export function beginTurn(id, at, regenerate) {
  const rec = saved.get(id);
  if (!rec) return;
  rec.turn_at = at;
  rec.turn_base = regenerate ? null : rec.checkpoint;
  rec.turn_tab = TAB;
}

/** Write a chat's record: its saved history with the page's messages, partial reply and settings. */
export function saveChat(id, { messages, partialIds, streaming, settings }) {
  const rec = saved.get(id);
  if (!rec) return;
  rec.messages = messages;
  rec.partial_ids = partialIds;
  rec.streaming = streaming;  // a reply was streaming: after a reload it shows as interrupted
  if (settings) rec.settings = settings;
  if (!streaming) { delete rec.turn_at; delete rec.turn_base; delete rec.turn_tab; }
  return write(id);
}

let onMerged = () => {};
let onWritten = () => {};
let onFull = () => {};

/** What the page does when another tab's turns came into a chat's record (`merged(id, record, copied)`: the
 *  record now, to show and to reopen the worker's session from; `copied`: this tab's version of the chat,
 *  saved as a new chat, when the two could not be merged), after every write (`written`: the chat id), and when a write
 *  finds the quota full (`full`: the reason; from then on chats are kept in memory only). */
export function listen({ merged, written, full }) {
  onMerged = merged;
  onWritten = written;
  onFull = full;
  channel?.addEventListener("message", (e) => {
    const id = e.data?.chat;
    if (saved.has(id) && (e.data.version ?? 0) > (synced.get(id)?.version ?? -1)) refreshFromStore(id);
  });
}

function isQuotaError(err) {
  return err?.name === "QuotaExceededError" || /quota/i.test(String(err?.message ?? ""));
}

/** Why chat records are kept in memory only (a full quota), or null. */
export function memoryOnlyReason() {
  return memoryOnly;
}

// One write of chat `id`: the stored record is read and the new one put in one transaction; a version another
// tab wrote is merged with what this tab added since it last wrote (merge.js). Resolves once it is stored.
// Each record put names the tab that wrote it (`writer`). A page's kept write (recoverUnwritten: `revive`
// false, a record that is not stored, deleted since, is not written again; `tab`, the page that went) replaces
// a record that page wrote last as its own write would, whether or not that write landed before it went.
function write(id, { revive = true, tab } = {}) {
  if (!db || memoryOnly) return Promise.resolve();
  return new Promise((resolve) => {
    let tx;
    try { tx = db.transaction("chats", "readwrite"); } catch (err) { resolve(); return; }
    begun(id);
    const store = tx.objectStore("chats");
    let put = null;   // the record written
    let ours = null;  // this tab's record as it was when read for this write: the base of its next merge
    let merged = false;
    let copied = null;  // this tab's chat, kept as a chat of its own when it could not be merged
    const get = store.get(id);
    get.onsuccess = () => {
      const rec = saved.get(id);
      if (!rec) return;  // deleted meanwhile
      const stored = get.result;
      if (!stored && !revive) return;
      const mine = tab !== undefined && stored?.writer === tab ? { version: stored.version ?? 0, plain: true }
        : synced.get(id);
      ours = copy(rec);
      // Ours as it is, when the stored record is this tab's own last write (or the one it took); else a merge
      // (another tab wrote, or this tab's last write was a merge it has not taken yet: it lacks those turns).
      const own = !stored || !readable(stored) || (mine?.plain && (stored.version ?? 0) === mine.version);
      put = own ? ours : mergeRecords(mine?.base ?? null, stored, ours, TAB);
      if (put === null) {  // both tabs changed the chat in ways that do not add up: the stored one stands
        highest += 1;
        copied = { ...ours, id: `chat-${highest}`, title: `${ours.title} (from another tab)`.slice(0, 80), version: 1,
                   writer: TAB };
        store.put(copied);
        put = stored;
      } else {
        put.version = Math.max(stored?.version ?? 0, mine?.version ?? 0) + 1;
        put.writer = TAB;
        store.put(put);
      }
      merged = put !== ours;
    };
    tx.oncomplete = () => {
      if (put) {
        synced.set(id, { version: put.version, base: copied ? copy(put) : ours, plain: !merged || !!copied });
        channel?.postMessage({ chat: id, version: put.version });
        if (copied) {
          take(copied);
          channel?.postMessage({ chat: copied.id, version: 1 });
        }
        if (merged && saved.has(id)) onMerged(id, copy(put), copied);
        onWritten(id);
      }
      landed(id);
      resolve();
    };
    tx.onabort = () => {
      landed(id);
      if (isQuotaError(tx.error) && !memoryOnly) {
        memoryOnly = String(tx.error?.message || tx.error);
        onFull(memoryOnly);
      }
      resolve();
    };
  });
}

/** Take the stored record into this tab (its engine's session follows, via onMerged): after another tab's
 *  write, or once this chat is idle again. Resolves to whether it changed. */
export function refreshFromStore(id) {
  if (!db) return Promise.resolve(false);
  return new Promise((resolve) => {
    const get = chats("readonly").get(id);
    get.onsuccess = () => {
      const stored = get.result;
      const mine = synced.get(id);
      if (!stored || !readable(stored) || !saved.has(id) || (stored.version ?? 0) <= (mine?.version ?? -1)) {
        resolve(false);
        return;
      }
      onMerged(id, stored);
      resolve(true);
    };
    get.onerror = () => resolve(false);
  });
}

/** The page took `rec`, another tab's turns with this tab's: this tab's copy of the chat now. */
export function adopt(rec) {
  take(rec);
}

/** Whether `messages` (the page's, of chat `id`) are what this tab last wrote or took: nothing of its own is
 *  waiting to be written. */
export function unchangedSinceWrite(id, messages) {
  const base = synced.get(id)?.base;
  return !!base && !base.streaming && base.messages.length === messages.length &&
    base.messages.every((m, i) => m.role === messages[i].role && m.text === messages[i].text);
}

/** Whether chat `id` was deleted on this page (newChat never gives a new chat a used id). */
export function isDeleted(id) {
  return deleted.has(id);
}

export function deleteChat(id) {
  deleted.add(id);
  saved.delete(id);
  synced.delete(id);
  if (db && !memoryOnly) chats("readwrite").delete(id);
}
