#!/usr/bin/env bash
# Runs on the device machine (H200, no systemd, no network), from a copy of the repo
# carrying .whl and .carry (bench/gpu/prepare.sh makes them):
#
#   bash bench/gpu/residency.sh build    llama-server and a memory holder, CUDA, sm_90 (once per machine)
#   bash bench/gpu/residency.sh check    bench/gpu/residency.py: the checks, $OUT/gpu-residency.json
set -u
W=/opt/residency
mkdir -p "$W"
nvcc=$(ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
case "${1:-check}" in
  build)
    [ -d "$W/src" ] || { git clone -q .carry/llama.cpp.git "$W/src" && git -C "$W/src" checkout -q "$(cat .carry/commit)"; } || exit 1
    start=$(date +%s)
    cmake -S "$W/src" -B "$W/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
      -DCMAKE_CUDA_COMPILER="$nvcc" -DGGML_CUDA_FA=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
    cmake --build "$W/build" --target llama-server -j"$(nproc)" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
    "$nvcc" -o "$W/hold" bench/gpu/hold.cu || exit 1
    "$W/build/bin/llama-server" --help > "$W/build/server-help.txt" 2>&1
    echo "build: $(( $(date +%s) - start )) s"
    ;;
  check)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    PYTHONPATH=/tmp/site:$PWD python3 bench/gpu/residency.py --build "$W/build" --hold "$W/hold" --out "$W/out"
    cp "$W/out/gpu-residency.json" "$OUT/" && tar -C "$W/out" -cJf "$OUT/logs.tar.xz" logs
    ;;
esac
