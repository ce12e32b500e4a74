#!/usr/bin/env bash
# The same gpu_check.sh stages on several commits in one device call, to find which commit
# changed a figure (the device machine gets the working tree only, no git history).
#   bash scripts/gpu_commits.sh prepare REV...     # here: each commit's tree in .gpu_commits/
# A REV that is a .patch file (scripts/experiments/) stands for HEAD with that patch applied:
# only main lands, so an experiment kept for a later GPU session is kept as a patch.
#   run(command="bash scripts/gpu_commits.sh run STAGES...", carry=[".whl", ".gpu_commits"])
#   run(command="bash scripts/gpu_commits.sh pydfccl ARGS...", carry=[".whl", ".gpu_commits"])
# runs `python3 -m pydfccl ARGS` in each tree instead (for options that an old tree's
# gpu_check.sh has no stage for), each tree's output in $OUT/NAME.log and its last lines in
# summary.txt.
# `run` runs `gpu_check.sh STAGES` in each tree, in the order prepared, then the working
# tree's own; under $OUT: summary.txt (every tree's summary, headed by its commit) and
# commits.tgz (every tree's logs). Each tree compiles its own daemon (a cold Numba cache:
# about 30 to 40 s each on the H200).
set -u
cd "$(dirname "$0")/.."
DIR=.gpu_commits
case "${1:-}" in
  prepare)
    shift
    rm -rf "$DIR" && mkdir -p "$DIR"
    i=0
    for rev in "$@"; do
      i=$((i + 1))
      if [ "${rev%.patch}" != "$rev" ]; then
        name=$(printf "%02d-%s" "$i" "$(basename "$rev" .patch)")
        mkdir -p "$DIR/$name" && git archive HEAD | tar -x -C "$DIR/$name" &&
          patch -s -p1 -d "$DIR/$name" < "$rev" || exit 1
      else
        name=$(printf "%02d-%s" "$i" "$(git rev-parse --short "$rev")") || exit 1
        mkdir -p "$DIR/$name" && git archive "$rev" | tar -x -C "$DIR/$name" || exit 1
      fi
    done
    ls "$DIR" ;;
  run)
    shift
    OUT=${OUT:-out}
    mkdir -p "$OUT/commits"
    all=$(cd "$OUT/commits" && pwd)
    for tree in "$DIR"/*/ ./; do
      name=$(basename "$(cd "$tree" && pwd)")
      [ "$tree" = ./ ] && name="working-tree"
      # the numpy wheel is carried once, at the root (a copy per tree would pass carry's 64 MiB)
      [ "$tree" = ./ ] || [ -e "$tree/.whl" ] || ln -s "$PWD/.whl" "$tree/.whl"
      echo "=== $name" | tee -a "$OUT/summary.txt"
      (cd "$tree" && OUT="$all/$name" LOGS="/tmp/gpu_commits_$name" \
        bash scripts/gpu_check.sh "$@" > /dev/null 2>&1)
      sed -n '/^\[\|^unknown stage/,$p' "$all/$name/summary.txt" | tee -a "$OUT/summary.txt"
    done
    tar czf "$OUT/commits.tgz" -C "$OUT" commits && rm -rf "$all" ;;
  pydfccl)
    shift
    OUT=${OUT:-out}
    mkdir -p "$OUT"
    if ls .whl/*.whl > /dev/null 2>&1; then   # the numpy wheel, as gpu_common.sh installs it
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    fi
    for tree in "$DIR"/*/ ./; do
      name=$(basename "$(cd "$tree" && pwd)")
      [ "$tree" = ./ ] && name="working-tree"
      t0=$SECONDS
      (cd "$tree" && PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
        timeout "${TREE_LIMIT:-140}" python3 -m pydfccl "$@" > "$OUT/$name.log" 2>&1)
      echo "=== $name rc=$? $((SECONDS - t0))s: python3 -m pydfccl $*" | tee -a "$OUT/summary.txt"
      grep -v '^# cycle' "$OUT/$name.log" | tail -n 12 | tee -a "$OUT/summary.txt"
    done ;;
  *)
    echo "usage: $0 prepare REV... | run STAGES... | pydfccl ARGS..." >&2
    exit 2 ;;
esac
