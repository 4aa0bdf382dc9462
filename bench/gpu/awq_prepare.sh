#!/usr/bin/env bash
# Runs here (the CPU machine): makes .awqwhl, what bench/gpu/awq.sh takes to the GPU
# machine (no network) beside .carry (bench/gpu/prepare.sh):
#   .awqwhl/*.whl       AutoAWQ 0.2.7 and what it needs beside the machine's own torch, numpy,
#                       triton, sentencepiece: transformers 4.44.2 (the machine's 5.x is too new
#                       for AutoAWQ), its tokenizers and huggingface_hub, accelerate 0.33.0,
#                       datasets 3.0.1 (AutoAWQ imports it; the calibration is a list of texts,
#                       so nothing is loaded) with its pure dependencies, for Python 3.12;
#                       pyarrow and pandas stay behind (52 MB): awq.sh stands a stub in for
#                       datasets where the machine lacks them
#   .awqwhl/tokenizer/  the tiny model's SentencePiece tokenizer (the random checkpoint's)
# Then, on the GPU machine (bench/gpu/README.md), in the copy with .carry and .awqwhl: bash bench/gpu/awq.sh
#
#   bash bench/gpu/awq_prepare.sh [DIR [PYTHON_VERSION]]
# DIR other than .awqwhl (with PYTHON_VERSION, e.g. 3.11 for a rehearsal here): the same wheels
# for that Python, into DIR; git's exclude and the travel sum are left alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.awqwhl}
pyver=${2:-3.12}

pkgs=(transformers==4.44.2 tokenizers==0.19.1 huggingface_hub==0.36.2 accelerate==0.33.0 autoawq==0.2.7
      datasets==3.0.1 dill==0.3.8 multiprocess==0.70.16 xxhash==4.1.0 fsspec==2024.6.1
      aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 attrs==26.1.0 frozenlist==1.8.0
      multidict==7.2.1 propcache==0.5.4 yarl==1.25.1
      requests==2.34.2 urllib3==2.8.0 idna==3.20 charset_normalizer==3.5.3 certifi==2026.10.19.post1
      psutil==7.2.2 protobuf==4.25.9 regex==2026.11.19 pyyaml==6.0.4 safetensors==0.8.0)
rm -rf "$dir" && mkdir -p "$dir/tokenizer"
for p in "${pkgs[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "$p" 2>&1 | grep -v '^WARNING: Location' || true
  ls "$dir" | grep -qi "^$(echo "${p%%==*}" | tr -- '-_' '..')-${p##*==}-" \
    || { echo "awq_prepare: no wheel of $p for Python $pyver" >&2; exit 1; }
done

tok=$(python3 -c 'from pathlib import Path; from llamarack_lab.tiny_model import tiny_model
print(tiny_model(Path("/var/cache/llamarack")))')
cp "$tok"/tokenizer.model "$tok"/tokenizer_config.json "$tok"/special_tokens_map.json "$dir/tokenizer/"
[ "$dir" = .awqwhl ] || { du -sh "$dir"; exit 0; }

exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.awqwhl/' "$exclude" 2>/dev/null || printf '/.awqwhl/\n' >> "$exclude"
# What travels: the tree git would send plus the carried folders (.carry from prepare.sh).
[ -d .carry ] || echo "awq_prepare: no .carry yet (bash bench/gpu/prepare.sh)" >&2
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
carried=$(du -sb .awqwhl .carry 2>/dev/null | awk '{s+=$1} END {print s}')
echo "travels: $(( (tree + carried) / 1048576 )) MiB of 64 (tree $(( tree / 1048576 )), .awqwhl + .carry $(( carried / 1048576 )))"
