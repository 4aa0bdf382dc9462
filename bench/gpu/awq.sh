#!/usr/bin/env bash
# Runs on the GPU machine (one GPU, no network), in a copy of the repo with .carry
# (bench/gpu/prepare.sh) and .awqwhl (bench/gpu/awq_prepare.sh) beside it, twice, back to back:
#
#   bash bench/gpu/awq.sh
#
# The AWQ route on a random-weights checkpoint of a real shape, and the quality of both routes:
#   build    llama-quantize and llama-perplexity for sm_90 (in the background, niced, while the
#            next steps run; the quality step waits for it)
#   model    a random-weights checkpoint of AWQ_SHAPE (llama3-8b) in /dev/shm, the tiny model's
#            tokenizer (.awqwhl/tokenizer)
#   awq      AutoAWQ 0.2.7 (.awqwhl installed with --target, ahead of the machine's own packages
#            on PYTHONPATH: its transformers 5 is too new) on the machine's torch and GPU:
#            roles/model/files/awq_apply.py (the route's defaults) on roles/model/files/calibration.txt
#   convert  both checkpoints to f16 GGUFs (the pinned convert_hf_to_gguf.py, the machine's python)
#   quality  Q4_K_M of each; llama-perplexity (the model role's flags) on roles/model/files/quality.txt:
#            the plain f16 with --kl-divergence-base, then against it the AWQ f16 (what the scales
#            alone change) and each Q4_K_M with f16, q8_0 and q4_0 KV
#   check    $OUT/gpu-awq.json (bench/gpu/awq_report.py) and the logs in $OUT/logs.tar.xz; every
#            command ends with it, whatever it was given
# The steps run in that order (or those named as arguments); each skips what is done (work in
# AWQ_WORK, /opt/awq, and AWQ_SHM, /dev/shm/awq) and is not started when its estimate passes the
# command's time limit (AWQ_LIMIT, 540 s of the machine's 600): the next command on the warm
# machine does the rest.
#
# Rehearsal on a CPU machine (bench/gpu/README.md): AWQ_CPU=1 with AWQ_CPU_BUILD (a CPU build of
# both tools), AWQ_CPU_SRC (the pinned source), AWQ_PYTHON (a Python standing for the machine's),
# AWQ_SCALE_DOWN, and OUT.
set -u
export BENCH_COMMAND="bash bench/gpu/awq.sh${*:+ $*}"  # in the result's stamp (bench/provenance.py)
W=${AWQ_WORK:-/opt/awq}
SHM=${AWQ_SHM:-/dev/shm/awq}
PY=${AWQ_PYTHON:-python3}
WHL=${AWQ_WHL:-.awqwhl}
SHAPE=${AWQ_SHAPE:-llama3-8b}
DOWN=${AWQ_SCALE_DOWN:-1}
LIMIT=${AWQ_LIMIT:-540}
CTX=256  # the model role's QUALITY_CTX (roles/model/operations.py)
FILES=roles/model/files
DEFERRED=75
START=$(date +%s)
BUILD=
if [ -n "${AWQ_CPU:-}" ]; then NGL=(); else NGL=(-ngl 999); fi
. bench/gpu/build_cuda.sh

# room SECONDS WHAT: whether WHAT (about SECONDS at the 8B shape) still fits this command's time
room() {
  local used=$(( $(date +%s) - START ))
  (( used + $1 <= LIMIT )) && return 0
  echo "awq: ${used} s used of ${LIMIT}; $2 (about $1 s) is left for the next command"
  return $DEFERRED
}

