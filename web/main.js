// UI thread: starts the worker (where Pyodide and all compute live) and renders what it posts. Every
// message the worker posts goes through the one table below.
import * as alt from "./alternatives.js";
import * as boot from "./boot.js";
import * as chat from "./chat.js";
import { renderMarkdown } from "./markdown.js";
import * as models from "./models.js";
import * as store from "./store.js";

// The alternatives' messages change their chat's state; its view follows.
const altThenRefresh = (handle) => (msg) => { handle(msg); chat.refresh(msg.chat); };
// A deleted chat stays deleted: what the worker still posts about it (the reply it was streaming, a session-saved
// sent before it had the delete) is dropped, so nothing shows or stores it again.
const unlessDeleted = (handle) => (msg) => { if (!store.isDeleted(msg.chat)) handle(msg); };

function handlers(execResult) {
  return {
    "exec-result": execResult,
    progress: (msg) => boot.showStage(msg.stage, msg.detail),
    ready: (msg) => { boot.showReady(msg); chat.showChatApp(); },
    error: (msg) => boot.showError(msg.message, msg.detail),
    "no-webgpu": (msg) => { boot.showNoWebGPU(msg.message); chat.showChatApp(); },
    "device-lost": boot.onDeviceLost,
    "device-restored": chat.onDeviceRestored,
    "model-progress": chat.onModelProgress,
    "model-ready": (msg) => { chat.onModelReady(msg); models.onModelReady(msg); },
    "model-error": chat.onModelError,
    "turn-start": unlessDeleted(chat.onTurnStart),
    token: unlessDeleted(chat.onToken),
    "turn-end": unlessDeleted(chat.onTurnEnd),
    "session-saved": unlessDeleted(chat.onSessionSaved),
    "chat-error": chat.onChatError,
    "engine-error": chat.onEngineError,
    memory: chat.onMemory,
    "disk-flushed": chat.onDiskFlushed,
    "alt-start": unlessDeleted(altThenRefresh(alt.onAltStart)),
    "alt-token": unlessDeleted(altThenRefresh(alt.onAltToken)),
    "alt-end": unlessDeleted(altThenRefresh(alt.onAltEnd)),
    "alt-kept": unlessDeleted(altThenRefresh(alt.onAltKept)),
    "user-models": models.onUserModels,
    "gguf-progress": models.onProgress,
    "gguf-stored": models.onStored,
    "gguf-error": models.onError,
  };
}

function start() {
  if (!window.crossOriginIsolated) {
    console.warn("page is not cross-origin isolated; serve it with `python3 build.py serve`");
  }
  chat.showSavedChats();  // from IndexedDB at once: Python and the model take seconds (or fail to start)
  let worker;
  try {
    worker = new Worker("worker.js" + location.search);
  } catch (err) {
    boot.showError(`Could not start the worker: ${err.message}`);
    return;
  }
  const execs = new Map();  // exec id -> {resolve, reject}
  let nextId = 1;
  // window.pagedkv.exec(code): run Python in the worker; resolves to the JSON text of its last expression.
  // renderMarkdown(text): the reply renderer, for tests of its escaping.
  window.pagedkv = {
    exec(code) {
      const id = nextId++;
      return new Promise((resolve, reject) => {
        execs.set(id, { resolve, reject });
        worker.postMessage({ type: "exec", id, code });
      });
    },
    renderMarkdown,
  };
  const table = handlers((msg) => {
    const p = execs.get(msg.id);
    execs.delete(msg.id);
    if (msg.ok) p.resolve(msg.json); else p.reject(new Error(msg.error));
  });
  worker.onmessage = (event) => {
    const handle = table[event.data.type];
    if (!handle) throw new Error(`the worker posted an unknown message type ${event.data.type}`);
    handle(event.data);
  };
  chat.wireChatUI(worker);
  models.wireModels(worker);
  worker.onerror = (event) => {
    event.preventDefault();
    boot.showError(`The engine worker failed: ${event.message || "unknown error"}`);
  };
}

start();
