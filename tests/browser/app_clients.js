// An app's module, as an app writes it: the Vercel AI SDK (ai, @ai-sdk/openai-compatible, zod) and the official
// openai client talking to pagedkv.js's engine through engine.fetch, unchanged. test_app_clients_page.py bundles it
// with esbuild (as an app's build does) and serves it to /examples/api.html, whose window.engine it is given.
// Every request body the clients send is kept (`requests`), so a test can say what they send.
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateObject, generateText, isStepCount, Output, streamText, tool } from "ai";
import { OpenAI } from "openai";
import { z } from "zod";

const PERSON = z.object({ name: z.string(), age: z.number().int() });
const WEATHER = { description: "The weather in a city now", inputSchema: z.object({ city: z.string() }) };
const WEATHER_JSON = { type: "object", properties: { city: { type: "string" } }, required: ["city"],
                       additionalProperties: false };
const ASK_WEATHER = "What is the weather in Paris? Use the weather tool.";

export function connect(engine) {
  const requests = [];
  const fetch = async (input, init) => {  // engine.fetch, with each body kept as sent and each answer's text
    if (!init?.body) return engine.fetch(input, init);
    const request = { path: new URL(String(input?.url ?? input)).pathname, body: JSON.parse(init.body) };
    requests.push(request);
    const response = await engine.fetch(input, init);
    request.answer = response.clone().text().then((text) => `${response.status} ${text}`);
    return response;
  };
  const baseURL = location.origin + "/v1";
  // supportsStructuredOutputs: without it the provider sends a schema-less {type: "json_object"} and warns.
  const pagedkv = createOpenAICompatible({ name: "pagedkv", baseURL, fetch, supportsStructuredOutputs: true });
  const openai = new OpenAI({ baseURL, apiKey: "unused", fetch, dangerouslyAllowBrowser: true, maxRetries: 0 });
  return { model: pagedkv(engine.model), openai, id: engine.model, requests };
}

// Each function below runs one scenario and returns what a test checks (JSON), its request bodies included.
async function kept(app, run) {
  const from = app.requests.length;
  const requests = () => Promise.all(app.requests.slice(from).map(async (r) => ({ ...r, answer: await r.answer })));
  try {
    return { ...(await run()), requests: await requests() };
  } catch (err) {  // what a test shows when a scenario fails: the error, and the requests and answers before it
    return { error: `${err.constructor.name}: ${err.message}`, cause: String(err.cause ?? ""),
             requests: await requests() };
  }
}

export function sdkText(app) {
  return kept(app, async () => {
    const settings = { model: app.model, maxOutputTokens: 12, temperature: 0 };
    const prompt = "What is the capital of France?";
    const whole = await generateText({ ...settings, instructions: "Answer in one sentence.", prompt });
    const streamed = streamText({ ...settings, instructions: "Answer in one sentence.", prompt });
    let text = "", parts = 0;
    for await (const piece of streamed.textStream) { text += piece; parts += 1; }
    return { text: whole.text, finishReason: whole.finishReason, usage: whole.usage,
             streamed: text, parts, streamedFinish: await streamed.finishReason };
  });
}

export function openaiText(app) {
  return kept(app, async () => {
    const body = { model: app.id, messages: [{ role: "user", content: "What is the capital of France?" }],
                   max_tokens: 12, temperature: 0 };
    const whole = await app.openai.chat.completions.create(body);
    let streamed = "", usage = null;
    for await (const c of await app.openai.chat.completions.create({ ...body, stream: true,
                                                                      stream_options: { include_usage: true } })) {
      streamed += c.choices[0]?.delta?.content ?? "";
      usage = c.usage ?? usage;
    }
    return { text: whole.choices[0].message.content, finish: whole.choices[0].finish_reason, streamed, usage };
  });
}

// OpenAI's newer message shapes, a developer message and content as text parts, and the same request as plain
// strings: a system message and the parts joined by newlines (as vLLM joins them).
export function openaiShapes(app) {
  return kept(app, async () => {
    const ask = (messages) => app.openai.chat.completions.create({ model: app.id, max_tokens: 12, temperature: 0,
                                                                   messages });
    const shaped = await ask([
      { role: "developer", content: [{ type: "text", text: "Answer in one sentence." }] },
      { role: "user", content: [{ type: "text", text: "What is the capital of France?" },
                                { type: "text", text: "And of Italy?" }] }]);
    const plain = await ask([{ role: "system", content: "Answer in one sentence." },
                             { role: "user", content: "What is the capital of France?\nAnd of Italy?" }]);
    return { text: shaped.choices[0].message.content, usage: shaped.usage,
             plainText: plain.choices[0].message.content, plainUsage: plain.usage };
  });
}

