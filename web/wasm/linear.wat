;; Projections of f32 activations by QUANTIZED weights (4- or 8-bit codes: q4_1, q8_0 and the types held as them),
;; WebAssembly SIMD128, f32 accumulate.
;;
;; It imports Pyodide's own memory, so every pointer is a numpy array's address: no copies. Python's side is
;; py/pagedkv/backends/cpu_wasm.py (the layouts below, its numpy twin and the calls). build.py assembles this
;; text with wabt's wat2wasm into four modules (build.wasm_modules: with and without relaxed SIMD, on a plain or
;; a shared memory); tests/test_cpu_wasm_wasmtime.py runs them in CPython.
;;
;; Weight layouts, by `kind` (bits 1 | 8 | 16 | 64; bit 2 asks for 16-bit activations (quant_x), bit 32 for 8-bit ones
;; (quant_x8, kinds 0 and 17 only), bit 4 says x is quantized already): rows of
;; nb = cols / 32 blocks, blocks of 32 weights (cpu_wasm.KINDS names them):
;;   qs  kind 0 (q4_1, q4_K): 16 bytes a block, byte j = code j | code (j + 16) << 4 (codes 0..15)
;;       kind 1 (q8_0, q4_0, q5_0), 17 (q5_1, q5_K; q5_0 with 8-bit activations, m = -16 d), 9
;;       (q6_K): 32 bytes a block, signed codes in weight order (kind 17's 0..31)
;;   dm  two f32 a block, (d, m): weight = d * code + m, the reference's dequantization (m = 0 for kind 1; kind 17
;;       has mins, which one-token rows add after their codes' sum); kind 9 (d0, d1): weights 0..15 = d0 * code,
;;       16..31 = d1 * code (q6_K's scales of 16 weights)
;;   kind 65 (bit 64: q8_0's codes, the output head): one f32 d a block, no m, 16-bit activations only (a token at
;;       a time); a row's nb d, padded to 16 bytes, then its codes, the next row after them (dm points at row 0's d,
;;       qs at its codes): a row is one stream of memory, not two (the head streams ~10 % faster: docs/performance.md)
;; Activations x (t, cols) f32 row-major; out (t, ldo) f32, of which the kernel writes rows columns; scratch the
;; kernel overwrites: cols f32 (a decoded row, or for one token each block's sum of x), with 16-bit activations
;; t * cols * 2.25 bytes (each token's quant_x blocks), with 8-bit ones t * cols * 1.25 (quant_x8's).
(module
  (import "env" "memory" (memory 1))

  (func $hsum (param $s v128) (result f32)
    local.get $s f32x4.extract_lane 0 local.get $s f32x4.extract_lane 1 f32.add
    local.get $s f32x4.extract_lane 2 local.get $s f32x4.extract_lane 3 f32.add
    f32.add)

  ;; Decode one weight row (nb blocks at qs / dm) into w (nb * 32 f32), exactly d * code + m as numpy's
  ;; dequantize (the one-token path reads the blocks in registers instead: $dot_q4_1, $dot_q8, $dot_q8_split).
  (func $row (param $kind i32) (param $qs i32) (param $dm i32) (param $nb i32) (param $w i32)
    (local $half i32) (local $v v128) (local $h v128) (local $e v128) (local $d v128) (local $m v128) (local $split i32)
    local.get $kind i32.const 3 i32.shr_u i32.const 1 i32.and local.set $split
    local.get $kind i32.const 1 i32.and local.set $kind
    loop $block
      local.get $dm f32.load f32x4.splat local.set $d
      f32.const 0 local.get $dm f32.load offset=4 local.get $split select f32x4.splat local.set $m
      local.get $qs v128.load local.set $v
      local.get $kind
      if
        local.get $qs v128.load offset=16 local.set $h
      else
        ;; Nibbles 0..15 read as i8 are themselves, so both kinds widen with the signed extends below.
        local.get $v i32.const 4 i8x16.shr_u local.set $h
        local.get $v i32.const 15 i8x16.splat v128.and local.set $v
      end
      local.get $qs i32.const 16 local.get $kind i32.const 4 i32.shl i32.add i32.add local.set $qs
      i32.const 2 local.set $half
      loop $halves  ;; weights 0..15 from $v, then 16..31 from $h
        local.get $v i16x8.extend_low_i8x16_s local.set $e
        local.get $w local.get $e i32x4.extend_low_i16x8_s f32x4.convert_i32x4_s local.get $d f32x4.mul
        local.get $m f32x4.add v128.store
        local.get $w local.get $e i32x4.extend_high_i16x8_s f32x4.convert_i32x4_s local.get $d f32x4.mul
        local.get $m f32x4.add v128.store offset=16
        local.get $v i16x8.extend_high_i8x16_s local.set $e
        local.get $w local.get $e i32x4.extend_low_i16x8_s f32x4.convert_i32x4_s local.get $d f32x4.mul
        local.get $m f32x4.add v128.store offset=32
        local.get $w local.get $e i32x4.extend_high_i16x8_s f32x4.convert_i32x4_s local.get $d f32x4.mul
        local.get $m f32x4.add v128.store offset=48
        local.get $w i32.const 64 i32.add local.set $w
        local.get $h local.set $v
        local.get $split
        if  ;; weights 16..31 at their own scale
          local.get $dm f32.load offset=4 f32x4.splat local.set $d
        end
        local.get $half i32.const 1 i32.sub local.tee $half br_if $halves
      end
      local.get $dm i32.const 8 i32.add local.set $dm
      local.get $nb i32.const 1 i32.sub local.tee $nb br_if $block
    end)

  ;; One q4_1 row's dot product with one token x, straight from its nb blocks (the decode path's hot loop):
  ;; sum over blocks of d * (codes . x_block) + m * xsum[block]. Two accumulators per block, no branches.
  (func $dot_q4_1 (param $qs i32) (param $dm i32) (param $nb i32) (param $x i32) (param $xsum i32) (result f32)
    (local $v v128) (local $h v128) (local $e v128) (local $s0 v128) (local $s1 v128) (local $acc v128)
    (local $accm f32) (local $low v128)
    i32.const 15 i8x16.splat local.set $low
    loop $block
      local.get $qs v128.load local.tee $v i32.const 4 i8x16.shr_u local.set $h
      local.get $v local.get $low v128.and local.set $v
      local.get $v i16x8.extend_low_i8x16_u local.tee $e i32x4.extend_low_i16x8_u f32x4.convert_i32x4_s
      local.get $x v128.load f32x4.mul local.set $s0
      local.get $e i32x4.extend_high_i16x8_u f32x4.convert_i32x4_s local.get $x v128.load offset=16 f32x4.mul local.set $s1
      local.get $v i16x8.extend_high_i8x16_u local.tee $e i32x4.extend_low_i16x8_u f32x4.convert_i32x4_s
      local.get $x v128.load offset=32 f32x4.mul local.get $s0 f32x4.add local.set $s0
      local.get $e i32x4.extend_high_i16x8_u f32x4.convert_i32x4_s local.get $x v128.load offset=48 f32x4.mul
      local.get $s1 f32x4.add local.set $s1
      local.get $h i16x8.extend_low_i8x16_u local.tee $e i32x4.extend_low_i16x8_u f32x4.convert_i32x4_s
      local.get $x v128.load offset=64 f32x4.mul local.get $s0 f32x4.add local.set $s0
      local.get $e i32x4.extend_high_i16x8_u f32x4.convert_i32x4_s local.get $x v128.load offset=80 f32x4.mul
      local.get $s1 f32x4.add local.set $s1
      local.get $h i16x8.extend_high_i8x16_u local.tee $e i32x4.extend_low_i16x8_u f32x4.convert_i32x4_s
      local.get $x v128.load offset=96 f32x4.mul local.get $s0 f32x4.add local.set $s0
      local.get $e i32x4.extend_high_i16x8_u f32x4.convert_i32x4_s local.get $x v128.load offset=112 f32x4.mul
      local.get $s1 f32x4.add local.set $s1
      local.get $acc local.get $s0 local.get $s1 f32x4.add local.get $dm f32.load f32x4.splat f32x4.mul f32x4.add
      local.set $acc
      local.get $accm local.get $dm f32.load offset=4 local.get $xsum f32.load f32.mul f32.add local.set $accm
      local.get $qs i32.const 16 i32.add local.set $qs
      local.get $dm i32.const 8 i32.add local.set $dm
      local.get $x i32.const 128 i32.add local.set $x
      local.get $xsum i32.const 4 i32.add local.set $xsum
      local.get $nb i32.const 1 i32.sub local.tee $nb br_if $block
    end
    local.get $acc call $hsum local.get $accm f32.add)

  ;; The same for an 8-bit row: sum over blocks of d * (codes . x_block), 32 signed codes a block (kind 17 adds
  ;; its mins' term after: $mins).
  (func $dot_q8 (param $qs i32) (param $dm i32) (param $nb i32) (param $x i32) (result f32)
    (local $v v128) (local $h v128) (local $e v128) (local $s0 v128) (local $s1 v128) (local $acc v128)
    loop $block
      local.get $qs v128.load local.set $v
      local.get $qs v128.load offset=16 local.set $h
      local.get $v i16x8.extend_low_i8x16_s local.tee $e i32x4.extend_low_i16x8_s f32x4.convert_i32x4_s
      local.get $x v128.load f32x4.mul local.set $s0
      local.get $e i32x4.extend_high_i16x8_s f32x4.convert_i32x4_s local.get $x v128.load offset=16 f32x4.mul local.set $s1
      local.get $v i16x8.extend_high_i8x16_s local.tee $e i32x4.extend_low_i16x8_s f32x4.convert_i32x4_s
      local.get $x v128.load offset=32 f32x4.mul local.get $s0 f32x4.add local.set $s0
      local.get $e i32x4.extend_high_i16x8_s f32x4.convert_i32x4_s local.get $x v128.load offset=48 f32x4.mul
      local.get $s1 f32x4.add local.set $s1
      local.get $h i16x8.extend_low_i8x16_s local.tee $e i32x4.extend_low_i16x8_s f32x4.convert_i32x4_s
      local.get $x v128.load offset=64 f32x4.mul local.get $s0 f32x4.add local.set $s0
      local.get $e i32x4.extend_high_i16x8_s f32x4.convert_i32x4_s local.get $x v128.load offset=80 f32x4.mul
      local.get $s1 f32x4.add local.set $s1
      local.get $h i16x8.extend_high_i8x16_s local.tee $e i32x4.extend_low_i16x8_s f32x4.convert_i32x4_s
      local.get $x v128.load offset=96 f32x4.mul local.get $s0 f32x4.add local.set $s0
      local.get $e i32x4.extend_high_i16x8_s f32x4.convert_i32x4_s local.get $x v128.load offset=112 f32x4.mul
      local.get $s1 f32x4.add local.set $s1
      local.get $acc local.get $s0 local.get $s1 f32x4.add local.get $dm f32.load f32x4.splat f32x4.mul f32x4.add
      local.set $acc
      local.get $qs i32.const 32 i32.add local.set $qs
      local.get $dm i32.const 8 i32.add local.set $dm
      local.get $x i32.const 128 i32.add local.set $x
      local.get $nb i32.const 1 i32.sub local.tee $nb br_if $block
    end
    local.get $acc call $hsum)

  ;; sum over blocks of m * xsum[block]: the mins' term of an 8-bit row of kind 17 (q5_1, q5_K as 8-bit codes)
  (func $mins (param $dm i32) (param $nb i32) (param $xsum i32) (result f32)
    (local $acc f32)
    loop $block
      local.get $acc local.get $dm f32.load offset=4 local.get $xsum f32.load f32.mul f32.add local.set $acc
      local.get $dm i32.const 8 i32.add local.set $dm
      local.get $xsum i32.const 4 i32.add local.set $xsum
      local.get $nb i32.const 1 i32.sub local.tee $nb br_if $block
    end
    local.get $acc)

  ;; An 8-bit row of split scales (kind 9, q6_K's): per block d0 * (codes 0..15 . x) + d1 * (codes 16..31 . x).
  (func $dot_q8_split (param $qs i32) (param $dm i32) (param $nb i32) (param $x i32) (result f32)
    (local $v v128) (local $h v128) (local $e v128) (local $s0 v128) (local $s1 v128) (local $acc v128)
    loop $block
      local.get $qs v128.load local.set $v
      local.get $qs v128.load offset=16 local.set $h
      local.get $v i16x8.extend_low_i8x16_s local.tee $e i32x4.extend_low_i16x8_s f32x4.convert_i32x4_s
      local.get $x v128.load f32x4.mul local.set $s0
      local.get $e i32x4.extend_high_i16x8_s f32x4.convert_i32x4_s local.get $x v128.load offset=16 f32x4.mul local.set $s1
      local.get $v i16x8.extend_high_i8x16_s local.tee $e i32x4.extend_low_i16x8_s f32x4.convert_i32x4_s
      local.get $x v128.load offset=32 f32x4.mul local.get $s0 f32x4.add local.set $s0
      local.get $e i32x4.extend_high_i16x8_s f32x4.convert_i32x4_s local.get $x v128.load offset=48 f32x4.mul
      local.get $s1 f32x4.add local.set $s1
      local.get $acc local.get $s0 local.get $s1 f32x4.add local.get $dm f32.load f32x4.splat f32x4.mul f32x4.add
      local.set $acc
      local.get $h i16x8.extend_low_i8x16_s local.tee $e i32x4.extend_low_i16x8_s f32x4.convert_i32x4_s
      local.get $x v128.load offset=64 f32x4.mul local.set $s0
      local.get $e i32x4.extend_high_i16x8_s f32x4.convert_i32x4_s local.get $x v128.load offset=80 f32x4.mul local.set $s1
      local.get $h i16x8.extend_high_i8x16_s local.tee $e i32x4.extend_low_i16x8_s f32x4.convert_i32x4_s
      local.get $x v128.load offset=96 f32x4.mul local.get $s0 f32x4.add local.set $s0
      local.get $e i32x4.extend_high_i16x8_s f32x4.convert_i32x4_s local.get $x v128.load offset=112 f32x4.mul
      local.get $s1 f32x4.add local.set $s1
      local.get $acc local.get $s0 local.get $s1 f32x4.add local.get $dm f32.load offset=4 f32x4.splat f32x4.mul
      f32x4.add local.set $acc
      local.get $qs i32.const 32 i32.add local.set $qs
      local.get $dm i32.const 8 i32.add local.set $dm
      local.get $x i32.const 128 i32.add local.set $x
      local.get $nb i32.const 1 i32.sub local.tee $nb br_if $block
    end
    local.get $acc call $hsum)

  ;; 16-bit activations (kind | 2, any number of tokens, each the same as alone): x quantized once per product
  ;; (bit 4: done already, every thread reading the same blocks), a scale per 32-value block as llama.cpp's
  ;; q8 blocks but to 16 bits (d = max |x| / 32767, q = nearest(x / d), ties to even: i32x4.dot_i16x8_s takes
  ;; 16-bit lanes, so 8 would buy no speed, and its rounding flips near ties 256 times as wide), and each weight
  ;; block's codes meet q in i32x4.dot_i16x8_s: integer sums (exact up to 2^24 a lane: 4-bit codes always; 8-bit
  ;; codes round there as f32 would), one f32 multiply by d_w * d_x a block. scratch then holds xsum (nb f32:
  ;; d times the sum of the block's q, as llama.cpp's q8_1 s, so a row with mins sums (d_w c + m) q d, its weights
  ;; times the quantized x; the exact sum of x left the error c d_w (q d - x), c's bias not cancelled), xd (nb f32)
  ;; and xq (nb * 32 i16): nb * 72 bytes a token.
  (func $quant_x (export "quant_x") (param $x i32) (param $nb i32) (param $t i32) (param $s i32)
    loop $tokens  ;; token i of x (nb * 32 f32 apart) into its blocks at s + i * nb * 72
      local.get $x local.get $nb local.get $s call $quant_x1
      local.get $x local.get $nb i32.const 7 i32.shl i32.add local.set $x
      local.get $s local.get $nb i32.const 72 i32.mul i32.add local.set $s
      local.get $t i32.const 1 i32.sub local.tee $t br_if $tokens
    end)

  (func $quant_x1 (param $x i32) (param $nb i32) (param $s i32)
    (local $xd i32) (local $xq i32) (local $m v128) (local $a f32) (local $id v128) (local $v v128) (local $acc v128)
    local.get $s local.get $nb i32.const 2 i32.shl i32.add local.set $xd
    local.get $s local.get $nb i32.const 3 i32.shl i32.add local.set $xq
    loop $block
      local.get $x v128.load f32x4.abs local.get $x v128.load offset=16 f32x4.abs f32x4.max
      local.get $x v128.load offset=32 f32x4.abs local.get $x v128.load offset=48 f32x4.abs f32x4.max f32x4.max
      local.get $x v128.load offset=64 f32x4.abs local.get $x v128.load offset=80 f32x4.abs f32x4.max
      local.get $x v128.load offset=96 f32x4.abs local.get $x v128.load offset=112 f32x4.abs f32x4.max f32x4.max
      f32x4.max local.set $m
      local.get $m f32x4.extract_lane 0 local.get $m f32x4.extract_lane 1 f32.max
      local.get $m f32x4.extract_lane 2 local.get $m f32x4.extract_lane 3 f32.max f32.max
      f32.const 32767 f32.div local.set $a  ;; d
      local.get $xd local.get $a f32.store
      f32.const 1 local.get $a f32.div f32.const 0 local.get $a f32.const 0 f32.gt select f32x4.splat local.set $id
      local.get $xq
      local.get $x v128.load local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      local.get $x v128.load offset=16 local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      i16x8.narrow_i32x4_s local.tee $v v128.store
      local.get $v i32x4.extend_low_i16x8_s local.get $v i32x4.extend_high_i16x8_s i32x4.add local.set $acc
      local.get $xq
      local.get $x v128.load offset=32 local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      local.get $x v128.load offset=48 local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      i16x8.narrow_i32x4_s local.tee $v v128.store offset=16
      local.get $acc local.get $v i32x4.extend_low_i16x8_s i32x4.add local.get $v i32x4.extend_high_i16x8_s i32x4.add
      local.set $acc
      local.get $xq
      local.get $x v128.load offset=64 local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      local.get $x v128.load offset=80 local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      i16x8.narrow_i32x4_s local.tee $v v128.store offset=32
      local.get $acc local.get $v i32x4.extend_low_i16x8_s i32x4.add local.get $v i32x4.extend_high_i16x8_s i32x4.add
      local.set $acc
      local.get $xq
      local.get $x v128.load offset=96 local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      local.get $x v128.load offset=112 local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      i16x8.narrow_i32x4_s local.tee $v v128.store offset=48
      local.get $s  ;; xsum = d * the sum of q (exact in f32)
      local.get $acc local.get $v i32x4.extend_low_i16x8_s i32x4.add local.get $v i32x4.extend_high_i16x8_s i32x4.add
      f32x4.convert_i32x4_s call $hsum local.get $a f32.mul f32.store
      local.get $x i32.const 128 i32.add local.set $x
      local.get $s i32.const 4 i32.add local.set $s
      local.get $xd i32.const 4 i32.add local.set $xd
      local.get $xq i32.const 64 i32.add local.set $xq
      local.get $nb i32.const 1 i32.sub local.tee $nb br_if $block
    end)

  ;; One row's dot product with quant_x's blocks at s: per block d_w * d_x * (codes . q) (+ m * xsum); with kind
  ;; bit 8 (split scales) d_x * (d0 * (codes 0..15 . q) + d1 * (codes 16..31 . q)). kind & 1: 8-bit codes.
  (func $dot_x16 (param $kind i32) (param $qs i32) (param $dm i32) (param $nb i32) (param $s i32) (result f32)
    (local $v v128) (local $h v128) (local $lo v128) (local $sum v128) (local $accm f32) (local $xd i32) (local $xq i32)
    (local $split i32) (local $d f32)
    local.get $kind i32.const 3 i32.shr_u i32.const 1 i32.and local.set $split
    local.get $kind i32.const 1 i32.and local.set $kind
    local.get $s local.get $nb i32.const 2 i32.shl i32.add local.set $xd
    local.get $s local.get $nb i32.const 3 i32.shl i32.add local.set $xq
    loop $block
      local.get $qs v128.load local.set $v
      local.get $kind
      if
        local.get $qs v128.load offset=16 local.set $h
        local.get $v i16x8.extend_low_i8x16_s local.get $xq v128.load i32x4.dot_i16x8_s
        local.get $v i16x8.extend_high_i8x16_s local.get $xq v128.load offset=16 i32x4.dot_i16x8_s i32x4.add
        local.set $lo
        local.get $h i16x8.extend_low_i8x16_s local.get $xq v128.load offset=32 i32x4.dot_i16x8_s
        local.get $h i16x8.extend_high_i8x16_s local.get $xq v128.load offset=48 i32x4.dot_i16x8_s i32x4.add
        local.set $h
        local.get $qs i32.const 32 i32.add local.set $qs
      else
        local.get $v i32.const 4 i8x16.shr_u local.set $h
        local.get $v i32.const 15 i8x16.splat v128.and local.set $v
        local.get $v i16x8.extend_low_i8x16_u local.get $xq v128.load i32x4.dot_i16x8_s
        local.get $v i16x8.extend_high_i8x16_u local.get $xq v128.load offset=16 i32x4.dot_i16x8_s i32x4.add
        local.set $lo
        local.get $h i16x8.extend_low_i8x16_u local.get $xq v128.load offset=32 i32x4.dot_i16x8_s
        local.get $h i16x8.extend_high_i8x16_u local.get $xq v128.load offset=48 i32x4.dot_i16x8_s i32x4.add
        local.set $h
        local.get $qs i32.const 16 i32.add local.set $qs
      end
      local.get $dm f32.load local.get $xd f32.load f32.mul local.set $d
      local.get $split
      if
        local.get $sum local.get $lo f32x4.convert_i32x4_s local.get $d f32x4.splat f32x4.mul f32x4.add
        local.get $h f32x4.convert_i32x4_s local.get $dm f32.load offset=4 local.get $xd f32.load f32.mul f32x4.splat
        f32x4.mul f32x4.add local.set $sum
      else
        local.get $sum local.get $lo local.get $h i32x4.add f32x4.convert_i32x4_s local.get $d f32x4.splat f32x4.mul
        f32x4.add local.set $sum
        local.get $accm local.get $dm f32.load offset=4 local.get $s f32.load f32.mul f32.add local.set $accm
      end
      local.get $dm i32.const 8 i32.add local.set $dm
      local.get $s i32.const 4 i32.add local.set $s
      local.get $xd i32.const 4 i32.add local.set $xd
      local.get $xq i32.const 64 i32.add local.set $xq
      local.get $nb i32.const 1 i32.sub local.tee $nb br_if $block
    end
    local.get $sum call $hsum local.get $accm f32.add)

  ;; $dot_x16 of one 8-bit-code row without scales split or mins (kind 1: q8_0 and the codes promoted to it, the
  ;; tied heads among them), the arithmetic $dot_x16's, so bit-identical to it. Without its branches and its mins'
  ;; sum (+0 here, as m is 0) V8 runs 2,048 x 640 rows (in cache) in 0.07 ms, not 0.10; Gemma 3's 262,144-row
  ;; head, read from memory, gains less (docs/performance.md).
  (func $dot_q8_x16 (param $qs i32) (param $dm i32) (param $nb i32) (param $s i32) (result f32)
    (local $v v128) (local $h v128) (local $sum v128) (local $xd i32) (local $xq i32)
    local.get $s local.get $nb i32.const 2 i32.shl i32.add local.set $xd
    local.get $s local.get $nb i32.const 3 i32.shl i32.add local.set $xq
    loop $block
      local.get $qs v128.load local.set $v
      local.get $qs v128.load offset=16 local.set $h
      local.get $sum
      local.get $v i16x8.extend_low_i8x16_s local.get $xq v128.load i32x4.dot_i16x8_s
      local.get $v i16x8.extend_high_i8x16_s local.get $xq v128.load offset=16 i32x4.dot_i16x8_s i32x4.add
      local.get $h i16x8.extend_low_i8x16_s local.get $xq v128.load offset=32 i32x4.dot_i16x8_s
      local.get $h i16x8.extend_high_i8x16_s local.get $xq v128.load offset=48 i32x4.dot_i16x8_s i32x4.add
      i32x4.add f32x4.convert_i32x4_s local.get $dm f32.load local.get $xd f32.load f32.mul f32x4.splat f32x4.mul
      f32x4.add local.set $sum
      local.get $qs i32.const 32 i32.add local.set $qs
      local.get $dm i32.const 8 i32.add local.set $dm
      local.get $xd i32.const 4 i32.add local.set $xd
      local.get $xq i32.const 64 i32.add local.set $xq
      local.get $nb i32.const 1 i32.sub local.tee $nb br_if $block
    end
    local.get $sum call $hsum f32.const 0 f32.add)

  ;; $dot_q8_x16 of a row whose scales are one f32 d a block, without q8_0's zero m (kind 65: the output head, 36
  ;; bytes a block and the row's padding, not 40), the arithmetic $dot_q8_x16's, so the same bits as that row with
  ;; (d, 0) pairs.
  (func $dot_q8d_x16 (param $qs i32) (param $d i32) (param $nb i32) (param $s i32) (result f32)
    (local $v v128) (local $h v128) (local $sum v128) (local $xd i32) (local $xq i32)
    local.get $s local.get $nb i32.const 2 i32.shl i32.add local.set $xd
    local.get $s local.get $nb i32.const 3 i32.shl i32.add local.set $xq
    loop $block
      local.get $qs v128.load local.set $v
      local.get $qs v128.load offset=16 local.set $h
      local.get $sum
      local.get $v i16x8.extend_low_i8x16_s local.get $xq v128.load i32x4.dot_i16x8_s
      local.get $v i16x8.extend_high_i8x16_s local.get $xq v128.load offset=16 i32x4.dot_i16x8_s i32x4.add
      local.get $h i16x8.extend_low_i8x16_s local.get $xq v128.load offset=32 i32x4.dot_i16x8_s
      local.get $h i16x8.extend_high_i8x16_s local.get $xq v128.load offset=48 i32x4.dot_i16x8_s i32x4.add
      i32x4.add f32x4.convert_i32x4_s local.get $d f32.load local.get $xd f32.load f32.mul f32x4.splat f32x4.mul
      f32x4.add local.set $sum
      local.get $qs i32.const 32 i32.add local.set $qs
      local.get $d i32.const 4 i32.add local.set $d
      local.get $xd i32.const 4 i32.add local.set $xd
      local.get $xq i32.const 64 i32.add local.set $xq
      local.get $nb i32.const 1 i32.sub local.tee $nb br_if $block
    end
    local.get $sum call $hsum f32.const 0 f32.add)

  ;; $dot_x16 for four tokens (quant_x's blocks at s, s + stride, ...: out at out, out + ldo f32, ...): each
  ;; weight block's codes widened once for the four, every token's arithmetic $dot_x16's (bit-identical to it).
  (func $dot_x16_t4 (param $kind i32) (param $qs i32) (param $dm i32) (param $nb i32) (param $s i32) (param $stride i32)
    (param $out i32) (param $ldo i32)
    (local $v v128) (local $h v128) (local $e0 v128) (local $e1 v128) (local $e2 v128) (local $e3 v128)
    (local $lo v128) (local $hi v128) (local $sum0 v128) (local $sum1 v128) (local $sum2 v128) (local $sum3 v128)
    (local $accm0 f32) (local $accm1 f32) (local $accm2 f32) (local $accm3 f32) (local $d f32)
    (local $xd i32) (local $xq i32) (local $a i32) (local $split i32) (local $st1 i32) (local $st2 i32) (local $st3 i32)
    local.get $kind i32.const 3 i32.shr_u i32.const 1 i32.and local.set $split
    local.get $kind i32.const 1 i32.and local.set $kind
    local.get $s local.get $nb i32.const 2 i32.shl i32.add local.set $xd
    local.get $s local.get $nb i32.const 3 i32.shl i32.add local.set $xq
    local.get $stride local.set $st1
    local.get $stride i32.const 1 i32.shl local.set $st2
    local.get $st1 local.get $st2 i32.add local.set $st3
    loop $block
      local.get $qs v128.load local.set $v
      local.get $kind
      if
        local.get $qs v128.load offset=16 local.set $h
        local.get $v i16x8.extend_low_i8x16_s local.set $e0
        local.get $v i16x8.extend_high_i8x16_s local.set $e1
        local.get $h i16x8.extend_low_i8x16_s local.set $e2
        local.get $h i16x8.extend_high_i8x16_s local.set $e3
        local.get $qs i32.const 32 i32.add local.set $qs
      else
        local.get $v i32.const 4 i8x16.shr_u local.set $h
        local.get $v i32.const 15 i8x16.splat v128.and local.set $v
        local.get $v i16x8.extend_low_i8x16_u local.set $e0
        local.get $v i16x8.extend_high_i8x16_u local.set $e1
        local.get $h i16x8.extend_low_i8x16_u local.set $e2
        local.get $h i16x8.extend_high_i8x16_u local.set $e3
        local.get $qs i32.const 16 i32.add local.set $qs
      end
      local.get $xq local.set $a  ;; token 0
      local.get $e0 local.get $a v128.load i32x4.dot_i16x8_s
      local.get $e1 local.get $a v128.load offset=16 i32x4.dot_i16x8_s i32x4.add local.set $lo
      local.get $e2 local.get $a v128.load offset=32 i32x4.dot_i16x8_s
      local.get $e3 local.get $a v128.load offset=48 i32x4.dot_i16x8_s i32x4.add local.set $hi
      local.get $xd local.set $a
      local.get $dm f32.load local.get $a f32.load f32.mul local.set $d
      local.get $split
      if
        local.get $sum0 local.get $lo f32x4.convert_i32x4_s local.get $d f32x4.splat f32x4.mul f32x4.add
        local.get $hi f32x4.convert_i32x4_s local.get $dm f32.load offset=4 local.get $a f32.load f32.mul f32x4.splat
        f32x4.mul f32x4.add local.set $sum0
      else
        local.get $sum0 local.get $lo local.get $hi i32x4.add f32x4.convert_i32x4_s local.get $d f32x4.splat f32x4.mul
        f32x4.add local.set $sum0
        local.get $accm0 local.get $dm f32.load offset=4 local.get $s f32.load f32.mul f32.add local.set $accm0
      end
      local.get $xq local.get $st1 i32.add local.set $a  ;; token 1
      local.get $e0 local.get $a v128.load i32x4.dot_i16x8_s
      local.get $e1 local.get $a v128.load offset=16 i32x4.dot_i16x8_s i32x4.add local.set $lo
      local.get $e2 local.get $a v128.load offset=32 i32x4.dot_i16x8_s
      local.get $e3 local.get $a v128.load offset=48 i32x4.dot_i16x8_s i32x4.add local.set $hi
      local.get $xd local.get $st1 i32.add local.set $a
      local.get $dm f32.load local.get $a f32.load f32.mul local.set $d
      local.get $split
      if
        local.get $sum1 local.get $lo f32x4.convert_i32x4_s local.get $d f32x4.splat f32x4.mul f32x4.add
        local.get $hi f32x4.convert_i32x4_s local.get $dm f32.load offset=4 local.get $a f32.load f32.mul f32x4.splat
        f32x4.mul f32x4.add local.set $sum1
      else
        local.get $sum1 local.get $lo local.get $hi i32x4.add f32x4.convert_i32x4_s local.get $d f32x4.splat f32x4.mul
        f32x4.add local.set $sum1
        local.get $accm1 local.get $dm f32.load offset=4 local.get $s local.get $st1 i32.add f32.load f32.mul f32.add local.set $accm1
      end
      local.get $xq local.get $st2 i32.add local.set $a  ;; token 2
      local.get $e0 local.get $a v128.load i32x4.dot_i16x8_s
      local.get $e1 local.get $a v128.load offset=16 i32x4.dot_i16x8_s i32x4.add local.set $lo
      local.get $e2 local.get $a v128.load offset=32 i32x4.dot_i16x8_s
      local.get $e3 local.get $a v128.load offset=48 i32x4.dot_i16x8_s i32x4.add local.set $hi
      local.get $xd local.get $st2 i32.add local.set $a
      local.get $dm f32.load local.get $a f32.load f32.mul local.set $d
      local.get $split
      if
        local.get $sum2 local.get $lo f32x4.convert_i32x4_s local.get $d f32x4.splat f32x4.mul f32x4.add
        local.get $hi f32x4.convert_i32x4_s local.get $dm f32.load offset=4 local.get $a f32.load f32.mul f32x4.splat
        f32x4.mul f32x4.add local.set $sum2
      else
        local.get $sum2 local.get $lo local.get $hi i32x4.add f32x4.convert_i32x4_s local.get $d f32x4.splat f32x4.mul
        f32x4.add local.set $sum2
        local.get $accm2 local.get $dm f32.load offset=4 local.get $s local.get $st2 i32.add f32.load f32.mul f32.add local.set $accm2
      end
      local.get $xq local.get $st3 i32.add local.set $a  ;; token 3
      local.get $e0 local.get $a v128.load i32x4.dot_i16x8_s
      local.get $e1 local.get $a v128.load offset=16 i32x4.dot_i16x8_s i32x4.add local.set $lo
      local.get $e2 local.get $a v128.load offset=32 i32x4.dot_i16x8_s
      local.get $e3 local.get $a v128.load offset=48 i32x4.dot_i16x8_s i32x4.add local.set $hi
      local.get $xd local.get $st3 i32.add local.set $a
      local.get $dm f32.load local.get $a f32.load f32.mul local.set $d
      local.get $split
      if
        local.get $sum3 local.get $lo f32x4.convert_i32x4_s local.get $d f32x4.splat f32x4.mul f32x4.add
        local.get $hi f32x4.convert_i32x4_s local.get $dm f32.load offset=4 local.get $a f32.load f32.mul f32x4.splat
        f32x4.mul f32x4.add local.set $sum3
      else
        local.get $sum3 local.get $lo local.get $hi i32x4.add f32x4.convert_i32x4_s local.get $d f32x4.splat f32x4.mul
        f32x4.add local.set $sum3
        local.get $accm3 local.get $dm f32.load offset=4 local.get $s local.get $st3 i32.add f32.load f32.mul f32.add local.set $accm3
      end
      local.get $dm i32.const 8 i32.add local.set $dm
      local.get $s i32.const 4 i32.add local.set $s
      local.get $xd i32.const 4 i32.add local.set $xd
      local.get $xq i32.const 64 i32.add local.set $xq
      local.get $nb i32.const 1 i32.sub local.tee $nb br_if $block
    end
    local.get $out local.get $sum0 call $hsum local.get $accm0 f32.add f32.store
    local.get $out local.get $ldo i32.const 2 i32.shl i32.add local.tee $out local.get $sum1 call $hsum local.get $accm1 f32.add
    f32.store
    local.get $out local.get $ldo i32.const 2 i32.shl i32.add local.tee $out local.get $sum2 call $hsum local.get $accm2 f32.add
    f32.store
    local.get $out local.get $ldo i32.const 2 i32.shl i32.add local.tee $out local.get $sum3 call $hsum local.get $accm3 f32.add
    f32.store)

  ;; 8-bit activations (kind | 32: 4-bit codes, kind 0, or 8-bit ones 0..127 with mins, kind 17; relaxed SIMD):
  ;; llama.cpp's q8_1 blocks, d = max |x| / 127, q = nearest(x / d) (ties to even) as i8, xsum = d * sum(q), each
  ;; weight block's codes (0..15, or 0..31 for kind 17's 5-bit types: the i7 operand)
  ;; meeting q in i32x4.relaxed_dot_i8x16_i7x16_add_s: sixteen products a lane group in one instruction where
  ;; i32x4.dot_i16x8_s takes eight and the codes widened first, so a one-token product runs 1.5x faster from cache
  ;; (Chromium, 3072x576). Exact integer sums (|codes . q| <= 32 * 127 * 127), so the result does not depend on how
  ;; the browser lowers the instruction. scratch: xsum (nb f32), xd (nb f32), xq (nb * 32 i8): nb * 40 bytes a
  ;; token. Browsers without relaxed SIMD load the module assembled without these functions (build.without_relaxed).
  (func $quant_x8 (export "quant_x8") (param $x i32) (param $nb i32) (param $t i32) (param $s i32)
    loop $tokens  ;; token i of x (nb * 32 f32 apart) into its blocks at s + i * nb * 40
      local.get $x local.get $nb local.get $s call $quant_x8_1
      local.get $x local.get $nb i32.const 7 i32.shl i32.add local.set $x
      local.get $s local.get $nb i32.const 40 i32.mul i32.add local.set $s
      local.get $t i32.const 1 i32.sub local.tee $t br_if $tokens
    end)

  (func $quant_x8_1 (param $x i32) (param $nb i32) (param $s i32)
    (local $xd i32) (local $xq i32) (local $m v128) (local $a f32) (local $id v128) (local $v v128) (local $w v128)
    (local $acc v128)
    local.get $s local.get $nb i32.const 2 i32.shl i32.add local.set $xd
    local.get $s local.get $nb i32.const 3 i32.shl i32.add local.set $xq
    loop $block
      local.get $x v128.load f32x4.abs local.get $x v128.load offset=16 f32x4.abs f32x4.max
      local.get $x v128.load offset=32 f32x4.abs local.get $x v128.load offset=48 f32x4.abs f32x4.max f32x4.max
      local.get $x v128.load offset=64 f32x4.abs local.get $x v128.load offset=80 f32x4.abs f32x4.max
      local.get $x v128.load offset=96 f32x4.abs local.get $x v128.load offset=112 f32x4.abs f32x4.max f32x4.max
      f32x4.max local.set $m
      local.get $m f32x4.extract_lane 0 local.get $m f32x4.extract_lane 1 f32.max
      local.get $m f32x4.extract_lane 2 local.get $m f32x4.extract_lane 3 f32.max f32.max
      f32.const 127 f32.div local.set $a  ;; d
      local.get $xd local.get $a f32.store
      f32.const 1 local.get $a f32.div f32.const 0 local.get $a f32.const 0 f32.gt select f32x4.splat local.set $id
      local.get $x v128.load local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      local.get $x v128.load offset=16 local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      i16x8.narrow_i32x4_s local.set $v
      local.get $x v128.load offset=32 local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      local.get $x v128.load offset=48 local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      i16x8.narrow_i32x4_s local.set $w
      local.get $v i32x4.extend_low_i16x8_s local.get $v i32x4.extend_high_i16x8_s i32x4.add
      local.get $w i32x4.extend_low_i16x8_s i32x4.add local.get $w i32x4.extend_high_i16x8_s i32x4.add local.set $acc
      local.get $xq local.get $v local.get $w i8x16.narrow_i16x8_s v128.store  ;; values 0..15
      local.get $x v128.load offset=64 local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      local.get $x v128.load offset=80 local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      i16x8.narrow_i32x4_s local.set $v
      local.get $x v128.load offset=96 local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      local.get $x v128.load offset=112 local.get $id f32x4.mul f32x4.nearest i32x4.trunc_sat_f32x4_s
      i16x8.narrow_i32x4_s local.set $w
      local.get $xq local.get $v local.get $w i8x16.narrow_i16x8_s v128.store offset=16  ;; values 16..31
      local.get $s  ;; xsum = d * the sum of q (exact in f32)
      local.get $acc local.get $v i32x4.extend_low_i16x8_s i32x4.add local.get $v i32x4.extend_high_i16x8_s i32x4.add
      local.get $w i32x4.extend_low_i16x8_s i32x4.add local.get $w i32x4.extend_high_i16x8_s i32x4.add
      f32x4.convert_i32x4_s call $hsum local.get $a f32.mul f32.store
      local.get $x i32.const 128 i32.add local.set $x
      local.get $s i32.const 4 i32.add local.set $s
      local.get $xd i32.const 4 i32.add local.set $xd
      local.get $xq i32.const 32 i32.add local.set $xq
      local.get $nb i32.const 1 i32.sub local.tee $nb br_if $block
    end)

;; Four 4-bit-code rows (wide: 8-bit codes, kind 17) against n tokens' quant_x8 blocks (token i's at xq + i * q; the
  ;; rows at qs / dm, nb * 16 (32) / nb * 8 bytes apart): per block, each row's codes (the i7 operand) meet each
  ;; token's q in two relaxed dots, the four rows' lanes of one token summed into one i32 lane each (exact
  ;; integers), converted once, times d_w * d_x and added to that token's accumulator of the block's slot; m * xsum
  ;; summed in a second one. acc: five slots of n tokens' (d part, m part), f32x4 over the four rows (n * 32 bytes
  ;; a slot): slot b % 4 for the blocks in fours, slot 4 for the last nb % 4, each summed in block order; out[i * ldo +
  ;; 0..3] = (((s0 + s1) + (s2 + s3)) + s4) d part + the same of the m parts. Per row and token that is
  ;; $dot_x8_r1's arithmetic, in its order (its four lanes are the slots), so a row gives the same bits in either
  ;; and every token its own (the decoded codes and the scales shared by the chunk's tokens: 2.2 -> ~3.7
  ;; multiply-adds an instruction).
  (func $dot_x8_r4 (param $qs i32) (param $dm i32) (param $nb i32) (param $xq i32) (param $q i32) (param $n i32)
    (param $acc i32) (param $out i32) (param $ldo i32) (param $wide i32)
    (local $lo0 v128) (local $hi0 v128) (local $lo1 v128) (local $hi1 v128) (local $lo2 v128) (local $hi2 v128)
    (local $lo3 v128) (local $hi3 v128) (local $dv v128) (local $mv v128) (local $xl v128) (local $xh v128)
    (local $i0 v128) (local $i1 v128) (local $i2 v128) (local $i3 v128) (local $low v128) (local $z v128)
    (local $rq i32) (local $rd i32) (local $b i32) (local $xp i32) (local $ap i32) (local $end i32) (local $so i32) (local $sl i32)
    i32.const 15 i8x16.splat local.set $low
    local.get $nb i32.const 4 local.get $wide i32.add i32.shl local.set $rq  ;; bytes a row's codes
    local.get $nb i32.const 3 i32.shl local.set $rd  ;; bytes a row's scales
    local.get $n i32.const 5 i32.shl local.set $sl  ;; bytes a slot: n tokens x (d part, m part)
    local.get $acc local.get $sl i32.const 5 i32.mul i32.add local.set $end
    local.get $acc local.set $ap
    loop $zero
      local.get $ap local.get $z v128.store
      local.get $ap i32.const 16 i32.add local.tee $ap local.get $end i32.lt_u br_if $zero
    end
    loop $block
      local.get $wide
      if  ;; 8-bit codes: weights 0..15 and 16..31 of each row's block as they are
        local.get $qs v128.load local.set $lo0
        local.get $qs v128.load offset=16 local.set $hi0
        local.get $qs local.get $rq i32.add local.tee $ap v128.load local.set $lo1
        local.get $ap v128.load offset=16 local.set $hi1
        local.get $ap local.get $rq i32.add local.tee $ap v128.load local.set $lo2
        local.get $ap v128.load offset=16 local.set $hi2
        local.get $ap local.get $rq i32.add local.tee $ap v128.load local.set $lo3
        local.get $ap v128.load offset=16 local.set $hi3
      else  ;; 4-bit codes: weight j in byte j's low nibble, weight 16 + j in its high one
        local.get $qs v128.load local.tee $i0 local.get $low v128.and local.set $lo0
        local.get $i0 i32.const 4 i8x16.shr_u local.set $hi0
        local.get $qs local.get $rq i32.add v128.load local.tee $i0 local.get $low v128.and local.set $lo1
        local.get $i0 i32.const 4 i8x16.shr_u local.set $hi1
        local.get $qs local.get $rq i32.const 1 i32.shl i32.add v128.load local.tee $i0 local.get $low v128.and local.set $lo2
        local.get $i0 i32.const 4 i8x16.shr_u local.set $hi2
        local.get $qs local.get $rq i32.const 3 i32.mul i32.add v128.load local.tee $i0 local.get $low v128.and local.set $lo3
        local.get $i0 i32.const 4 i8x16.shr_u local.set $hi3
      end
      local.get $dm f32.load f32x4.splat  ;; the four rows' d, then m
      local.get $dm local.get $rd i32.add f32.load f32x4.replace_lane 1
      local.get $dm local.get $rd i32.const 1 i32.shl i32.add f32.load f32x4.replace_lane 2
      local.get $dm local.get $rd i32.const 3 i32.mul i32.add f32.load f32x4.replace_lane 3 local.set $dv
      local.get $dm f32.load offset=4 f32x4.splat
      local.get $dm local.get $rd i32.add f32.load offset=4 f32x4.replace_lane 1
      local.get $dm local.get $rd i32.const 1 i32.shl i32.add f32.load offset=4 f32x4.replace_lane 2
      local.get $dm local.get $rd i32.const 3 i32.mul i32.add f32.load offset=4 f32x4.replace_lane 3 local.set $mv
      i32.const 4  ;; the block's slot: b % 4 for the blocks in fours, 4 for the last nb % 4 ($dot_x8_r1's lanes)
      local.get $b i32.const 3 i32.and
      local.get $b local.get $nb i32.const -4 i32.and i32.ge_u select local.get $sl i32.mul local.set $so
      local.get $xq local.set $xp
      local.get $acc local.get $so i32.add local.set $ap
      loop $tokens  ;; token i of the chunk: its block b's q, d and xsum
        local.get $xp local.get $nb i32.const 3 i32.shl i32.add local.get $b i32.const 5 i32.shl i32.add local.tee $end
        v128.load local.set $xl
        local.get $end v128.load offset=16 local.set $xh
        local.get $xh local.get $hi0 local.get $xl local.get $lo0 local.get $z
        i32x4.relaxed_dot_i8x16_i7x16_add_s i32x4.relaxed_dot_i8x16_i7x16_add_s local.set $i0
        local.get $xh local.get $hi1 local.get $xl local.get $lo1 local.get $z
        i32x4.relaxed_dot_i8x16_i7x16_add_s i32x4.relaxed_dot_i8x16_i7x16_add_s local.set $i1
        local.get $xh local.get $hi2 local.get $xl local.get $lo2 local.get $z
        i32x4.relaxed_dot_i8x16_i7x16_add_s i32x4.relaxed_dot_i8x16_i7x16_add_s local.set $i2
        local.get $xh local.get $hi3 local.get $xl local.get $lo3 local.get $z
        i32x4.relaxed_dot_i8x16_i7x16_add_s i32x4.relaxed_dot_i8x16_i7x16_add_s local.set $i3
        ;; [sum i0, sum i1, sum i2, sum i3]: lanes paired, then halves
        local.get $i0 local.get $i1 i8x16.shuffle 0 1 2 3 16 17 18 19 8 9 10 11 24 25 26 27
        local.get $i0 local.get $i1 i8x16.shuffle 4 5 6 7 20 21 22 23 12 13 14 15 28 29 30 31 i32x4.add local.set $i0
        local.get $i2 local.get $i3 i8x16.shuffle 0 1 2 3 16 17 18 19 8 9 10 11 24 25 26 27
        local.get $i2 local.get $i3 i8x16.shuffle 4 5 6 7 20 21 22 23 12 13 14 15 28 29 30 31 i32x4.add local.set $i2
        local.get $i0 local.get $i2 i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23
        local.get $i0 local.get $i2 i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 i32x4.add
        f32x4.convert_i32x4_s
        local.get $dv local.get $xp local.get $nb i32.const 2 i32.shl i32.add local.get $b i32.const 2 i32.shl i32.add
        f32.load f32x4.splat f32x4.mul f32x4.mul
        local.get $ap v128.load f32x4.add local.set $i1
        local.get $ap local.get $i1 v128.store
        local.get $ap local.get $ap v128.load offset=16
        local.get $mv local.get $xp local.get $b i32.const 2 i32.shl i32.add f32.load f32x4.splat f32x4.mul f32x4.add
        v128.store offset=16
        local.get $ap i32.const 32 i32.add local.set $ap
        local.get $xp local.get $q i32.add local.tee $xp
        local.get $xq local.get $n local.get $q i32.mul i32.add i32.lt_u br_if $tokens
      end
      local.get $qs i32.const 16 local.get $wide i32.shl i32.add local.set $qs
      local.get $dm i32.const 8 i32.add local.set $dm
      local.get $b i32.const 1 i32.add local.tee $b local.get $nb i32.lt_u br_if $block
    end
    local.get $acc local.set $ap
    loop $stores  ;; out's row i, the four rows': ((slot 0 + 1) + (2 + 3)) + slot 4, d part + m part
      local.get $out
      local.get $ap v128.load local.get $ap local.get $sl i32.add local.tee $so v128.load f32x4.add
      local.get $so local.get $sl i32.add local.tee $so v128.load
      local.get $so local.get $sl i32.add local.tee $so v128.load f32x4.add f32x4.add
      local.get $so local.get $sl i32.add local.tee $so v128.load f32x4.add
      local.get $ap v128.load offset=16 local.get $ap local.get $sl i32.add local.tee $so v128.load offset=16 f32x4.add
      local.get $so local.get $sl i32.add local.tee $so v128.load offset=16
      local.get $so local.get $sl i32.add local.tee $so v128.load offset=16 f32x4.add f32x4.add
      local.get $so local.get $sl i32.add local.tee $so v128.load offset=16 f32x4.add
      f32x4.add v128.store
      local.get $out local.get $ldo i32.const 2 i32.shl i32.add local.set $out
      local.get $ap i32.const 32 i32.add local.tee $ap local.get $acc local.get $sl i32.add i32.lt_u
      br_if $stores
    end)

  ;; One 4-bit-code row against n tokens' quant_x8 blocks: $dot_x8_r4's arithmetic for one row (its lane), token
  ;; by token: per block the codes' two relaxed dots, the i32 lanes summed, converted, times d_w * d_x; m * xsum
  ;; apart. Four blocks at a time (a decode step's rows): their sums gathered into one i32x4, converted and scaled
  ;; as one vector added to a vector accumulator (lane j: blocks j, j + 4, ...), the last nb % 4 blocks in order
  ;; into a scalar; out[i * ldo] = ($hsum of the lanes + the scalar) d part + the same m part: $dot_x8_r4's slots.
  (func $dot_x8_r1 (param $qs i32) (param $dm i32) (param $nb i32) (param $xq i32) (param $q i32) (param $n i32)
    (param $out i32) (param $ldo i32)
    (local $lo v128) (local $v v128) (local $z v128) (local $i0 v128) (local $i1 v128) (local $i2 v128)
    (local $i3 v128) (local $p v128) (local $pm v128) (local $accdv v128) (local $accmv v128) (local $low v128) (local $accd f32) (local $accm f32)
    (local $b i32) (local $at i32) (local $xp i32) (local $w i32) (local $e i32)
    i32.const 15 i8x16.splat local.set $low
    local.get $xq local.set $xp
    loop $tokens
      f32.const 0 local.set $accd
      f32.const 0 local.set $accm
      local.get $z local.tee $accdv local.set $accmv
      i32.const 0 local.set $b
      local.get $xp local.get $nb i32.const 3 i32.shl i32.add local.set $at  ;; the token's q
      local.get $qs local.set $w
      block $fours
        loop $quads  ;; blocks b .. b + 3
          local.get $b i32.const 4 i32.add local.get $nb i32.gt_u br_if $fours
          local.get $at v128.load offset=16 local.get $w v128.load local.tee $v i32.const 4 i8x16.shr_u
          local.get $at v128.load local.get $v local.get $low v128.and local.get $z
          i32x4.relaxed_dot_i8x16_i7x16_add_s i32x4.relaxed_dot_i8x16_i7x16_add_s local.set $i0
          local.get $at v128.load offset=48 local.get $w v128.load offset=16 local.tee $v i32.const 4 i8x16.shr_u
          local.get $at v128.load offset=32 local.get $v local.get $low v128.and local.get $z
          i32x4.relaxed_dot_i8x16_i7x16_add_s i32x4.relaxed_dot_i8x16_i7x16_add_s local.set $i1
          local.get $at v128.load offset=80 local.get $w v128.load offset=32 local.tee $v i32.const 4 i8x16.shr_u
          local.get $at v128.load offset=64 local.get $v local.get $low v128.and local.get $z
          i32x4.relaxed_dot_i8x16_i7x16_add_s i32x4.relaxed_dot_i8x16_i7x16_add_s local.set $i2
          local.get $at v128.load offset=112 local.get $w v128.load offset=48 local.tee $v i32.const 4 i8x16.shr_u
          local.get $at v128.load offset=96 local.get $v local.get $low v128.and local.get $z
          i32x4.relaxed_dot_i8x16_i7x16_add_s i32x4.relaxed_dot_i8x16_i7x16_add_s local.set $i3
          local.get $i0 local.get $i1 i8x16.shuffle 0 1 2 3 16 17 18 19 8 9 10 11 24 25 26 27
          local.get $i0 local.get $i1 i8x16.shuffle 4 5 6 7 20 21 22 23 12 13 14 15 28 29 30 31 i32x4.add local.set $i0
          local.get $i2 local.get $i3 i8x16.shuffle 0 1 2 3 16 17 18 19 8 9 10 11 24 25 26 27
          local.get $i2 local.get $i3 i8x16.shuffle 4 5 6 7 20 21 22 23 12 13 14 15 28 29 30 31 i32x4.add local.set $i2
          local.get $i0 local.get $i2 i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23
          local.get $i0 local.get $i2 i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 i32x4.add
          f32x4.convert_i32x4_s  ;; the four blocks' sums
          local.get $dm local.get $b i32.const 3 i32.shl i32.add local.tee $e v128.load local.tee $v
          local.get $e v128.load offset=16 local.tee $lo i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27  ;; d
          local.get $xp local.get $nb i32.const 2 i32.shl i32.add local.get $b i32.const 2 i32.shl i32.add v128.load
          f32x4.mul f32x4.mul local.set $p
          local.get $v local.get $lo i8x16.shuffle 4 5 6 7 12 13 14 15 20 21 22 23 28 29 30 31  ;; m
          local.get $xp local.get $b i32.const 2 i32.shl i32.add v128.load f32x4.mul local.set $pm
          local.get $accdv local.get $p f32x4.add local.set $accdv  ;; lane j: blocks j, j + 4, ... in order
          local.get $accmv local.get $pm f32x4.add local.set $accmv
          local.get $at i32.const 128 i32.add local.set $at
          local.get $w i32.const 64 i32.add local.set $w
          local.get $b i32.const 4 i32.add local.set $b
          br $quads
        end
      end
      block $done
        loop $block  ;; the last nb % 4 blocks
          local.get $b local.get $nb i32.ge_u br_if $done
          local.get $at v128.load offset=16 local.get $w v128.load local.tee $v i32.const 4 i8x16.shr_u
          local.get $at v128.load local.get $v local.get $low v128.and local.get $z
          i32x4.relaxed_dot_i8x16_i7x16_add_s i32x4.relaxed_dot_i8x16_i7x16_add_s local.tee $v
          local.get $v local.get $v i8x16.shuffle 4 5 6 7 0 1 2 3 12 13 14 15 8 9 10 11 i32x4.add local.tee $v
          local.get $v local.get $v i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 i32x4.add i32x4.extract_lane 0
          f32.convert_i32_s
          local.get $dm local.get $b i32.const 3 i32.shl i32.add f32.load
          local.get $xp local.get $nb i32.const 2 i32.shl i32.add local.get $b i32.const 2 i32.shl i32.add f32.load
          f32.mul f32.mul local.get $accd f32.add local.set $accd
          local.get $accm
          local.get $dm local.get $b i32.const 3 i32.shl i32.add f32.load offset=4
          local.get $xp local.get $b i32.const 2 i32.shl i32.add f32.load f32.mul f32.add local.set $accm
          local.get $at i32.const 32 i32.add local.set $at
          local.get $w i32.const 16 i32.add local.set $w
          local.get $b i32.const 1 i32.add local.set $b
          br $block
        end
      end
      local.get $out  ;; (the lanes' sum, $hsum's order) + the last blocks, d part + m part: $dot_x8_r4's order
      local.get $accdv call $hsum local.get $accd f32.add local.get $accmv call $hsum local.get $accm f32.add f32.add
      f32.store
      local.get $out local.get $ldo i32.const 2 i32.shl i32.add local.set $out
      local.get $xp local.get $q i32.add local.tee $xp
      local.get $xq local.get $n local.get $q i32.mul i32.add i32.lt_u br_if $tokens
    end)

  ;; $dot_x8_r1 for a row of 8-bit codes (0..31: q5_0's, q5_1's, q5_K's; 32 bytes a block), weights 0..15
  ;; and 16..31 of a block loaded as they are: the same arithmetic, in the same order.
  (func $dot_u8_r1 (param $qs i32) (param $dm i32) (param $nb i32) (param $xq i32) (param $q i32) (param $n i32)
    (param $out i32) (param $ldo i32)
    (local $lo v128) (local $v v128) (local $z v128) (local $i0 v128) (local $i1 v128) (local $i2 v128)
    (local $i3 v128) (local $p v128) (local $pm v128) (local $accdv v128) (local $accmv v128) (local $accd f32) (local $accm f32)
    (local $b i32) (local $at i32) (local $xp i32) (local $w i32) (local $e i32)
    local.get $xq local.set $xp
    loop $tokens
      f32.const 0 local.set $accd
      f32.const 0 local.set $accm
      local.get $z local.tee $accdv local.set $accmv
      i32.const 0 local.set $b
      local.get $xp local.get $nb i32.const 3 i32.shl i32.add local.set $at  ;; the token's q
      local.get $qs local.set $w
      block $fours
        loop $quads  ;; blocks b .. b + 3
          local.get $b i32.const 4 i32.add local.get $nb i32.gt_u br_if $fours
          local.get $at v128.load offset=16 local.get $w v128.load offset=16
          local.get $at v128.load local.get $w v128.load local.get $z
          i32x4.relaxed_dot_i8x16_i7x16_add_s i32x4.relaxed_dot_i8x16_i7x16_add_s local.set $i0
          local.get $at v128.load offset=48 local.get $w v128.load offset=48
          local.get $at v128.load offset=32 local.get $w v128.load offset=32 local.get $z
          i32x4.relaxed_dot_i8x16_i7x16_add_s i32x4.relaxed_dot_i8x16_i7x16_add_s local.set $i1
          local.get $at v128.load offset=80 local.get $w v128.load offset=80
          local.get $at v128.load offset=64 local.get $w v128.load offset=64 local.get $z
          i32x4.relaxed_dot_i8x16_i7x16_add_s i32x4.relaxed_dot_i8x16_i7x16_add_s local.set $i2
          local.get $at v128.load offset=112 local.get $w v128.load offset=112
          local.get $at v128.load offset=96 local.get $w v128.load offset=96 local.get $z
          i32x4.relaxed_dot_i8x16_i7x16_add_s i32x4.relaxed_dot_i8x16_i7x16_add_s local.set $i3
          local.get $i0 local.get $i1 i8x16.shuffle 0 1 2 3 16 17 18 19 8 9 10 11 24 25 26 27
          local.get $i0 local.get $i1 i8x16.shuffle 4 5 6 7 20 21 22 23 12 13 14 15 28 29 30 31 i32x4.add local.set $i0
          local.get $i2 local.get $i3 i8x16.shuffle 0 1 2 3 16 17 18 19 8 9 10 11 24 25 26 27
          local.get $i2 local.get $i3 i8x16.shuffle 4 5 6 7 20 21 22 23 12 13 14 15 28 29 30 31 i32x4.add local.set $i2
          local.get $i0 local.get $i2 i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23
          local.get $i0 local.get $i2 i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 i32x4.add
          f32x4.convert_i32x4_s  ;; the four blocks' sums
          local.get $dm local.get $b i32.const 3 i32.shl i32.add local.tee $e v128.load local.tee $v
          local.get $e v128.load offset=16 local.tee $lo i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27  ;; d
          local.get $xp local.get $nb i32.const 2 i32.shl i32.add local.get $b i32.const 2 i32.shl i32.add v128.load
          f32x4.mul f32x4.mul local.set $p
          local.get $v local.get $lo i8x16.shuffle 4 5 6 7 12 13 14 15 20 21 22 23 28 29 30 31  ;; m
          local.get $xp local.get $b i32.const 2 i32.shl i32.add v128.load f32x4.mul local.set $pm
          local.get $accdv local.get $p f32x4.add local.set $accdv  ;; lane j: blocks j, j + 4, ... in order
          local.get $accmv local.get $pm f32x4.add local.set $accmv
          local.get $at i32.const 128 i32.add local.set $at
          local.get $w i32.const 128 i32.add local.set $w
          local.get $b i32.const 4 i32.add local.set $b
          br $quads
        end
      end
      block $done
        loop $block  ;; the last nb % 4 blocks
          local.get $b local.get $nb i32.ge_u br_if $done
          local.get $at v128.load offset=16 local.get $w v128.load offset=16
          local.get $at v128.load local.get $w v128.load local.get $z
          i32x4.relaxed_dot_i8x16_i7x16_add_s i32x4.relaxed_dot_i8x16_i7x16_add_s local.tee $v
          local.get $v local.get $v i8x16.shuffle 4 5 6 7 0 1 2 3 12 13 14 15 8 9 10 11 i32x4.add local.tee $v
          local.get $v local.get $v i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 i32x4.add i32x4.extract_lane 0
          f32.convert_i32_s
          local.get $dm local.get $b i32.const 3 i32.shl i32.add f32.load
          local.get $xp local.get $nb i32.const 2 i32.shl i32.add local.get $b i32.const 2 i32.shl i32.add f32.load
          f32.mul f32.mul local.get $accd f32.add local.set $accd
          local.get $accm
          local.get $dm local.get $b i32.const 3 i32.shl i32.add f32.load offset=4
          local.get $xp local.get $b i32.const 2 i32.shl i32.add f32.load f32.mul f32.add local.set $accm
          local.get $at i32.const 32 i32.add local.set $at
          local.get $w i32.const 32 i32.add local.set $w
          local.get $b i32.const 1 i32.add local.set $b
          br $block
        end
      end
      local.get $out  ;; (the lanes' sum, $hsum's order) + the last blocks, d part + m part: $dot_x8_r4's order
      local.get $accdv call $hsum local.get $accd f32.add local.get $accmv call $hsum local.get $accm f32.add f32.add
      f32.store
      local.get $out local.get $ldo i32.const 2 i32.shl i32.add local.set $out
      local.get $xp local.get $q i32.add local.tee $xp
      local.get $xq local.get $n local.get $q i32.mul i32.add i32.lt_u br_if $tokens
    end)

  ;; xsum[b] = the sum of x's block b (nb blocks of 32 f32)
  (func $block_sums (param $x i32) (param $nb i32) (param $xsum i32)
    loop $block
      local.get $xsum
      local.get $x v128.load local.get $x v128.load offset=16 f32x4.add
      local.get $x v128.load offset=32 local.get $x v128.load offset=48 f32x4.add f32x4.add
      local.get $x v128.load offset=64 local.get $x v128.load offset=80 f32x4.add
      local.get $x v128.load offset=96 local.get $x v128.load offset=112 f32x4.add f32x4.add
      f32x4.add call $hsum f32.store
      local.get $x i32.const 128 i32.add local.set $x
      local.get $xsum i32.const 4 i32.add local.set $xsum
      local.get $nb i32.const 1 i32.sub local.tee $nb br_if $block
    end)

  ;; out = dot(w, x) for one token; four accumulators hide the add latency (cols is a multiple of 32).
  (func $dot1 (param $w i32) (param $x i32) (param $cols i32) (param $out i32)
    (local $end i32) (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    local.get $w local.get $cols i32.const 2 i32.shl i32.add local.set $end
    loop $k
      local.get $a0 local.get $w v128.load local.get $x v128.load f32x4.mul f32x4.add local.set $a0
      local.get $a1 local.get $w v128.load offset=16 local.get $x v128.load offset=16 f32x4.mul f32x4.add local.set $a1
      local.get $a2 local.get $w v128.load offset=32 local.get $x v128.load offset=32 f32x4.mul f32x4.add local.set $a2
      local.get $a3 local.get $w v128.load offset=48 local.get $x v128.load offset=48 f32x4.mul f32x4.add local.set $a3
      local.get $x i32.const 64 i32.add local.set $x
      local.get $w i32.const 64 i32.add local.tee $w local.get $end i32.lt_u br_if $k
    end
    local.get $out local.get $a0 local.get $a1 f32x4.add local.get $a2 local.get $a3 f32x4.add f32x4.add
    call $hsum f32.store)

  ;; Four tokens (rows of x, cols apart) against one decoded weight row: each weight vector loaded once.
  ;; out[i * rows] = dot(w, x_i).
  (func $dot4 (param $w i32) (param $x i32) (param $cols i32) (param $out i32) (param $rows i32)
    (local $k i32) (local $p i32) (local $step i32) (local $wv v128) (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    local.get $cols i32.const 2 i32.shl local.set $step
    loop $kloop
      local.get $w local.get $k i32.add v128.load local.set $wv
      local.get $a0 local.get $wv local.get $x local.get $k i32.add local.tee $p v128.load f32x4.mul f32x4.add local.set $a0
      local.get $a1 local.get $wv local.get $p local.get $step i32.add local.tee $p v128.load f32x4.mul f32x4.add local.set $a1
      local.get $a2 local.get $wv local.get $p local.get $step i32.add local.tee $p v128.load f32x4.mul f32x4.add local.set $a2
      local.get $a3 local.get $wv local.get $p local.get $step i32.add v128.load f32x4.mul f32x4.add local.set $a3
      local.get $k i32.const 16 i32.add local.tee $k local.get $step i32.lt_u br_if $kloop
    end
    local.get $rows i32.const 2 i32.shl local.set $step
    local.get $out local.get $a0 call $hsum f32.store
    local.get $out local.get $step i32.add local.tee $out local.get $a1 call $hsum f32.store
    local.get $out local.get $step i32.add local.tee $out local.get $a2 call $hsum f32.store
    local.get $out local.get $step i32.add local.get $a3 call $hsum f32.store)

  ;; out (t, rows) = x (t, cols) @ W.T for W (rows, cols) of `kind`, out's rows ldo f32 apart (ldo = rows, or
  ;; the whole weight's rows when a thread takes a slice of them: web/linear_threads.js). Integer activations (8-
  ;; or 16-bit): every token's quantized blocks against each row's codes: 16-bit four tokens at a time
  ;; ($dot_x16_t4), the rest one at a time; 8-bit four rows at a time against a chunk's tokens ($dot_x8_r4), the
  ;; last rows one at a time ($dot_x8_r1). One token (decode) reads the rows one after another ($dot_x8_r1 for
  ;; every row), which streams from memory faster than rows side by side (Chromium, 30 SmolLM2-shaped layers,
  ;; 80 MB: 8-bit 8.8 -> 7.5 ms, 16-bit 10.2 -> 9.2; four rows took a SmolLM2 decode step 8.5 -> 9.9 ms). f32, one token: each row straight from its blocks ($row's dot). More:
  ;; tokens go in chunks of 16 (the chunk of x stays in cache while every row passes); each row is decoded once
  ;; per chunk, then used by tiles of four tokens and single ones.
  (func $matmul (export "matmul") (param $kind i32) (param $qs i32) (param $dm i32) (param $rows i32)
    (param $cols i32) (param $x i32) (param $t i32) (param $out i32) (param $ldo i32) (param $scratch i32)
    (local $nb i32) (local $t0 i32) (local $n i32) (local $r i32) (local $q i32) (local $s i32) (local $xp i32) (local $o i32)
    (local $mode i32) (local $q8 i32) (local $dstep i32) (local $qstep i32)
    local.get $kind i32.const 38 i32.and local.set $mode  ;; 2: 16-bit activations; 32: 8-bit; 4: x quantized already
    local.get $kind i32.const 89 i32.and local.set $kind  ;; 1: 8-bit codes; 8: split scales; 16: mins; 64: d only
    local.get $kind i32.const 64 i32.and
    if  ;; kind 65 (d only) runs with 16-bit activations only
      local.get $mode i32.const 2 i32.and i32.eqz
      if unreachable end
    end
    local.get $kind i32.const 1 i32.and local.set $q8  ;; a row's qs: nb << (4 + q8) bytes
    local.get $cols i32.const 5 i32.shr_u local.set $nb
    local.get $nb i32.const 3 i32.shl local.set $dstep  ;; a row's scales: nb (d, m) f32 pairs
    local.get $nb i32.const 4 local.get $q8 i32.add i32.shl local.set $qstep
    local.get $kind i32.const 64 i32.and
    if  ;; d only: one row's d and codes together, a row apart (the header's kind 65)
      local.get $nb i32.const 2 i32.shl i32.const 15 i32.add i32.const -16 i32.and local.get $qstep i32.add
      local.tee $dstep local.set $qstep
    end
    local.get $mode i32.const 32 i32.and
    if  ;; 8-bit activations (kind 0, or 17: 8-bit codes 0..127 with mins): quant_x8 every token into scratch unless
        ;; bit 4 (then x holds them and scratch is this thread's own), then four rows at a time ($dot_x8_r4) on
        ;; tokens in chunks of 16, the accumulators after the tokens' blocks (scratch + t * nb * 40: 16 tokens x 160
        ;; bytes); the codes are the relaxed dot's 0..127 operand, so other kinds trap
      local.get $kind i32.eqz local.get $kind i32.const 17 i32.eq i32.or i32.eqz
      if unreachable end
      local.get $nb i32.const 40 i32.mul local.set $q  ;; bytes a quantized token
      local.get $mode i32.const 4 i32.and
      if
        local.get $x local.set $xp  ;; the tokens' blocks; scratch: the accumulators
      else
        local.get $x local.get $nb local.get $t local.get $scratch call $quant_x8
        local.get $scratch local.set $xp
        local.get $scratch local.get $t local.get $q i32.mul i32.add local.set $scratch
      end
      loop $chunks_x8  ;; tokens in chunks of 16 (their blocks stay in cache while every row passes)
        local.get $t local.get $t0 i32.sub local.set $n
        i32.const 16 local.get $n local.get $n i32.const 16 i32.gt_u select local.set $n
        local.get $xp local.get $t0 local.get $q i32.mul i32.add local.set $mode  ;; the chunk's first token
        local.get $out local.get $t0 local.get $ldo i32.mul i32.const 2 i32.shl i32.add local.set $o
        local.get $qs local.set $s
        local.get $dm local.set $dstep
        i32.const 0 local.set $r
        block $fours
          loop $rows4
            local.get $r i32.const 4 i32.add local.get $rows i32.gt_u br_if $fours
            local.get $t i32.const 1 i32.eq br_if $fours  ;; one token (decode): row after row streams faster
            local.get $s local.get $dstep local.get $nb local.get $mode local.get $q local.get $n local.get $scratch
            local.get $o local.get $ldo local.get $q8 call $dot_x8_r4
            local.get $s local.get $nb i32.const 6 local.get $q8 i32.add i32.shl i32.add local.set $s  ;; 4 rows' codes
            local.get $dstep local.get $nb i32.const 5 i32.shl i32.add local.set $dstep  ;; 4 rows of nb * 8
            local.get $o i32.const 16 i32.add local.set $o
            local.get $r i32.const 4 i32.add local.set $r
            br $rows4
          end
        end
        block $ones
          loop $rows1
            local.get $r local.get $rows i32.ge_u br_if $ones
            local.get $s local.get $dstep local.get $nb local.get $mode local.get $q local.get $n local.get $o
            local.get $ldo
            local.get $q8
            if (param i32 i32 i32 i32 i32 i32 i32 i32)
              call $dot_u8_r1
            else
              call $dot_x8_r1
            end
            local.get $s local.get $nb i32.const 4 local.get $q8 i32.add i32.shl i32.add local.set $s
            local.get $dstep local.get $nb i32.const 3 i32.shl i32.add local.set $dstep
            local.get $o i32.const 4 i32.add local.set $o
            local.get $r i32.const 1 i32.add local.set $r
            br $rows1
          end
        end
        local.get $t0 i32.const 16 i32.add local.tee $t0 local.get $t i32.lt_u br_if $chunks_x8
      end
      return
    end
    local.get $mode i32.const 2 i32.and
    if  ;; 16-bit activations: quant_x every token into scratch (unless done: bit 4), then $dot_x16_t4 / $dot_x16
      local.get $mode i32.const 4 i32.and i32.eqz
      if
        local.get $x local.get $nb local.get $t local.get $scratch call $quant_x
      end
      local.get $nb i32.const 72 i32.mul local.set $q  ;; bytes a quantized token
      loop $chunks8  ;; tokens in chunks of 16 (their blocks stay in cache while every row passes)
        local.get $qs local.set $xp
        local.get $dm local.set $s
        i32.const 0 local.set $r
        loop $rows8
          local.get $t local.get $t0 i32.sub local.set $n
          i32.const 16 local.get $n local.get $n i32.const 16 i32.gt_u select local.set $n
          local.get $scratch local.get $t0 local.get $q i32.mul i32.add local.set $mode
          local.get $out local.get $t0 local.get $ldo i32.mul local.get $r i32.add i32.const 2 i32.shl i32.add local.set $o
          block $tiled8
            loop $tiles8
              local.get $n i32.const 4 i32.lt_u br_if $tiled8
              local.get $kind i32.const 64 i32.and br_if $tiled8  ;; d only: one token at a time
              local.get $kind local.get $xp local.get $s local.get $nb local.get $mode local.get $q local.get $o local.get $ldo
              call $dot_x16_t4
              local.get $mode local.get $q i32.const 2 i32.shl i32.add local.set $mode
              local.get $o local.get $ldo i32.const 4 i32.shl i32.add local.set $o
              local.get $n i32.const 4 i32.sub local.set $n
              br $tiles8
            end
          end
          block $single8
            loop $ones8
              local.get $n i32.eqz br_if $single8
              local.get $o
              local.get $kind i32.const 1 i32.eq
              if (param i32) (result i32 f32)  ;; kind 1: the same products without the branches
                local.get $xp local.get $s local.get $nb local.get $mode call $dot_q8_x16
              else
                local.get $kind i32.const 65 i32.eq
                if (param i32) (result i32 f32)
                  local.get $xp local.get $s local.get $nb local.get $mode call $dot_q8d_x16
                else
                  local.get $kind local.get $xp local.get $s local.get $nb local.get $mode call $dot_x16
                end
              end
              f32.store
              local.get $mode local.get $q i32.add local.set $mode
              local.get $o local.get $ldo i32.const 2 i32.shl i32.add local.set $o
              local.get $n i32.const 1 i32.sub local.set $n
              br $ones8
            end
          end
          local.get $xp local.get $qstep i32.add local.set $xp
          local.get $s local.get $dstep i32.add local.set $s
          local.get $r i32.const 1 i32.add local.tee $r local.get $rows i32.lt_u br_if $rows8
        end
        local.get $t0 i32.const 16 i32.add local.tee $t0 local.get $t i32.lt_u br_if $chunks8
      end
      return
    end
    local.get $t i32.const 1 i32.eq
    if  ;; one token (decode): each row's blocks meet x in registers, no decoded row in memory
      local.get $x local.get $nb local.get $scratch call $block_sums
      loop $vec
        local.get $kind i32.const 9 i32.eq
        if
          local.get $out local.get $qs local.get $dm local.get $nb local.get $x call $dot_q8_split f32.store
        else
          local.get $q8
          if
            local.get $out local.get $qs local.get $dm local.get $nb local.get $x call $dot_q8 f32.store
            local.get $kind i32.const 16 i32.and
            if
              local.get $out local.get $out f32.load local.get $dm local.get $nb local.get $scratch call $mins f32.add
              f32.store
            end
          else
            local.get $out local.get $qs local.get $dm local.get $nb local.get $x local.get $scratch call $dot_q4_1
            f32.store
          end
        end
        local.get $out i32.const 4 i32.add local.set $out
        local.get $qs local.get $nb i32.const 4 local.get $q8 i32.add i32.shl i32.add local.set $qs
        local.get $dm local.get $nb i32.const 3 i32.shl i32.add local.set $dm
        local.get $r i32.const 1 i32.add local.tee $r local.get $rows i32.lt_u br_if $vec
      end
      return
    end
    loop $chunks
      local.get $qs local.set $q
      local.get $dm local.set $s
      i32.const 0 local.set $r
      loop $rowloop
        local.get $kind local.get $q local.get $s local.get $nb local.get $scratch call $row
        local.get $t local.get $t0 i32.sub local.set $n
        i32.const 16 local.get $n local.get $n i32.const 16 i32.gt_u select local.set $n
        local.get $x local.get $t0 local.get $cols i32.mul i32.const 2 i32.shl i32.add local.set $xp
        local.get $out local.get $t0 local.get $ldo i32.mul local.get $r i32.add i32.const 2 i32.shl i32.add local.set $o
        block $tiled
          loop $tiles
            local.get $n i32.const 4 i32.lt_u br_if $tiled
            local.get $scratch local.get $xp local.get $cols local.get $o local.get $ldo call $dot4
            local.get $xp local.get $cols i32.const 4 i32.shl i32.add local.set $xp
            local.get $o local.get $ldo i32.const 4 i32.shl i32.add local.set $o
            local.get $n i32.const 4 i32.sub local.set $n
            br $tiles
          end
        end
        block $single
          loop $ones
            local.get $n i32.eqz br_if $single
            local.get $scratch local.get $xp local.get $cols local.get $o call $dot1
            local.get $xp local.get $cols i32.const 2 i32.shl i32.add local.set $xp
            local.get $o local.get $ldo i32.const 2 i32.shl i32.add local.set $o
            local.get $n i32.const 1 i32.sub local.set $n
            br $ones
          end
        end
        local.get $q local.get $nb i32.const 4 local.get $q8 i32.add i32.shl i32.add local.set $q
        local.get $s local.get $nb i32.const 3 i32.shl i32.add local.set $s
        local.get $r i32.const 1 i32.add local.tee $r local.get $rows i32.lt_u br_if $rowloop
      end
      local.get $t0 i32.const 16 i32.add local.tee $t0 local.get $t i32.lt_u br_if $chunks
    end)

  ;; Attention of nq new tokens, the LAST nq of a sequence's ctx cached ones, over a paged K/V pool (f32,
  ;; (num_blocks, bs, nkv, hd) per layer): the two products around the softmax, which numpy does between them
  ;; (exactly as the reference does it). Query i sees keys 0 .. ctx - nq + i (causal); query head n = kv * group + g
  ;; (GQA); q (nq, nkv * group, hd). table: i32 block ids; key j lives at slot table[j / bs] * bs + j % bs.
  ;; attn_scores: out (nq, nkv * group, ctx) = q_i,n . k_j (no scale) for the keys query i sees; the rest of
  ;; each row is left as it was. hd a multiple of 16.
  (func $attn_scores (export "attn_scores") (param $q i32) (param $k i32) (param $table i32) (param $ctx i32)
    (param $nq i32) (param $bs i32) (param $nkv i32) (param $group i32) (param $hd i32) (param $out i32)
    (local $i i32) (local $nh i32)
    local.get $nkv local.get $group i32.mul local.set $nh
    loop $queries  ;; query i: $scores1 over its ctx - nq + i + 1 keys, rows ctx apart
      local.get $q local.get $i local.get $nh i32.mul local.get $hd i32.mul i32.const 2 i32.shl i32.add
      local.get $k local.get $table
      local.get $ctx local.get $nq i32.sub local.get $i i32.add i32.const 1 i32.add
      local.get $bs local.get $nkv local.get $group local.get $hd
      local.get $out local.get $i local.get $nh i32.mul local.get $ctx i32.mul i32.const 2 i32.shl i32.add
      local.get $ctx call $scores1
      local.get $i i32.const 1 i32.add local.tee $i local.get $nq i32.lt_u br_if $queries
    end)

  ;; One query's scores over its first ctx keys: out rows (one a head) ld f32 apart. Block by block (its keys'
  ;; rows contiguous: read from memory once, in order, every head then finding them in cache); in a block, per
  ;; head, four keys at a time: one accumulator each over hd (q's vector loaded once for the four), a 4x4
  ;; transpose adding them into one vector of the four scores; its last n % 4 keys one at a time.
  (func $scores1 (param $q i32) (param $k i32) (param $table i32) (param $ctx i32)
    (param $bs i32) (param $nkv i32) (param $group i32) (param $hd i32) (param $out i32) (param $ld i32)
    (local $h i32) (local $j i32) (local $n i32) (local $g i32) (local $tp i32) (local $kp i32) (local $tok i32)
    (local $qp i32) (local $kc i32) (local $e i32) (local $o i32) (local $end i32) (local $kb i32) (local $m i32)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128) (local $x v128)
    local.get $nkv local.get $hd i32.mul i32.const 2 i32.shl local.set $tok  ;; bytes a token in the pool
    local.get $hd i32.const 2 i32.shl local.set $end
    local.get $table local.set $tp
    loop $blocks
      local.get $k local.get $tp i32.load local.get $bs i32.mul local.get $tok i32.mul i32.add local.set $kb
      local.get $ctx local.get $j i32.sub local.set $m
      local.get $bs local.get $m local.get $bs local.get $m i32.lt_u select local.set $m
      local.get $kb local.set $e  ;; the block's rows read once in order (the passes below then hit cache)
      local.get $kb local.get $m local.get $tok i32.mul i32.add local.set $n
      loop $touch
        local.get $e v128.load drop
        local.get $e i32.const 64 i32.add local.tee $e local.get $n i32.lt_u br_if $touch
      end
      i32.const 0 local.set $h
      loop $heads
        i32.const 0 local.set $g
        loop $groups  ;; head row h * group + g: its q, its scores from key j
          local.get $q local.get $h local.get $group i32.mul local.get $g i32.add local.tee $o local.get $end i32.mul
          i32.add local.set $qp
          local.get $out local.get $o local.get $ld i32.mul local.get $j i32.add i32.const 2 i32.shl i32.add local.set $o
          local.get $kb local.get $h local.get $end i32.mul i32.add local.set $kp
          local.get $m local.set $n
          block $tail
            loop $quads
              local.get $n i32.const 4 i32.lt_u br_if $tail
              f32.const 0 f32x4.splat local.tee $a0 local.tee $a1 local.tee $a2 local.set $a3
              i32.const 0 local.set $e
              loop $dims
                local.get $qp local.get $e i32.add v128.load local.set $x
                local.get $kp local.get $e i32.add local.set $kc
                local.get $a0 local.get $x local.get $kc v128.load f32x4.mul f32x4.add local.set $a0
                local.get $kc local.get $tok i32.add local.set $kc
                local.get $a1 local.get $x local.get $kc v128.load f32x4.mul f32x4.add local.set $a1
                local.get $kc local.get $tok i32.add local.set $kc
                local.get $a2 local.get $x local.get $kc v128.load f32x4.mul f32x4.add local.set $a2
                local.get $kc local.get $tok i32.add local.set $kc
                local.get $a3 local.get $x local.get $kc v128.load f32x4.mul f32x4.add local.set $a3
                local.get $e i32.const 16 i32.add local.tee $e local.get $end i32.lt_u br_if $dims
              end
              local.get $o  ;; [a0 a1 a2 a3] summed lane-wise: (a0_0 + a0_2, a1_0 + a1_2, a0_1 + a0_3, a1_1 + a1_3) ...
              local.get $a0 local.get $a1 i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23
              local.get $a0 local.get $a1 i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 f32x4.add
              local.tee $x
              local.get $a2 local.get $a3 i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23
              local.get $a2 local.get $a3 i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 f32x4.add
              local.tee $a0 i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23
              local.get $x local.get $a0 i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31
              f32x4.add v128.store  ;; ... then the halves added: the four keys' scores
              local.get $o i32.const 16 i32.add local.set $o
              local.get $kp local.get $tok i32.const 2 i32.shl i32.add local.set $kp
              local.get $n i32.const 4 i32.sub local.set $n
              br $quads
            end
          end
          block $done
            loop $singles
              local.get $n i32.eqz br_if $done
              f32.const 0 f32x4.splat local.set $a0
              i32.const 0 local.set $e
              loop $dims1
                local.get $a0 local.get $qp local.get $e i32.add v128.load local.get $kp local.get $e i32.add v128.load
                f32x4.mul f32x4.add local.set $a0
                local.get $e i32.const 16 i32.add local.tee $e local.get $end i32.lt_u br_if $dims1
              end
              local.get $o local.get $a0 call $hsum f32.store
              local.get $o i32.const 4 i32.add local.set $o
              local.get $kp local.get $tok i32.add local.set $kp
              local.get $n i32.const 1 i32.sub local.set $n
              br $singles
            end
          end
          local.get $g i32.const 1 i32.add local.tee $g local.get $group i32.lt_u br_if $groups
        end
        local.get $h i32.const 1 i32.add local.tee $h local.get $nkv i32.lt_u br_if $heads
      end
      local.get $tp i32.const 4 i32.add local.set $tp
      local.get $j local.get $m i32.add local.tee $j local.get $ctx i32.lt_u br_if $blocks
    end)

  ;; attn_values: out (nq, nkv * group, hd) = sum over the keys query i sees of p[i, n, j] * v_j, p (nq,
  ;; nkv * group, ctx) the softmax; keys in order, one f32 multiply-add each (hd a multiple of 16).
  (func $attn_values (export "attn_values") (param $p i32) (param $v i32) (param $table i32) (param $ctx i32)
    (param $nq i32) (param $bs i32) (param $nkv i32) (param $group i32) (param $hd i32) (param $out i32)
    (local $i i32) (local $nh i32)
    local.get $nkv local.get $group i32.mul local.set $nh
    loop $queries  ;; query i: $values1 over its ctx - nq + i + 1 keys, p's rows ctx apart
      local.get $p local.get $i local.get $nh i32.mul local.get $ctx i32.mul i32.const 2 i32.shl i32.add
      local.get $v local.get $table
      local.get $ctx local.get $nq i32.sub local.get $i i32.add i32.const 1 i32.add
      local.get $bs local.get $nkv local.get $group local.get $hd
      local.get $out local.get $i local.get $nh i32.mul local.get $hd i32.mul i32.const 2 i32.shl i32.add
      local.get $ctx i32.const 0 local.get $hd i32.const 2 i32.shl call $values1
      local.get $i i32.const 1 i32.add local.tee $i local.get $nq i32.lt_u br_if $queries
    end)

  ;; One query's probability-weighted sum of its first ctx values: p's rows (one a head) ldp f32 apart. Block by
  ;; block (read from memory once, in order); per head, 16 of its hd at a time in four accumulators carried on
  ;; from out over the block's keys: each output is p_0 v_0 + p_1 v_1 + ... summed left to right. Only each head's
  ;; bytes d0 .. d1 - 1 of its hd * 4 (multiples of 64; 0 .. hd * 4: all), read and written: threads splitting
  ;; them read apart (web/linear_threads.js attn_decode), every output the same sum.
  (func $values1 (param $p i32) (param $v i32) (param $table i32) (param $ctx i32)
    (param $bs i32) (param $nkv i32) (param $group i32) (param $hd i32) (param $out i32) (param $ldp i32)
    (param $d0 i32) (param $d1 i32)
    (local $h i32) (local $j i32) (local $n i32) (local $g i32) (local $tp i32) (local $vp i32) (local $tok i32)
    (local $row i32) (local $d i32) (local $pp i32) (local $end i32) (local $vb i32) (local $m i32) (local $o i32)
    (local $pv v128) (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    local.get $nkv local.get $hd i32.mul i32.const 2 i32.shl local.set $tok
    local.get $hd i32.const 2 i32.shl local.set $end
    local.get $out local.set $o  ;; zero out's bytes d0 .. d1 - 1 of every head
    local.get $out local.get $nkv local.get $group i32.mul local.get $end i32.mul i32.add local.set $vb
    loop $zero
      local.get $d0 local.set $d
      loop $zero_row
        local.get $o local.get $d i32.add f32.const 0 f32x4.splat v128.store
        local.get $d i32.const 16 i32.add local.tee $d local.get $d1 i32.lt_u br_if $zero_row
      end
      local.get $o local.get $end i32.add local.tee $o local.get $vb i32.lt_u br_if $zero
    end
    local.get $table local.set $tp
    loop $blocks
      local.get $v local.get $tp i32.load local.get $bs i32.mul local.get $tok i32.mul i32.add local.set $vb
      local.get $ctx local.get $j i32.sub local.set $m
      local.get $bs local.get $m local.get $bs local.get $m i32.lt_u select local.set $m
      local.get $vb local.set $d  ;; the block's rows read once in order (the passes below then hit cache): all of
      local.get $vb local.get $m local.get $tok i32.mul i32.add local.set $n  ;; them, or each head's d0 .. d1 - 1
      local.get $d0 local.get $d1 local.get $end i32.sub i32.or i32.eqz
      if
        loop $touch
          local.get $d v128.load drop
          local.get $d i32.const 64 i32.add local.tee $d local.get $n i32.lt_u br_if $touch
        end
      else
        loop $touch_heads  ;; d: a head's row in the block
          local.get $d0 local.set $pp
          loop $touch_lines
            local.get $d local.get $pp i32.add v128.load drop
            local.get $pp i32.const 64 i32.add local.tee $pp local.get $d1 i32.lt_u br_if $touch_lines
          end
          local.get $d local.get $end i32.add local.tee $d local.get $n i32.lt_u br_if $touch_heads
        end
      end
      i32.const 0 local.set $h
      loop $heads
        i32.const 0 local.set $g
        loop $groups
          local.get $h local.get $group i32.mul local.get $g i32.add local.set $row
          local.get $d0 local.set $d
          loop $slices  ;; out[row, d .. d + 16] += sum over the block's keys of p[row, j] * v_j[d .. d + 16]
            local.get $out local.get $row local.get $end i32.mul i32.add local.get $d i32.add local.tee $o v128.load
            local.set $a0
            local.get $o v128.load offset=16 local.set $a1
            local.get $o v128.load offset=32 local.set $a2
            local.get $o v128.load offset=48 local.set $a3
            local.get $p local.get $row local.get $ldp i32.mul local.get $j i32.add i32.const 2 i32.shl i32.add local.set $pp
            local.get $vb local.get $h local.get $end i32.mul i32.add local.get $d i32.add local.set $vp
            local.get $m local.set $n
            loop $keys
              local.get $pp f32.load f32x4.splat local.set $pv
              local.get $a0 local.get $pv local.get $vp v128.load f32x4.mul f32x4.add local.set $a0
              local.get $a1 local.get $pv local.get $vp v128.load offset=16 f32x4.mul f32x4.add local.set $a1
              local.get $a2 local.get $pv local.get $vp v128.load offset=32 f32x4.mul f32x4.add local.set $a2
              local.get $a3 local.get $pv local.get $vp v128.load offset=48 f32x4.mul f32x4.add local.set $a3
              local.get $pp i32.const 4 i32.add local.set $pp
              local.get $vp local.get $tok i32.add local.set $vp
              local.get $n i32.const 1 i32.sub local.tee $n br_if $keys
            end
            local.get $o local.get $a0 v128.store
            local.get $o local.get $a1 v128.store offset=16
            local.get $o local.get $a2 v128.store offset=32
            local.get $o local.get $a3 v128.store offset=48
            local.get $d i32.const 64 i32.add local.tee $d local.get $d1 i32.lt_u br_if $slices
          end
          local.get $g i32.const 1 i32.add local.tee $g local.get $group i32.lt_u br_if $groups
        end
        local.get $h i32.const 1 i32.add local.tee $h local.get $nkv i32.lt_u br_if $heads
      end
      local.get $tp i32.const 4 i32.add local.set $tp
      local.get $j local.get $m i32.add local.tee $j local.get $ctx i32.lt_u br_if $blocks
    end)

  ;; The softmax of `rows` rows of scores at s (ld f32 apart, ld >= ctx a multiple of 4), each over its first ctx
  ;; keys: times scale, minus the row's max, $exp4, over its sum; the row's first lo keys (lo < ctx) and its tail
  ;; past ctx get probability 0 (-inf before the exp): a sliding window's keys before it.
  (func $softmax_rows (param $s i32) (param $rows i32) (param $ctx i32) (param $lo i32) (param $ld i32) (param $scale f32)
    (local $p i32) (local $end i32) (local $i i32) (local $row i32) (local $n i32) (local $mx v128) (local $sum v128)
    (local $e v128)
    loop $each  ;; one row's softmax
      local.get $s local.get $row local.get $ld i32.mul i32.const 2 i32.shl i32.add local.set $p
      local.get $p local.get $ctx i32.const 2 i32.shl i32.add local.set $end
      local.get $p local.get $ld i32.const 2 i32.shl i32.add local.set $n
      loop $pad  ;; the row's tail past ctx: -inf, so its exp is 0
        local.get $end local.get $n i32.lt_u
        if
          local.get $end f32.const -inf f32.store
          local.get $end i32.const 4 i32.add local.set $end
          br $pad
        end
      end
      local.get $p local.set $i
      loop $masked  ;; the keys before the window: -inf too
        local.get $i local.get $p local.get $lo i32.const 2 i32.shl i32.add i32.lt_u
        if
          local.get $i f32.const -inf f32.store
          local.get $i i32.const 4 i32.add local.set $i
          br $masked
        end
      end
      f32.const -inf f32x4.splat local.set $mx
      local.get $p local.set $i
      loop $scaled
        local.get $i local.get $i v128.load local.get $scale f32x4.splat f32x4.mul local.tee $e v128.store
        local.get $mx local.get $e f32x4.max local.set $mx
        local.get $i i32.const 16 i32.add local.tee $i local.get $n i32.lt_u br_if $scaled
      end
      local.get $mx f32x4.extract_lane 0 local.get $mx f32x4.extract_lane 1 f32.max
      local.get $mx f32x4.extract_lane 2 local.get $mx f32x4.extract_lane 3 f32.max f32.max f32x4.splat local.set $mx
      f32.const 0 f32x4.splat local.set $sum
      local.get $p local.set $i
      loop $exps
        local.get $i local.get $i v128.load local.get $mx f32x4.sub call $exp4 local.tee $e v128.store
        local.get $sum local.get $e f32x4.add local.set $sum
        local.get $i i32.const 16 i32.add local.tee $i local.get $n i32.lt_u br_if $exps
      end
      local.get $sum call $hsum f32x4.splat local.set $sum
      local.get $p local.set $i
      loop $normed
        local.get $i local.get $i v128.load local.get $sum f32x4.div v128.store
        local.get $i i32.const 16 i32.add local.tee $i local.get $n i32.lt_u br_if $normed
      end
      local.get $row i32.const 1 i32.add local.tee $row local.get $rows i32.lt_u br_if $each
    end
  )

  ;; A decode step's attention for one sequence in one call (the tab's path, f32 pools): the new token's q | k | v
  ;; (nq = 1; qkv holds nkv * group + 2 * nkv heads of hd f32) rotated in place at its position's cos / sin
  ;; (hd / 2 f32 each: x0 cos - x1 sin, x0 sin + x1 cos, as ref_ops.rotate_adjacent), its k and v copied into
  ;; the pools at row `slot` (a token's index into them), then attn_scores, the softmax of each head's row
  ;; (times scale, minus its max, $exp4, over its sum) in s (nkv * group rows ld f32 apart, ld >= ctx a multiple
  ;; of 4), then attn_values into out (nkv * group * hd f32). The row's first lo keys (lo < ctx) get probability
  ;; 0: a sliding window's keys before it in the first block of the table (which starts at that block).
  (func $attn_decode (export "attn_decode") (param $qkv i32) (param $cos i32) (param $sin i32) (param $k i32)
    (param $v i32) (param $table i32) (param $ctx i32) (param $lo i32) (param $bs i32) (param $nkv i32)
    (param $group i32) (param $hd i32) (param $slot i32) (param $scale f32) (param $s i32) (param $ld i32) (param $out i32)
    local.get $qkv local.get $cos local.get $sin local.get $k local.get $v local.get $nkv local.get $group local.get $hd
    local.get $slot call $rope_kv
    local.get $qkv local.get $k local.get $table local.get $ctx local.get $bs local.get $nkv local.get $group
    local.get $hd local.get $s local.get $ld call $scores1
    local.get $s local.get $nkv local.get $group i32.mul local.get $ctx local.get $lo local.get $ld local.get $scale
    call $softmax_rows
    local.get $s local.get $v local.get $table local.get $ctx local.get $bs local.get $nkv local.get $group
    local.get $hd local.get $out local.get $ld i32.const 0 local.get $hd i32.const 2 i32.shl call $values1)

  ;; attn_decode in parts, for threads to share a step's attention (web/linear_threads.js attn_decode), each
  ;; output with the bits of the one call. rope_kv: q | k | v rotated in place, the new k and v into the pools' row
  ;; `slot`. attn_keys: the scores of the keys in the table's blocks b0 .. b1 - 1 (every head's, each the same dot
  ;; product). attn_softmax: softmax_rows. attn_dims: the values' sums of each head's bytes d0 .. d1 - 1 of hd * 4
  ;; (multiples of 64), each the same sum over every key.
  (func $rope_kv (export "rope_kv") (param $qkv i32) (param $cos i32) (param $sin i32) (param $k i32) (param $v i32)
    (param $nkv i32) (param $group i32) (param $hd i32) (param $slot i32)
    (local $p i32) (local $end i32) (local $i i32) (local $x0 f32) (local $x1 f32) (local $tok i32) (local $kn i32)
    (local $m f32) (local $t f32)
    local.get $nkv local.get $hd i32.mul i32.const 2 i32.shl local.set $tok
    local.get $qkv local.get $nkv local.get $group i32.mul local.get $hd i32.mul i32.const 2 i32.shl i32.add
    local.set $kn
    local.get $qkv local.set $p  ;; rope over the q and k heads: (nkv * group + nkv) * hd / 2 pairs
    local.get $kn local.get $tok i32.add local.set $end
    loop $pairs
      local.get $p f32.load local.set $x0
      local.get $p f32.load offset=4 local.set $x1
      local.get $cos local.get $i i32.const 2 i32.shl i32.add f32.load local.set $m
      local.get $sin local.get $i i32.const 2 i32.shl i32.add f32.load local.set $t
      local.get $p local.get $x0 local.get $m f32.mul local.get $x1 local.get $t f32.mul f32.sub f32.store
      local.get $p local.get $x0 local.get $t f32.mul local.get $x1 local.get $m f32.mul f32.add f32.store offset=4
      local.get $i i32.const 1 i32.add local.tee $i local.get $hd i32.const 1 i32.shr_u i32.eq
      if i32.const 0 local.set $i end
      local.get $p i32.const 8 i32.add local.tee $p local.get $end i32.lt_u br_if $pairs
    end
    i32.const 0 local.set $i  ;; the new k and v into their pool rows, 16 bytes at a time
    local.get $slot local.get $tok i32.mul local.set $p
    loop $copy
      local.get $k local.get $p i32.add local.get $kn local.get $i i32.add v128.load v128.store
      local.get $v local.get $p i32.add local.get $kn local.get $tok i32.add local.get $i i32.add v128.load v128.store
      local.get $p i32.const 16 i32.add local.set $p
      local.get $i i32.const 16 i32.add local.tee $i local.get $tok i32.lt_u br_if $copy
    end)

  (func $attn_keys (export "attn_keys") (param $q i32) (param $k i32) (param $table i32) (param $ctx i32)
    (param $bs i32) (param $nkv i32) (param $group i32) (param $hd i32) (param $s i32) (param $ld i32)
    (param $b0 i32) (param $b1 i32)
    (local $end i32)
    local.get $b1 local.get $bs i32.mul local.set $end  ;; the blocks' keys: to min(ctx, b1 * bs)
    local.get $q local.get $k local.get $table local.get $b0 i32.const 2 i32.shl i32.add
    local.get $ctx local.get $end local.get $ctx local.get $end i32.lt_u select
    local.get $b0 local.get $bs i32.mul i32.sub
    local.get $bs local.get $nkv local.get $group local.get $hd
    local.get $s local.get $b0 local.get $bs i32.mul i32.const 2 i32.shl i32.add local.get $ld call $scores1)

  (func $attn_softmax (export "attn_softmax") (param $s i32) (param $rows i32) (param $ctx i32) (param $lo i32)
    (param $ld i32) (param $scale f32)
    local.get $s local.get $rows local.get $ctx local.get $lo local.get $ld local.get $scale call $softmax_rows)

  (func $attn_dims (export "attn_dims") (param $p i32) (param $v i32) (param $table i32) (param $ctx i32)
    (param $bs i32) (param $nkv i32) (param $group i32) (param $hd i32) (param $out i32) (param $ld i32)
    (param $d0 i32) (param $d1 i32)
    local.get $p local.get $v local.get $table local.get $ctx local.get $bs local.get $nkv local.get $group
    local.get $hd local.get $out local.get $ld local.get $d0 local.get $d1 call $values1)

  ;; A prompt chunk's attention in one call (the tab's prefill, f32 pools, its new keys and values written
  ;; already): nq new tokens, the last nq of ctx, q (nq, nkv * group, hd); query i sees keys lo_i .. seen_i - 1,
  ;; seen_i = ctx - nq + i + 1 (causal) and lo_i = max(0, seen_i - window) (window 0: none, lo_i = 0; the table
  ;; starts at the block of the first key any query sees). Per query: $scores1 into s (nkv * group rows ld_i f32
  ;; apart, ld_i = seen_i rounded up to 4), $softmax_rows, $values1 into out (nq, nkv * group, hd): attn_decode's
  ;; arithmetic for each query, without a (nq, heads, ctx) array of scores.
  (func $attn_prefill (export "attn_prefill") (param $q i32) (param $k i32) (param $v i32) (param $table i32)
    (param $ctx i32) (param $nq i32) (param $bs i32) (param $nkv i32) (param $group i32) (param $hd i32)
    (param $window i32) (param $scale f32) (param $s i32) (param $out i32)
    (local $i i32) (local $nh i32) (local $seen i32) (local $lo i32) (local $ld i32) (local $row i32)
    local.get $nkv local.get $group i32.mul local.set $nh
    local.get $nh local.get $hd i32.mul i32.const 2 i32.shl local.set $row  ;; bytes a query's heads
    loop $queries
      local.get $ctx local.get $nq i32.sub local.get $i i32.add i32.const 1 i32.add local.set $seen
      i32.const 0 local.set $lo
      local.get $window
      if
        local.get $seen local.get $window i32.gt_s
        if local.get $seen local.get $window i32.sub local.set $lo end
      end
      local.get $seen i32.const 3 i32.add i32.const -4 i32.and local.set $ld
      local.get $q local.get $i local.get $row i32.mul i32.add local.get $k local.get $table local.get $seen
      local.get $bs local.get $nkv local.get $group local.get $hd local.get $s local.get $ld call $scores1
      local.get $s local.get $nh local.get $seen local.get $lo local.get $ld local.get $scale call $softmax_rows
      local.get $s local.get $v local.get $table local.get $seen local.get $bs local.get $nkv local.get $group
      local.get $hd local.get $out local.get $i local.get $row i32.mul i32.add local.get $ld
      i32.const 0 local.get $hd i32.const 2 i32.shl call $values1
      local.get $i i32.const 1 i32.add local.tee $i local.get $nq i32.lt_u br_if $queries
    end)

  ;; A decode step's glue in one call each (backends/cpu_attention.py: WasmAttentionModel's one-token step), n f32
  ;; a multiple of 4. rms_norm: out = x / sqrt(sum(x * x) / n + eps) * w (ref_ops.rms_norm's operations; the sum
  ;; in four lanes). add_rms_norm: x += y first (the residual), then rms_norm of it.
  (func $rms_norm (export "rms_norm") (param $x i32) (param $w i32) (param $n i32) (param $eps f32) (param $out i32)
    (local $i i32) (local $acc v128) (local $r v128)
    loop $squares
      local.get $acc local.get $x local.get $i i32.add v128.load local.tee $r local.get $r f32x4.mul f32x4.add
      local.set $acc
      local.get $i i32.const 16 i32.add local.tee $i local.get $n i32.const 2 i32.shl i32.lt_u br_if $squares
    end
    local.get $acc call $hsum local.get $n f32.convert_i32_u f32.div local.get $eps f32.add f32.sqrt f32x4.splat
    local.set $r
    i32.const 0 local.set $i
    loop $scaled
      local.get $out local.get $i i32.add
      local.get $x local.get $i i32.add v128.load local.get $r f32x4.div local.get $w local.get $i i32.add v128.load
      f32x4.mul v128.store
      local.get $i i32.const 16 i32.add local.tee $i local.get $n i32.const 2 i32.shl i32.lt_u br_if $scaled
    end)

  (func $add_rms_norm (export "add_rms_norm") (param $x i32) (param $y i32) (param $w i32) (param $n i32)
    (param $eps f32) (param $out i32)
    (local $i i32)
    loop $sums
      local.get $x local.get $i i32.add local.get $x local.get $i i32.add v128.load
      local.get $y local.get $i i32.add v128.load f32x4.add v128.store
      local.get $i i32.const 16 i32.add local.tee $i local.get $n i32.const 2 i32.shl i32.lt_u br_if $sums
    end
    local.get $x local.get $w local.get $n local.get $eps local.get $out call $rms_norm)

  ;; out = silu(g) * u, silu(g) = g / (1 + e^-g) (ref_ops.silu): with t = e^-|g| ($exp4's domain), g / (1 + t)
  ;; where g >= 0 and g * t / (1 + t) where g < 0 (e^-g overflows there; the same value).
  (func $silu_mul (export "silu_mul") (param $g i32) (param $u i32) (param $n i32) (param $out i32)
    (local $i i32) (local $v v128) (local $t v128) (local $neg v128)
    loop $lanes
      local.get $g local.get $i i32.add v128.load local.tee $v
      f32.const 0 f32x4.splat f32x4.lt local.set $neg
      local.get $v f32x4.abs f32x4.neg call $exp4 local.set $t
      local.get $out local.get $i i32.add
      local.get $v local.get $t f32x4.mul local.get $v local.get $neg v128.bitselect
      f32.const 1 f32x4.splat local.get $t f32x4.add f32x4.div
      local.get $u local.get $i i32.add v128.load f32x4.mul v128.store
      local.get $i i32.const 16 i32.add local.tee $i local.get $n i32.const 2 i32.shl i32.lt_u br_if $lanes
    end)

  ;; rms_norm of `rows` rows of n f32 each (a row every n f32, at x and out alike; in place when out = x), one gain w
  ;; for all: the per-head q / k norms of a family with them (model/family.py qk_norm), before rotary.
  (func $rms_norm_rows (export "rms_norm_rows") (param $x i32) (param $w i32) (param $n i32) (param $rows i32)
    (param $eps f32) (param $out i32)
    loop $each
      local.get $x local.get $w local.get $n local.get $eps local.get $out call $rms_norm
      local.get $x local.get $n i32.const 2 i32.shl i32.add local.set $x
      local.get $out local.get $n i32.const 2 i32.shl i32.add local.set $out
      local.get $rows i32.const 1 i32.sub local.tee $rows br_if $each
    end)

  ;; out = gelu_tanh(g) * u (GeGLU, ref_ops.gelu_tanh: 0.5 g (1 + tanh(z)), z = sqrt(2 / pi) (g + 0.044715 g^3)),
  ;; as g * sigmoid(2 z), the same value: $silu_mul's steps with t = e^-|2z| (z has g's sign, as 1 + 0.044715 g^2
  ;; > 0): g / (1 + t) where g >= 0, g * t / (1 + t) where g < 0.
  (func $gelu_tanh_mul (export "gelu_tanh_mul") (param $g i32) (param $u i32) (param $n i32) (param $out i32)
    (local $i i32) (local $v v128) (local $t v128) (local $neg v128)
    loop $lanes
      local.get $g local.get $i i32.add v128.load local.tee $v
      f32.const 0 f32x4.splat f32x4.lt local.set $neg
      local.get $v f32x4.abs f32.const 1.5957691216057308 f32x4.splat f32x4.mul
      f32.const 1 f32x4.splat local.get $v local.get $v f32x4.mul f32.const 0.044715 f32x4.splat f32x4.mul f32x4.add
      f32x4.mul f32x4.neg call $exp4 local.set $t
      local.get $out local.get $i i32.add
      local.get $v local.get $t f32x4.mul local.get $v local.get $neg v128.bitselect
      f32.const 1 f32x4.splat local.get $t f32x4.add f32x4.div
      local.get $u local.get $i i32.add v128.load f32x4.mul v128.store
      local.get $i i32.const 16 i32.add local.tee $i local.get $n i32.const 2 i32.shl i32.lt_u br_if $lanes
    end)

  ;; A prompt's activations in one call: `rows` rows of gate | up (2n f32 a row, as the stacked gate | up product
  ;; writes them) into out (rows, n): each row silu_mul's / gelu_tanh_mul's of its own halves.
  (func $silu_mul_rows (export "silu_mul_rows") (param $gu i32) (param $n i32) (param $rows i32) (param $out i32)
    loop $each
      local.get $gu local.get $gu local.get $n i32.const 2 i32.shl i32.add local.get $n local.get $out call $silu_mul
      local.get $gu local.get $n i32.const 3 i32.shl i32.add local.set $gu
      local.get $out local.get $n i32.const 2 i32.shl i32.add local.set $out
      local.get $rows i32.const 1 i32.sub local.tee $rows br_if $each
    end)

  (func $gelu_tanh_mul_rows (export "gelu_tanh_mul_rows") (param $gu i32) (param $n i32) (param $rows i32)
    (param $out i32)
    loop $each
      local.get $gu local.get $gu local.get $n i32.const 2 i32.shl i32.add local.get $n local.get $out
      call $gelu_tanh_mul
      local.get $gu local.get $n i32.const 3 i32.shl i32.add local.set $gu
      local.get $out local.get $n i32.const 2 i32.shl i32.add local.set $out
      local.get $rows i32.const 1 i32.sub local.tee $rows br_if $each
    end)

  ;; e^x lane by lane for x <= 0 (a softmax's shifted scores): Cephes' expf, x = n ln 2 + r with |r| <= ln 2 / 2,
  ;; a degree-5 polynomial in r, times 2^n built in the exponent bits; x below -87 (-inf too) gives 0 (e^-87 is
  ;; ~1.6e-38, where f32's normal numbers end).
  (func $exp4 (param $x v128) (result v128)
    (local $n v128) (local $r v128) (local $p v128) (local $keep v128)
    local.get $x f32.const -87 f32x4.splat f32x4.ge local.set $keep
    local.get $x f32.const -87 f32x4.splat f32x4.max local.tee $x
    f32.const 1.44269504 f32x4.splat f32x4.mul f32x4.nearest local.set $n
    local.get $x local.get $n f32.const 0.693359375 f32x4.splat f32x4.mul f32x4.sub
    local.get $n f32.const -2.12194440e-4 f32x4.splat f32x4.mul f32x4.sub local.set $r
    f32.const 1.9875691500e-4 f32x4.splat local.get $r f32x4.mul f32.const 1.3981999507e-3 f32x4.splat f32x4.add
    local.get $r f32x4.mul f32.const 8.3334519073e-3 f32x4.splat f32x4.add
    local.get $r f32x4.mul f32.const 4.1665795894e-2 f32x4.splat f32x4.add
    local.get $r f32x4.mul f32.const 1.6666665459e-1 f32x4.splat f32x4.add
    local.get $r f32x4.mul f32.const 5.0000001201e-1 f32x4.splat f32x4.add local.set $p
    local.get $p local.get $r f32x4.mul local.get $r f32x4.mul local.get $r f32x4.add f32.const 1 f32x4.splat f32x4.add
    local.get $n i32x4.trunc_sat_f32x4_s i32.const 127 i32x4.splat i32x4.add i32.const 23 i32x4.shl f32x4.mul
    local.get $keep v128.and)
)
