// The KV memory panel: the block map (one cell per physical block, coloured by state and owner chat) and
// the pool's figures.
import { $, root } from "./page.js";

/** The colour a chat has in the block map and the conversation list. */
export function chatColor(id) {
  const n = parseInt(String(id).replace(/\D+/g, ""), 10) || 0;
  return `hsl(${(n * 137) % 360} 65% 50%)`;
}

function drawBlockMap(mem) {
  const canvas = $("block-map");
  const n = mem.cells.length;
  const cols = Math.ceil(Math.sqrt(n * 2));
  const rows = Math.ceil(n / cols);
  const size = Math.max(2, Math.floor(Math.min(canvas.clientWidth || 320, 640) / cols));
  canvas.width = cols * size;
  canvas.height = rows * size;
  const g = canvas.getContext("2d");
  g.fillStyle = "#fff";
  g.fillRect(0, 0, canvas.width, canvas.height);
  const colors = mem.owners.map(chatColor);
  const gap = size > 3 ? 1 : 0;
  for (let i = 0; i < n; i++) {
    const c = mem.cells.charCodeAt(i);  // see ChatService.memory_snapshot
    // f free, c cached, s shared, w a model's weights (several models, one pool), else the owner chat's colour
    g.fillStyle = c === 102 ? "#f2f2f2" : c === 99 ? "#c9c9c9" : c === 115 ? "#7a4cc2" : c === 119 ? "#333"
      : colors[c - 0x100];
    g.fillRect((i % cols) * size, Math.floor(i / cols) * size, size - gap, size - gap);
  }
  canvas.setAttribute("aria-label", `Block map: ${mem.used_blocks} used, ${mem.cached_blocks} cached, ` +
    `${mem.free_blocks} free of ${mem.total_blocks} blocks`);
}

/** Draw a `memory` snapshot from the worker; `modelInfo` is the model-ready message (null before it). */
export function renderMemory(mem, modelInfo) {
  drawBlockMap(mem);
  const pct = (x) => `${(100 * x).toFixed(1)} %`;
  const facts = [
    ["Model", mem.model],
    ["Blocks", `${mem.used_blocks} used · ${mem.cached_blocks} cached · ${mem.free_blocks} free / ${mem.total_blocks} (× ${mem.block_size} tokens)`],
    ["Utilization", pct(mem.utilization)],
    ["Slot efficiency", pct(mem.slot_efficiency)],
    ["Sharing factor", mem.sharing_factor.toFixed(2)],
    ["Tokens stored", mem.tokens_stored.toLocaleString()],
    ["Prefix-cache hit rate", pct(mem.prefix_hit_rate)],
    ["Tokens / s", mem.tokens_per_s.toFixed(1)],
    ["Blocks per chat", Object.entries(mem.per_chat_blocks).map(([k, v]) => {
      const model = mem.owner_models?.[mem.owners.indexOf(k)];  // several models: whose chat it is
      return model ? `${k} (${model}): ${v}` : `${k}: ${v}`;
    }).join(", ") || "–"],
    ["Preemptions", `swap ${mem.engine.preemptions.swap} · recompute ${mem.engine.preemptions.recompute}`],
  ];
  if ((mem.groups || []).length > 1) {  // KV groups (kv/groups.py): window groups hold only their window
    const byKind = {};
    mem.groups.forEach((label, g) => {
      const k = (byKind[label] ??= { groups: 0, blocks: 0 });
      k.groups += 1;
      k.blocks += mem.group_used_blocks[g] ?? 0;
    });
    facts.push(["KV groups", Object.entries(byKind).map(([label, k]) =>
      `${label}: ${k.blocks} blocks in ${k.groups} group${k.groups > 1 ? "s" : ""}`).join(" · ")]);
  }
  if (mem.models) {  // several models in one pool of pages: what each holds
    facts.push(["Models", Object.entries(mem.models).map(([m, v]) =>
      `${m}: ${v.kv_pages} KV + ${v.weights_pages} weights${v.null_pages ? ` + ${v.null_pages} null` : ""} pages ` +
      `(× ${v.block_size} tokens)`).join(" · ")]);
  }
  if (modelInfo && modelInfo.bytes_per_token) {
    facts.push(["KV bytes / token", `${modelInfo.bytes_per_token.toLocaleString()} B (${modelInfo.kv_dtype || "f32"}) · ` +
      `${(modelInfo.bytes_per_token * mem.block_size / 1024).toFixed(0)} KiB per block`]);
  }
  const e = mem.engine;
  if (modelInfo && modelInfo.bytes_per_token) {  // the middle tier in wasm memory: swapped chats, cached blocks
    const block = modelInfo.bytes_per_token * mem.block_size;
    const held = e.cpu_used_blocks + e.cpu_cached_blocks;
    facts.push(["CPU memory (KV)", `${held} of ${e.cpu_blocks} blocks (${e.cpu_used_blocks} swapped, ` +
      `${e.cpu_cached_blocks} cached), ${(held * block / 2 ** 20).toFixed(1)} of ` +
      `${(e.cpu_blocks * block / 2 ** 20).toFixed(1)} MiB`]);
  }
  if (e.disk_blocks !== undefined) {  // the disk tier (OPFS) is on
    const mib = (b) => (b / 2 ** 20).toFixed(1);
    facts.push(["On disk", `${e.disk_blocks} blocks, ${mib(e.disk_bytes)} MiB (budget ${mib(e.disk_budget_bytes)} MiB)`]);
    facts.push(["Restored from disk", `${e.last_disk_restored_tokens} tokens (last turn)`]);
    if (e.disk_notes.length) facts.push(["Disk note", e.disk_notes[e.disk_notes.length - 1]]);
  } else if (modelInfo && modelInfo.kv_disk) {
    facts.push(["On disk", modelInfo.kv_disk]);
  }
  if (mem.ledger) {
    const mib = (b) => (b / 2 ** 20).toFixed(1);
    const kinds = Object.entries(mem.ledger.by_kind || {}).map(([k, b]) => `${k} ${mib(b)}`).join(" · ");
    facts.push(["GPU budget", `${mib(mem.ledger.used_bytes)} of ${mib(mem.ledger.budget_bytes)} MiB` +
      (kinds ? ` (${kinds} MiB)` : "")]);
  }
  $("memory-facts").replaceChildren(...facts.flatMap(([k, v]) => {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    return [dt, dd];
  }));
  root.dataset.memory = JSON.stringify({ used: mem.used_blocks, cached: mem.cached_blocks, free: mem.free_blocks,
    total: mem.total_blocks, per_chat: mem.per_chat_blocks, owners: mem.owners, owner_models: mem.owner_models ?? null,
    cpu_blocks: e.cpu_blocks, cpu_used: e.cpu_used_blocks, cpu_cached: e.cpu_cached_blocks,
    disk_blocks: e.disk_blocks ?? null, disk_note: e.disk_notes?.at(-1) ?? null, restored: e.last_disk_restored_tokens ?? null,
    prefill_tokens: e.prefill_tokens, disk_corrupt: e.disk_corrupt_blocks ?? null,
    groups: mem.groups ?? null, group_used: mem.group_used_blocks ?? null });
}
