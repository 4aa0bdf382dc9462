#!/usr/bin/env bash
# Runs on the GPU machine (one GPU, no systemd, no network), from a copy of the repo
# carrying .whl and .carry (bench/gpu/prepare.sh makes them):
#
#   bash bench/gpu/residency.sh build    llama-server and a memory holder, CUDA, sm_90 (once per machine)
#   bash bench/gpu/residency.sh check    bench/gpu/residency.py: the checks, $OUT/gpu-residency.json
set -u
W=/opt/residency
mkdir -p "$W"
. bench/gpu/build_cuda.sh
case "${1:-check}" in
  build)
    start=$(date +%s)
    build_cuda "$W" llama-server || exit 1
    "$nvcc" -o "$W/hold" bench/gpu/hold.cu || exit 1
    echo "build: $(( $(date +%s) - start )) s"
    ;;
  check)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    BENCH_COMMAND="bash bench/gpu/residency.sh check" PYTHONPATH=/tmp/site:$PWD python3 bench/gpu/residency.py --build "$W/build" --hold "$W/hold" --out "$W/out"
    cp "$W/out/gpu-residency.json" "$OUT/" && tar -C "$W/out" -cJf "$OUT/logs.tar.xz" logs
    ;;
esac
