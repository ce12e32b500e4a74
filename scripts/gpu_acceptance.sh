#!/usr/bin/env bash
# The GPU acceptance batch: what docs/results.md reports, run on a machine with a GPU from
# the repository root, e.g. `bash scripts/gpu_acceptance.sh chaos train`. Stages (default:
# all of them in this order):
#   tests   the test suite on the GPU (threads and rank processes under MPS)
#   chaos   the chaos demo with 4 rank processes, 8 collectives x 500 iterations, a device
#           sync after every submission
#   train   examples/train_gpt.py with 2, 3 and 4 rank processes, RUNS runs of STEPS steps
#           each (default 10 x 200); the first run starts from an empty kernel cache
#           unless WARM is set (train2, train3, train4: one size alone)
# Under $OUT (default ./out): summary.txt and logs.tgz (one log per run). Rank processes
# share the GPU through the MPS daemon, started here and stopped at the end.
LOGS=${LOGS:-/tmp/pydfccl_acceptance_logs}
source "$(dirname "$0")/gpu_common.sh"
RUNS=${RUNS:-10}
STEPS=${STEPS:-200}
DEADLINE=$((SECONDS + ${BUDGET_S:-540}))   # stop starting runs past this (the call's limit)

export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d && echo "MPS started" | tee -a "$SUMMARY"
trap 'echo quit | nvidia-cuda-mps-control; tar czf "$OUT/logs.tgz" -C "$LOGS" .' EXIT

train_runs() {  # train_runs NAME ARGS...: RUNS runs of the example; one line of results
  local name=$1; shift
  local ok=0 done=0 times=()
  for i in $(seq 1 "$RUNS"); do
    [ $SECONDS -lt $DEADLINE ] || { echo "[$name] stopped at the deadline" | tee -a "$SUMMARY"; break; }
    if [ -z "${WARM:-}" ]; then    # the first run of the batch compiles the daemon afresh
      rm -f pydfccl/kernels/__pycache__/*.nbi pydfccl/kernels/__pycache__/*.nbc
      WARM=1; echo "[$name] run $i starts with an empty kernel cache" | tee -a "$SUMMARY"
    fi
    local t0=$SECONDS log="$LOGS/${name}_$i.log"
    timeout 200 $PY examples/train_gpt.py "$@" --steps "$STEPS" --device cuda \
      --watchdog 120 --timeout 190 > "$log" 2>&1
    local rc=$?
    tar czf "$OUT/logs.tgz" -C "$LOGS" .
    done=$((done + 1)); times+=($((SECONDS - t0)))
    if [ $rc -eq 0 ] && grep -q "(ok)" "$log" && grep -q "(decreasing)" "$log"; then
      ok=$((ok + 1))
    else
      echo "[$name] run $i failed (rc=$rc):" | tee -a "$SUMMARY"
      grep -v '^\[rank' "$log" | tail -n 8 | sed 's/^/    /' | tee -a "$SUMMARY"
    fi
  done
  echo "[$name] $ok of $done runs trained and verified; seconds a run: ${times[*]}" \
    | tee -a "$SUMMARY"
  grep -h "pydfccl on rank 0" "$LOGS/${name}"_*.log | tail -n 1 | sed 's/^/    /' \
    | tee -a "$SUMMARY"
  tar czf "$OUT/logs.tgz" -C "$LOGS" .
}

for s in ${*:-tests chaos train}; do
  case $s in
    tests) stage tests 300 env PYDFCCL_DEADLOCK_STACKS=1 $PY -m pytest -q -rfE --tb=short \
             -p no:cacheprovider -o faulthandler_timeout=120 tests ;;
    train) train_runs train2 --nranks 2
           train_runs train3 --nranks 3 --tp 1 --batch 6
           train_runs train4 --nranks 4 ;;
    train2) train_runs train2 --nranks 2 ;;
    train3) train_runs train3 --nranks 3 --tp 1 --batch 6 ;;
    train4) train_runs train4 --nranks 4 ;;
    chaos) stage chaos4_sync 200 env PYDFCCL_BACKEND=processes $PY -m pydfccl demo -n 4 -k 8 \
             -i 500 --sync device ;;
    *)     echo "unknown stage $s" | tee -a "$SUMMARY" ;;
  esac
done
