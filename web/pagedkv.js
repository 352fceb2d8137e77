// PagedKV as a library for any page on this origin: OpenAI Chat Completions (and legacy Completions) in the tab.
//
//   import { createEngine } from "/pagedkv.js";
//   const engine = await createEngine({ model: "smollm2-135m-instruct", onProgress: (p) => console.log(p.text) });
//   const reply = await engine.chat.completions.create({ model: engine.model, messages: [...] });
//   for await (const chunk of await engine.chat.completions.create({ ..., stream: true })) ...
//   const text = await engine.completions.create({ model: engine.model, prompt: "Once upon a time" });  // no template
//   const openai = new OpenAI({ baseURL: location.origin + "/v1", apiKey: "none", fetch: engine.fetch,
//                               dangerouslyAllowBrowser: true });
//
// The engine runs in its own worker (worker.js beside this file: Pyodide, the model, the paged KV cache); this
// module only speaks the worker's api-* messages (docs/api.md). Errors are ApiError: status, OpenAI's error JSON.

export class ApiError extends Error {
  constructor(status, body) {
    super(body?.error?.message || `error ${status}`);
    this.name = "ApiError";
    this.status = status;
    this.body = body;
    this.param = body?.error?.param ?? null;
  }
}

const MAX_BODY_BYTES = 8 << 20;  // a JSON body engine.fetch takes, as pagedkv/request_limits.py's MAX_BODY_BYTES

const QUERY_OPTIONS = { model: "model", backend: "backend", budgetMiB: "budget_mib", kvDtype: "kv_dtype" };

// options.models: several models in one engine, one budget and one KV pool (["smollm2-135m-instruct",
// "tiny-random"]); the first is `engine.model`. options.model: one model (the same as models: [model]). A
// model is a built-in id, a GGUF the user opened before ("gguf:<file name>", kept in this origin's storage), or a
// GGUF File / Blob: converted and stored in the worker as the chat page's "Open GGUF" does, then named
// "gguf:<file name>" (a Blob without a name is "model.gguf").
export async function createEngine(options = {}) {
  const engine = openEngine(options);
  try {
    await engine.ready;
  } catch (err) {  // the caller gets no handle to close it: its worker goes now
    engine.close();
    throw err;
  }
  return engine;
}

const closedError = () => new ApiError(503, { error: { message: "the engine is closed", type: "service_unavailable",
                                                       param: null, code: null } });

// The engine at once, before its models are in (createEngine waits for them): its worker boots now,
// `engine.ready` resolves when the models are loaded (rejects with the load's error) and `engine.on(type, fn)`
// hears every event as it comes (boot progress, the adapter, the model's progress, the chat sessions' turns
// and tokens, memory snapshots, ...: docs/api.md, "Events"). options.params: more of the chat page's URL
// parameters for the worker (URLSearchParams or an object: block_size, kv_mib, test_models, ...).
export function openEngine(options = {}) {
  const url = new URL("worker.js", import.meta.url);
  for (const [key, value] of new URLSearchParams(options.params ?? {})) url.searchParams.set(key, value);
  const models = options.models ?? (options.model !== undefined ? [options.model] : []);
  const files = [];
  const names = Array.isArray(models) ? models.map((m) => {
    if (typeof Blob !== "undefined" && m instanceof Blob) {
      files.push(m instanceof File ? m : new File([m], "model.gguf"));
      return `file:${files.length - 1}`;  // the worker waits for it (app/pagedkv_app/main.py, requested_models)
    }
    return m;
  }) : null;
  if (!names || names.some((m) => typeof m !== "string" || !m || m.includes(","))) {
    throw new TypeError("models must be an array of model ids and GGUF Files / Blobs");
  }
  options = { ...options, model: names[0] };
  for (const [key, param] of Object.entries(QUERY_OPTIONS)) {
    if (options[key] !== undefined) url.searchParams.set(param, String(options[key]));
  }
  if (names.length > 1) url.searchParams.set("models", names.join(","));
  return new Engine(new Worker(url), options.onProgress, files);
}

