#!/usr/bin/env bash
# Runs on the GPU machine: several of the scripts here in one command, in order, each with its
# own folder $OUT/NAME (their logs share names) and its output in $OUT/NAME/stdout.log. The first
# build is the one the later scripts share (build_cuda.sh), and so is a model of the same shape.
# A step that fails is named and the next one runs; the command fails if any step did. Each
# step's result JSON is also copied to $OUT itself: only so many files come back from a command.
#
#   bash bench/gpu/series.sh "residency.sh build" layers.sh "residency.sh check" sandbox.sh sleep.sh
set -u
all=$OUT
rc=0
for step in "$@"; do
  name=$(printf '%s' "$step" | sed 's/\.sh//; s/ /-/g')
  mkdir -p "$all/$name"
  start=$(date +%s)
  # shellcheck disable=SC2086 (a step is a script and its words)
  OUT=$all/$name bash bench/gpu/$step > "$all/$name/stdout.log" 2>&1
  code=$?
  echo "$step: exit $code, $(( $(date +%s) - start )) s"
  [ "$code" = 0 ] || { rc=1; tail -15 "$all/$name/stdout.log"; }
done
for f in "$all"/*/*.json; do
  [ -e "$f" ] && cp "$f" "$all/"
done
exit $rc
