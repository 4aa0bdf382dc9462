#!/usr/bin/env bash
# Runs on the GPU machine (one GPU, CUDA 13, no systemd, no network), in a copy of the
# repo with .whl and .carry beside it (bench/gpu/proof_prepare.sh makes them):
#
#   bash bench/gpu/proof.sh [PHASES] [LIMIT_S]
#
# PHASES: comma-separated (default all, see bench/gpu/proof.py); a later command on the
# same (warm) machine skips the phases already done. LIMIT_S: seconds this command may
# run (default 560 of the 600 the machine allows one). Results: $OUT/gpu-proof.json, the
# driver's log $OUT/proof.log, every tool's log in $OUT/logs.tar.xz.
set -u
if [ ! -d /tmp/site/pyinfra ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD:$PWD/lab PYTHONUNBUFFERED=1
phases=${1:-machine,build,model8b,roofline,bench8b,serve8b,memory8b,v100}
python3 bench/gpu/proof.py --phases "$phases" --limit "${2:-560}" --out "$OUT"
rc=$?
tar -C /tmp/gpuproof -cJf "$OUT/logs.tar.xz" logs 2>/dev/null
exit $rc
