#!/usr/bin/env bash
# Runs on the GPU machine (no systemd, no network), from a copy of the repo carrying .carry
# (bench/gpu/prepare.sh makes it): llama-server for sm_90, then bench/gpu/layers.py: the
# residency check refusing a server that holds fewer layers than planned, read from the
# load log the unit's log verbosity prints.
#
#   bash bench/gpu/layers.sh        $OUT/gpu-layers.json, the servers' logs
set -u
W=/opt/layers
mkdir -p "$W"
. bench/gpu/build_cuda.sh
start=$(date +%s)
build_cuda "$W" llama-server || exit 1
echo "build: $(( $(date +%s) - start )) s"
BENCH_COMMAND="bash bench/gpu/layers.sh" PYTHONPATH=$PWD python3 bench/gpu/layers.py --build "$W/build" --out "$OUT"
