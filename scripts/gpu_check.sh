#!/usr/bin/env bash
# The GPU batch: run on the lent H200 (device tool) from the repository root, e.g.
#   run(command="bash scripts/gpu_check.sh full", carry=[".whl"])
# It runs the GPU test suite, the chaos demos and the benchmarks. Under $OUT (default ./out)
# it writes summary.txt, logs.tgz (scripts/gpu_common.sh) and the timeline picture.
# Stages: quick | full | a list of names.
LOGS=${LOGS:-/tmp/pydfccl_gpu_logs}
source "$(dirname "$0")/gpu_common.sh"

workload() {  # workload NAME SUFFIX OPTIONS...: one of the A/B stages' workloads
  local w=$1 sfx=$2; shift 2
  case $w in
    bench)   stage bench_$sfx 60 $PY -m pydfccl bench latency -n 2 --iters 3000 --driver one --no-baseline "$@" ;;
    many4)   stage many4_$sfx 60 $PY -m pydfccl bench latency -n 4 -k 64 -c 1024 --iters 200 -w 20 --driver one --no-baseline "$@" ;;
    bench8)  stage bench8_$sfx 60 $PY -m pydfccl bench latency -n 8 --iters 1000 --driver one --no-baseline "$@" ;;
    sync)    stage demo4_sync_$sfx 80 $PY -m pydfccl demo -n 4 -k 8 -i 20 --sync device --no-progress "$@" ;;
    policy)  stage policy_$sfx 200 $PY -m pydfccl bench --nranks 4 -b 32768 -e 8388608 -f 16 -n 200 -N ${CYCLES:-15} -w 2 --baseline nccl --no-hbm --no-progress "$@" ;;
    aligned) stage aligned_chaos_$sfx 100 $PY -m pydfccl demo -n 4 -k 8 -i 50 --align --no-progress "$@"
             stage aligned_inorder_$sfx 100 $PY -m pydfccl demo -n 4 -k 8 -i 50 --align --in-order --no-progress "$@" ;;
    *)       echo "unknown workload $w" | tee -a "$SUMMARY" ;;
  esac
}

case "${1:-quick}" in
  quick) stages="tests demo4 demo8_nccl bench" ;;
  full)  stages="tests demo8 demo8_nccl demo4_sync replay timeline soak bench bench8 many4 sweep4 sweep4_policy big256" ;;
  *)     stages="$*" ;;