# logged NAME CMD...: CMD with its output in logs/NAME.log (there once CMD succeeded; NAME.log.tmp
# otherwise), its command line in commands.tsv, its seconds and exit status in steps.tsv; cut
# 40 s after LIMIT, before the machine's own 600 s
logged() {
  local name=$1 log=$W/out/logs/$1.log t0 limit rc
  shift
  t0=$(date +%s)
  limit=$(( LIMIT + 40 - (t0 - START) ))
  (( limit > 1 )) || limit=1
  printf '%s\t%s\n' "$name" "$(printf '%q ' "$@")" >> "$W/out/commands.tsv"
  timeout "$limit" "$@" > "$log.tmp" 2>&1
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$(( $(date +%s) - t0 ))" "$rc" >> "$W/out/steps.tsv"
  if [ "$rc" = 0 ]; then mv -f "$log.tmp" "$log"; else echo "awq: $name failed (rc $rc)"; tail -n 25 "$log.tmp"; fi
  return "$rc"
}

built() { [ -x "$W/build/bin/llama-quantize" ] && [ -x "$W/build/bin/llama-perplexity" ]; }

wait_build() {
  [ -z "$BUILD" ] || { wait "$BUILD"; BUILD=; }
  built
}

build() {
  if [ -n "${AWQ_CPU:-}" ]; then  # the rehearsal: a CPU build made beforehand
    ln -sfn "$AWQ_CPU_SRC" "$W/src" && ln -sfn "$AWQ_CPU_BUILD" "$W/build"
    return
  fi
  built && { echo "build: done"; return 0; }
  (
    renice -n 10 -p "$BASHPID" > /dev/null
    t0=$(date +%s)
    build_cuda "$W" "llama-quantize llama-perplexity"
    rc=$?
    printf 'build\t%s\t%s\n' "$(( $(date +%s) - t0 ))" "$rc" >> "$W/out/steps.tsv"
    exit $rc
  ) &
  BUILD=$!
  echo "build: started in the background"
}

model() {
  if [ -f "$SHM/plain/config.json" ]; then echo "model: done"; return 0; fi
  room 60 model || return
  rm -rf "$SHM/plain.tmp"
  logged model "$PY" bench/gpu/random_model.py checkpoint "$SHAPE" "$SHM/plain.tmp" \
    --tokenizer "$WHL/tokenizer" --scale-down "$DOWN" && mv -T "$SHM/plain.tmp" "$SHM/plain"
}

# AutoAWQ's env: the carried wheels in W/site, ahead of the machine's packages on PYTHONPATH
awq_env() {
  [ -f "$W/site/.done" ] && return 0
  rm -rf "$W/site"
  logged awq-install "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "$W/site" "$WHL"/*.whl || return
  if ! PYTHONPATH=$W/site "$PY" -c 'import awq' > "$W/out/logs/awq-import.log" 2>&1; then
    # datasets imports pyarrow and pandas, not carried (52 MB): AutoAWQ imports its load_dataset
    # and, given a list of texts, never calls it; the log says why the real one did not import
    rm -rf "$W/site/datasets" "$W/site"/datasets-*.dist-info && mkdir -p "$W/site/datasets"
    printf '%s\n' '"""Stands in for datasets (no pyarrow, pandas): the calibration is a list of texts."""' \
      'def load_dataset(*args, **kwargs):' '    raise RuntimeError("datasets is a stub here")' \
      > "$W/site/datasets/__init__.py"
  fi
  logged awq-env env PYTHONPATH="$W/site" "$PY" bench/gpu/awq_report.py env && touch "$W/site/.done"
}

awq() {
  if [ -f "$SHM/awq/config.json" ]; then echo "awq: done"; return 0; fi
  room 420 awq || return
  awq_env || return
  rm -rf "$SHM/awq.tmp"
  logged awq env PYTHONPATH="$W/site" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$PY" "$FILES/awq_apply.py" \
    --model "$SHM/plain" --out "$SHM/awq.tmp" --calibration "$FILES/calibration.txt" || return
  mv -T "$SHM/awq.tmp" "$SHM/awq"
}

