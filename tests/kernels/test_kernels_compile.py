"""Compile every daemon to PTX for sm_90 without a GPU, and check its wait loops.

The simulator runs the kernels as Python, so it hides typing errors and cannot see
memory-ordering bugs; this test compiles the real device code with libNVVM (shipped with the
CUDA 13 pip packages) in a subprocess that does not use the simulator.
"""

import json
import os
import subprocess
import sys

import pytest

from pydfccl.kernels.limits import blocks_per_sm, register_cap
from pydfccl.sched.policies import policy_names
from pydfccl.host.world_config import WorldConfig

SCRIPT = """
import json, sys
from pydfccl.kernels.ptx import daemon_ptx, spin_loops, unordered_spin_loops
report = {}
for name in sys.argv[1:]:
    ptx = daemon_ptx(name)
    report[name] = dict(
        entry=".entry" in ptx and ".target sm_90" in ptx,
        loops=len(spin_loops(ptx)),
        unordered=len(unordered_spin_loops(ptx)),
        acquire="ld.acquire.sys" in ptx,
        release="st.release.sys" in ptx,
        atomics="atom.add.acq_rel.gpu" in ptx,
        fences="fence.acq_rel.gpu" in ptx and "fence.acq_rel.sys" in ptx,
        timer="%globaltimer" in ptx,
        vector_loads=ptx.count("ld.global.v2.u64"),
        vector_stores=ptx.count("st.global.v2.u64"),
        non_coherent=".nc" in ptx,
        local_memory="__local_depot" in ptx,
    )
print(json.dumps(report))
"""


def _compile_reports(names: list[str], processes: int = 2) -> dict:
    """SCRIPT's report for every policy in ``names``, compiled by ``processes`` processes
    at once (libNVVM and Numba's front end use one core each)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")    # Numba's CUDA target, no driver
    env["NUMBA_FORCE_CUDA_CC"] = "9.0"
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, *names[i::processes]], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(processes) if names[i::processes]]
    report = {}
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        report.update(json.loads(out.strip().splitlines()[-1]))
    return report


def test_every_daemon_compiles_to_ptx_with_ordered_waits_and_16_byte_moves():
    report = _compile_reports(policy_names())
    assert sorted(report) == policy_names()
    for name, r in report.items():
        assert r["entry"], name
        assert r["loops"] > 0, f"{name}: no wait loop found"
        assert r["unordered"] == 0, f"{name}: a wait loop polls with plain loads"
        # the CQ's stamps follow a system fence (_publish_cq), no release store of their own
        assert r["acquire"] and r["atomics"] and r["timer"], (name, r)
        assert r["fences"], (name, r)   # GPU scope for peers on this GPU, system otherwise
        # The movers' 16-byte path: per dtype, one load for the slot and one for the user's
        # input, one store for each output; never a non-coherent (.nc) load, since peers
        # write the slots; the vectors' elements stay in registers.
        assert r["vector_loads"] >= 2 * 8 and r["vector_stores"] >= 2 * 8, (name, r)
        assert not r["non_coherent"], (name, r)
        assert not r["local_memory"], (name, r)


KEY_SCRIPT = """
import json
from pydfccl.kernels.compiler import fingerprint
from pydfccl.kernels.daemon import make_daemon
from pydfccl.sched.policies import get_policy
kernel = make_daemon(get_policy("dfccl"))
narrow = make_daemon(get_policy("dfccl"), nthreads=256)
print(json.dumps(dict(
    dfccl=fingerprint(get_policy("dfccl")),
    nccl=fingerprint(get_policy("nccl")),
    tuned=fingerprint(get_policy("dfccl").with_params(BASE=1)),
    cache_key=kernel._cache._stable_key,
    registers=kernel.targetoptions["max_registers"],
    narrow_key=narrow._cache._stable_key,
    narrow_registers=narrow.targetoptions["max_registers"])))
"""


def test_the_daemons_disk_cache_key_is_the_same_in_every_process():
    """Numba keyed the daemon (a closure) by pickled dispatchers, whose uuids change in every
    process, so its disk cache never hit; pydfccl's key is the source, alike everywhere."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")    # Numba's CUDA target, no driver
    keys = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", KEY_SCRIPT], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        keys.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert keys[0] == keys[1]
    key = keys[0]
    assert key["cache_key"] == key["dfccl"] + "-r128" != key["nccl"] + "-r128"
    assert key["tuned"] == key["dfccl"]          # parameters are data: no new kernel
    assert key["registers"] * 512 <= 65536       # every policy launches 512 threads
    # blocks of 256 threads take a daemon of their own, with every register a thread may have
    assert key["narrow_registers"] == 255
    assert key["narrow_key"] == key["dfccl"] + "-r255"


def test_the_register_cap_follows_the_blocks_width():
    assert [register_cap(n) for n in (512, 500, 384, 257, 256, 128, 1)] == [
        128, 128, 168, 248, 255, 255, 255]
    # so a multiprocessor holds one block of 256 threads or more, two of 128
    assert [blocks_per_sm(n) for n in (512, 500, 384, 256, 128, 64)] == [1, 1, 1, 1, 2, 4]


def test_more_threads_than_the_register_cap_allows_are_refused():
    with pytest.raises(ValueError, match="nthreads must be in 1..512"):
        WorldConfig(nranks=2, nthreads=1024)
