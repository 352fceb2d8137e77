#!/usr/bin/env bash
# The kernel benchmark (both kernel families: matvec, matmul, attention rows, a decode step each) and native
# generates (both families; SmolLM2-135M's shapes and the synthetic 1.5B model's) on a lent NVIDIA H200 (the
# `device` tool), as ONE call. Everything lands in one tarball, $OUT/h200.tar.gz (JSON and logs), plus
# $OUT/summary.json (each step's exit status and seconds): two files of the eight the tool brings back.
#
# 1. Here, once, in the repo root (the device tool's README: the machine reaches no registry; its python3 is
#    3.12 with numpy and jinja2, without wgpu, cffi, rendercanvas, pycparser):
#      echo /.gl/ >>.git/info/exclude; mkdir -p .gl /tmp/amd64/partial
#      o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
#      apt-get $o update; (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
#      echo /.whl/ >>.git/info/exclude
#      python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#        -d .whl wgpu==0.32.0 cffi==2.0.0 pycparser==3.0 rendercanvas==2.7.2
#      python3 build.py     # dist/models/smollm2-135m-instruct/model.json: tokenizer, template, shapes (1.8 MB)
# 2. run(command="bash bench/device/h200.sh", carry=[".gl", ".whl", "dist/models/smollm2-135m-instruct/model.json"],
#        timeout_s=480)   # the steps' own timeouts add up to under 7 minutes; leave time for a second try
#
# Proven off the GPU with H200_QUICK=1 (a 2-layer model, 32 tokens, bench.kernels --quick, no 1.5B model, the
# machine's own wgpu and Vulkan ICD, lavapipe here), OUT set by hand:
#      OUT=/tmp/h200-out H200_QUICK=1 PYTHON=.venv/bin/python bash bench/device/h200.sh
#
# The real weights (94 MiB; the 1.5B model's 837 MiB) cannot travel (64 MiB a call): the generates run random
# weights made on the machine from a seed (bench/device/random_model.py, every row its own), with
# --ignore-eos so that each decodes exactly its --max-tokens; decode_tok_s leaves out the first decode step
# (pipeline compilation, reported as first_decode_ms). Timings are the real model's kernels; text is noise.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?run through the device tool, which sets OUT}"
QUICK=${H200_QUICK:-}
PY=${PYTHON:-python3}
R=$(mktemp -d /tmp/h200.XXXXXX)  # results; tarred into $OUT at the end
M=$(mktemp -d /tmp/h200-models.XXXXXX)
SUMMARY=()
step() {  # step NAME SECONDS CMD...: run CMD under `timeout`, its stdout to $R/NAME.json, stderr to $R/NAME.log
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  timeout -k 10 "$limit" "$@" >"$R/$name.json" 2>"$R/$name.log"
  rc=$?
  [ -s "$R/$name.json" ] || rm -f "$R/$name.json"
  echo "$name: exit $rc in $((SECONDS - t0)) s (limit $limit)"
  SUMMARY+=("{\"step\": \"$name\", \"exit\": $rc, \"seconds\": $((SECONDS - t0)), \"limit_s\": $limit}")
}
finish() {
  (IFS=,; echo "{\"quick\": \"${QUICK}\", \"steps\": [${SUMMARY[*]}]}") >"$OUT/summary.json"
  tar -czf "$OUT/h200.tar.gz" -C "$R" .
  echo "$OUT: $(ls "$OUT" | tr '\n' ' ')"; tail -n 2 "$R"/*.log
}
trap finish EXIT

if [ -z "$QUICK" ]; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH="/tmp/site:$PWD/py:$PWD"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$R/nvidia-smi.csv" 2>&1
else
  export PYTHONPATH="$PWD/py:$PWD"
fi
export PYTHONUNBUFFERED=1 WGPU_BACKEND_TYPE=Vulkan  # wgpu-py's own variable: Vulkan, never a GL fallback
probe='import json, wgpu; a = wgpu.gpu.request_adapter_sync(power_preference="high-performance"); print(json.dumps(a.info))'
step adapter 60 $PY -c "$probe"
if [ -z "$QUICK" ] && ! grep -qi nvidia "$R/adapter.json" 2>/dev/null; then
  # The loader found no NVIDIA ICD on its own: point it at the driver's (the device README's fallback).
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  step adapter 60 $PY -c "$probe"
fi

MJ=dist/models/smollm2-135m-instruct/model.json
echo '[{"role": "user", "content": "Write a long story about the sea."}]' >"$R/chat.json"
if [ -n "$QUICK" ]; then
  step kernels 300 $PY -m bench.kernels --backend wgpu --json --quick --kernels qkv lm_head decode_attention argmax
  step kernels_prefill 120 $PY -m bench.kernels --backend wgpu --json --quick --kernels gate_up prefill_attention \
    --prefill 64
  step kernels_1.5b 120 $PY -m bench.kernels --backend wgpu --json --quick --kernels o_1.5b
  step model_small 120 $PY bench/device/random_model.py "$MJ" "$M/small" --preset small
  models="small"; tokens=32
else
  step kernels 150 $PY -m bench.kernels --backend wgpu --json
  # prefill at a long prompt's length: where its time goes (the projections' matmuls, causal attention)
  # (--quick: 9 timed passes over 16 MiB of weight copies; at 10 x 5 over 256 MiB this step outran 120 s)
  step kernels_prefill 120 $PY -m bench.kernels --backend wgpu --json --quick --kernels qkv o gate_up down \
    prefill_attention --prefill 2048
  # the synthetic 1.5B model's Q4_K projections (its decode reads ~0.85 GB a token), weights rotated through 256 MiB
  step kernels_1.5b 120 $PY -m bench.kernels --backend wgpu --json --quick --rotate-mib 256 --kernels qkv_1.5b \
    o_1.5b gate_up_1.5b down_1.5b
  step model_smollm2 90 $PY bench/device/random_model.py "$MJ" "$M/smollm2" --preset smollm2
  step model_1.5b 150 $PY bench/device/random_model.py "$MJ" "$M/1.5b" --preset 1.5b
  models="smollm2 1.5b"; tokens=256
fi
generate() {  # generate NAME SECONDS MODEL MESSAGES ARGS...: one `pagedkv generate` on the device, $tokens tokens
  local name=$1 limit=$2 model=$3 chat=$4
  shift 4
  step "$name" "$limit" $PY -m pagedkv generate --backend wgpu --budget-mib 2048 --tuning-cache "$R/gpu_tuning.json" \
    --model "$M/$model" --messages-json "$chat" --max-tokens "$tokens" --ignore-eos --json "$@"
}
m=${models%% *}  # the first model also runs the repeats, the sampled and the long generates
for model in $models; do
  [ -f "$M/$model/model.json" ] || continue
  # Both kernel families (the gpu one tunes first: its choice and timings in the JSON), pipelined decode (the
  # default); then the gpu family with each step waiting for its ids (--no-pipeline), the pipelining's baseline;
  # on the first model twice more each (a step's host part varies between runs on this machine).
  for rep in "" _2 _3; do
    for run in cpu gpu "gpu --no-pipeline"; do
      set -- $run
      [ -z "$rep" ] || { [ "$model" = "$m" ] && [ "$1" = gpu ]; } || continue
      generate "generate_${model}_$1${2:+_plain}$rep" 120 "$model" "$R/chat.json" --kernels "$@" --greedy
    done
  done
done
if [ -f "$M/$m/model.json" ]; then
  # The app's default settings (temperature 0.7, top-p 0.95): the gpu family draws each token on the GPU
  # (shaders/sample.wgsl), so the step reads back an id, not a logits row.
  generate "generate_${m}_gpu_sampled" 90 "$m" "$R/chat.json" --kernels gpu --temperature 0.7 --top-p 0.95 --seed 1
  # A long conversation (2,924 prompt tokens): prefill at a real length, decode at a real context.
  $PY -c 'import json, sys; words = " ".join(f"The tide came in over stone {i} and went out again." for i in range(200))
json.dump([{"role": "user", "content": words + " Tell me more."}], open(sys.argv[1], "w"))' "$R/chat_long.json"
  generate "generate_${m}_gpu_long" 90 "$m" "$R/chat_long.json" --kernels gpu --greedy
fi
step geometry_decode_gpu 60 $PY -m pagedkv.backends.webgpu.dispatch_geometry --json --kernels gpu --context 1024
step geometry_prefill_gpu 60 $PY -m pagedkv.backends.webgpu.dispatch_geometry --json --kernels gpu --prefill 512
