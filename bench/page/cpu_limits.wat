;; What this machine's cores can do in WebAssembly SIMD (bench/cpu_limits.py assembles it with a shared memory,
;; bench/page/cpu_limits.mjs runs it on 1..N threads): the rate a core streams memory, and the rate of f32x4
;; multiplies and adds (wasm SIMD128 has no fused multiply-add; linear.wat's products are these two ops).
(module
  (import "env" "memory" (memory 1))

  ;; Reads [p, p + bytes) once, four 16-byte loads a trip into four sums (bytes a multiple of 64); returns one
  ;; lane so the loads are used.
  (func $stream (export "stream") (param $p i32) (param $bytes i32) (result f32)
    (local $end i32) (local $a v128) (local $b v128) (local $c v128) (local $d v128)
    local.get $p local.get $bytes i32.add local.set $end
    loop $l
      local.get $a local.get $p v128.load f32x4.add local.set $a
      local.get $b local.get $p v128.load offset=16 f32x4.add local.set $b
      local.get $c local.get $p v128.load offset=32 f32x4.add local.set $c
      local.get $d local.get $p v128.load offset=48 f32x4.add local.set $d
      local.get $p i32.const 64 i32.add local.tee $p local.get $end i32.lt_u br_if $l
    end
    local.get $a local.get $b f32x4.add local.get $c local.get $d f32x4.add f32x4.add f32x4.extract_lane 0)

  ;; n trips of a = a * m + c on 12 independent f32x4 chains (enough to cover the multiply's and the add's
  ;; latency on two pipes each): 12 x 4 lanes x 2 = 96 flops a trip.
  (func $muladd (export "muladd") (param $n i32) (result f32)
    (local $m v128) (local $c v128) (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128) (local $a4 v128)
    (local $a5 v128) (local $a6 v128) (local $a7 v128) (local $a8 v128) (local $a9 v128) (local $a10 v128) (local $a11 v128)
    f32.const 0.999 f32x4.splat local.set $m
    f32.const 0.001 f32x4.splat local.set $c
    loop $l
      local.get $a0 local.get $m f32x4.mul local.get $c f32x4.add local.set $a0
      local.get $a1 local.get $m f32x4.mul local.get $c f32x4.add local.set $a1
      local.get $a2 local.get $m f32x4.mul local.get $c f32x4.add local.set $a2
      local.get $a3 local.get $m f32x4.mul local.get $c f32x4.add local.set $a3
      local.get $a4 local.get $m f32x4.mul local.get $c f32x4.add local.set $a4
      local.get $a5 local.get $m f32x4.mul local.get $c f32x4.add local.set $a5
      local.get $a6 local.get $m f32x4.mul local.get $c f32x4.add local.set $a6
      local.get $a7 local.get $m f32x4.mul local.get $c f32x4.add local.set $a7
      local.get $a8 local.get $m f32x4.mul local.get $c f32x4.add local.set $a8
      local.get $a9 local.get $m f32x4.mul local.get $c f32x4.add local.set $a9
      local.get $a10 local.get $m f32x4.mul local.get $c f32x4.add local.set $a10
      local.get $a11 local.get $m f32x4.mul local.get $c f32x4.add local.set $a11
      local.get $n i32.const 1 i32.sub local.tee $n br_if $l
    end
    local.get $a0 local.get $a1 f32x4.add local.get $a2 f32x4.add local.get $a3 f32x4.add local.get $a4 f32x4.add
    local.get $a5 f32x4.add local.get $a6 f32x4.add local.get $a7 f32x4.add local.get $a8 f32x4.add local.get $a9 f32x4.add
    local.get $a10 f32x4.add local.get $a11 f32x4.add
    f32x4.extract_lane 0)
)
