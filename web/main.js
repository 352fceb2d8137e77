// UI thread: opens the engine through pagedkv.js (its worker holds Pyodide and all compute; this page never
// talks to the worker itself) and renders its events. Every event goes through the one table below.
import * as alt from "./alternatives.js";
import * as boot from "./boot.js";
import * as chat from "./chat.js";
import { renderMarkdown } from "./markdown.js";
import * as models from "./models.js";
import { openEngine } from "./pagedkv.js";
import * as store from "./store.js";

// The alternatives' messages change their chat's state; its view follows.
const altThenRefresh = (handle) => (msg) => { handle(msg); chat.refresh(msg.chat); };
// A deleted chat stays deleted: what the worker still posts about it (the reply it was streaming, a session-saved
// sent before it had the delete) is dropped, so nothing shows or stores it again.
const unlessDeleted = (handle) => (msg) => { if (!store.isDeleted(msg.chat)) handle(msg); };

function handlers() {
  return {
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
  let engine;
  try {
    // The page's own URL parameters (model, backend, budget_mib, models, ...) go to the engine as they are.
    engine = openEngine({ params: new URLSearchParams(location.search) });
  } catch (err) {
    boot.showError(`Could not start the engine: ${err.message}`);
    return;
  }
  engine.ready.catch(() => {});  // a failed load is an `error` / `model-error` event, shown by the table
  // window.pagedkv.exec(code): run Python in the worker; resolves to the JSON text of its last expression.
  // renderMarkdown(text): the reply renderer, for tests of its escaping. engine: the page's engine.
  window.pagedkv = { exec: (code) => engine.exec(code), renderMarkdown, engine };
  const table = handlers();
  engine.on("*", (msg) => {
    const handle = table[msg.type];
    if (!handle) throw new Error(`the engine sent an unknown event ${msg.type}`);
    handle(msg);
  });
  chat.wireChatUI(engine);
  models.wireModels(engine);
}

start();
