#!/usr/bin/env bash
# Runs on the GPU machine (no systemd, no network), from a copy of the repo carrying .carry
# (bench/gpu/prepare.sh makes it): llama-server and llama-quantize built for sm_90, a
# random-weight Llama 3 8B shape at half width and depth (Q4_K_M), then bench/gpu/sleep.py:
# a unit's GPU memory awake and asleep (--sleep-idle-seconds) and its wake latency.
#
#   bash bench/gpu/sleep.sh        $OUT/gpu-sleep.json, the logs
set -u
W=/opt/sleep
mkdir -p "$W"
. bench/gpu/build_cuda.sh
start=$(date +%s)
build_cuda "$W" "llama-server llama-quantize" || exit 1
echo "build: $(( $(date +%s) - start )) s"
python3 bench/gpu/random_model.py gguf llama3-8b /dev/shm/f16.gguf --scale-down 2 --gguf-py "$W/src/gguf-py" \
  > "$OUT/gguf.log" 2>&1 || { tail -20 "$OUT/gguf.log"; exit 1; }
"$W/build/bin/llama-quantize" /dev/shm/f16.gguf /dev/shm/q4.gguf Q4_K_M > "$OUT/quantize.log" 2>&1 \
  || { tail -20 "$OUT/quantize.log"; exit 1; }
rm -f /dev/shm/f16.gguf
echo "model: $(( $(date +%s) - start )) s"
BENCH_COMMAND="bash bench/gpu/sleep.sh" python3 bench/gpu/sleep.py --build "$W/build" --model /dev/shm/q4.gguf --out "$OUT"
