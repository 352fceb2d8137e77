// The CPU path's projections on every core. wasm/linear_shared.wasm (linear.wat assembled to import a SHARED
// memory) runs here, in the engine worker, and in helper workers (linear_helper.js), all on one shared
// WebAssembly.Memory that holds the quantized weights. A product copies x in from Pyodide's memory, cuts the
// weight's rows into chunks (CHUNKS_PER_THREAD per thread) that every thread claims one at a time from a shared
// counter until none is left, so a slower or busier thread takes fewer (runChunks), and copies out back.
// attn_prefill runs a prompt chunk's attention the same way, its queries in chunks (runQueries), and attn_decode
// a decode step's, its keys' blocks in chunks for the scores (runKeys), its heads for the softmax (runSoftmax),
// then each head's dims in chunks for the values (runDims), over the KV mirror: a copy of the K and V pools here
// (mirror), which Python keeps current (sync after every write numpy makes; attn_decode writes its new row to
// both). A pool without one has attn_prefill copy the blocks it reads each call.
// py/pagedkv/backends/cpu_wasm.py's ThreadsTwin is the numpy twin of matmul; cpu_wasm.SharedStore is Python's
// side, reached through pagedkv/browser/interop.py's linear_threads.
//
// A helper's control block (CTRL_BYTES at CTRL_BYTES * i): CTRL_INTS i32, [0] job number, [1] last job done, [2] 1
// once a job threw, [13] microseconds the job took, [14] how long to poll after it, [15] chunks it claimed; then
// at JOB_AT its job, JOB_WORDS f64: [0] what (MATMUL: kind, qs, dm, rows, cols, x, t, out, its scratch, chunk
// rows; ATTN_PREFILL: attn_prefill's arguments, s its own, then chunk queries; ATTN_KEYS: attn_keys' arguments
// but b0 and b1, then chunk blocks and the blocks in all; ATTN_SOFTMAX: s, ctx, lo, ld, scale, then chunk heads
// and the heads in all; ATTN_DIMS: attn_dims' but d0 and d1, then chunk bytes).
// Plain writes (the job, x) happen before the Atomics.store of the job number and the helper's (out) before its
// Atomics.store of [1]: seq-cst atomics order them.
"use strict";

const CTRL_INTS = 16;
const CTRL_BYTES = 256;
const JOB_AT = 64;  // bytes into a control block
const JOB_WORDS = 24;
const MATMUL = 0, ATTN_PREFILL = 1, ATTN_KEYS = 2, ATTN_DIMS = 3, ATTN_SOFTMAX = 4;  // a job's [0]
const COUNTER_AT = 65536 - 64;  // the chunk counter of the product under way
const ARENA_START = 65536;  // the first page holds the control blocks and the counter
const CHUNKS_PER_THREAD = 8;
const JOIN_SPIN_MS = 50;  // how long the engine worker polls for a helper's slice before it sleeps in Atomics.wait
const WAIT_MS = 20000;  // a helper that has not answered by then is taken for dead
const MAX_THREADS = 16;

// Claims chunks of `chunk` rows from counter[0] until none is left and runs each: out's columns r0..r1 of
// x @ W.T (the engine worker and every helper run this on the same job).
function runChunks(exports, counter, kind, qs, dm, rows, cols, x, t, out, scratch, chunk) {
  // a row's codes and scales apart (cpu_wasm.row_steps); kind 65 (d alone): a row's d (padded to 16 bytes) and its
  // codes together, so both step over the whole row
  const nb = cols >> 5, dRow = ((nb * 4 + 15) & ~15) + nb * 32;
  const rowQ = kind & 64 ? dRow : nb * (kind & 1 ? 32 : 16), rowD = kind & 64 ? dRow : nb * 8;
  let claimed = 0;
  for (let r0 = Atomics.add(counter, 0, 1) * chunk; r0 < rows; r0 = Atomics.add(counter, 0, 1) * chunk) {
    exports.matmul(kind, qs + r0 * rowQ, dm + r0 * rowD, Math.min(chunk, rows - r0), cols, x, t, out + 4 * r0,
      rows, scratch);
    claimed++;
  }
  return claimed;
}

