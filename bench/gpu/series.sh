#!/usr/bin/env bash
# Runs on the GPU machine: several of the scripts here in one command, in order, each with its
# own folder (their logs share names) and its output in stdout.log there. The first build is the
# one the later scripts share (build_cuda.sh), and so is a model of the same shape. A step that
# fails is named and the next one runs; the command fails if any step did.
#
# Only so many files come back from a command, so after each step its results (gpu-*.json, a
# later step's replacing an earlier one's) are copied to $OUT itself and the rest of its folder
# goes back as one $OUT/NAME.tar.xz. One script with many logs is a series of one:
#
#   bash bench/gpu/series.sh "residency.sh build" layers.sh "residency.sh check" sandbox.sh sleep.sh
#   bash bench/gpu/series.sh "build_proof.sh ship"
set -u
all=$OUT
rc=0
for step in "$@"; do
  name=$(printf '%s' "$step" | sed 's/\.sh//; s/ /-/g')
  dir=$all/$name
  mkdir -p "$dir"
  start=$(date +%s)
  # shellcheck disable=SC2086 (a step is a script and its words)
  OUT=$dir bash bench/gpu/$step > "$dir/stdout.log" 2>&1
  code=$?
  echo "$step: exit $code, $(( $(date +%s) - start )) s"
  [ "$code" = 0 ] || { rc=1; tail -15 "$dir/stdout.log"; }
  for f in "$dir"/gpu-*.json; do
    [ -e "$f" ] && cp "$f" "$all/"
  done
  tar -C "$all" -cJf "$all/$name.tar.xz" "$name" && rm -rf "$dir"
done
exit $rc