class Engine {
  constructor(worker, onProgress, files = []) {
    this.worker = worker;
    this.requests = new Map();  // id -> {push(msg)}: the api-* and exec answers of one request
    this.listeners = new Map();  // event type ("*": every one) -> Set of handlers
    this.nextId = 1;
    this.closed = false;
    this.ready = new Promise((resolve, reject) => {
      this.failReady = reject;
      worker.onmessage = ({ data: msg }) => {
        if (msg.type === "progress" || msg.type === "model-progress" || msg.type === "gguf-progress") {
          const fraction = msg.total ? msg.loaded / msg.total : null;
          const stage = msg.type === "gguf-progress" ? `gguf-${msg.stage}` : msg.stage || "model";
          onProgress?.({ stage, fraction, text: msg.detail });
        } else if ((msg.type === "ready" || msg.type === "no-webgpu") && files.length) {
          // Python is up: the GGUFs go over now (the worker waits for them before it loads the models)
          files.forEach((file, slot) => worker.postMessage({ type: "open-gguf", file, slot }));
          files = [];
        } else if (msg.type === "model-ready") {
          this.info = msg;
          this.model = msg.model;
          resolve();
        } else if (msg.type === "model-error" || msg.type === "error") {
          reject(new Error(msg.message));
        }
        if (msg.id !== undefined && (msg.type?.startsWith("api-") || msg.type === "exec-result")) {
          this.requests.get(msg.id)?.push(msg);
        } else this.emit(msg);
      };
      worker.onerror = (event) => {
        event.preventDefault();
        const message = `The engine worker failed: ${event.message || "unknown error"}`;
        this.emit({ type: "error", kind: "worker", message });
        reject(new Error(message));
      };
    });
    this.chat = { completions: { create: (body, opts) => this.create(body, opts) } };
    // OpenAI's legacy Completions: the prompt continued as it is (base models have no chat template).
    this.completions = { create: (body, opts) => this.create(body, opts, true) };
    this.models = { list: async () => {
      this.open();
      return { object: "list", data: (this.info.models || [this.model]).map((id) => ({
        id, object: "model", created: 0, owned_by: "pagedkv" })) };
    } };
    this.fetch = (input, init) => this.handleFetch(input, init);
    const post = (msg) => {
      this.open();
      this.worker.postMessage(msg);
    };
    // Chats with a memory (the chat page's): each keeps its exact token history, KV blocks and disk-tier
    // checkpoints in the worker and streams its turns as events (turn-start, token, turn-end, alt-*, ...).
    this.chats = {
      send: (chat, text, settings = {}, model = undefined) => post({ type: "send", chat, text, settings, model }),
      regenerate: (chat, settings = {}) => post({ type: "regenerate", chat, settings }),
      alternatives: (chat, settings = {}, n = 3) => post({ type: "alternatives", chat, settings, n }),
      keepAlternative: (chat, index) => post({ type: "keep-alternative", chat, index }),
      stop: (chat) => post({ type: "stop", chat }),
      forget: (chat) => post({ type: "forget-session", chat }),
      open: (sessions) => post({ type: "open-sessions", sessions }),
      flushDisk: () => post({ type: "flush-disk" }),
    };
    // The GGUF models kept in this origin's storage (events user-models, gguf-progress, gguf-stored, gguf-error).
    this.library = {
      open: (file) => post({ type: "open-gguf", file }),
      remove: (id) => post({ type: "remove-model", id }),
    };
  }

  // engine.on("token", (msg) => ...): every event of that type from now on ("*": every event); returns a
  // function that stops it.
  on(type, handle) {
    if (!this.listeners.has(type)) this.listeners.set(type, new Set());
    this.listeners.get(type).add(handle);
    return () => this.listeners.get(type).delete(handle);
  }

  emit(msg) {
    for (const type of [msg.type, "*"]) for (const handle of this.listeners.get(type) ?? []) handle(msg);
  }

  // Run Python in the engine's worker (tools and tests): resolves to the JSON text of its last expression.
  exec(code) {
    return this.ask({ type: "exec", code }).then((msg) => {
      if (!msg.ok) throw new Error(msg.error?.error?.message ?? msg.error);
      return msg.json;
    });
  }

  // Drop an API session (`pagedkv: {session}`): its token history and its blocks in the prefix cache. Resolves
  // to whether there was one.
  forget(session) {
    return this.ask({ type: "api-forget", session }).then((msg) => msg.forgotten);
  }

  // Post `msg` with a fresh id; resolves with the one answer that carries the id, rejects with an ApiError for
  // an api-error (a closed engine's at once).
  ask(msg) {
    const id = `${msg.type}-${this.nextId++}`;
    return new Promise((resolve, reject) => {
      this.open();
      this.requests.set(id, { push: (answer) => {
        this.requests.delete(id);
        if (answer.type === "api-error") reject(new ApiError(answer.status, answer.error));
        else resolve(answer);
      } });
      this.worker.postMessage({ ...msg, id });
    });
  }

  // Throws the closed engine's ApiError (503) once close() was called.
  open() {
    if (this.closed) throw closedError();
  }

  // {model: LLMEngine.stats()} per model: its KV pool (num_blocks, used_blocks, free_blocks, cached_blocks),
  // running and waiting requests, preemptions, prefill / decode token counters, bytes per token; with several
  // models also `pool`: the shared pages (pages, free, cached, reserved, and per model its KV and weights pages).
  stats() {
    return this.ask({ type: "api-stats" }).then((msg) => msg.stats);
  }

