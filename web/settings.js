// The settings forms: generation settings (they belong to a chat), the fallback server (remembered in
// this browser) and the memory settings (they rebuild the engine through the URL).
import { $ } from "./page.js";
import { ui } from "./state.js";

// Generation settings belong to a chat: the form shows the chat in view's, edits are saved with it
// (IndexedDB), and a new chat starts from the values the form holds.
const SETTING_FIELDS = { temperature: "set-temperature", top_p: "set-top-p", max_tokens: "set-max-tokens",
                         seed: "set-seed", system: "set-system" };

export function readSettingsForm() {
  return Object.fromEntries(Object.entries(SETTING_FIELDS).map(([key, id]) => [key, $(id).value]));
}

export function showChatSettings(id) {
  if (!ui.settings[id]) ui.settings[id] = readSettingsForm();
  for (const [key, field] of Object.entries(SETTING_FIELDS)) $(field).value = ui.settings[id][key] ?? "";
}

/** The settings a send / regenerate / alternatives request carries. */
export function requestSettings() {
  const v = (id) => $(id).value;
  return { ...readSettingsForm(), priority: 1,
           fallback_url: v("set-fallback-url").trim(), fallback_model: v("set-fallback-model").trim(),
           fallback_mode: v("set-fallback-mode") };
}

/** onEdited() after every edit of a generation setting. */
export function wireGenerationSettings(onEdited) {
  for (const id of Object.values(SETTING_FIELDS)) $(id).addEventListener("input", onEdited);
}

// The fallback server is remembered in this browser (localStorage); empty URL = off, the default.
const FALLBACK_FIELDS = ["set-fallback-url", "set-fallback-model", "set-fallback-mode"];

export function wireFallbackSettings() {
  let stored = {};
  try { stored = JSON.parse(localStorage.getItem("pagedkv.fallback") || "{}"); } catch (err) { stored = {}; }
  for (const id of FALLBACK_FIELDS) {
    if (typeof stored[id] === "string") $(id).value = stored[id];
    $(id).addEventListener("change", () => {
      const values = Object.fromEntries(FALLBACK_FIELDS.map((f) => [f, $(f).value.trim()]));
      try { localStorage.setItem("pagedkv.fallback", JSON.stringify(values)); } catch (err) { /* private mode */ }
    });
  }
}

export function wireMemorySettings() {
  const params = new URLSearchParams(location.search);
  if (params.get("budget_mib")) $("mem-budget").value = params.get("budget_mib");
  if (params.get("block_size")) $("mem-block-size").value = params.get("block_size");
  if (params.get("max_context")) $("mem-max-context").value = params.get("max_context");
  if (params.get("kv_dtype")) $("mem-kv-dtype").value = params.get("kv_dtype");
  if (params.get("cpu_mib")) $("mem-cpu-budget").value = params.get("cpu_mib");
  if (params.get("disk_mib")) $("mem-disk-budget").value = params.get("disk_mib");
  $("mem-kv-disk").checked = params.get("kv_disk") !== "0";
  $("memory-form").addEventListener("submit", (e) => {
    e.preventDefault();
    // Pool geometry is fixed when the engine starts: rebuild by restarting it with the new settings.
    // Chats live in IndexedDB with their exact token history, so they come back and re-prefill.
    params.set("budget_mib", $("mem-budget").value);
    params.set("block_size", $("mem-block-size").value);
    if (!$("mem-kv-dtype").disabled) params.set("kv_dtype", $("mem-kv-dtype").value);
    params.set("cpu_mib", $("mem-cpu-budget").value);
    params.set("disk_mib", $("mem-disk-budget").value);
    if ($("mem-kv-disk").checked) params.delete("kv_disk");
    else params.set("kv_disk", "0");
    if ($("mem-max-context").value) params.set("max_context", $("mem-max-context").value);
    else params.delete("max_context");
    location.search = params.toString();
  });
}
