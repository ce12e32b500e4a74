#!/usr/bin/env bash
# The GPU acceptance batch: the GPU tests and the commands whose figures
# docs/results.md lists. Run from the repository root on a machine with a GPU, e.g.
# `bash scripts/gpu_acceptance.sh latency2 bandwidth`. Stages (default: all, in this order):
#   startup    `build-kernels` into an empty directory (no GPU used: as an install step
#              would), then start-up to the first verified collective: cold, warm, and
#              with that directory as the kernel cache (prebuilt)
#   tests      the GPU tests (tests/gpu: threads and rank processes under MPS) and the
#              all_to_allv's (tests/ranks/test_all_to_allv.py: its counts travel through
#              mapped memory); the rest of the suite is CI's, on the simulator, but for the
#              stages below. TESTS (pytest paths or node ids) runs those instead
#   latency2   an 8-byte all-reduce, submit to completion, 2 ranks, against a launch each
#   latency8   the same on 8 ranks
#   many4      64 concurrent 4 KiB all-reduces on 4 ranks, against a kernel launch each
#   registration  prepare + start of 10,000 all-reduces sharing the daemon's slots on 4
#              ranks, beside 32 with slots of their own, and 100 distinct ones run
#   bandwidth  128 MiB and 256 MiB all-reduces on 4 ranks against a device-to-device copy,
#              the median of 7 cycles of 50 runs (cycles of 10 runs, about 10 ms each,
#              spread threefold in one batch), beside the nccl policy (no preemption)
#   chaos      the chaos demo with 4 rank processes, 8 collectives x 500 iterations, a device
#              sync after every submission
#   chaos8     the chaos demo on 8 ranks, 200 iterations, under dfccl and under the nccl
#              policy (which deadlocks and exits with status 3)
#   chaos8p    the chaos demo on 8 rank processes, 200 iterations
#   sync8      the chaos demo on 8 ranks, 1000 iterations, a device sync after every
#              submission
#   replay     a three-rank schedule with device syncs replayed (scripts/schedules/), under
#              dfccl and under the nccl policy (exit status 3)
#   ddp        examples/ddp_bench.py: DDP steps a second on nccl (a rank a GPU), gloo and
#              dfccl (2 rank processes)
#   hook       examples/ddp_timing.py: DDP with pydfccl's all-reduce hook against all-reduces
#              by hand, 2 rank processes
#   disorder   the demo on 4 ranks, every iteration started on all ranks at once, in 100%
#              disorder and then in order
#   inorder    in-order all-reduces from 8 B to 256 MiB on 4 ranks, dfccl beside the nccl
#              policy, 7 cycles
#   net        ranks on emulated nodes under mpiexec, as docs/nodes.md runs them: the demo
#              (and with device syncs), the nccl policy's deadlock across nodes (exit
#              status 3), `bench` (the network path beside IPC and mpi4py's Allreduce)
#   netgil     the network benchmark with a 50 us GIL switch interval in every rank process
#   nettests   tests/ranks/test_net.py on the GPU (the collectives matrix among them)
#   torchtests tests/torch/test_torch_api.py on CUDA tensors, rank processes under MPS
#   faulttests the fault table on the GPU: tests/torch/test_torch_faults.py (CUDA tensors,
#              a rank 60 s late to barrier()) and tests/ranks/test_faults.py
#   soak       random schedules with device syncs for SOAK_S seconds (default 60), every
#              output checked
#   train      examples/train_gpt.py with 2, 3 and 4 rank processes, RUNS runs of STEPS steps
#              each (default 1 x 200); the first run starts from an empty kernel cache
#              unless WARM is set (train2, train3, train4: one size alone)
#   part1, part2, part3  the whole batch (about 18 minutes on an H100) in three parts of
#              under 10 minutes each, for machines that bound a call's time
# TREE names the tree in the summary (default: git's HEAD, which is wrong where the files
# were copied without their git metadata). Under $OUT (default ./out): summary.txt and
# logs.tgz (one log per stage or run). Rank processes share the GPU through the MPS daemon,
# started here and stopped at the end. Processes a stage leaves behind are named in the
# summary and killed before the next stage. BUDGET_S (default 540) bounds the whole call:
# a stage is cut to what is left of it, and none starts in its last 10 s. Set it below
# what the machine will give the call: a stage killed from outside leaves no log.
set -u
OUT=${OUT:-out}
LOGS=${LOGS:-/tmp/pydfccl_acceptance_logs}
mkdir -p "$OUT" "$LOGS"
# Wheels in .whl/ (if any) replace the machine's: numpy < 2.5 (numba-cuda 0.30 needs it)
# and ml_dtypes < 0.7 (pyproject.toml pins it: 0.7's import takes half a second). Byte code
# is written as pip's install writes it, here and for pydfccl below, so that start-up is
# measured as an installed package starts rather than compiling its sources in every process.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
# mpi4py and MPICH's wheels in .whl/mpi/ (if any) give the net stage an MPI: installed under
# a prefix, as a target directory would drop MPICH's libraries and mpiexec.
if ls .whl/mpi/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --prefix /tmp/mpi .whl/mpi/*.whl || exit 1
  export PATH=/tmp/mpi/bin:$PATH LD_LIBRARY_PATH=/tmp/mpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  PYTHONPATH=$(python3 -c 'import sysconfig; print(sysconfig.get_path("purelib",
    vars={"base": "/tmp/mpi", "platbase": "/tmp/mpi"}))')${PYTHONPATH:+:$PYTHONPATH}
  export PYTHONPATH
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
python3 -m compileall -q pydfccl
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # for mpiexec run as root
SUMMARY="$OUT/summary.txt"
{ echo "tree ${TREE:-$(git rev-parse --short HEAD 2>/dev/null)}"
  nvidia-smi --query-gpu=name,driver_version \
  --format=csv,noheader; python3 -m pydfccl doctor; } 2>&1 | tee "$SUMMARY"
PY=python3

stage() {  # stage NAME TIMEOUT_S COMMAND...: log to $LOGS/NAME.log, one summary line
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS left=$((DEADLINE - SECONDS))
  [ $left -gt 10 ] || { echo "[$name] not started: the call's deadline" | tee -a "$SUMMARY"; return; }
  [ $left -ge $limit ] || limit=$left      # ends within the call, its log kept
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "[$name] rc=$rc $((SECONDS - t0)) s: $*" | tee -a "$SUMMARY"
  tail -n 12 "$LOGS/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
  reap "$name"
  tar czf "$OUT/logs.tgz" -C "$LOGS" .
}
reap() {  # reap NAME: kill and name the processes a stage left behind (they hold the GPU)
  local left p
  left=$(for p in $(pgrep -f 'pydfccl|examples/|pytest|mpiexec|hydra_pmi_proxy'); do
           ps -o args= -p "$p" | grep -q gpu_acceptance.sh || echo "$p"   # not this script
         done)
  [ -n "$left" ] || return 0
  echo "[$1] left $(echo "$left" | wc -l) processes behind: killed" | tee -a "$SUMMARY"
  ps -o pid,ppid,etimes,args -p $(echo $left) | cut -c1-160 | sed 's/^/    /' \
    | tee -a "$SUMMARY"
  kill -9 $left 2>/dev/null; sleep 1
}
RUNS=${RUNS:-1}
STEPS=${STEPS:-200}
DEADLINE=$((SECONDS + ${BUDGET_S:-540}))   # no stage or run goes past this (the call's limit)

export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d && echo "MPS started" | tee -a "$SUMMARY"
trap 'echo quit | nvidia-cuda-mps-control; tar czf "$OUT/logs.tgz" -C "$LOGS" .' EXIT

train_runs() {  # train_runs NAME ARGS...: RUNS runs of the example; one line of results
  local name=$1; shift
  local ok=0 done=0 times=()
  for i in $(seq 1 "$RUNS"); do
    [ $((DEADLINE - SECONDS)) -gt 10 ] || { echo "[$name] stopped at the deadline" | tee -a "$SUMMARY"; break; }
    if [ -z "${WARM:-}" ]; then    # the first run of the batch compiles the daemon afresh
      rm -f pydfccl/kernels/__pycache__/*.nbi pydfccl/kernels/__pycache__/*.nbc
      WARM=1; echo "[$name] run $i starts with an empty kernel cache" | tee -a "$SUMMARY"
    fi
    local t0=$SECONDS log="$LOGS/${name}_$i.log"
    local limit=$((DEADLINE - SECONDS)); [ $limit -lt 200 ] || limit=200
    timeout "$limit" $PY examples/train_gpt.py "$@" --steps "$STEPS" --device cuda \
      --watchdog 120 --timeout 190 > "$log" 2>&1
    local rc=$?
    reap "${name}_$i"
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

pytest_stage() {  # pytest_stage NAME TIMEOUT_S PATHS...: each test's name and result as it
  local name=$1 limit=$2; shift 2     # ends (a stage cut short shows how far it got)
  stage "$name" "$limit" env PYDFCCL_DEADLOCK_STACKS=1 $PY -m pytest -v -rfE --tb=short \
    -p no:cacheprovider -o faulthandler_timeout=120 --durations=10 "$@"
}

SCHEDULE=scripts/schedules/three_ranks_disordered_with_syncs.json
PART1="tests startup latency2 latency8 many4 registration bandwidth inorder disorder chaos"
PART2="chaos8 chaos8p sync8 replay net netgil nettests ddp hook"
PART3="torchtests faulttests soak train"
STAGES=${*:-$PART1 $PART2 $PART3}
STAGES=${STAGES//part1/$PART1}; STAGES=${STAGES//part2/$PART2}; STAGES=${STAGES//part3/$PART3}
for s in $STAGES; do
  case $s in
    tests) pytest_stage tests 300 ${TESTS:-tests/gpu tests/ranks/test_all_to_allv.py} ;;
    torchtests) pytest_stage torch_tests 540 tests/torch/test_torch_api.py ;;
    faulttests) pytest_stage fault_tests 540 tests/torch/test_torch_faults.py \
                  tests/ranks/test_faults.py ;;
    latency2) stage latency2 120 $PY -m pydfccl bench latency -n 2 --iters 10000 ;;
    latency8) stage latency8 120 $PY -m pydfccl bench latency -n 8 --iters 1000 ;;
    many4) stage many4 120 $PY -m pydfccl bench latency -n 4 -k 64 -c 1024 --iters 200 -w 20 ;;
    registration) stage registration 200 $PY -m pydfccl bench registration -n 4 ;;
    bandwidth) stage bandwidth 200 $PY -m pydfccl bench --nranks 4 -b 134217728 \
                 -e 268435456 -f 2 -n 50 -w 2 -N 7 --baseline nccl ;;
    train) train_runs train2 --nranks 2
           train_runs train3 --nranks 3 --tp 1 --batch 6
           train_runs train4 --nranks 4 ;;
    train2) train_runs train2 --nranks 2 ;;
    train3) train_runs train3 --nranks 3 --tp 1 --batch 6 ;;
    train4) train_runs train4 --nranks 4 ;;
    chaos) stage chaos4_sync 200 env PYDFCCL_BACKEND=processes $PY -m pydfccl demo -n 4 -k 8 \
             -i 500 --sync device ;;
    chaos8) stage chaos8 100 $PY -m pydfccl demo -n 8 -k 8 -i 200
            stage chaos8_nccl 60 $PY -m pydfccl demo -n 8 -k 8 -i 200 --policy nccl ;;
    chaos8p) stage chaos8p 120 env PYDFCCL_BACKEND=processes $PY -m pydfccl demo -n 8 -k 8 \
               -i 200 ;;
    sync8) stage sync8 420 $PY -m pydfccl demo -n 8 -k 8 -i 1000 --sync device ;;
    startup) rm -rf /tmp/pydfccl_prebuilt
             stage build_kernels 300 env PYDFCCL_CACHE_DIR=/tmp/pydfccl_prebuilt \
               $PY -m pydfccl build-kernels
             stage startup 300 $PY -m pydfccl bench startup --warm 3 \
               --prebuilt /tmp/pydfccl_prebuilt ;;
    hook) stage hook 200 $PY examples/ddp_timing.py --nranks 2 --steps 30 ;;
    disorder) stage disorder 120 $PY -m pydfccl demo -n 4 -k 8 -i 50 --align
              stage in_order 120 $PY -m pydfccl demo -n 4 -k 8 -i 50 --align --in-order ;;
    inorder) stage inorder 200 $PY -m pydfccl bench --nranks 4 -b 8 -e 268435456 -f 16 \
               -n 200 -N 7 -w 2 --baseline nccl ;;
    net) stage net_demo 150 env PYDFCCL_RANKS_PER_NODE=2 mpiexec -n 4 $PY -m pydfccl demo
         stage net_demo_sync 150 env PYDFCCL_RANKS_PER_NODE=2 mpiexec -n 4 $PY -m pydfccl \
           demo -i 20 --sync device
         stage net_nccl 90 env PYDFCCL_RANKS_PER_NODE=1 mpiexec -n 4 $PY -m pydfccl demo \
           -i 2 -k 4 --policy nccl --watchdog 5
         stage net_bench 200 env PYDFCCL_RANKS_PER_NODE=2 mpiexec -n 4 $PY -m pydfccl bench ;;
    netgil) stage net_bench_gil 150 env PYDFCCL_RANKS_PER_NODE=2 mpiexec -n 4 $PY -m pydfccl \
              bench --bytes 8,4096,262144 --switch-interval 5e-5 ;;
    nettests) pytest_stage net_tests 300 tests/ranks/test_net.py ;;
    soak) stage soak $((${SOAK_S:-60} + 90)) $PY -m pydfccl soak --seconds ${SOAK_S:-60} ;;
    ddp) stage ddp 300 $PY examples/ddp_bench.py --nranks 2 --backends nccl,gloo,dfccl \
         --device cuda ;;
    replay) stage replay 90 $PY -m pydfccl demo --schedule $SCHEDULE
            stage replay_nccl 60 $PY -m pydfccl demo --schedule $SCHEDULE --policy nccl --watchdog 5 ;;
    *)     echo "unknown stage $s" | tee -a "$SUMMARY" ;;
  esac
done