esac
for s in $stages; do
  case $s in
    tests)      stage tests 300 env PYDFCCL_DEADLOCK_STACKS=1 $PY -m pytest -q -rfE --tb=short -p no:cacheprovider -o faulthandler_timeout=100 tests/test_engine.py tests/test_kernels_compile.py tests/test_layout.py tests/test_trace.py tests/test_buffers_lifetime.py tests/test_soak.py tests/test_collectives.py tests/test_group.py tests/test_point_to_point.py tests/test_foreign_buffers.py tests/test_movers.py tests/test_late_registration.py tests/test_hold.py tests/test_one_shot.py ;;
    tests_one_shot) stage tests_one_shot 120 $PY -m pytest -q -rfE --tb=short -p no:cacheprovider tests/test_one_shot.py ;;
    flaky)      # the two tests that failed at 22:44, three times more; a failure shows every
                # thread's stack at the deadlock report (PYDFCCL_DEADLOCK_STACKS=1)
                for i in 1 2 3; do
                  stage flaky_$i 120 env PYDFCCL_DEADLOCK_STACKS=1 $PY -m pytest -q -rfE --tb=short -p no:cacheprovider tests/test_point_to_point.py::test_crossed_receives_complete_under_dfccl_and_deadlock_under_nccl tests/test_engine.py::test_device_sync_between_submissions_needs_voluntary_quits
                done ;;
    demo4)      stage demo4 100 $PY -m pydfccl demo -n 4 -k 8 -i 50 --no-progress ;;
    demo4_inorder) stage demo4_inorder 100 $PY -m pydfccl demo -n 4 -k 8 -i 50 --in-order --no-progress ;;
    aligned)    # disorder against order with every iteration started on all ranks at once
                stage aligned_chaos 100 $PY -m pydfccl demo -n 4 -k 8 -i 50 --align --no-progress
                stage aligned_inorder 100 $PY -m pydfccl demo -n 4 -k 8 -i 50 --align --in-order --no-progress ;;
    aligned_trace) # where the aligned demo's time in collectives goes: the daemons' events
                # and each rank's host marks on one timeline ($OUT/aligned_trace.json.gz)
                stage aligned_trace 150 $PY -m pydfccl demo -n 4 -k 8 -i 12 --align --in-order --no-progress --trace "$OUT/aligned_trace.json"
                gzip -f -9 "$OUT/aligned_trace.json" ;;
    demo8)      stage demo8 100 $PY -m pydfccl demo -n 8 -k 8 -i 200 --no-progress ;;
    demo8_nccl) stage demo8_nccl 45 $PY -m pydfccl demo -n 8 -k 8 -i 200 --policy nccl --no-progress ;;
    demo4_sync) stage demo4_sync 80 $PY -m pydfccl demo -n 4 -k 8 -i 20 --sync device --no-progress ;;
    demo8_sync) stage demo8_sync 100 $PY -m pydfccl demo -n 8 -k 8 -i 20 --sync device --no-progress ;;
    bench)      stage bench 120 env PYDFCCL_DEADLOCK_STACKS=1 $PY -m pydfccl bench latency -n 2 --iters 10000 ;;
    blocks_ab)  # small messages, many at once and device syncs with a rank's daemon blocks
                # (BLOCKS, "default" for the machine's) taking turns in one call
                for w in ${AB_WORKLOADS:-bench many4 bench8 sync}; do
                  for b in ${BLOCKS:-4 default}; do
                    opt=""; [ "$b" = default ] || opt="--nblocks $b"
                    workload $w b$b $opt
                  done
                done ;;
    head_ab)    # dfccl's first wait budget for the queue head (HEADS, ns; "default" for the
                # policy's own) taking turns in one call: the in-order target at 32 KiB to
                # 8 MiB against the nccl policy, small messages, disorder against order
                for w in ${AB_WORKLOADS:-policy bench bench8 aligned sync}; do
                  for h in ${HEADS:-20000 default}; do
                    opt=""; [ "$h" = default ] || opt="--param HEAD_BASE=$h"
                    workload $w head$h $opt
                  done
                done ;;
    bench1)     stage bench1 60 $PY -m pydfccl bench latency -n 1 --iters 3000 ;;
    many4)      stage many4 120 env PYDFCCL_DEADLOCK_STACKS=1 $PY -m pydfccl bench latency -n 4 -k 64 -c 1024 --iters 200 -w 20 ;;
    many4_conn) # the same with 32 hardware work queues (CUDA's default is 8; streams beyond
                # share them, and a kernel then waits behind another stream's)
                stage many4_conn 120 env CUDA_DEVICE_MAX_CONNECTIONS=32 PYDFCCL_DEADLOCK_STACKS=1 $PY -m pydfccl bench latency -n 4 -k 64 -c 1024 --iters 200 -w 20 ;;
    bench8)     stage bench8 100 $PY -m pydfccl bench latency -n 8 --iters 1000 ;;
    step_cost)  # what a daemon step costs with nothing to wait for: one rank, one block,
                # 16-byte slots, so a run of S bytes takes S/16 steps of 16 bytes; and the
                # ring on two ranks the same way (3 steps a loop of 32 bytes)
                stage step_cost1 60 $PY -m pydfccl bench --nranks 1 -b 16 -e 16384 -f 32 --nblocks 1 --slot-bytes 16 -n 50 -w 5 --baseline none --no-hbm --no-progress
                stage step_cost2 60 env PYDFCCL_ONE_SHOT_BYTES=0 $PY -m pydfccl bench --nranks 2 -b 32 -e 16384 -f 32 --nblocks 1 --slot-bytes 16 -n 50 -w 5 --baseline none --no-hbm --no-progress ;;
    registers)  # the daemon's register cap follows the block's width (compiler.register_cap):
                # 512 threads 128 registers (ptxas spills thread 0's state), 384 168, 256
                # 255 (no spills): a no-wait step's cost and the 2- and 8-rank latency,
                # the widths interleaved (THREADS) since the host drifts between runs
                i=0
                for t in ${THREADS:-512 256 384 512 256}; do
                  i=$((i + 1))
                  stage step_cost1_t${t}_$i 60 $PY -m pydfccl bench --nranks 1 -b 16 -e 16384 -f 32 --nblocks 1 --nthreads $t --slot-bytes 16 -n 50 -w 5 --baseline none --no-hbm --no-progress
                  stage bench2_t${t}_$i 100 $PY -m pydfccl bench latency -n 2 --iters 10000 --driver one --nthreads $t
                  stage bench8_t${t}_$i 100 $PY -m pydfccl bench latency -n 8 --iters 1000 --driver one --nthreads $t --no-baseline
                done ;;
    step_phases) # where a step's time goes, phase by phase (the daemon built with
                # PYDFCCL_PROFILE_STEPS=1, kernels/step_profile.py), blocks of 256 and 512
                stage step_phases 200 $PY scripts/probe_step_phases.py --nthreads 256 512 --runs 50 ;;
    width_big)  # large messages with blocks of 512 and 256 threads (THREADS), the default
                # world (4 blocks when it ran at 19:47, 32 since e1e05eb) and 32 blocks of
                # 512 KiB slots
                for t in ${THREADS:-512 256}; do
                  stage width_big_t$t 150 $PY -m pydfccl bench --nranks 4 -b 1048576 -e 268435456 -f 4 -n 20 -w 5 --nthreads $t --baseline none --no-progress
                  stage width_big32_t$t 150 $PY -m pydfccl bench --nranks 4 -b 16777216 -e 268435456 -f 16 -n 20 -w 5 --nthreads $t --nblocks 32 --slot-bytes 524288 --baseline none --no-progress
                done ;;
    one_shot_limit) # where the one-shot stops paying: 4 KiB to 64 KiB one-shot (a larger
                # limit; 8 ranks' lanes stop at 18,720 bytes) against the ring
                for limit in 65536 0; do
                  stage one_shot_limit4_$limit 100 env PYDFCCL_ONE_SHOT_BYTES=$limit $PY -m pydfccl bench --nranks 4 -b 4096 -e 65536 -f 2 -n 200 -w 20 -c 1 --baseline none --no-hbm --no-progress
                  stage one_shot_limit8_$limit 100 env PYDFCCL_ONE_SHOT_BYTES=$limit $PY -m pydfccl bench --nranks 8 -b 4096 -e 16384 -f 2 -n 200 -w 20 -c 1 --baseline none --no-hbm --no-progress
                done ;;
    one_shot)   # small all_reduces one-shot (the default up to 16 KiB) against the ring
                # (PYDFCCL_ONE_SHOT_BYTES=0) in the same call: latency on 2 and 8 ranks,
                # and 8 B to 1 MiB on 4 and 8 ranks
                for limit in default 0; do
                  if [ $limit = default ]; then e=""; else e="PYDFCCL_ONE_SHOT_BYTES=0"; fi
                  stage one_shot_bench2_$limit 120 env $e $PY -m pydfccl bench latency -n 2 --iters 10000
                  stage one_shot_bench8_$limit 100 env $e $PY -m pydfccl bench latency -n 8 --iters 1000
                  for n in 4 8; do
                    stage one_shot_sizes${n}_$limit 150 env $e $PY -m pydfccl bench --nranks $n -b 8 -e 1048576 -f 4 -n 200 -w 20 -c 1 --baseline launch --no-hbm --no-progress
                  done
                done ;;
    timeline)   stage timeline 100 $PY -m pydfccl demo -n 8 -k 8 -i 1 --no-progress --trace "$LOGS/timeline8.json" --plot "$OUT/timeline8.png" ;;
    soak)       stage soak $(( ${SOAK_SECONDS:-120} + 60 )) $PY -m pydfccl soak --seconds ${SOAK_SECONDS:-120} --no-progress ;;
    sweep4)     # nccl-tests-style sizes, 8 B to 256 MiB on 4 ranks, with both baselines
                stage sweep4 300 $PY -m pydfccl bench --nranks 4 -b 8 -e 268435456 -f 4 --baseline both --no-progress --csv "$LOGS/sweep4.csv" ;;
    sweep4_policy) # issue 5's preemption cost: dfccl against the nccl policy (no preemption)
                # on in-order work, 8 B to 128 MiB by 16x, in one run; BASES="default 100000"
                # adds runs with dfccl's first wait budget (BASE, ns) set. 21 cycles of 200
                # runs by default: 5 cycles left the median within the host's noise of the
                # 97% line (2026-11-30, 07:01 to 09:04). A cycle took about 5 s at 09:04
                # (50 s before the sweep's check stopped rebuilding its 128 MiB inputs for
                # every rank), so the limit grows with CYCLES
                for b in ${BASES:-default}; do
                  if [ "$b" = default ]; then name=sweep4_policy param=""; else name=sweep4_policy_$b param="--param BASE=$b"; fi
                  stage $name $(( 120 + 15 * ${CYCLES:-21} )) $PY -m pydfccl bench --nranks 4 -b 8 -e 268435456 -f 16 -n ${SWEEP_ITERS:-200} -N ${CYCLES:-21} -w 2 --baseline nccl $param --no-progress --csv "$LOGS/$name.csv"
                done ;;
    sweep4_configs) # 8 B to 128 MiB by 4 on 4 ranks for world sizes (CONFIGS: "default" or
                # "blocks:slot_bytes"), the daemon alone: how the channel count by size works
                for c in ${CONFIGS:-default 32:524288}; do
                  if [ "$c" = default ]; then param=""; else param="--nblocks ${c%%:*} --slot-bytes ${c##*:}"; fi
                  stage sweep4_${c/:/x} 200 $PY -m pydfccl bench --nranks 4 -b 8 -e 268435456 -f 4 -n 20 -w 3 --baseline none $param --no-progress
                done ;;
    policy_small) # the 97% target below 1 MiB, where one size's cycles spread most: more
                # cycles of more runs, no HBM table (it needs no check at these sizes)
                stage policy_small 240 $PY -m pydfccl bench --nranks 4 -b 8 -e 524288 -f 16 -n 500 -N ${CYCLES:-11} -w 5 --baseline nccl --no-hbm --no-progress ;;
    policy_8m|policy_base) # the 97% target at one size (SIZE bytes; 8 MiB for policy_8m)
                # for dfccl's first wait budget (BASES, ns; 20000 is the default): do
                # preemptions of in-order work cost the few percent?
                size=${SIZE:-8388608}; [ "$s" = policy_8m ] && size=8388608
                for b in ${BASES:-20000 100000}; do
                  name=policy_${size}_$b; [ "$s" = policy_8m ] && name=policy_8m_$b
                  stage $name $(( 60 + 10 * ${CYCLES:-9} )) $PY -m pydfccl bench --nranks 4 -b $size -e $size -n 200 -N ${CYCLES:-9} -w 5 --baseline nccl --param BASE=$b --no-hbm --no-progress
                done ;;
    sweep2_gpus) # two GPUs (device kind nvidia-h200-x2): a rank process per GPU, beside NCCL
                # itself through torch.distributed in the same run
                stage sweep2_gpus 300 env PYDFCCL_BACKEND=processes $PY -m pydfccl bench --nranks 2 -b 8 -e 268435456 -f 8 -n 10 -w 2 --baseline torch --no-progress --csv "$LOGS/sweep2_gpus.csv" ;;
    sweep2_gpus_big) # the same from 1 MiB with more channels and larger slots
                # (BIG_CONFIGS="blocks:bytes ..."), as one GPU's 256 MiB target needed
                for c in ${BIG_CONFIGS:-16:1048576 32:524288}; do
                  stage sweep2_gpus_${c%%:*}x${c##*:} 200 env PYDFCCL_BACKEND=processes $PY -m pydfccl bench --nranks 2 -b 1048576 -e 268435456 -f 16 -n 10 -w 2 --baseline torch --nblocks ${c%%:*} --slot-bytes ${c##*:} --no-progress
                done ;;
    train2_gpus) # two GPUs (nvidia-h200-x2): the example with a rank per GPU, data parallel
                # plus a metrics group; pydfccl trains, NCCL deadlocks and the watchdog exits 3
                stage train2_gpus_dfccl 150 $PY examples/train_gpt.py --nranks 2 --tp 1 --steps 20 --device cuda --watchdog 30 --timeout 140
                stage train2_gpus_nccl 90 $PY examples/train_gpt.py --nranks 2 --tp 1 --steps 20 --backend nccl --device cuda --watchdog 20 --timeout 80 ;;
    sweep4_big) # large messages with larger slots and more channels (16 blocks, 1 MiB slots)
                stage sweep4_big 240 $PY -m pydfccl bench --nranks 4 -b 1048576 -e 268435456 -f 16 -n 10 -w 2 --baseline none --nblocks 16 --slot-bytes 1048576 --no-progress ;;
    big256)     # issue 5's large-message target: 256 MiB on 4 ranks against the copy measured
                # in the same run, for channel counts and slot sizes (BIG_CONFIGS="blocks:bytes ...")
                for c in ${BIG_CONFIGS:-16:1048576 32:1048576 32:524288}; do
                  stage big256_${c%%:*}x${c##*:} 120 $PY -m pydfccl bench --nranks 4 -b 268435456 -e 268435456 -n 10 -w 2 --baseline none --nblocks ${c%%:*} --slot-bytes ${c##*:} --no-progress
                done ;;
    big256_policy) # the 256 MiB target's best configuration so far, dfccl against the nccl policy
                stage big256_policy 150 $PY -m pydfccl bench --nranks 4 -b 16777216 -e 268435456 -f 16 -n 10 -w 2 --baseline nccl --nblocks 32 --slot-bytes 524288 --no-progress ;;
    big256_base) # dfccl's wait budget (BASE, ns) at the 256 MiB target's configuration:
                # do preemptions of long waits explain dfccl's gap to the nccl policy?
                for b in ${BASES:-100000 1000000}; do
                  stage big256_base_$b 120 $PY -m pydfccl bench --nranks 4 -b 16777216 -e 268435456 -f 16 -n 10 -w 2 --baseline none --nblocks 32 --slot-bytes 524288 --param BASE=$b --no-progress
                done ;;
    probe_big)  # 16 and 256 MiB with 32 channels under dfccl and the nccl policy, one by one
                # and back to back; event logs in $OUT/probe_big_<policy>_32ch.json.gz
                # (read them with: python3 scripts/probe_big.py --summarize FILE...)
                stage probe_big 200 $PY scripts/probe_big.py ;;
    probe_big8) # 16 MiB with 8 channels of 512 KiB, every block with a share, against 32 (24
                # idle a rank): 0.6 against 3.1 ms a run, 2026-11-30 04:27; not the idle polling,
                # nor blocks sharing SMs (07:00: each block on its own SM)
                stage probe_big8 120 $PY scripts/probe_big.py --nblocks 8 --sizes 16777216
                stage probe_big32 120 $PY scripts/probe_big.py --nblocks 32 --sizes 16777216 ;;
    probe_small32) # small all-reduces with 32 daemon blocks a rank against 4: which block's
                # taking or completing of a run the CQ waits for; logs in $OUT, summarized
                for nb in 4 32; do
                  stage probe_small_${nb} 120 $PY scripts/probe_big.py --nblocks $nb --sizes 8 65536 --policies dfccl --iters 100
                  stage probe_small_${nb}_summary 60 $PY scripts/probe_big.py --summarize "$OUT/probe_big_dfccl_${nb}ch.json.gz"
                done ;;
    probe_pool32) # is it the pool's size (2 GiB a rank for 32 blocks of 512 KiB slots and 32
                # collectives)? The same small runs with room for 2 collectives (128 MiB), and
                # with 64 KiB slots (256 MiB)
                for cfg in 524288:2 524288:32 65536:32; do
                  slot=${cfg%%:*} colls=${cfg##*:}
                  stage probe_pool_${slot}_${colls} 120 $PY scripts/probe_big.py --nblocks 32 --slot-bytes $slot --max-colls $colls --sizes 8 65536 --policies dfccl --iters 100
                  stage probe_pool_${slot}_${colls}_summary 60 $PY scripts/probe_big.py --summarize "$OUT/probe_big_dfccl_32ch_$((slot / 1024))k_${colls}colls.json.gz"
                done ;;
    probe_ranks_blocks) # does a busy block slow down with its rank's blocks or with the
                # GPU's? 8-byte runs for ranks x blocks a rank of 1x32, 2x32, 4x8 and 8x4
                for cfg in 1:32 2:32 4:8 8:4; do
                  r=${cfg%%:*} nb=${cfg##*:} tag=""; [ "$r" = 4 ] || tag="_${r}ranks"
                  stage probe_${r}x${nb} 120 $PY scripts/probe_big.py --nranks $r --nblocks $nb --sizes 8 --policies dfccl --iters 100
                  stage probe_${r}x${nb}_summary 60 $PY scripts/probe_big.py --summarize "$OUT/probe_big_dfccl_${nb}ch${tag}.json.gz"
                done ;;
    probe_host_path) # the host's share of a run: pydfccl's Python against an echo daemon (CPU)
                stage probe_host_path 120 env NUMBA_ENABLE_CUDASIM=1 $PY scripts/probe_host_path.py ;;
    probe_host_profile) # the same under cProfile: where the host's microseconds go
                stage probe_host_profile 120 env NUMBA_ENABLE_CUDASIM=1 PROBE_SORT=tottime $PY scripts/probe_host_path.py --iters 20000 --profile ;;
    probe_host_knobs) # the 2-rank latency under settings of the poller and the event-log copier
                stage probe_host_knobs 240 $PY scripts/probe_host_knobs.py 3000 5 ;;
    movers)     stage movers 120 $PY scripts/probe_movers.py ;;
    probe)      stage probe 60 $PY scripts/probe_timer.py ;;
    probe_host) stage probe_host 60 $PY scripts/probe_host.py ;;
    probe_contention) # one thread's clock reads, loads and stores while the other blocks
                # idle as daemon blocks do: the 32-block slowdown (docs/benchmarks.md)
                stage probe_contention 120 $PY scripts/probe_contention.py ;;
    probe_latency) stage probe_latency 90 $PY scripts/probe_latency.py ;;
    probe_latency8) # the same with 8 ranks (2026-11-30 07:05: the ranks took the run over 54 us,
                # one run() after another, then 15 ring steps of about 4.6 us)
                stage probe_latency8 90 $PY scripts/probe_latency.py 1000 8 ;;
    probe_memory) stage probe_memory 60 $PY scripts/probe_memory.py ;;
    floor)      # the least an 8-byte all-reduce from Python can take here: a kernel a rank that
                # trades one flag, no pydfccl (issue 5's 6 and 10 us targets against it)
                stage floor 180 $PY scripts/probe_floor.py --ranks 1 2 4 8 --relay ;;
    probe_step) stage probe_step 60 $PY scripts/probe_step.py ;;
    clocks)     # the SM clock while a latency run keeps the daemons busy (read, never set)
                stage clocks 60 bash -c "$PY scripts/probe_latency.py 4000 > /dev/null & for i in 1 2 3 4 5 6 7 8; do sleep 2; nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,utilization.gpu --format=csv,noheader; done; wait" ;;
    startup)    # the same small demo twice: the first compiles the daemon, the second loads it
                # from Numba's on-disk cache (the lent machine starts bare, so the cache is cold)
                stage startup_cold 200 bash -c "time $PY -m pydfccl demo -n 2 -k 2 -i 1 --no-progress"
                stage startup_warm 100 bash -c "time $PY -m pydfccl demo -n 2 -k 2 -i 1 --no-progress"
                stage startup_probe 200 $PY scripts/probe_startup.py
                stage startup_probe_again 100 $PY scripts/probe_startup.py ;;
    p2p_diag)   # the point-to-point deadlock test, with every thread's stack if it hangs
                stage p2p_diag 120 $PY -m pytest -q -rfE --tb=short -p no:cacheprovider -o faulthandler_timeout=45 "tests/test_point_to_point.py::test_crossed_receives_complete_under_dfccl_and_deadlock_under_nccl" ;;
    ipc_nomps)  # rank processes sharing the GPU without MPS: a warning, slow but correct
                stage ipc_nomps 120 env PYDFCCL_BACKEND=processes $PY -m pydfccl demo -n 2 -k 4 -i 3 --no-progress ;;
    mps)        # rank processes on one GPU through CUDA IPC, under the MPS daemon
                nvidia-cuda-mps-control -d; sleep 1
                stage mps_tests 300 env PYDFCCL_BACKEND=processes $PY -m pytest -q -rfE --tb=short -p no:cacheprovider -o faulthandler_timeout=100 tests/test_collectives.py::test_every_kind_matches_numpy tests/test_point_to_point.py tests/test_env_bootstrap.py tests/test_mpi.py
                stage mps_demo4 120 env PYDFCCL_BACKEND=processes $PY -m pydfccl demo -n 4 -k 8 -i 50 --no-progress
                stage mps_mpiexec4 120 mpiexec -n 4 $PY -m pydfccl demo -k 8 -i 50 --no-progress
                stage mps_sync4 120 env PYDFCCL_BACKEND=processes $PY -m pydfccl demo -n 4 -k 8 -i 10 --sync device --no-progress
                stage mps_nccl4 60 env PYDFCCL_BACKEND=processes $PY -m pydfccl demo -n 4 -k 8 -i 10 --policy nccl --no-progress
                echo quit | nvidia-cuda-mps-control ;;
    mps_killed) # a rank process killed mid-collective under MPS: its peers name it
                nvidia-cuda-mps-control -d; sleep 1
                stage mps_killed 90 $PY -m pytest -q -rfE --tb=short -p no:cacheprovider tests/test_env_bootstrap.py::test_a_killed_rank_is_named_within_the_heartbeat_timeout
                echo quit | nvidia-cuda-mps-control ;;
    train2_diag) # the torch example on 2 rank processes under MPS, with a short watchdog: if
                # it stalls, each rank prints pydfccl's status and every thread's stack
                nvidia-cuda-mps-control -d; sleep 1
                stage train2_diag 90 $PY examples/train_gpt.py --nranks 2 --tp 2 --steps 3 --device cuda --watchdog 25 --timeout 80
                echo quit | nvidia-cuda-mps-control ;;
    torch_quick) # tests/test_torch.py under MPS (a stuck rank reports its status and stacks after
                # 40 s) and the DDP-hook timing example (scripts/gpu_torch.sh runs more)
                nvidia-cuda-mps-control -d; sleep 1
                stage torch_tests 200 env PYDFCCL_TEST_STALL=40 $PY -m pytest -q -rfE --tb=short -p no:cacheprovider tests/test_torch.py
                stage ddp_timing2 90 $PY examples/ddp_timing.py --nranks 2 --steps 30 --device cuda --stall 30 --timeout 80
                echo quit | nvidia-cuda-mps-control ;;
    hold)       stage hold 150 $PY -m pytest -q -rfE --tb=short -p no:cacheprovider tests/test_hold.py ;;
    torch_stall) # the multi-process torch cases that stalled, under MPS; a rank stuck for
                # 12 s (8 s in ddp_timing) prints its status and Python stacks (STALL_NATIVE=1:
                # native stacks too, but cuda-gdb cannot attach under MPS: "Late attach is
                # not supported with CUDA MPS", 2026-11-29 20:47)
                nvidia-cuda-mps-control -d; sleep 1
                stage stall_collectives 120 env PYDFCCL_TEST_STALL=12 PYDFCCL_STALL_NATIVE=${STALL_NATIVE:-0} $PY -c "import sys; from pydfccl.torch.spawn import spawn_ranks; rs = spawn_ranks(['tests/torch_workers.py', 'collectives'], 3, timeout=110); sys.exit(max(abs(r.returncode) for r in rs))"
                stage stall_ddp_timing 120 env PYDFCCL_STALL_NATIVE=${STALL_NATIVE:-0} $PY examples/ddp_timing.py --nranks 2 --steps 30 --device cuda --stall 8 --timeout 110
                echo quit | nvidia-cuda-mps-control ;;
    train4)     # the torch example, 4 rank processes under MPS (tensor-parallel pairs, data
                # parallel across; rank-dependent orders and implicit syncs between them)
                nvidia-cuda-mps-control -d; sleep 1
                stage train4 120 $PY examples/train_gpt.py --nranks 4 --tp 2 --steps 20 --device cuda --watchdog 30 --timeout 110
                echo quit | nvidia-cuda-mps-control ;;
    bench_mps)  # the latency benchmark with ranks as processes under MPS (no GIL shared by ranks)
                nvidia-cuda-mps-control -d; sleep 1
                stage bench_mps 90 env PYDFCCL_BACKEND=processes $PY -m pydfccl bench latency -n 2 --iters 5000 --driver threads
                echo quit | nvidia-cuda-mps-control ;;
    sweep4s)    # a shorter sweep: 8 B to 256 MiB by 8x, 10 runs per size
                stage sweep4s 240 $PY -m pydfccl bench --nranks 4 -b 8 -e 268435456 -f 8 -n 10 -w 2 --baseline both --no-progress --csv "$LOGS/sweep4s.csv" ;;
    replay)     # a model schedule replayed on the engine (exit 0), and under nccl (exit 3)
                stage replay 90 $PY -m pydfccl demo --schedule scripts/schedules/three_ranks_disordered_with_syncs.json
                stage replay_nccl 60 $PY -m pydfccl demo --schedule scripts/schedules/three_ranks_disordered_with_syncs.json --policy nccl --watchdog 5 ;;
    *) echo "unknown stage $s" | tee -a "$SUMMARY" ;;
  esac
done
