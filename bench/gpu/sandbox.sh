#!/usr/bin/env bash
# Runs on the GPU machine (no systemd): the served unit's sandbox applied by hand
# (bench/gpu/sandbox.py) to a CUDA llama-server, which must still load onto the card
# and answer. In a copy of the repo with .carry beside it (bench/gpu/prepare.sh makes
# it: the lab's llama.cpp mirror and its pinned commit):
#
#   bash bench/gpu/sandbox.sh
#
# The build is the pinned commit for the card's arch (bench/gpu/build_cuda.sh, the build the other
# GPU scripts share); the server runs with --flash-attn off: what is proven is CUDA under the
# sandbox. Results: $OUT/gpu-sandbox.json (bench/results/gpu-sandbox.json).
set -u
W=/opt/gpusandbox
mkdir -p "$W" /var/cache/llamarack-server
cp bench/gpu/sandbox.py bench/gpu/sandbox-syscalls.json "$W/"
python3 -c 'import sys; sys.path.insert(0, "."); from roles.llamacpp.files.llamacpp_proof import write_smoke_gguf
write_smoke_gguf("/opt/gpusandbox/smoke.gguf")' || exit 1
. bench/gpu/build_cuda.sh
start=$(date +%s)
build_cuda "$W" llama-server || exit 1
seconds=$(( $(date +%s) - start ))
echo "build: $seconds s"
chmod -R a+rX "$W" "$SHARED"
built="the carried llama.cpp commit $(cut -c1-8 .carry/commit), -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real, \
target llama-server ($seconds s on $(nproc) cores, the build shared with the other GPU scripts counted where this one \
made it; $("$nvcc" --version | tail -1)); the server ran with --flash-attn off, the smoke GGUF of \
roles/llamacpp/files/llamacpp_proof.py, every layer on the card"
BENCH_COMMAND="bash bench/gpu/sandbox.sh" python3 "$W/sandbox.py" serve --bin "$W/build/bin" --model "$W/smoke.gguf" \
  --out "$OUT" --repo "$PWD" --built "$built"
