#!/usr/bin/env bash
# Runs on the GPU machine (no systemd): the served unit's sandbox applied by hand
# (bench/gpu/sandbox.py) to a CUDA llama-server, which must still load onto the card
# and answer. In a copy of the repo with .carry beside it (bench/gpu/prepare.sh makes
# it: the lab's llama.cpp mirror and its pinned commit):
#
#   bash bench/gpu/sandbox.sh
#
# The build is the pinned commit for the card's arch with flash attention's
# kernels left out (-DGGML_CUDA_FA=OFF: a third of the compile time; the server
# then runs with --flash-attn off): what is proven is CUDA under the sandbox.
# Results: $OUT/gpu-sandbox.json (bench/results/gpu-sandbox.json).
set -u
W=/opt/gpusandbox
mkdir -p "$W" /var/cache/llamarack-server
cp bench/gpu/sandbox.py bench/gpu/sandbox-syscalls.json "$W/"
python3 -c 'import sys; sys.path.insert(0, "."); from roles.llamacpp.files.llamacpp_proof import write_smoke_gguf
write_smoke_gguf("/opt/gpusandbox/smoke.gguf")' || exit 1
[ -d "$W/src" ] || { git clone -q .carry/llama.cpp.git "$W/src" && git -C "$W/src" checkout -q "$(cat .carry/commit)"; } || exit 1
nvcc=$(ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
start=$(date +%s)
cmake -S "$W/src" -B "$W/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DGGML_CUDA_FA=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build "$W/build" --target llama-server -j"$(nproc)" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
seconds=$(( $(date +%s) - start ))
echo "build: $seconds s"
chmod -R a+rX "$W"
built="the carried llama.cpp commit $(cut -c1-8 .carry/commit), -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
-DGGML_CUDA_FA=OFF, target llama-server ($seconds s on $(nproc) cores, $("$nvcc" --version | tail -1)); the server ran \
with --flash-attn off, the smoke GGUF of roles/llamacpp/files/llamacpp_proof.py, every layer on the card"
BENCH_COMMAND="bash bench/gpu/sandbox.sh" python3 "$W/sandbox.py" serve --bin "$W/build/bin" --model "$W/smoke.gguf" \
  --out "$OUT" --repo "$PWD" --built "$built"
