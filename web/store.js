// Chats persist in IndexedDB, one record per chat: {id, title, messages, checkpoint, before_reply,
// partial_ids, settings}. The worker sends the exact token history (checkpoint) after every turn; the
// reply streaming now is saved while it streams (its token ids as partial_ids), so a reload keeps it.

let db = null;
const saved = new Map();  // chat id -> its record as last written

export function openStore() {
  return new Promise((resolve) => {
    let req;
    try { req = indexedDB.open("pagedkv", 1); } catch (err) { resolve(null); return; }
    req.onupgradeneeded = () => req.result.createObjectStore("chats", { keyPath: "id" });
    req.onsuccess = () => { db = req.result; resolve(db); };
    req.onerror = () => { console.warn("IndexedDB unavailable: chats will not survive a reload"); resolve(null); };
  });
}

function chats(mode) { return db.transaction("chats", mode).objectStore("chats"); }

/** Every saved record (none without IndexedDB); each is remembered as the chat's saved record. */
export function loadRecords() {
  if (!db) return Promise.resolve([]);
  return new Promise((resolve) => {
    const r = chats("readonly").getAll();
    r.onsuccess = () => {
      for (const rec of r.result) saved.set(rec.id, rec);
      resolve(r.result);
    };
    r.onerror = () => resolve([]);
  });
}

/** The worker's chat-saved message: the chat's title and exact token history, as it stands now. */
export function rememberSaved(msg) {
  saved.set(msg.chat, { id: msg.chat, title: msg.title, checkpoint: msg.checkpoint, before_reply: msg.before_reply });
}

/** Write a chat's record: its saved history with the page's messages, partial reply and settings. */
export function saveChat(id, { messages, partialIds, settings }) {
  const rec = saved.get(id);
  if (!rec) return;
  rec.messages = messages;
  rec.partial_ids = partialIds;
  if (settings) rec.settings = settings;
  if (db) chats("readwrite").put(JSON.parse(JSON.stringify(rec)));
}

export function deleteChat(id) {
  saved.delete(id);
  if (db) chats("readwrite").delete(id);
}
