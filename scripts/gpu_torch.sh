#!/usr/bin/env bash
# The torch batch for the lent H200 (device tool), from the repository root, e.g.
#   run(command="bash scripts/gpu_torch.sh", carry=[".whl"])
# Needs CUDA IPC between rank processes (communicator_from_group on GPUs). It starts MPS
# (several rank processes share the one GPU), runs tests/test_torch.py on CUDA (the stand-in
# communicator's runs go through the real stream gate: cuStreamWriteValue64/WaitValue64),
# the backend and DDP tests with ranks as processes, examples/train_gpt.py with 2 and 4
# ranks and examples/ddp_timing.py (the DDP hook against the functional API); then stops MPS. Under $OUT: summary.txt and logs.tgz (every log, repacked after
# every stage).
LOGS=${LOGS:-/tmp/pydfccl_torch_logs}
source "$(dirname "$0")/gpu_common.sh"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$SUMMARY"

# MPS: rank processes of one GPU run concurrently (without it they time-slice, 4.8 ms a
# round trip; docs/gpu.md). Stopped at the end whatever happened.
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d && echo "MPS started" | tee -a "$SUMMARY"
trap 'echo quit | nvidia-cuda-mps-control; tar czf "$OUT/logs.tgz" -C "$LOGS" .' EXIT

stage torch_tests 230 env PYDFCCL_TEST_STALL=60 $PY -m pytest -q -rfE --tb=short -p no:cacheprovider -o faulthandler_timeout=90 tests/test_torch.py
stage train2 100 $PY examples/train_gpt.py --nranks 2 --tp 2 --steps 20 --device cuda --watchdog 30 --timeout 90
stage train4 120 $PY examples/train_gpt.py --nranks 4 --tp 2 --steps 20 --device cuda --watchdog 30 --timeout 110
# iteration time with the DDP hook against the functional all-reduce by hand (issue 8)
stage ddp_timing2 100 $PY examples/ddp_timing.py --nranks 2 --steps 30 --device cuda --stall 30 --timeout 90
cp /tmp/mps_log/*.log "$LOGS/" 2>/dev/null