  // Stop a model's requests (their streams end) and give its weights' and KV pages back to the others. The
  // first model (the chat page's) stays; ApiError 404 for a model not loaded.
  unload(model) {
    return this.modelChange("api-unload", model,
                            () => (this.info.models || [this.model]).filter((m) => m !== model));
  }

  // Load another model at run time into an engine made with several (its weights take pages of the budget):
  // ApiError 413 with the numbers when they are not free now, 404 for no such model, 400 for an engine of one
  // model or a model loaded already.
  load(model) {
    return this.modelChange("api-load", model, () => [...(this.info.models || [this.model]), model]);
  }

  modelChange(type, model, models) {
    return this.ask({ type, model }).then(() => { this.info.models = models(); });
  }

  // One request: its chunks as an async iterator (stream: true) or joined into a chat.completion (legacy: a
  // legacy Completions body, its text_completion pieces or the text_completion).
  async create(body, { signal } = {}, legacy = false) {
    this.open();
    const chunks = this.start(body, signal, legacy);
    const first = await chunks.next();  // a refused request throws here, before anything streams
    if (body?.stream) return prepend(first, chunks);
    return collect(first, chunks, signal, legacy);
  }

  start(body, signal, legacy) {
    const id = `${legacy ? "cmpl" : "chatcmpl"}-${this.nextId++}`;
    const queue = [];
    let wake = null;
    this.requests.set(id, { push: (msg) => { queue.push(msg); wake?.(); } });
    const abort = () => { this.worker.postMessage({ type: "api-abort", id }); wake?.(); };
    signal?.addEventListener("abort", abort, { once: true });
    this.worker.postMessage({ type: "api-request", id, body, legacy });
    const requests = this.requests;
    return (async function* () {
      let ended = false;
      try {
        for (;;) {
          while (!queue.length && !signal?.aborted) await new Promise((resolve) => { wake = resolve; });
          // Aborted by its signal: the stream ends here, without an error (as the openai client's does), and
          // the chunks the worker sent before it heard of the abort are not handed out.
          if (signal?.aborted) return;
          const msg = queue.shift();
          if (msg.type === "api-chunk") yield msg.chunk;
          else {
            ended = true;
            if (msg.type === "api-error") throw new ApiError(msg.status, msg.error);
            return;  // api-end
          }
        }
      } finally {  // the caller stopped reading before the end: the worker stops it and frees its KV blocks
        requests.delete(id);
        if (!ended && !signal?.aborted) abort();  // an aborted signal's listener told the worker already
        signal?.removeEventListener("abort", abort);
      }
    })();
  }

  // fetch-compatible: POST <any base>/v1/chat/completions and <any base>/v1/completions (legacy: a prompt, no
  // chat template) answer JSON, or server-sent events when streaming; GET <any base>/v1/models; anything else is
  // a 404 in OpenAI's error JSON.
  async handleFetch(input, init = {}) {
    const request = new Request(input, init);
    const path = new URL(request.url).pathname;
    try {
      if (request.method === "GET" && path.endsWith("/v1/models")) return json(200, await this.models.list());
      const legacy = path.endsWith("/v1/completions");
      if (request.method !== "POST" || !(legacy || path.endsWith("/v1/chat/completions"))) {
        throw new ApiError(404, { error: { message: `no route ${request.method} ${path}`, type: "not_found_error" } });
      }
      let body;
      try {
        // Bounded before it is parsed (pagedkv/request_limits.py: the worker bounds messages and text too).
        const declared = Number(request.headers.get("content-length") ?? 0);
        const bytes = declared > MAX_BODY_BYTES ? null : await request.arrayBuffer();
        if (bytes === null || bytes.byteLength > MAX_BODY_BYTES) {
          throw new ApiError(413, { error: { message: `the body is ${(bytes?.byteLength ?? declared).toLocaleString("en-US")} `
            + `bytes; one request takes at most ${MAX_BODY_BYTES.toLocaleString("en-US")}`,
                                             type: "invalid_request_error", param: null, code: null } });
        }
        body = JSON.parse(new TextDecoder().decode(bytes));
      } catch (err) {
        if (err instanceof ApiError) throw err;
        throw new ApiError(400, { error: { message: `the body is not JSON: ${err.message}`,
                                           type: "invalid_request_error" } });
      }
      // As fetch does: an aborted signal rejects the call, or errors the body being read, with an AbortError.
      const signal = init.signal ?? request.signal;
      const abortError = () => new DOMException("The operation was aborted.", "AbortError");
      if (signal?.aborted) throw abortError();
      const result = await this.create(body, { signal }, legacy);
      if (signal?.aborted) throw abortError();
      if (!body.stream) return json(200, result);
      const encoder = new TextEncoder();
      const stream = new ReadableStream({
        start(controller) {
          signal?.addEventListener("abort", () => { controller.error(abortError()); result.return(); },
                                  { once: true });
        },
        async pull(controller) {
          let value, done;
          try {
            ({ value, done } = await result.next());
          } catch (err) {  // ended by the engine mid-stream (its model unloaded, the engine closed): as OpenAI's
            if (!(err instanceof ApiError)) throw err;  // streams say it, an `error` event and no [DONE]
            controller.enqueue(encoder.encode(`data: ${JSON.stringify(err.body)}\n\n`));
            controller.close();
            return;
          }
          if (signal?.aborted) return;  // errored already
          if (done) {
            controller.enqueue(encoder.encode("data: [DONE]\n\n"));
            controller.close();
          } else controller.enqueue(encoder.encode(`data: ${JSON.stringify(value)}\n\n`));
        },
        cancel() { result.return(); },
      });
      return new Response(stream, { status: 200, headers: { "content-type": "text/event-stream" } });
    } catch (err) {
      if (err instanceof ApiError) return json(err.status, err.body);
      throw err;
    }
  }

