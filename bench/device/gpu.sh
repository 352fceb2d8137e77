#!/usr/bin/env bash
# The kernel benchmark, the LM head's ids against numpy and native generates (both kernel families;
# SmolLM2-135M's shapes and the synthetic 1.5B model's) on a lent GPU (the `device` tool lends an H100 or an
# H200), as ONE call whose step deadlines add up to at most 300 s (printed first), so a start and a rerun fit
# the 15 minutes of device time. Each step is recorded into $OUT the moment it ends
# (bench/device/record_step.py): a killed run still returns every step that finished, and the stderr of the
# one under way ($OUT/running.log: bench.kernels writes every row there as it is measured). Three more files
# come back: $OUT/steps.jsonl (a line a step: its JSON, the card that measured it, exit status, seconds,
# deadline), $OUT/summary.json (the same without the results) and $OUT/logs.tar.gz (each finished step's
# stderr, so a kernel step stopped at its deadline keeps the rows it measured).
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
# 2. run(command="bash bench/device/gpu.sh", carry=[".gl", ".whl", "dist/models/smollm2-135m-instruct/model.json"],
#        timeout_s=400)   # the deadlines' sum (at most 300 s) plus the tool's transfers; room for a second try
#
# Proven off the GPU with GPU_QUICK=1 (a 2-layer model, 32 tokens, bench.kernels --quick on a few kernels, no
# 1.5B model, the machine's own wgpu and Vulkan ICD, lavapipe here), OUT set by hand:
#      OUT=/tmp/gpu-out GPU_QUICK=1 PYTHON=.venv/bin/python bash bench/device/gpu.sh
#
# The real weights (94 MiB; the 1.5B model's 837 MiB) cannot travel (64 MiB a call): the generates run random
# weights made on the machine from a seed (bench/device/random_model.py, every row its own), built in the
# background while the kernel steps use the GPU (a step of its own waits for each, within its deadline), with
# --ignore-eos so that each decodes exactly its --max-tokens; decode_tok_s leaves out the first decode step
# (pipeline compilation, reported as first_decode_ms). Timings are the real model's kernels; text is noise.
# Figures already stable over three runs (the cpu family's decode, the gpu family's without the pipeline) run
# once; the dispatch geometry needs no GPU (python3 -m pagedkv.backends.webgpu.dispatch_geometry, here).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?run through the device tool, which sets OUT}"
QUICK=${GPU_QUICK:-}
PY=${PYTHON:-python3}
W=$(mktemp -d /tmp/gpu.XXXXXX)  # each step's stdout and stderr, the card's name, the lock
M=$(mktemp -d /tmp/gpu-models.XXXXXX)

# name:deadline (s) of every step this run may take, in order; their sum bounds its wall time (a background
# build gets no deadline of its own in the sum: the step that waits for it stops it at that step's deadline)
if [ -z "$QUICK" ]; then
  PLAN="setup:20 nvidia_smi:5 adapter:10 adapter_icd:10 lm_head:12 kernels:40 kernels_prefill:40 kernels_1.5b:20
        wait_smollm2:5 generate_smollm2_gpu:25 generate_smollm2_gpu_2:10 generate_smollm2_cpu:15
        generate_smollm2_gpu_plain:10 generate_smollm2_gpu_sampled:10 generate_smollm2_gpu_long:15 wait_1.5b:10
        generate_1.5b_gpu:25 generate_1.5b_gpu_plain:15"
else
  # lavapipe on this machine's 2 shared cores: the SmolLM2-shaped decode steps and the first boot's tuning
  PLAN="adapter:10 lm_head:20 kernels:75 kernels_prefill:30 kernels_1.5b:35 wait_small:5 generate_small_gpu:45
        generate_small_cpu:30 generate_small_gpu_plain:45"