// Claims chunks of `chunk` queries of a prompt's attention from counter[0], the last queries (which see the most
// keys) first, and runs each through attn_prefill as the last queries of a shorter context: query i of the
// chunk sees the keys it sees in the whole call, so every output has the bits of one call over every query.
function runQueries(exports, counter, q, k, v, table, ctx, nq, bs, nkv, group, hd, window, scale, s, out, chunk) {
  const row = nkv * group * hd * 4;  // bytes of a query's heads
  let claimed = 0;
  for (let c = Atomics.add(counter, 0, 1); c * chunk < nq; c = Atomics.add(counter, 0, 1)) {
    const i1 = nq - c * chunk, i0 = Math.max(0, i1 - chunk);
    exports.attn_prefill(q + i0 * row, k, v, table, ctx - nq + i1, i1 - i0, bs, nkv, group, hd, window, scale, s,
      out + i0 * row);
    claimed++;
  }
  return claimed;
}

// Claims chunks of `chunk` blocks of a decode step's keys from counter[0] and runs attn_keys on each: their scores,
// every head's (each the dot product of the one attn_decode call).
function runKeys(exports, counter, q, k, table, ctx, bs, nkv, group, hd, s, ld, chunk, blocks) {
  let claimed = 0;
  for (let b0 = Atomics.add(counter, 0, 1) * chunk; b0 < blocks; b0 = Atomics.add(counter, 0, 1) * chunk) {
    exports.attn_keys(q, k, table, ctx, bs, nkv, group, hd, s, ld, b0, Math.min(blocks, b0 + chunk));
    claimed++;
  }
  return claimed;
}

// Claims chunks of `chunk` heads' score rows from counter[0] and runs attn_softmax on each (a row's own softmax).
function runSoftmax(exports, counter, s, ctx, lo, ld, scale, chunk, heads) {
  let claimed = 0;
  for (let r0 = Atomics.add(counter, 0, 1) * chunk; r0 < heads; r0 = Atomics.add(counter, 0, 1) * chunk) {
    exports.attn_softmax(s + r0 * ld * 4, Math.min(chunk, heads - r0), ctx, lo, ld, scale);
    claimed++;
  }
  return claimed;
}

// Claims chunks of `chunk` bytes of each head's hd * 4 from counter[0] and runs attn_dims on each: their values'
// sums over every key (each the sum of the one attn_decode call); a thread reads its cache lines of V only.
function runDims(exports, counter, p, v, table, ctx, bs, nkv, group, hd, out, ld, chunk) {
  let claimed = 0;
  const end = hd * 4;
  for (let d0 = Atomics.add(counter, 0, 1) * chunk; d0 < end; d0 = Atomics.add(counter, 0, 1) * chunk) {
    exports.attn_dims(p, v, table, ctx, bs, nkv, group, hd, out, ld, d0, Math.min(end, d0 + chunk));
    claimed++;
  }
  return claimed;
}

// A helper's job (its control block's f64 words) run to the end of its chunks.
function runJob(exports, counter, j) {
  if (j[0] === MATMUL) return runChunks(exports, counter, j[1], j[2], j[3], j[4], j[5], j[6], j[7], j[8], j[9], j[10]);
  if (j[0] === ATTN_PREFILL) {
    return runQueries(exports, counter, j[1], j[2], j[3], j[4], j[5], j[6], j[7], j[8], j[9], j[10], j[11], j[12],
      j[13], j[14], j[15]);
  }
  if (j[0] === ATTN_KEYS) {
    return runKeys(exports, counter, j[1], j[2], j[3], j[4], j[5], j[6], j[7], j[8], j[9], j[10], j[11], j[12]);
  }
  if (j[0] === ATTN_SOFTMAX) return runSoftmax(exports, counter, j[1], j[2], j[3], j[4], j[5], j[6], j[7]);
  if (j[0] === ATTN_DIMS) {
    return runDims(exports, counter, j[1], j[2], j[3], j[4], j[5], j[6], j[7], j[8], j[9], j[10], j[11]);
  }
  throw new Error(`kernel thread: job ${j[0]} is not one it runs`);
}

// First-fit over the shared memory past the control page, 64-byte blocks, growing the memory when nothing fits.
class Arena {
  constructor(memory) {
    this.memory = memory;
    this.free = [[ARENA_START, memory.buffer.byteLength - ARENA_START]];  // [at, bytes], sorted, coalesced
    this.sizes = new Map();
  }

