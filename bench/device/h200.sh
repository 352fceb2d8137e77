#!/usr/bin/env bash
# The kernel benchmark (both kernel families: matvec, matmul, attention rows, a decode step each) and a native
# generate per family on a lent NVIDIA H200 (the `device` tool), as ONE call; JSON to $OUT.
# Not run by the session that wrote it (none was lent); a later session with a machine does:
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
#        timeout_s=420)   # the benchmark takes under two minutes on a GPU; leave time for a second try
#
# The real weights (94 MiB) cannot travel (64 MiB a call): the generate runs random weights at SmolLM2's shapes
# (bench/device/random_model.py), so its timings are the real model's kernels and its text is noise.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?run through the device tool, which sets OUT}"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH="/tmp/site:$PWD/py:$PWD" PYTHONUNBUFFERED=1 PAGEDKV_BENCH_RESULTS="$OUT"
probe='import wgpu; a = wgpu.gpu.request_adapter_sync(power_preference="high-performance"); print(a.info)'
if ! python3 -c "$probe" 2>&1 | tee "$OUT/adapter.txt" | grep -qi nvidia; then
  # The loader found no NVIDIA ICD on its own: point it at the driver's (the device README's fallback).
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  python3 -c "$probe" 2>&1 | tee "$OUT/adapter.txt"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.csv" 2>&1
python3 -m bench.kernels --backend wgpu > "$OUT/kernels.log" 2>&1  # JSON: $OUT/kernels_wgpu.json
echo "bench.kernels exit $?"
python3 bench/device/random_model.py dist/models/smollm2-135m-instruct/model.json /tmp/smollm2-random
echo '[{"role": "user", "content": "Write a long story about the sea."}]' > /tmp/chat.json
for family in cpu gpu; do  # both kernel families; the gpu one tunes first (its choice and timings in the JSON)
  python3 -m pagedkv generate --backend wgpu --kernels "$family" --tuning-cache "$OUT/gpu_tuning.json" \
    --model /tmp/smollm2-random --messages-json /tmp/chat.json --max-tokens 128 --greedy --json \
    > "$OUT/generate_h200_$family.json" 2> "$OUT/generate_$family.log"
  echo "generate --kernels $family exit $?"
done
python3 -m bench.dispatch_geometry --json --kernels gpu --prefill 512 > "$OUT/geometry_prefill_gpu.json"
tail -n 3 "$OUT"/*.log
