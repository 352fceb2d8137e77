// The model list: the built-in models (assets.json) and the GGUF files the user opened (converted by the
// worker and kept in this browser's OPFS), with Open a GGUF model (file input or drag and drop) and
// Remove. Opening a model reloads the page with ?model=<id>, as the memory settings do; chats stay saved.
// Test models (assets.json's "test": the tiny random model answers noise) are listed only with ?test_models=1,
// or while the page runs one.
import { $, root } from "./page.js";

let engine = null;  // pagedkv.js's engine: its library holds the GGUF models
let builtIn = [];     // [{id, title, test}]
let userModels = [];  // [{id, name, bytes}] as the worker lists them
let loaded = null;    // the model the worker has loaded (model-ready)

function currentModel() {
  return loaded || new URLSearchParams(location.search).get("model") || "";
}

function openModel(id) {
  const params = new URLSearchParams(location.search);
  params.set("model", id);
  location.search = params.toString();
}

function modelItem(id, label, removable) {
  const li = document.createElement("li");
  const open = document.createElement("button");
  open.type = "button";
  open.textContent = label;
  open.dataset.model = id;
  open.setAttribute("aria-current", String(id === currentModel()));
  open.addEventListener("click", () => openModel(id));
  li.append(open);
  if (removable) {
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "remove-model";
    remove.textContent = "Remove";
    remove.title = `delete ${label} from this browser`;
    remove.addEventListener("click", () => engine.library.remove(id));
    li.append(remove);
  }
  return li;
}

function render() {
  const mib = (n) => `${(n / 2 ** 20).toFixed(1)} MiB`;
  const withTests = new URLSearchParams(location.search).get("test_models") === "1";
  const offered = builtIn.filter((m) => !m.test || withTests || m.id === currentModel());
  $("model-list").replaceChildren(
    ...offered.map((m) => modelItem(m.id, m.title, false)),
    ...userModels.map((m) => modelItem(m.id, `${m.name} (${mib(m.bytes)})`, true)));
  root.dataset.userModels = JSON.stringify(userModels);
}

function setStatus(state, text) {
  root.dataset.gguf = state;
  $("gguf-status").textContent = text;
  $("gguf-progress").hidden = state !== "working";
}

function openFile(file) {
  if (!file) return;
  if (!file.name.toLowerCase().endsWith(".gguf")) {
    setStatus("error", `${file.name} is not a .gguf file`);
    root.dataset.ggufError = $("gguf-status").textContent;
    return;
  }
  setStatus("working", `opening ${file.name}`);
  engine.library.open(file);
}

export function onModelReady(msg) {
  loaded = msg.model;
  render();
}

export function onUserModels(msg) {
  userModels = msg.models;
  render();
}

export function onProgress(msg) {
  setStatus("working", `${msg.file}: ${msg.detail}`);
  $("gguf-progress").max = msg.total;
  $("gguf-progress").value = msg.loaded;
}

export function onStored(msg) {
  setStatus("stored", `${msg.name} is converted and stored in this browser: opening it`);
  openModel(msg.id);
}

export function onError(msg) {
  setStatus("error", msg.message);
  root.dataset.ggufError = msg.message;
}

/** Wire the file input, drag and drop onto the page, and the built-in models of this build. */
export async function wireModels(e) {
  engine = e;
  $("gguf-input").addEventListener("change", (e) => { openFile(e.target.files[0]); e.target.value = ""; });
  document.addEventListener("dragover", (e) => { if (e.dataTransfer.types.includes("Files")) e.preventDefault(); });
  document.addEventListener("drop", (e) => {
    if (!e.dataTransfer.files.length) return;
    e.preventDefault();
    openFile(e.dataTransfer.files[0]);
  });
  const assets = await (await fetch("assets.json")).json();
  builtIn = Object.entries(assets.models).map(([id, m]) => ({ id, title: m.title, test: !!m.test }));
  render();
}