convert() {
  local r pids=() rc=0
  [ -f "$W/src/convert_hf_to_gguf.py" ] || wait_build
  for r in plain awq; do
    [ -f "$SHM/$r-f16.gguf" ] && continue
    [ -f "$SHM/$r/config.json" ] || { echo "convert: no $SHM/$r (steps model, awq)"; return 1; }
    room 100 "convert $r" || return
    ( logged "convert-$r" "$PY" "$W/src/convert_hf_to_gguf.py" "$SHM/$r" --outtype f16 \
        --outfile "$SHM/$r-f16.gguf.tmp" && mv -f "$SHM/$r-f16.gguf.tmp" "$SHM/$r-f16.gguf" ) &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || rc=1; done
  return $rc
}

# measure NAME MODEL [ARG...]: llama-perplexity with the model role's flags, against the plain f16's
# logits. Run again (three times at most) when its log lacks the figure: at the pinned commit the
# log's worker thread is leaked, so a line still queued when the process exits is lost, exit 0
# (common/log.cpp, common_log_main); seen here on a loaded CPU, 3 runs in 8.
measure() {
  local name=$1 model=$2 want='Mean    KLD' try
  shift 2
  [ "$name" = f16 ] && want='Final estimate: PPL'
  for try in 1 2 3; do
    grep -q "$want" "$W/out/logs/quality-$name.log" 2> /dev/null && return 0
    room 40 "quality $name" || return
    logged "quality-$name" "$W/build/bin/llama-perplexity" -m "$model" -c "$CTX" -b "$CTX" \
      --kl-divergence-base "$SHM/plain-f16.kld" "${NGL[@]}" "$@" < /dev/null || return
  done
  grep -q "$want" "$W/out/logs/quality-$name.log" || echo "awq: quality $name: no figure in 3 runs"
}

quality() {
  local r kv pids=() rc=0
  wait_build || { echo "quality: no llama-quantize, llama-perplexity (step build)"; return 1; }
  for r in plain awq; do
    [ -f "$SHM/$r-q4km.gguf" ] && continue
    [ -f "$SHM/$r-f16.gguf" ] || { echo "quality: no $SHM/$r-f16.gguf (step convert)"; return 1; }
    room 150 "quantize $r" || return
    ( logged "quantize-$r" "$W/build/bin/llama-quantize" "$SHM/$r-f16.gguf" "$SHM/$r-q4km.gguf.tmp" Q4_K_M \
        $(( $(nproc) / 2 )) && mv -f "$SHM/$r-q4km.gguf.tmp" "$SHM/$r-q4km.gguf" ) &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || rc=1; done
  [ $rc = 0 ] || return 1
  measure f16 "$SHM/plain-f16.gguf" -f "$FILES/quality.txt" || return
  measure awq-f16 "$SHM/awq-f16.gguf" --kl-divergence -ctk f16 -ctv f16 -fa on || return
  for r in plain awq; do
    for kv in f16 q8_0 q4_0; do
      measure "$r-q4km-kv-$kv" "$SHM/$r-q4km.gguf" --kl-divergence -ctk "$kv" -ctv "$kv" -fa on || return
    done
  done
}

check() {
  python3 bench/gpu/awq_report.py report --work "$W" --shm "$SHM" --shape "$SHAPE" --scale-down "$DOWN" \
    --ctx "$CTX" --out "$OUT/gpu-awq.json" || return
  tar -C "$W/out" -cJf "$OUT/logs.tar.xz" logs commands.tsv steps.tsv
}

mkdir -p "$W/out/logs" "$SHM" || exit 1
steps=${*:-build model awq convert quality check}
for s in $steps; do
  case $s in
    build|model|awq|convert|quality|check) ;;
    *) echo "usage: bash bench/gpu/awq.sh [build|model|awq|convert|quality|check ...]" >&2; exit 2 ;;
  esac
done
rc=0
for s in $steps; do
  [ "$s" = check ] && continue
  echo "== $s ($(( $(date +%s) - START )) s)"
  "$s" || { rc=$?; break; }
done
[ -z "$BUILD" ] || { echo "== waiting for the build"; wait_build || rc=1; }
echo "== check ($(( $(date +%s) - START )) s)"
check || rc=1
[ "$rc" = "$DEFERRED" ] && rc=0
exit $rc