  // Terminate the worker: requests running and calls waiting reject with ApiError 503 (as does `ready` when
  // it had not resolved), and so does every later call.
  close() {
    if (this.closed) return;
    this.closed = true;
    this.worker.terminate();
    const { status, body } = closedError();
    for (const request of [...this.requests.values()]) request.push({ type: "api-error", status, error: body });
    this.failReady(closedError());
  }
}

async function* prepend(first, rest) {
  try {
    if (!first.done) yield first.value;
    yield* rest;
  } finally {  // a caller that stops after the first chunk stops the request too
    await rest.return();
  }
}

async function collect(first, rest, signal, legacy) {
  const texts = new Map();
  const calls = new Map();  // choice index -> its tool calls, assembled from their deltas (as api._collect)
  const reasons = new Map();
  const logprobs = new Map();  // each choice's chunks' logprobs (pagedkv.logprobs.join_logprobs joins them)
  let head = null;
  let usage = null;
  for await (const chunk of prepend(first, rest)) {
    head ??= chunk;
    for (const choice of chunk.choices) {
      const piece = legacy ? choice.text : choice.delta.content;
      texts.set(choice.index, (texts.get(choice.index) || "") + (piece || ""));
      for (const delta of (legacy ? null : choice.delta.tool_calls) ?? []) {
        if (!calls.has(choice.index)) calls.set(choice.index, []);
        const made = calls.get(choice.index);
        if (delta.id) made.push({ id: delta.id, type: delta.type, function: { ...delta.function } });
        else made[delta.index].function.arguments += delta.function.arguments;
      }
      if (choice.finish_reason) reasons.set(choice.index, choice.finish_reason);
      if (choice.logprobs) logprobs.set(choice.index, [...(logprobs.get(choice.index) || []), choice.logprobs]);
    }
    if (chunk.usage) usage = chunk.usage;
  }
  if (signal?.aborted) throw new DOMException("the request was aborted", "AbortError");  // as fetch rejects
  const indices = [...texts.keys()].sort((a, b) => a - b);
  if (legacy) {  // as pagedkv.completions.completion(legacy=True) builds it
    const choices = indices.map((index) => ({ text: texts.get(index), index,
                                              logprobs: joinLogprobs(logprobs.get(index), legacy),
                                              finish_reason: reasons.get(index) ?? null }));
    return { id: head.id, object: "text_completion", created: head.created, model: head.model, choices, usage,
             system_fingerprint: null };
  }
  const message = (index) => (calls.has(index)  // as pagedkv.completions.completion builds it
    ? { role: "assistant", content: texts.get(index) || null, tool_calls: calls.get(index) }
    : { role: "assistant", content: texts.get(index) });
  const choices = indices.map((index) => ({
    index, message: message(index), logprobs: joinLogprobs(logprobs.get(index), legacy),
    finish_reason: reasons.get(index) ?? null,
  }));
  return { id: head.id, object: "chat.completion", created: head.created, model: head.model, choices, usage,
           system_fingerprint: null };
}

// As pagedkv.logprobs.join_logprobs: one choice's logprobs from its chunks' (null when none had any).
function joinLogprobs(parts, legacy) {
  if (!parts) return null;
  if (legacy) {
    const keys = ["tokens", "token_logprobs", "top_logprobs", "text_offset"];
    return Object.fromEntries(keys.map((key) => [key, parts.flatMap((part) => part[key])]));
  }
  return { content: parts.flatMap((part) => part.content), refusal: null };
}

function json(status, value) {
  return new Response(JSON.stringify(value), { status, headers: { "content-type": "application/json" } });
}
