#!/usr/bin/env bash
# Runs on the GPU machine (no systemd, no network), from a copy of the repo carrying .whl and .carry
# (bench/gpu/prepare.sh makes them): llama-server, llama-bench and llama-quantize for sm_90, a
# random-weights Llama-3-8B Q4_K_M (its f16 written while the build runs), then
# bench/gpu/sampling.py: the unit as the server role plans it, with --backend-sampling
# (server_backend_sampling 'auto') and without ('off'): greedy and seeded tokens, the samplers
# llama.cpp leaves on the CPU and what it logs of them, served decode against llama-bench's tg128.
#
#   bash bench/gpu/sampling.sh        $OUT/gpu-sampling.json, the servers' logs in $OUT/logs.tar.xz
#
# A step an earlier command on the same machine finished is not done again (the build is
# incremental, the model kept): a command that ran out of time is run again.
set -u
W=/opt/sampling
mkdir -p "$W"
. bench/gpu/build_cuda.sh
start=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
clone_src "$W" || exit 1
random_f16 "$W" llama3-8b > "$OUT/gguf.log" 2>&1 &
f16=$!
build_cuda "$W" "llama-server llama-bench llama-quantize" || exit 1
echo "build: $(( $(date +%s) - start )) s"
wait "$f16" || { tail -20 "$OUT/gguf.log"; exit 1; }
random_q4_k_m "$W" llama3-8b || exit 1
echo "model: $(( $(date +%s) - start )) s"
BENCH_COMMAND="bash bench/gpu/sampling.sh" PYTHONPATH=/tmp/site:$PWD python3 bench/gpu/sampling.py --build "$W/build" --model-dir "$W/model" --out "$W/out" \
  --commit "$(cat .carry/commit)"
rc=$?
cp "$W/out/gpu-sampling.json" "$OUT/" 2>/dev/null
tar -C "$W/out" -cJf "$OUT/logs.tar.xz" logs
echo "all: $(( $(date +%s) - start )) s"
exit $rc
