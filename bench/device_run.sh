#!/usr/bin/env bash
# Runs on the device machine (H200, CUDA 13, no systemd, no network): the
# llama.cpp role twice through pyinfra @local, then llama-server on the GPU.
# Results land in $OUT. Carried: .whl (pyinfra and its deps), .carry (the
# git mirror, the tiny GGUF).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=/tmp/llamarack
COMMIT=$(cat .carry/commit)
DATA=(--data llamarack_root=$ROOT --data python_env_backend=venv --data 'toolchain_cuda_version="13.0"'
      --data llamacpp_git_url=file://$PWD/.carry/llama.cpp.git --data llamacpp_commit=$COMMIT --data llamacpp_build_jobs=16)
nvidia-smi --query-gpu=index,name,uuid,memory.total,compute_cap,driver_version --format=csv,noheader,nounits > $OUT/query_noheader_nounits.txt 2>&1
start=$(date +%s)
python3 -m pyinfra -y @local bench/device_deploy.py "${DATA[@]}" > $OUT/deploy1.log 2>&1; echo "deploy1 rc=$? s=$(( $(date +%s) - start ))" | tee $OUT/summary.txt
start=$(date +%s)
python3 -m pyinfra -y @local bench/device_deploy.py "${DATA[@]}" > $OUT/deploy2.log 2>&1; echo "deploy2 rc=$? s=$(( $(date +%s) - start ))" | tee -a $OUT/summary.txt
B=$ROOT/builds/current
{ ls -la $ROOT/builds/; cat $B/version.txt; head -5 $B/cubins.txt; grep -c cubin $B/cubins.txt; cat $B/build-info.json; } >> $OUT/summary.txt 2>&1
cp $B/server-help.txt $OUT/ 2>/dev/null
if [ -f .carry/tiny.gguf ]; then
  $B/bin/llama-server -m .carry/tiny.gguf -ngl 99 --load-mode none --flash-attn on -ctk q4_0 -ctv q4_0 -c 4096 --port 18080 > $OUT/server.log 2>&1 &
  pid=$!
  for i in $(seq 1 100); do curl -sf localhost:18080/health > /dev/null && break; sleep 0.2; done
  { echo "health: $(curl -s localhost:18080/health)"; curl -s localhost:18080/completion -d '{"prompt":"hello","n_predict":64}' | head -c 600; echo; } >> $OUT/summary.txt
  kill $pid
  $B/bin/llama-bench -m .carry/tiny.gguf -ngl 99 -p 128 -n 64 >> $OUT/summary.txt 2>&1
fi
cat $OUT/summary.txt