  alloc(bytes) {
    const n = Math.max(64, Math.ceil(bytes / 64) * 64);
    let i = this.free.findIndex(([, len]) => len >= n);
    if (i < 0) {
      const end = this.memory.buffer.byteLength;
      const last = this.free[this.free.length - 1];
      const tail = last && last[0] + last[1] === end ? last[1] : 0;
      const pages = this.grow(n - tail);
      if (tail) last[1] += pages * 65536;
      else this.free.push([end, pages * 65536]);
      i = this.free.length - 1;
    }
    const [at, len] = this.free[i];
    if (len === n) this.free.splice(i, 1);
    else this.free[i] = [at + n, len - n];
    this.sizes.set(at, n);
    return at;
  }

  fresh(bytes) {  // zeros: pages the memory grows by now, past everything else (the OS maps them as they are written)
    const end = this.memory.buffer.byteLength;
    this.sizes.set(end, this.grow(bytes) * 65536);
    return end;
  }

  grow(bytes) {  // the memory grown by the pages `bytes` take; how many
    const end = this.memory.buffer.byteLength, pages = Math.ceil(bytes / 65536);
    try {
      this.memory.grow(pages);
    } catch (err) {
      throw new Error(`the kernel threads' shared memory cannot grow by ${pages * 64} KiB past ` +
        `${Math.round(end / 1048576)} MiB: ${err.message || err}`);
    }
    return pages;
  }

  release(at) {
    const n = this.sizes.get(at);
    if (n === undefined) throw new Error(`no block of the kernel threads' memory starts at ${at}`);
    this.sizes.delete(at);
    this.free.push([at, n]);
    this.free.sort((a, b) => a[0] - b[0]);
    this.free = this.free.reduce((out, b) => {
      const prev = out[out.length - 1];
      if (prev && prev[0] + prev[1] === b[0]) prev[1] += b[1];
      else out.push(b);
      return out;
    }, []);
  }
}

class LinearThreads {
  constructor(memory, exports, helpers, pyMemory) {
    this.memory = memory;
    this.exports = exports;
    this.helpers = helpers;  // [{worker, ctrl, seq}]
    this.pyMemory = pyMemory;
    this.threads = helpers.length + 1;
    this.minWork = 1 << 16;  // rows * cols * tokens below which one thread runs the product (no handoff)
    this.stats = { calls: 0, split: 0, chunks: 0, helperChunks: 0, ownUs: 0, waitUs: 0, copyUs: 0, helperUs: 0,
      attnCalls: 0, attnUs: 0, decodeCalls: 0, decodeUs: 0 };
    this.counter = new Int32Array(memory.buffer, COUNTER_AT, 1);
    this.spinUs = 2000;  // how long a helper polls for its next job before it sleeps (each job says)
    this.arena = new Arena(memory);
    this.io = { at: 0, bytes: 0 };  // x then out, reused; then one cols-sized scratch per thread
    this.attn = { at: 0, bytes: 0 };  // attn_prefill's copies (attnArea)
    this.mirrors = [];  // [{py, bytes, at}]: Pyodide's [py, py + bytes) mirrored at offset `at` here
    this.decodeArea = { at: 0, bytes: 0 };  // attn_decode's copies
    this.minKeys = 64;  // a decode step's keys below which its attention stays on this thread
  }

  // A mirror of Pyodide's [address, address + bytes) (a KV pool, or the pages several models' pools view), zeros
  // like the pools it mirrors when they are made; the one already made for the same range. Returns its offset.
  mirror(address, bytes) {
    const known = this.mirrors.find((m) => m.py === address && m.bytes === bytes);
    if (known) return known.at;
    if (this.mirrors.some((m) => address < m.py + m.bytes && m.py < address + bytes)) {
      throw new Error(`a KV mirror of ${bytes} bytes at ${address} overlaps one made before`);
    }
    const at = this.arena.fresh(bytes);
    this.mirrors.push({ py: address, bytes, at });
    return at;
  }

  unmirror(address) {  // the mirror of Pyodide's range from `address` dropped (its arrays are gone); none: nothing
    const i = this.mirrors.findIndex((m) => m.py === address);
    if (i < 0) return;
    this.arena.release(this.mirrors[i].at);
    this.mirrors.splice(i, 1);
  }

