"""``python -m pydfccl build-kernels`` compiles a daemon on the CPU (libNVVM, nvJitLink)
into the kernel cache, and the runtime's own lookup finds it: from the same install, and
from a copy of the package elsewhere with new modification times (a reinstall of the same
version), and the dispatcher launches what it loaded. Only the device's answers (compute
capability 9.0) and the launch itself are stood in for."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LOOKUP = """
import json
import numpy as np
from numba.cuda.dispatcher import _Kernel
from pydfccl.kernels.ahead import offline_device
from pydfccl.kernels.daemon import DAEMON_SIGNATURE, make_daemon
from pydfccl.sched.policies import get_policy
import pydfccl

refreshed, launched = [], []

def lookup(nthreads):
    kernel = make_daemon(get_policy("dfccl"), nthreads)
    kernel.targetctx.refresh = lambda: refreshed.append(nthreads)
    with offline_device((9, 0)):
        return kernel, kernel._cache.load_overload(DAEMON_SIGNATURE, kernel.targetctx)

kernel, found = lookup(512)
lib = found._codelibrary if found is not None else None
# the runtime's path from here: compile (a cache hit), then a configured launch, which
# only the driver could make: the loaded kernel's launch is recorded instead
_Kernel.launch = lambda self, args, *config: launched.append(self)
with offline_device((9, 0)):
    loaded = kernel.compile(DAEMON_SIGNATURE)
    kernel[1, 512, 0](*[np.int64(0)] * 9)
print(json.dumps(dict(
    package=pydfccl.__file__, cache_path=kernel._cache.cache_path, found=found is not None,
    cubin=lib is not None and (9, 0, "a") in lib._cubin_cache,
    entry=lib is not None and ".entry" in lib.get_asm_str(cc=(9, 0, "a")),
    launched_loaded=launched == [loaded] and sum(kernel._cache_hits.values()) == 1,
    narrow_found=lookup(256)[1] is not None, refreshed=refreshed)))
"""


def _env(cache, path):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")    # Numba's CUDA target, no driver
    env.update(PYDFCCL_CACHE_DIR=str(cache), PYTHONPATH=str(path))
    return env


def _lookup(cache, path):
    proc = subprocess.run([sys.executable, "-c", LOOKUP], env=_env(cache, path), cwd=path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_build_kernels_writes_entries_the_runtime_finds_after_a_reinstall(tmp_path):
    cache = tmp_path / "kernels"
    env = dict(_env(cache, ROOT), NUMBA_ENABLE_CUDASIM="1")   # it builds outside the simulator
    proc = subprocess.run([sys.executable, "-m", "pydfccl", "build-kernels", "--policy", "dfccl"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dfccl" in proc.stdout and "registers 128" in proc.stdout, proc.stdout
    assert list(cache.glob("*.nbi")) and list(cache.glob("*.nbc"))

    here = _lookup(cache, ROOT)
    assert here["cache_path"] == str(cache)
    assert here["found"] and here["cubin"] and here["entry"], here
    # loading and launching a cached daemon never refreshes Numba's target context (1 s)
    assert here["launched_loaded"] and here["refreshed"] == [], here
    assert not here["narrow_found"]        # blocks of 256 are another daemon, not built

    copy = tmp_path / "reinstalled"
    shutil.copytree(ROOT / "pydfccl", copy / "pydfccl",
                    ignore=shutil.ignore_patterns("__pycache__"))
    there = _lookup(cache, copy)
    assert there["package"].startswith(str(copy))
    assert there["found"] and there["cubin"], there


def test_a_bad_compute_capability_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "pydfccl", "build-kernels", "--cc", "nine"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "--cc 'nine'" in proc.stderr
