// The tab's one-token step in one crossing from Python: py/pagedkv/backends/cpu_tape.py writes the step's kernel
// calls as a tape, float64 [opcode, arguments...] runs in Pyodide's memory, and this walks it, calling the
// exports of the kernel instance on Pyodide's memory (linear_wasm.js) with the same arguments Python would pass,
// its products on the kernel threads (linear_threads.js's matmul) where Python gives them. Made from Python each
// call is a crossing of Pyodide's FFI (a few microseconds, ~270 a SmolLM2 step); from here a JS-to-wasm call.
// The opcodes, their argument counts and order are cpu_tape.OPS'; a tape with a CALL op (Python between two
// calls) never comes here (cpu_tape.StepTape.run walks it in Python).
"use strict";

// runTape(at, words, threads): the tape of `words` float64 at byte offset `at` of Pyodide's memory; threads a
// LinearThreads (x and out copied in and out of their memory) or null / undefined (the export on one thread).
function makeTapeRunner(exports, memory) {
  return (at, words, threads) => {
    const t = new Float64Array(memory.buffer, at, words);  // Pyodide's memory may have grown since the last step
    for (let i = 0; i < words;) {
      switch (t[i]) {
        case 0:  // MATMUL code, qs, dm, rows, cols, x, out, scratch: one token
          if (threads) threads.matmul(t[i + 1], t[i + 2], t[i + 3], t[i + 4], t[i + 5], t[i + 6], 1, t[i + 7]);
          else exports.matmul(t[i + 1], t[i + 2], t[i + 3], t[i + 4], t[i + 5], t[i + 6], 1, t[i + 7], t[i + 4], t[i + 8]);
          i += 9;
          break;
        case 1:  // RMS_NORM x, w, n, eps, out
          exports.rms_norm(t[i + 1], t[i + 2], t[i + 3], t[i + 4], t[i + 5]);
          i += 6;
          break;
        case 2:  // ADD_RMS_NORM x, y, w, n, eps, out
          exports.add_rms_norm(t[i + 1], t[i + 2], t[i + 3], t[i + 4], t[i + 5], t[i + 6]);
          i += 7;
          break;
        case 3:  // RMS_NORM_ROWS x, w, n, rows, eps, out
          exports.rms_norm_rows(t[i + 1], t[i + 2], t[i + 3], t[i + 4], t[i + 5], t[i + 6]);
          i += 7;
          break;
        case 4:  // SILU_MUL g, u, n, out
          exports.silu_mul(t[i + 1], t[i + 2], t[i + 3], t[i + 4]);
          i += 5;
          break;
        case 5:  // GELU_TANH_MUL g, u, n, out
          exports.gelu_tanh_mul(t[i + 1], t[i + 2], t[i + 3], t[i + 4]);
          i += 5;
          break;
        case 6:  // ATTN_DECODE qkv, cos, sin, k, v, table, ctx, lo, bs, nkv, group, hd, slot, scale, s, ld, out
          exports.attn_decode(t[i + 1], t[i + 2], t[i + 3], t[i + 4], t[i + 5], t[i + 6], t[i + 7], t[i + 8], t[i + 9],
            t[i + 10], t[i + 11], t[i + 12], t[i + 13], t[i + 14], t[i + 15], t[i + 16], t[i + 17]);
          i += 18;
          break;
        case 8:  // ATTN_THREADS: ATTN_DECODE's arguments, on the kernel threads over the KV mirror
          threads.attn_decode(t[i + 1], t[i + 2], t[i + 3], t[i + 4], t[i + 5], t[i + 6], t[i + 7], t[i + 8], t[i + 9],
            t[i + 10], t[i + 11], t[i + 12], t[i + 13], t[i + 14], t[i + 15], t[i + 16], t[i + 17]);
          i += 18;
          break;
        default:
          throw new Error(`step tape: opcode ${t[i]} at word ${i} is not one this walker runs`);
      }
    }
  };
}