  mirrorOf(address) {  // the offset here of Pyodide's byte `address`, or -1 where no mirror holds it
    for (const m of this.mirrors) if (address >= m.py && address < m.py + m.bytes) return m.at + address - m.py;
    return -1;
  }

  // Pyodide's bytes copied into their mirrors: n runs of (address, bytes) as f64 pairs at Pyodide address `runs`
  // (what numpy just wrote: a prompt's keys and values, copied or shifted blocks, blocks swapped or read in).
  sync(runs, n) {
    const r = new Float64Array(this.pyMemory.buffer, runs, 2 * n), heap = this.heap(), py = this.py();
    for (let i = 0; i < 2 * n; i += 2) {
      const at = this.mirrorOf(r[i]);
      if (at < 0 || this.mirrorOf(r[i] + r[i + 1] - 1) !== at + r[i + 1] - 1) {
        throw new Error(`KV sync: bytes ${r[i]} .. ${r[i] + r[i + 1]} are not in one mirror`);
      }
      heap.set(py.subarray(r[i], r[i] + r[i + 1]), at);
    }
  }

  heap() {
    if (!this.u8 || this.u8.byteLength !== this.memory.buffer.byteLength) this.u8 = new Uint8Array(this.memory.buffer);
    return this.u8;
  }

  place(address, bytes) {  // a copy of Pyodide's bytes [address, address + bytes); returns its offset
    const at = this.arena.alloc(bytes);
    this.heap().set(this.py().subarray(address, address + bytes), at);
    return at;
  }

  free(at) {
    this.arena.release(at);
  }

  read(at, bytes, dest) {  // bytes at offset `at` into Pyodide's memory at dest
    this.py().set(this.heap().subarray(at, at + bytes), dest);
  }

  ioArea(bytes) {
    if (bytes > this.io.bytes) {
      if (this.io.bytes) this.arena.release(this.io.at);
      this.io = { at: this.arena.alloc(bytes * 2), bytes: bytes * 2 };
    }
    return this.io.at;
  }

  py() {  // a view of Pyodide's memory, renewed when it grows (its old buffer is detached then)
    if (!this.pyU8 || this.pyU8.buffer !== this.pyMemory.buffer) this.pyU8 = new Uint8Array(this.pyMemory.buffer);
    return this.pyU8;
  }

  // out (t, rows) = x (t, cols) @ W.T, x and out in Pyodide's memory, W (qs, dm) in the shared one; kind | 2 or
  // kind | 32: the tokens through 16- or 8-bit activations (linear.wat's quant_x / quant_x8, here once for every
  // thread: kind | 4). stats: the
  // products, how many were split, chunks the helpers ran, and microseconds in copies, in this thread's chunks,
  // waiting for helpers and in the helpers' (each reports its job's in ctrl[13]).
  matmul(kind, qs, dm, rows, cols, x, t, out) {
    const t0 = performance.now();
    const act8 = (kind & 32) !== 0, act = act8 || (kind & 2) !== 0, xBytes = t * cols * 4, outBytes = t * rows * 4;
    const blockBytes = act ? t * (cols >> 5) * (act8 ? 40 : 72) : 0;  // the tokens' quantized blocks
    // a thread's own scratch: a decoded row (f32), 8-bit activations' accumulators (16 tokens x 160 bytes: cpu_wasm's
    // ACC8_FLOATS), none for 16-bit ones (their one quantized x is every thread's scratch)
    const ownBytes = act8 ? 2560 : act ? 0 : cols * 4;
    const n = rows >= this.threads && rows * cols * t >= this.minWork ? this.threads : 1;
    const xAt = this.ioArea(xBytes + outBytes + blockBytes + n * ownBytes);
    const outAt = xAt + xBytes, blocksAt = outAt + outBytes;
    const heap = this.heap();
    heap.set(this.py().subarray(x, x + xBytes), xAt);
    const chunk = Math.ceil(rows / (n * CHUNKS_PER_THREAD));
    let xIn = xAt, scratchAt = blocksAt, stride = ownBytes;  // what the threads read x from, their scratch
    if (act && n > 1) {  // x quantized once for every thread (kind | 4)
      (act8 ? this.exports.quant_x8 : this.exports.quant_x)(xAt, cols >> 5, t, blocksAt);
      kind |= 4;
      if (act8) [xIn, scratchAt] = [blocksAt, blocksAt + blockBytes];  // x: the blocks; scratch: accumulators
    }
    Atomics.store(this.counter, 0, n > 1 ? 0 : 1);  // one thread: its one chunk is the whole weight
    for (let i = 1; i < n; i++) {
      this.start(this.helpers[i - 1], [MATMUL, kind, qs, dm, rows, cols, xIn, t, outAt, scratchAt + i * stride, chunk]);
    }
    const t1 = performance.now();
    if (n > 1) runChunks(this.exports, this.counter, kind, qs, dm, rows, cols, xIn, t, outAt, scratchAt, chunk);
    else this.exports.matmul(kind, qs, dm, rows, cols, xAt, t, outAt, rows, scratchAt);
    const t2 = performance.now();
    const st = this.stats;
    this.joinAll(n);
    const t3 = performance.now();
    this.py().set(heap.subarray(outAt, outAt + outBytes), out);
    st.calls++; st.split += n > 1; st.chunks += n > 1 ? Math.ceil(rows / chunk) : 0;
    st.ownUs += (t2 - t1) * 1000; st.waitUs += (t3 - t2) * 1000; st.copyUs += (t1 - t0 + performance.now() - t3) * 1000;
  }

