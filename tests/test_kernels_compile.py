"""Compile every daemon to PTX for sm_90 without a GPU, and check its wait loops.

The simulator runs the kernels as Python, so it hides typing errors and cannot see
memory-ordering bugs; this test compiles the real device code with libNVVM (shipped with the
CUDA 13 pip packages) in a subprocess that does not use the simulator.
"""

import json
import os
import subprocess
import sys

from pydfccl.sched.policies import policy_names

SCRIPT = """
import json
from pydfccl.kernels.ptx import daemon_ptx, spin_loops, unordered_spin_loops
from pydfccl.sched.policies import policy_names
report = {}
for name in policy_names():
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


def test_every_daemon_compiles_to_ptx_with_ordered_waits_and_16_byte_moves():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["NUMBA_FORCE_CUDA_CC"] = "9.0"
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(report) == policy_names()
    for name, r in report.items():
        assert r["entry"], name
        assert r["loops"] > 0, f"{name}: no wait loop found"
        assert r["unordered"] == 0, f"{name}: a wait loop polls with plain loads"
        assert r["acquire"] and r["release"] and r["atomics"] and r["timer"], (name, r)
        assert r["fences"], (name, r)   # GPU scope for peers on this GPU, system otherwise
        # The movers' 16-byte path: per dtype, one load for the slot and one for the user's
        # input, one store for each output; never a non-coherent (.nc) load, since peers
        # write the slots; the vectors' elements stay in registers.
        assert r["vector_loads"] >= 2 * 8 and r["vector_stores"] >= 2 * 8, (name, r)
        assert not r["non_coherent"], (name, r)
        assert not r["local_memory"], (name, r)