fi
declare -A LIMIT
total=0
for entry in $PLAN; do LIMIT[${entry%:*}]=${entry#*:}; total=$((total + ${entry#*:})); done
echo "step deadlines (s): $(echo $PLAN | sed 's/:/ /g; s/ \([a-z]\)/ + \1/g') = $total"
[ "$total" -le 300 ] || { echo "the deadlines add up to $total s, over the 300 s a run may take" >&2; exit 2; }

record() {  # record NAME EXIT SECONDS: into $OUT now
  $PY bench/device/record_step.py "$OUT" "$W" "$1" "$2" "$3" "${LIMIT[$1]}" || echo "$1: not recorded" >&2
}
step() {  # step NAME CMD...: CMD under its deadline, stdout to $W/NAME.json, stderr to $W/NAME.log, then recorded
  local name=$1 t0=$SECONDS rc
  shift
  # stderr straight into $OUT while the step runs: a run killed mid-step still returns what it wrote so far
  timeout -k 5 "${LIMIT[$name]}" "$@" >"$W/$name.json" 2>"$OUT/running.log"
  rc=$?
  mv "$OUT/running.log" "$W/$name.log"
  echo "$name: exit $rc in $((SECONDS - t0)) s (deadline ${LIMIT[$name]})"
  record "$name" "$rc" $((SECONDS - t0))
}
build() {  # build NAME CMD...: CMD in the background (a model on the CPU while the GPU steps run); wait_for stops it
  local name=$1
  shift
  ( t0=$SECONDS; "$@" >"$W/$name.json" 2>"$W/$name.log" & echo $! >"$W/$name.pid"; wait $!; rc=$?
    LIMIT[$name]=0; echo "$name: exit $rc in $((SECONDS - t0)) s (background)"; record "$name" "$rc" $((SECONDS - t0))
    touch "$W/$name.done" ) &
}
wait_for() {  # wait_for STEP BUILD: wait for the background BUILD within STEP's deadline, else stop it
  local name=$1 build=$2 t0=$SECONDS
  while [ ! -e "$W/$build.done" ] && [ $((SECONDS - t0)) -lt "${LIMIT[$name]}" ]; do sleep 0.5; done
  if [ ! -e "$W/$build.done" ]; then
    kill "$(cat "$W/$build.pid")" 2>/dev/null
    sleep 1
  fi
  echo "$name: $build $( [ -e "$W/$build.done" ] && echo ready || echo 'stopped, not ready') in $((SECONDS - t0)) s"
}

if [ -z "$QUICK" ]; then
  step setup bash -c 'for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig &&
    '"$PY"' -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl'
  export PYTHONPATH="/tmp/site:$PWD/py:$PWD"
  step nvidia_smi nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  sed -n 2p "$W/nvidia_smi.json" | cut -d, -f1 >"$W/card"
else
  export PYTHONPATH="$PWD/py:$PWD"
fi
export PYTHONUNBUFFERED=1 WGPU_BACKEND_TYPE=Vulkan  # wgpu-py's own variable: Vulkan, never a GL fallback
probe='import json, wgpu; a = wgpu.gpu.request_adapter_sync(power_preference="high-performance"); print(json.dumps(a.info))'
step adapter $PY -c "$probe"
if [ -z "$QUICK" ] && ! grep -qi nvidia "$W/adapter.json" 2>/dev/null; then
  # The loader found no NVIDIA ICD on its own: point it at the driver's (the device README's fallback).
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  step adapter_icd $PY -c "$probe"
fi
[ -s "$W/card" ] || $PY -c 'import json, sys; print(json.load(open(sys.argv[1]))["device"])' "$W/adapter.json" \
  >"$W/card" 2>/dev/null

MJ=dist/models/smollm2-135m-instruct/model.json
if [ -n "$QUICK" ]; then
  build model_small $PY bench/device/random_model.py "$MJ" "$M/small" --preset small
  models="small"; tokens=32
  step lm_head $PY bench/device/lm_head_check.py --vocab 4096
  step kernels $PY -m bench.kernels --backend wgpu --json --progress --quick --rotate-mib 2 --kernels o argmax \
    decode_step
  step kernels_prefill $PY -m bench.kernels --backend wgpu --json --progress --quick --rotate-mib 2 --kernels o \
    prefill_attention --prefill 8 16
  step kernels_1.5b $PY -m bench.kernels --backend wgpu --json --progress --quick --rotate-mib 2 --kernels o_1.5b
else
  build model_smollm2 $PY bench/device/random_model.py "$MJ" "$M/smollm2" --preset smollm2
  build model_1.5b $PY bench/device/random_model.py "$MJ" "$M/1.5b" --preset 1.5b
  models="smollm2 1.5b"; tokens=256
  step lm_head $PY bench/device/lm_head_check.py
  # decode: the projections, the LM head, attention, argmax and sampling, the dependent-dispatch chains and a
  # whole step per family (GPU timestamps); --quick: 3 x 3 passes, weights rotated through 256 MiB all the same
  step kernels $PY -m bench.kernels --backend wgpu --json --progress --quick --rotate-mib 256 --kernels qkv o \
    gate_up down lm_head decode_attention argmax sample decode_step
  # prefill at 128, 512 and 2,048 tokens: the projections' matmuls (every thread-token shape) and causal
  # attention (compute, not DRAM: 16 MiB of weight copies)
  step kernels_prefill $PY -m bench.kernels --backend wgpu --json --progress --quick --rotate-mib 16 --kernels qkv \
    o gate_up down prefill_attention --prefill 128 512 2048
  # the synthetic 1.5B model's Q4_K projections (its decode reads ~0.85 GB a token), weights rotated through 256 MiB
  step kernels_1.5b $PY -m bench.kernels --backend wgpu --json --progress --quick --rotate-mib 256 --kernels qkv_1.5b \
    o_1.5b gate_up_1.5b down_1.5b
fi
generate() {  # generate NAME MODEL MESSAGES ARGS...: one `pagedkv generate` on the device, $tokens tokens
  local name=$1 model=$2 chat=$3
  shift 3
  [ -f "$M/$model/model.json" ] || { echo "$name: skipped, no $model model"; return; }
  step "$name" $PY -m pagedkv generate --backend wgpu --budget-mib 2048 --tuning-cache "$W/gpu_tuning.json" \
    --model "$M/$model" --messages-json "$chat" --max-tokens "$tokens" --ignore-eos --json "$@"
}
echo '[{"role": "user", "content": "Write a long story about the sea."}]' >"$W/chat.json"
# A long conversation (~2,050 prompt tokens: the first token's target is 100 ms at 2,048): prefill at a real
# length, decode at a real context.
$PY -c 'import json, sys; words = " ".join(f"The tide came in over stone {i} and went out again." for i in range(140))
json.dump([{"role": "user", "content": words + " Tell me more."}], open(sys.argv[1], "w"))' "$W/chat_long.json"
first=1
for model in $models; do
  wait_for "wait_$model" "model_$model"
  # The gpu family first (it tunes: its choice and timings in the JSON), pipelined (the default); on the first
  # model once more (a step's host part varies between runs), then the cpu family and the gpu family with each
  # step waiting for its ids (--no-pipeline), the pipeline's baseline, once each.
  generate "generate_${model}_gpu" "$model" "$W/chat.json" --kernels gpu --greedy
  if [ -n "$first" ] && [ -z "$QUICK" ]; then
    generate "generate_${model}_gpu_2" "$model" "$W/chat.json" --kernels gpu --greedy
    generate "generate_${model}_cpu" "$model" "$W/chat.json" --kernels cpu --greedy
  fi
  [ -z "$QUICK" ] || generate "generate_${model}_cpu" "$model" "$W/chat.json" --kernels cpu --greedy
  generate "generate_${model}_gpu_plain" "$model" "$W/chat.json" --kernels gpu --no-pipeline --greedy
  if [ -n "$first" ] && [ -z "$QUICK" ]; then
    # The app's default settings (temperature 0.7, top-p 0.95): the gpu family draws each token on the GPU
    # (shaders/sample.wgsl), so the step reads back an id, not a logits row.
    generate "generate_${model}_gpu_sampled" "$model" "$W/chat.json" --kernels gpu --temperature 0.7 --top-p 0.95 \
      --seed 1
    generate "generate_${model}_gpu_long" "$model" "$W/chat_long.json" --kernels gpu --greedy
  fi
  first=
done
echo "$OUT: $(ls "$OUT" | tr '\n' ' ')"
