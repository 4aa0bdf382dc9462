#!/usr/bin/env bash
# Runs here (the CPU machine): makes what the GPU proof takes to the GPU
# machine, which has no network: .whl (pyinfra and the dependencies its image
# lacks, for its Python 3.12) and .carry (the lab's llama.cpp mirror, its
# pinned commit, and this checkout's commit and files: run it again after a
# commit). Both are ignored by git (.git/info/exclude) and go with the copy of
# the repo. Needs the lab's sources: `llamarack lab up` once.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || printf '/.whl/\n/.carry/\n' >> .git/info/exclude

# Versions as on this machine, so the GPU machine runs the pyinfra the tests ran.
pkgs=(pyinfra paramiko gevent greenlet zope.event zope.interface cryptography cffi pycparser bcrypt
      pynacl invoke distro typeguard pydantic pydantic-core annotated-types typing-inspection types-paramiko)
rm -rf .whl && mkdir -p .whl
for p in "${pkgs[@]}"; do
  v=$(python3 -m pip show "$p" 2>/dev/null | sed -n 's/^Version: //p')
  [ -n "$v" ] || { echo "prepare: $p is not installed here (bash .ci/setup first)" >&2; exit 1; }
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$p==$v"
done

mirror=/var/cache/llamarack/lab/srv/llama.cpp.git
[ -d "$mirror" ] || { echo "prepare: no lab mirror at $mirror (run: llamarack lab up)" >&2; exit 1; }
rm -rf .carry && mkdir -p .carry
git clone -q --bare --single-branch "$mirror" .carry/llama.cpp.git
python3 -c 'from llamarack_lab.mirror import LAB_COMMIT; print(LAB_COMMIT)' > .carry/commit
# This checkout's commit and every tracked file's blob id: the GPU machine's copy has no git, so each
# result's stamp (bench/provenance.py) names the commit from here and the files the copy changed.
python3 bench/provenance.py source > .carry/source.json
du -sh .whl .carry
