#!/usr/bin/env bash
# Runs here (the CPU machine): everything bench/gpu/proof.sh takes to the GPU
# machine, which has no network, within the 64 MiB a copy of the repo may weigh:
#   .whl               pyinfra and the dependencies its image lacks (bench/gpu/prepare.sh)
#   .carry/llama.cpp.git, .carry/commit   the lab's llama.cpp mirror and the pinned commit (same)
#   .carry/tokenizer/  the tiny model's SentencePiece tokenizer (1000 pieces): the random
#                      checkpoints' vocabulary, padded by the converter to the shape's vocab_size
# Then, on the GPU machine, in the copy with .whl and .carry: bash bench/gpu/proof.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bash bench/gpu/prepare.sh
tok=$(python3 -c 'from pathlib import Path; from llamarack_lab.tiny_model import tiny_model
print(tiny_model(Path("/var/cache/llamarack")))')
mkdir -p .carry/tokenizer
cp "$tok"/tokenizer.model "$tok"/tokenizer_config.json "$tok"/special_tokens_map.json .carry/tokenizer/
# What travels: the tree git would send plus the carried folders.
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
carried=$(du -sb .whl .carry | awk '{s+=$1} END {print s}')
echo "travels: $(( (tree + carried) / 1048576 )) MiB of 64 (tree $(( tree / 1048576 )), carried $(( carried / 1048576 )))"