// generateObject with a zod schema, once per seed: its finish reason and whether the object validates.
export function sdkObjects(app, seeds, maxOutputTokens = 60) {
  return kept(app, async () => {
    const runs = [];
    for (const seed of seeds) {
      const t0 = performance.now();
      try {
        const r = await generateObject({ model: app.model, schema: PERSON, temperature: 0.8, seed, maxOutputTokens,
                                         prompt: "Make up a person: a name and an age." });
        runs.push({ seed, finish: r.finishReason, valid: PERSON.safeParse(r.object).success, object: r.object,
                   ms: Math.round(performance.now() - t0), tokens: r.usage.outputTokens });
      } catch (err) {  // NoObjectGeneratedError: the text did not parse or validate
        runs.push({ seed, finish: err.finishReason ?? null, valid: false, error: err.message, text: err.text ?? null });
      }
    }
    return { runs };
  });
}

// generateText's structured output (ai 7: output: Output.object({schema})).
export function sdkOutputObject(app) {
  return kept(app, async () => {
    const r = await generateText({ model: app.model, output: Output.object({ schema: PERSON }), temperature: 0,
                                   maxOutputTokens: 60, prompt: "Make up a person: a name and an age." });
    return { output: r.output, valid: PERSON.safeParse(r.output).success, finish: r.finishReason };
  });
}

// A tool the model must call, without execute: generateText hands the call to the app.
export function sdkToolCall(app) {
  return kept(app, async () => {
    const r = await generateText({ model: app.model, tools: { weather: tool(WEATHER) }, toolChoice: "required",
                                   temperature: 0, maxOutputTokens: 40, prompt: ASK_WEATHER });
    return { calls: r.toolCalls.map(callOf), finish: r.finishReason };
  });
}

// A round trip, streamed: step 1 must call the tool, which runs; step 2 (no tools offered) answers in text.
export function sdkToolRoundTrip(app) {
  return kept(app, async () => {
    const ran = [];
    const execute = async ({ city }) => { ran.push(city); return { city, celsius: 21 }; };
    const trip = streamText({
      model: app.model, tools: { weather: tool({ ...WEATHER, execute }) }, temperature: 0, maxOutputTokens: 40,
      prompt: ASK_WEATHER, stopWhen: isStepCount(2),
      prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? "required" : "none" }),
    });
    let text = "";
    for await (const piece of trip.textStream) text += piece;
    const steps = await trip.steps;
    return { calls: steps[0].toolCalls.map(callOf), ran, steps: steps.map((s) => s.finishReason), text };
  });
}

function callOf(call) {  // invalid: the SDK could not parse the arguments or they failed the tool's schema
  return { name: call.toolName, input: call.input, invalid: call.invalid ?? false };
}

// The openai client's tools: one call non-streamed and the same request streamed, its deltas assembled as the
// client's users do (by index: id and name once, arguments in pieces).
export function openaiTools(app, seed = 7) {
  return kept(app, async () => {
    const body = { model: app.id, temperature: 0.8, seed, max_tokens: 40, tool_choice: "required",
                   messages: [{ role: "user", content: ASK_WEATHER }],
                   tools: [{ type: "function", function: { name: "weather", description: WEATHER.description,
                                                           parameters: WEATHER_JSON } }] };
    const whole = await app.openai.chat.completions.create(body);
    const calls = [];
    let finish = null;
    for await (const c of await app.openai.chat.completions.create({ ...body, stream: true })) {
      for (const d of c.choices[0]?.delta?.tool_calls ?? []) {
        const call = (calls[d.index] ??= { id: "", type: "function", function: { name: "", arguments: "" } });
        call.id += d.id ?? "";
        call.function.name += d.function?.name ?? "";
        call.function.arguments += d.function?.arguments ?? "";
      }
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    const message = whole.choices[0].message;
    return { message, finish: whole.choices[0].finish_reason, streamed: calls, streamedFinish: finish,
             args: (message.tool_calls ?? []).map((c) => parses(c.function.arguments)) };
  });
}

// response_format json_schema through the openai client, the seeds' requests at once (the engine batches them):
// each one's finish reason, and zod on its JSON.
export function openaiJsonSchema(app, seeds, maxTokens = 60) {
  return kept(app, async () => {
    const schema = z.toJSONSchema(PERSON);
    const runs = await Promise.all(seeds.map(async (seed) => {
      const t0 = performance.now();
      const r = await app.openai.chat.completions.create({
        model: app.id, temperature: 0.8, seed, max_tokens: maxTokens,
        messages: [{ role: "user", content: "Make up a person: a name and an age." }],
        response_format: { type: "json_schema", json_schema: { name: "person", strict: true, schema } },
      });
      const content = r.choices[0].message.content;
      const value = parses(content) ? JSON.parse(content) : undefined;
      return { seed, finish: r.choices[0].finish_reason, valid: PERSON.safeParse(value).success, content,
               ms: Math.round(performance.now() - t0), tokens: r.usage.completion_tokens };
    }));
    return { runs };
  });
}

export function openaiLogprobs(app) {
  return kept(app, async () => {
    const r = await app.openai.chat.completions.create({
      model: app.id, temperature: 0, max_tokens: 8, logprobs: true, top_logprobs: 3,
      messages: [{ role: "user", content: "What is the capital of France?" }],
    });
    return { text: r.choices[0].message.content, logprobs: r.choices[0].logprobs, finish: r.choices[0].finish_reason,
             usage: r.usage };
  });
}

function parses(text) {
  try { JSON.parse(text); return true; } catch { return false; }
}
