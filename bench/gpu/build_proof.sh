#!/usr/bin/env bash
# Runs on the GPU machine (CUDA 13, no systemd, no network), from a copy of the repo carrying
# .whl and .carry (bench/gpu/prepare.sh makes them):
#
#   bash bench/gpu/build_proof.sh right   the llama.cpp role through pyinfra @local for the
#                                         card's own arch, twice: the smoke run computes on
#                                         the GPU and is recorded; the second run changes nothing
#   bash bench/gpu/build_proof.sh quality as right, with model_quality: the proof also runs
#                                         llama-perplexity (f16 logits, KL divergence per KV type)
#   bash bench/gpu/build_proof.sh ship    one portable build (ggml's CPU baseline, the card's arch as
#                                         real SASS) made by one run and published to a directory
#                                         runs share (LLAMARACK_SHIP_DIR); a second run with a root
#                                         of its own receives it, checks its seal, proves it on the
#                                         card and switches to it, compiling nothing
#   bash bench/gpu/build_proof.sh wrong   a build for sm_80 only (80-real: no PTX to JIT),
#                                         rules bypassed: the smoke run must refuse it and
#                                         leave builds/current as it was
#
# Each is one command (the first build is most of the machine's 600 s); run `wrong` after
# `right` on the same warm machine, so builds/current holds the right build when the wrong
# one is refused. `ship` writes gpu-ship-proof.json (the artifact's cubins and CPU code checked
# by the report itself). Results land in $OUT: gpu-build-proof.json (bench/gpu/build_report.py: both
# cases so far on this machine, stamped; `quality`: gpu-build-proof-tools.json, each tool's
# figures from its log), summary.txt, the deploy logs, the build records, the tools' logs.
set -u
what=${1:-right}
case "$what" in right|quality|ship|wrong) ;; *) echo "usage: bash bench/gpu/build_proof.sh right|quality|ship|wrong" >&2; exit 2 ;; esac
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=/tmp/llamarack
JOBS=$(nproc)
# A throwaway machine: the root may be under /tmp (llamarack_allow_shared_dirs).
DATA=(--data llamarack_root=$ROOT --data llamarack_allow_shared_dirs=True --data python_env_backend=venv
      --data 'toolchain_cuda_version="13.0"' --data llamacpp_git_url=file://$PWD/.carry/llama.cpp.git
      --data llamacpp_commit=$(cat .carry/commit) --data llamacpp_build_jobs=$JOBS)
summary=$OUT/summary.txt
deploy() {  # deploy NAME [extra pyinfra args...]
  local name=$1 rc; shift
  local start=$(date +%s)
  python3 -m pyinfra -y @local bench/gpu/build_deploy.py "${DATA[@]}" "$@" > $OUT/$name.log 2>&1
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - start ))" >> $OUT/steps.tsv
  echo "$name rc=$rc s=$(( $(date +%s) - start ))" | tee -a $summary
}
{ nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader; nproc; } >> $summary 2>&1
at_start=$(readlink $ROOT/builds/current 2>/dev/null)
case "$what" in
  right)
    deploy deploy1
    deploy deploy2
    ;;
  quality)  # with model_quality the build carries llama-perplexity, and the proof runs it too
    deploy quality1 --data model_quality=True
    deploy quality2 --data model_quality=True
    ;;
  ship)  # ggml's CPU baseline (x86-64-v3 without AVX-512) in the stamp: a build other hosts may take
    export LLAMARACK_SHIP_DIR=/tmp/buildproof-ship RECEIVER=/tmp/llamarack-receiver
    rm -rf $LLAMARACK_SHIP_DIR $RECEIVER && mkdir -p $LLAMARACK_SHIP_DIR && chmod 700 $LLAMARACK_SHIP_DIR
    PORTABLE='llamacpp_cpu_features=["sse42","avx","avx2","bmi2","fma","f16c"]'
    deploy maker --data "$PORTABLE"
    deploy maker_again --data "$PORTABLE"
    deploy receiver --data "$PORTABLE" --data llamarack_root=$RECEIVER
    deploy receiver_again --data "$PORTABLE" --data llamarack_root=$RECEIVER
    ;;
  wrong)
    deploy wrong_arch --data 'llamacpp_cuda_archs=["80-real"]' --data bench_skip_rules=True
    echo "builds/current at start: ${at_start:-none}; at end: $(readlink $ROOT/builds/current 2>/dev/null || echo none)" | tee -a $summary
    for log in $ROOT/builds/*/smoke/server-*.log; do echo "== $log"; tail -n 15 "$log"; done > $OUT/smoke-logs.txt 2>&1
    ;;
esac
B=$ROOT/builds/current
{ ls -la $ROOT/builds/; cat $B/version.txt; grep -c cubin $B/cubins.txt; } >> $summary 2>&1
cp $B/build-info.json $OUT/build-info.json 2>/dev/null
mkdir -p $OUT/smoke && cp $B/smoke/*.log $OUT/smoke/ 2>/dev/null  # the smoke run's and each tool's log
BENCH_COMMAND="bash bench/gpu/build_proof.sh $what" python3 bench/gpu/build_report.py "$what" --root $ROOT --out "$OUT" \
  --jobs "$JOBS" --at-start "$at_start" > /dev/null || exit 1
cat $summary
