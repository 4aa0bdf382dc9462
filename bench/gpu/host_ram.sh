#!/usr/bin/env bash
# Runs on the GPU machine (one GPU, no systemd, no network), from a copy of the repo
# carrying .whl and .carry (bench/gpu/prepare.sh makes them):
#
#   bash bench/gpu/host_ram.sh build   llama-server and llama-quantize, CUDA, sm_90 (once per machine)
#   bash bench/gpu/host_ram.sh model   a random-weights Llama-3-8B Q4_K_M (its f16 in /dev/shm)
#   bash bench/gpu/host_ram.sh check   bench/gpu/host_ram.py: $OUT/gpu-host-ram.json
#
# Each llama-server's resident memory (VmRSS), after long prompts that fill its prompt cache,
# against its share of the host-RAM ledger (`llamarack plan --json`, host_ram.units[0]).
set -u
W=/opt/hostram
mkdir -p "$W"
. bench/gpu/build_cuda.sh
case "${1:-check}" in
  build) build_cuda "$W" "llama-server llama-quantize" ;;
  model) random_q4_k_m "$W" llama3-8b ;;
  check)
    shift $(( $# > 0 ? 1 : 0 ))
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    BENCH_COMMAND="bash bench/gpu/host_ram.sh check${*:+ $*}" PYTHONPATH=/tmp/site:$PWD \
      python3 bench/gpu/host_ram.py --build "$W/build" --model-dir "$W/model" --out "$W/out" "$@" || exit 1
    cp "$W/out/gpu-host-ram.json" "$OUT/" && tar -C "$W/out" -cJf "$OUT/logs.tar.xz" logs
    ;;
  *) echo "usage: bash bench/gpu/host_ram.sh build|model|check [host_ram.py options]" >&2; exit 2 ;;
esac
