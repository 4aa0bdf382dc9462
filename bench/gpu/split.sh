#!/usr/bin/env bash
# Runs on the GPU machine (one GPU, no systemd, no network), from a copy of the repo
# carrying .whl and .carry (bench/gpu/prepare.sh makes them):
#
#   bash bench/gpu/split.sh build   llama-server, ggml-rpc-server, llama-quantize: CUDA + RPC, sm_90
#   bash bench/gpu/split.sh model   a random-weights Gemma-3-27B Q4_K_M (its f16 in /dev/shm)
#   bash bench/gpu/split.sh check   bench/gpu/split_ledger.py: $OUT/gpu-split.json
#   bash bench/gpu/split.sh all     the three in one command, the f16 written while the build runs
#
# One card stands for two: an rpc-server on the same card is a second device of llama.cpp's
# own (RPC0), so llama-server splits the layers over two devices and prints each one's
# buffers, which split_ledger.py sets against the per-card ledger of a 2x V100 16 GB plan.
set -u
W=/opt/split
. bench/gpu/build_cuda.sh

build() {
  local start=$(date +%s)
  build_cuda "$W" "llama-server ggml-rpc-server llama-quantize" -DGGML_RPC=ON || return 1
  echo "build: $(( $(date +%s) - start )) s"
}

# The GPU proof's v100 phase (proof.py) makes the same shape, Q4_K_M, with the same script and
# llama.cpp commit: where it ran on this machine first, its file is used, not made again.
PROOF_27B=/tmp/llamarack-v100/models/gemma3-27b-q4km/model.gguf

model() {
  local m=$SHARED/model-gemma3-27b
  if [ ! -e "$m/model.gguf" ] && [ -f "$PROOF_27B" ]; then
    mkdir -p "$m" && ln -s "$PROOF_27B" "$m/model.gguf" && echo "model: the GPU proof's ($PROOF_27B)"
  fi
  random_q4_k_m "$W" gemma3-27b
}

check() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
  BENCH_COMMAND="bash bench/gpu/split.sh $step${*:+ $*}" PYTHONPATH=/tmp/site:$PWD python3 bench/gpu/split_ledger.py --build "$W/build" --model-dir "$W/model" --out "$W/out" "$@" || return 1
  cp "$W/out/gpu-split.json" "$OUT/" && tar -C "$W/out" -cJf "$OUT/logs.tar.xz" logs
}

all() {
  clone_src "$W" || return 1
  random_f16 "$W" gemma3-27b > "$OUT/f16.log" 2>&1 &
  local f16=$!
  build || { wait "$f16"; return 1; }
  wait "$f16" || { tail -20 "$OUT/f16.log"; return 1; }
  model && check "$@"
}

mkdir -p "$W"
step=${1:-check}
case "$step" in
  build|model|check|all) shift $(( $# > 0 ? 1 : 0 )); "$step" "$@" ;;
  *) echo "usage: bash bench/gpu/split.sh build|model|check|all [split_ledger.py options]" >&2; exit 2 ;;
esac