  // A prompt chunk's attention (linear.wat's attn_prefill, the same arguments: q, the K and V pools, the table and
  // out in Pyodide's memory) on every thread: q and the K and V blocks the table names copied in (the table then
  // 0, 1, ..., its blocks in order), chunks of queries claimed from the counter (runQueries), each thread on its
  // own score rows, out copied back; each output the bits of the one-thread call. stats.attnCalls counts them,
  // attnUs their time (the products' stats leave them out).
  attn_prefill(q, k, v, table, ctx, nq, bs, nkv, group, hd, window, scale, out) {
    const t0 = performance.now();  // stats.attnUs: the whole call's microseconds, copies included
    const n = this.threads, row = nkv * group * hd * 4, blockBytes = bs * nkv * hd * 4, used = Math.ceil(ctx / bs);
    const qBytes = nq * row, poolBytes = used * blockBytes, tableBytes = Math.ceil(used / 16) * 64;
    const sBytes = Math.ceil(nkv * group * ((ctx + 3) & ~3) / 16) * 64;  // a thread's score rows
    const kMirror = this.mirrorOf(k), vMirror = this.mirrorOf(v), mirrored = kMirror >= 0 && vMirror >= 0;
    const copied = mirrored ? 0 : poolBytes;  // the blocks read in the mirrors, or copies of them
    const at = this.attnArea(2 * qBytes + 2 * copied + tableBytes + n * sBytes);
    const qAt = at, outAt = qAt + qBytes, tableAt = outAt + qBytes + 2 * copied;
    const [kAt, vAt] = mirrored ? [kMirror, vMirror] : [outAt + qBytes, outAt + qBytes + copied];
    const sAt = tableAt + tableBytes;
    const heap = this.heap(), py = this.py();
    heap.set(py.subarray(q, q + qBytes), qAt);
    const ids = new Int32Array(this.pyMemory.buffer, table, used);
    if (mirrored) new Int32Array(this.memory.buffer, tableAt, used).set(ids);
    else new Int32Array(this.memory.buffer, tableAt, used).set(Array.from({ length: used }, (_, b) => b));
    for (let b = 0; b < used && !mirrored;) {  // runs of consecutive blocks in one copy each
      let e = b + 1;
      while (e < used && ids[e] === ids[e - 1] + 1) e++;
      const from = ids[b] * blockBytes, bytes = (e - b) * blockBytes;
      heap.set(py.subarray(k + from, k + from + bytes), kAt + b * blockBytes);
      heap.set(py.subarray(v + from, v + from + bytes), vAt + b * blockBytes);
      b = e;
    }
    const chunk = Math.ceil(nq / (n * CHUNKS_PER_THREAD));
    const args = [qAt, kAt, vAt, tableAt, ctx, nq, bs, nkv, group, hd, window, scale];
    Atomics.store(this.counter, 0, 0);
    for (let i = 1; i < n; i++) this.start(this.helpers[i - 1], [ATTN_PREFILL, ...args, sAt + i * sBytes, outAt, chunk]);
    runQueries(this.exports, this.counter, ...args, sAt, outAt, chunk);
    this.joinAll(n, false);
    py.set(heap.subarray(outAt, outAt + qBytes), out);
    this.stats.attnCalls++;
    this.stats.attnUs += (performance.now() - t0) * 1000;
  }

