// One wasm matmul export timed alone in Node's V8 (the engine Chromium runs the tab's kernels on): the built
// module's `matmul` on random q8_0-layout rows (codes -127..127, d in [0, 0.01), m 0) and one token, one thread.
//   node bench/cpu_limits_q8.cjs <module.wasm> <rows> <cols> <kind> [reps]
// Prints the median and fastest of `reps` calls and a hash of the outputs (two modules' products compared bit for
// bit). build.wasm_modules(path) writes a module of any linear.wat, e.g. main's, for a side-by-side run (issue 51:
// $dot_q8_x16 against the general $dot_x16 at kind 3, q8_0 with 16-bit activations; kind 67: the head's d alone).
"use strict";
const fs = require('fs');
const [file, rows, cols, kind, reps] = [process.argv[2], +process.argv[3], +process.argv[4], +process.argv[5], +(process.argv[6] || 20)];
const memory = new WebAssembly.Memory({ initial: 4000, maximum: 65536 });
const { exports: ex } = new WebAssembly.Instance(new WebAssembly.Module(fs.readFileSync(file)), { env: { memory } });
const nb = cols >> 5, QS = 1 << 20, DM = QS + rows * cols, X = DM + rows * nb * 8, OUT = 0, SCR = 65536 * 4;
const u8 = new Int8Array(memory.buffer), f32 = new Float32Array(memory.buffer);
let seed = 1; const rnd = () => (seed = (seed * 1103515245 + 12345) >>> 0) / 4294967296;
const pad = (nb * 4 + 15) & ~15;  // kind 67 (q8_d, the head's, cpu_wasm.d_rows): a row's d alone, padding, its codes
const [qs, dm] = kind & 64 ? [QS + pad, QS] : [QS, DM];
for (let i = 0; i < rows * cols; i++) u8[QS + i] = Math.floor(rnd() * 255) - 127;
if (kind & 64) {
  for (let r = rows - 1; r >= 0; r--) u8.copyWithin(QS + r * (pad + cols) + pad, QS + r * cols, QS + (r + 1) * cols);
  for (let i = 0; i < rows * nb; i++) f32[((QS + Math.floor(i / nb) * (pad + cols)) >> 2) + i % nb] = rnd() * 0.01;
} else {
  for (let i = 0; i < rows * nb; i++) { f32[(DM >> 2) + 2 * i] = rnd() * 0.01; f32[(DM >> 2) + 2 * i + 1] = 0; }
}
for (let i = 0; i < cols; i++) f32[(X >> 2) + i] = rnd() - 0.5;
ex.matmul(kind, qs, dm, rows, cols, X, 1, OUT, rows, SCR);
const times = [];
for (let r = 0; r < reps; r++) {
  const t0 = performance.now();
  ex.matmul(kind, qs, dm, rows, cols, X, 1, OUT, rows, SCR);
  times.push(performance.now() - t0);
}
times.sort((a, b) => a - b);
let h = 0; for (let i = 0; i < rows; i++) h = (h * 31 + new Int32Array(memory.buffer)[i]) | 0;
const bytes = kind & 64 ? rows * (pad + cols) : rows * cols + rows * nb * 8;  // codes and scales
console.log(file, 'kind', kind, 'median ms', times[reps >> 1].toFixed(2), 'min', times[0].toFixed(2),
  'GB/s', (bytes / times[0] / 1e6).toFixed(2), 'hash', h);
