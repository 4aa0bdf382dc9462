#!/usr/bin/env bash
# Sourced by the GPU machine's scripts (layers.sh, sleep.sh, residency.sh, sandbox.sh, split.sh,
# awq.sh, host_ram.sh, sampling.sh). build_cuda W TARGET [CMAKE_ARG...] clones the carried
# llama.cpp mirror at its pinned commit (once per machine: clone_src W links it as W/src) and
# builds TARGETs for sm_90, the logs in $OUT; nvcc is the machine's. The build is one per set of
# CMAKE_ARGs on the machine, shared by every script asking for the same set (W/build links to
# it): a later script compiles only the targets an earlier one did not. A build with
# llama-server ends with its --help (the build's first run). random_q4_k_m W SHAPE makes
# W/model/model.gguf, a random-weights Q4_K_M of bench/gpu/random_model.py's SHAPE (its f16 in
# /dev/shm: random_f16 W SHAPE, which may run while the build does), with W/build's llama-quantize.
nvcc=$(ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)

SHARED=/opt/gpubuild

clone_src() {
  local src=$SHARED/src
  [ -d "$src" ] || { mkdir -p "$SHARED" && git clone -q .carry/llama.cpp.git "$src.tmp" \
    && git -C "$src.tmp" checkout -q "$(cat .carry/commit)" && mv "$src.tmp" "$src"; } || return 1
  [ -e "$1/src" ] || ln -s "$src" "$1/src"
}

build_cuda() {
  local w=$1 targets=$2 b
  shift 2
  clone_src "$w" || return 1
  b=$SHARED/build-$(printf '%s\n' "$@" | sha256sum | cut -c1-12)
  [ -L "$w/build" ] || rm -rf "$w/build"
  ln -sfn "$b" "$w/build"
  cmake -S "$SHARED/src" -B "$b" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF "$@" > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; return 1; }
  # shellcheck disable=SC2086 (the targets are words)
  cmake --build "$b" --target $targets -j"$(nproc)" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; return 1; }
  [ ! -x "$w/build/bin/llama-server" ] || "$w/build/bin/llama-server" --help > "$w/build/server-help.txt" 2>&1
}

# The model is one per shape on the machine too ($SHARED/model-SHAPE; W/model links to it). The f16
# is written beside and renamed: one a killed command left half written is never quantized.
random_f16() {
  local w=$1 shape=$2 f16=/dev/shm/f16-$2.gguf out
  [ -f "$SHARED/model-$shape/model.gguf" ] || [ -f "$f16" ] && return 0
  out=$(python3 bench/gpu/random_model.py gguf "$shape" "$f16.tmp" --gguf-py "$w/src/gguf-py") || return 1
  printf "%s\n" "$out" | tail -c 600 && mv "$f16.tmp" "$f16"
}

random_q4_k_m() {
  local w=$1 shape=$2 m=$SHARED/model-$2
  mkdir -p "$m"
  [ -e "$w/model" ] || ln -s "$m" "$w/model"
  [ -f "$m/model.gguf" ] && { echo "model: already made"; return 0; }
  local start=$(date +%s)
  random_f16 "$w" "$shape" || return 1
  "$w/build/bin/llama-quantize" "/dev/shm/f16-$shape.gguf" "$m/model.gguf.tmp" Q4_K_M > "$OUT/quantize.log" 2>&1 \
    || { tail -20 "$OUT/quantize.log"; return 1; }
  rm -f "/dev/shm/f16-$shape.gguf" && mv "$m/model.gguf.tmp" "$m/model.gguf"
  echo "model: $(( $(date +%s) - start )) s"
}
