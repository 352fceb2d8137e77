// Bench harness (plain JS, not part of the app): runs @wllama/wllama on the same GGUF, greedy, and reports
// llama.cpp's own prompt / generation timings. Driven by bench/wllama.py through window.runWllama(config).
import { Wllama } from './wllama/esm/index.js';

const log = (line) => { document.getElementById('log').textContent += '\n' + line; };

let gguf = null;  // the model file, fetched once per page

window.runWllama = async ({ threads, flashAttn, prompt, newTokens, nCtx }) => {
  if (gguf === null) {
    gguf = await (await fetch('./model.gguf')).blob();
  }
  const wllama = new Wllama({ default: './wllama/esm/wasm/wllama.wasm' }, { suppressNativeLog: true });
  const t0 = performance.now();
  // n_gpu_layers 0: wllama's WebGPU path needs shader-f16, which SwiftShader lacks; keep it on the CPU explicitly.
  await wllama.loadModel([gguf], { n_threads: threads, flash_attn: flashAttn, n_ctx: nCtx, n_batch: 512,
                                   n_gpu_layers: 0, warmup: true });
  const loadMs = performance.now() - t0;
  const response = await wllama.createCompletion({
    prompt, max_tokens: newTokens, temperature: 0, ignore_eos: true, cache_prompt: false,
  });
  const result = {
    threads: wllama.getNumThreads(), multithread: wllama.isMultithread(), flash_attn: flashAttn,
    cross_origin_isolated: self.crossOriginIsolated, load_ms: loadMs, timings: response.timings,
    text: response.choices[0].text,
  };
  await wllama.exit();
  log(JSON.stringify(result.timings));
  return result;
};
log('ready');
document.documentElement.dataset.ready = '1';
