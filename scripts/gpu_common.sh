# Sourced by the GPU batches (gpu_check.sh, gpu_torch.sh) on the lent H200: the numpy wheel,
# the environment, the summary header and `stage`. Set LOGS before sourcing. Under $OUT
# (default ./out) each batch leaves summary.txt and logs.tgz: one log per stage, repacked
# after every stage, since the device tool returns at most 8 files.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT" "$LOGS"
# The image's numpy 2.5 breaks numba-cuda 0.30: carry a numpy 2.4 wheel in .whl/ (see docs/gpu.md).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # the machine runs us as root
SUMMARY="$OUT/summary.txt"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader;
  python3 -m pydfccl doctor; } 2>&1 | tee "$SUMMARY"
PY=python3

stage() {  # stage NAME TIMEOUT_S COMMAND...: log to $LOGS/NAME.log, one summary line
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "[$name] rc=$rc ${SECONDS}s-${t0}s: $*" | tee -a "$SUMMARY"
  tail -n 12 "$LOGS/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
  tar czf "$OUT/logs.tgz" -C "$LOGS" .
}
