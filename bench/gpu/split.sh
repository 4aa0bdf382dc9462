#!/usr/bin/env bash
# Runs on the device machine (one H200, no systemd, no network), from a copy of the repo
# carrying .whl and .carry (bench/gpu/prepare.sh makes them):
#
#   bash bench/gpu/split.sh build   llama-server, ggml-rpc-server, llama-quantize: CUDA + RPC, sm_90
#   bash bench/gpu/split.sh model   a random-weights Gemma-3-27B Q4_K_M (its f16 in /dev/shm)
#   bash bench/gpu/split.sh check   bench/gpu/split_ledger.py: $OUT/gpu-split.json
#
# One card stands for two: an rpc-server on the same H200 is a second device of llama.cpp's
# own (RPC0), so llama-server splits the layers over two devices and prints each one's
# buffers, which split_ledger.py sets against the per-card ledger of a 2x V100 16 GB plan.
set -u
W=/opt/split
mkdir -p "$W"
nvcc=$(ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
case "${1:-check}" in
  build)
    [ -d "$W/src" ] || { git clone -q .carry/llama.cpp.git "$W/src" && git -C "$W/src" checkout -q "$(cat .carry/commit)"; } || exit 1
    start=$(date +%s)
    cmake -S "$W/src" -B "$W/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_RPC=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90-real -DCMAKE_CUDA_COMPILER="$nvcc" -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF > "$OUT/configure.log" 2>&1 \
      || { tail -30 "$OUT/configure.log"; exit 1; }
    cmake --build "$W/build" --target llama-server ggml-rpc-server llama-quantize -j"$(nproc)" > "$OUT/build.log" 2>&1 \
      || { tail -40 "$OUT/build.log"; exit 1; }
    "$W/build/bin/llama-server" --help > "$W/build/server-help.txt" 2>&1
    echo "build: $(( $(date +%s) - start )) s"
    ;;
  model)
    [ -f "$W/model/model.gguf" ] && { echo "model: already made"; exit 0; }
    mkdir -p "$W/model"
    start=$(date +%s)
    python3 bench/gpu/random_model.py gguf gemma3-27b /dev/shm/f16.gguf --gguf-py "$W/src/gguf-py" | tail -c 600 || exit 1
    "$W/build/bin/llama-quantize" /dev/shm/f16.gguf "$W/model/model.gguf.tmp" Q4_K_M > "$OUT/quantize.log" 2>&1 \
      || { tail -20 "$OUT/quantize.log"; exit 1; }
    rm -f /dev/shm/f16.gguf && mv "$W/model/model.gguf.tmp" "$W/model/model.gguf"
    echo "model: $(( $(date +%s) - start )) s"
    ;;
  check)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    PYTHONPATH=/tmp/site:$PWD python3 bench/gpu/split_ledger.py --build "$W/build" --model-dir "$W/model" --out "$W/out" "${@:2}"
    cp "$W/out/gpu-split.json" "$OUT/" && tar -C "$W/out" -cJf "$OUT/logs.tar.xz" logs
    ;;
esac