  // A decode step's attention (linear.wat's attn_decode, the same arguments, all in Pyodide's memory, k and v in
  // pools with a mirror) on every thread: q | k | v, cos, sin and the table copied in, rope_kv here (the new k and
  // v into the mirrors, then copied into Pyodide's pools), the scores of chunks of the keys' blocks on every thread
  // (runKeys), the softmax of chunks of the heads (runSoftmax), the values' sums of chunks of each head's dims
  // (runDims), out copied back: each thread reads its part of K and of V only, every output the bits of the
  // one-thread call (qkv's rotation and s's probabilities stay here). Below minKeys keys, all on this thread.
  attn_decode(qkv, cos, sin, k, v, table, ctx, lo, bs, nkv, group, hd, slot, scale, s, ld, out) {
    const t0 = performance.now();
    const kAt = this.mirrorOf(k), vAt = this.mirrorOf(v);
    if (kAt < 0 || vAt < 0) throw new Error("attn_decode on the kernel threads needs K and V pools with a mirror");
    const heads = nkv * group, hb = hd * 4, tok = nkv * hb, used = Math.ceil(ctx / bs);
    const qkvBytes = (heads + 2 * nkv) * hb, sBytes = heads * ld * 4;
    const bytes = [qkvBytes, hb / 2, hb / 2, used * 4, sBytes, heads * hb].map((b) => Math.ceil(b / 64) * 64);
    const total = bytes.reduce((a, b) => a + b);
    let next = this.decodeArea.bytes >= total ? this.decodeArea.at : this.growDecode(total);
    const [qkvAt, cosAt, sinAt, tableAt, sAt, outAt] = bytes.map((b) => (next += b) - b);
    const heap = this.heap(), py = this.py(), ex = this.exports;
    heap.set(py.subarray(qkv, qkv + qkvBytes), qkvAt);
    heap.set(py.subarray(cos, cos + hb / 2), cosAt);
    heap.set(py.subarray(sin, sin + hb / 2), sinAt);
    heap.set(py.subarray(table, table + used * 4), tableAt);
    ex.rope_kv(qkvAt, cosAt, sinAt, kAt, vAt, nkv, group, hd, slot);
    py.set(heap.subarray(kAt + slot * tok, kAt + (slot + 1) * tok), k + slot * tok);
    py.set(heap.subarray(vAt + slot * tok, vAt + (slot + 1) * tok), v + slot * tok);
    const n = ctx >= this.minKeys ? this.threads : 1;
    const keys = [qkvAt, kAt, tableAt, ctx, bs, nkv, group, hd, sAt, ld];
    const dims = [sAt, vAt, tableAt, ctx, bs, nkv, group, hd, outAt, ld];
    if (n === 1) {
      ex.attn_keys(...keys, 0, used);
      ex.attn_softmax(sAt, heads, ctx, lo, ld, scale);
      ex.attn_dims(...dims, 0, hb);
    } else {
      const blockChunk = Math.ceil(used / (n * CHUNKS_PER_THREAD)), dimChunk = Math.ceil(hb / 64 / n) * 64;
      this.everyThread(n, ATTN_KEYS, [...keys, blockChunk, used], runKeys);
      this.everyThread(n, ATTN_SOFTMAX, [sAt, ctx, lo, ld, scale, Math.ceil(heads / n), heads], runSoftmax);
      this.everyThread(n, ATTN_DIMS, [...dims, dimChunk], runDims);
    }
    py.set(heap.subarray(outAt, outAt + heads * hb), out);
    this.stats.decodeCalls++;
    this.stats.decodeUs += (performance.now() - t0) * 1000;
  }

  // One job on threads 0 .. n - 1, the same arguments for each: the counter reset, the helpers started, run's
  // chunks claimed here too, the helpers joined (their time not counted in the products' stats).
  everyThread(n, what, args, run) {
    Atomics.store(this.counter, 0, 0);
    for (let i = 1; i < n; i++) this.start(this.helpers[i - 1], [what, ...args]);
    run(this.exports, this.counter, ...args);
    this.joinAll(n, false);
  }

  growDecode(bytes) {  // attn_decode's copies, reused, grown to the next 64 KiB
    const size = Math.ceil(bytes / 65536) * 65536;
    if (this.decodeArea.bytes) this.arena.release(this.decodeArea.at);
    this.decodeArea = { at: this.arena.alloc(size), bytes: size };
    return this.decodeArea.at;
  }

  attnArea(bytes) {  // the attention's copies, reused, grown to the next MiB
    if (bytes > this.attn.bytes) {
      if (this.attn.bytes) this.arena.release(this.attn.at);
      const size = Math.ceil(bytes / 1048576) * 1048576;
      this.attn = { at: this.arena.alloc(size), bytes: size };
    }
    return this.attn.at;
  }

  start(h, job) {  // the helper's next job
    h.job.set(job);
    h.ctrl[14] = this.spinUs;
    Atomics.store(h.ctrl, 0, ++h.seq);
    Atomics.notify(h.ctrl, 0);
  }

  joinAll(n, counted = true) {  // helpers 1 .. n - 1; counted: their chunks and time into the products' stats
    const st = this.stats;
    for (let i = 1; i < n; i++) {
      const h = this.helpers[i - 1];
      this.join(h);
      if (counted) {
        st.helperUs += h.ctrl[13];
        st.helperChunks += h.ctrl[15];
      }
    }
  }

  join(h) {  // polls (the engine worker has nothing else to do), then sleeps once a slice runs long
    for (let spins = 0, since = performance.now(); Atomics.load(h.ctrl, 1) !== h.seq; spins++) {
      if ((spins & 255) !== 0 || performance.now() - since < JOIN_SPIN_MS) continue;
      const seen = Atomics.load(h.ctrl, 1);
      if (seen !== h.seq && Atomics.wait(h.ctrl, 1, seen, WAIT_MS) === "timed-out") {
        throw new Error(`a kernel thread did not answer in ${WAIT_MS / 1000} s`);
      }
    }
    if (Atomics.load(h.ctrl, 2)) throw new Error("a kernel thread's product threw (see the console)");
  }
}

// Resolves to {api, error}: api a LinearThreads of `count` threads (0: one per core the browser reports), or
// error says why the products stay on one thread. `module` is the compiled linear_shared.wasm.
async function startLinearThreads(base, module, pyMemory, count) {
  try {
    if (!self.crossOriginIsolated || typeof SharedArrayBuffer === "undefined") {
      throw new Error("this page is not cross-origin isolated, so it has no shared memory");
    }
    const want = count > 0 ? count : Math.min(self.navigator.hardwareConcurrency || 1, MAX_THREADS);
    if (want < 2) throw new Error(count === 1 ? "one thread asked for (threads=1)" : "the browser reports one core");
    const memory = new WebAssembly.Memory({ initial: 2, maximum: 65536, shared: true });
    const { exports } = await WebAssembly.instantiate(module, { env: { memory } });
    const helpers = await Promise.all(Array.from({ length: want - 1 }, (_, i) => startHelper(base, module, memory, i)));
    return { api: new LinearThreads(memory, exports, helpers, pyMemory), error: null };
  } catch (err) {
    return { api: null, error: String(err.message || err) };
  }
}

function startHelper(base, module, memory, i) {
  return new Promise((resolve, reject) => {
    const worker = new Worker(base + "linear_helper.js");
    const ctrlAt = i * CTRL_BYTES;
    const timer = setTimeout(() => reject(new Error(`kernel thread ${i + 1} did not start in 20 s`)), 20000);
    worker.onerror = (e) => { clearTimeout(timer); reject(new Error(`kernel thread ${i + 1}: ${e.message}`)); };
    worker.onmessage = (e) => {
      clearTimeout(timer);
      if (e.data !== "ready") reject(new Error(`kernel thread ${i + 1}: ${e.data}`));
      else {
        resolve({ worker, ctrl: new Int32Array(memory.buffer, ctrlAt, CTRL_INTS),
          job: new Float64Array(memory.buffer, ctrlAt + JOB_AT, JOB_WORDS), seq: 0 });
      }
    };
    worker.postMessage({ module, memory, ctrlAt, counterAt: COUNTER_AT });
  });
}
