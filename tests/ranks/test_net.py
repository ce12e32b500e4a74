"""Ranks on several (emulated) nodes under mpiexec: pairs across nodes go through the
network proxy (``pydfccl.transport``), pairs within a node through shared memory. The chaos
demo verifies every output in 100% disorder, with device synchronizations too; its nccl
twin is reported as a deadlock whose cycle crosses the nodes; the collectives matrix
matches numpy with every pair over the network and with two ranks a node; a pair across
nodes really goes through MPI; a rank of another node that stops is named on every rank.
Without a GPU the processes run the simulator."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pydfccl.cli.doctor import find_mpiexec

MPIEXEC = find_mpiexec()
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich)")
pytest.importorskip("mpi4py")
HERE = Path(__file__).resolve().parent


def _env(per_node, **extra):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return dict(env, PYDFCCL_RANKS_PER_NODE=str(per_node), **extra)


def _mpiexec(n, per_node, *argv, timeout=300, **extra):
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *argv],
                          env=_env(per_node, **extra), capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("sync", ["none", "device"])
def test_demo_across_emulated_nodes_verifies_every_output(sync):
    done = _mpiexec(4, 2, "-m", "pydfccl", "demo", "-i", "2", "-k", "6", "-c", "40",
                    "--kinds", "all", "--sync", sync)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "100% disorder" in done.stdout
    assert "outputs verified: 42 " in done.stdout      # 6 kinds x 4 ranks x 2, less reduce's
    assert "pairs: 2 ipc, 4 mpi (the network proxies sent " in done.stdout


def test_nccl_policy_deadlock_is_reported_across_nodes():
    done = _mpiexec(4, 2, "-m", "pydfccl", "demo", "-i", "2", "-k", "4",
                    "--policy", "nccl", "--watchdog", "5")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "wait-for cycle: rank 0 -> rank 3 -> rank 2 -> rank 1 -> rank 0" in done.stderr


def test_the_benchmark_stops_at_a_wrong_result_naming_it():
    """bench checks every run (inputs change from run to run), not only the last."""
    import numpy as np

    from pydfccl.cli.bench_net import _check

    _check(0, 8, np.full(2, 10.0, np.float32), 10, 3)
    with pytest.raises(AssertionError, match=r"rank 1: wrong all-reduce of 8 bytes in run 3: "
                                             r"1 elements differ from 10 \(first at 1: 7.0\)"):
        _check(1, 8, np.array([10.0, 7.0], np.float32), 10, 3)


def test_bench_under_mpiexec_shows_network_ipc_and_mpi_rows():
    done = _mpiexec(4, 2, "-m", "pydfccl", "bench", "--bytes", "8,512", "--iters", "2",
                    "--switch-interval", "0.0005")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 ranks, pairs: 2 ipc, 4 mpi; ipc: pydfccl on 4 ranks without the network" \
        in done.stdout
    assert "warm-up; GIL switch interval 0.5 ms" in done.stdout
    assert "dfccl net us  dfccl ipc us  mpi4py us" in done.stdout
    lines = done.stdout.splitlines()
    rows = [x.split() for x in lines if x.strip()[:1].isdigit() and len(x.split()) == 5]
    assert [int(r[0]) for r in rows] == [8, 512]
    # where the proxies' time went, by size: their loops, received slots' writes and the
    # messages' transit (the ranks share this machine's clock)
    head = lines.index(next(x for x in lines if x.split()[:3] == ["bytes", "loop", "gap"]))
    assert lines[head].split()[3:] == ["us", "p99", "pool", "write", "us", "p99", "transit",
                                       "us", "p99"]
    timed = [x.split() for x in lines[head + 1:head + 3]]
    assert [int(r[0]) for r in timed] == [8, 512]
    assert all(len(r) == 7 and all(float(v) > 0 for v in r[1:]) for r in timed), timed


def test_bench_net_names_a_bad_switch_interval():
    done = subprocess.run([sys.executable, "-m", "pydfccl", "bench", "net",
                           "--switch-interval", "0"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--switch-interval 0.0: must be positive" in done.stderr


def _records(text: str, head: str) -> list:
    """Each record that starts with ``head``, up to the next record or line end: mpiexec
    forwards the ranks' output in pieces, so two ranks' lines can share a line."""
    return re.findall(rf"{head}.*?(?={head}|\n|$)", text)


def _results(done) -> dict:
    assert done.returncode == 0, done.stdout + done.stderr
    found = [json.loads(x[len("RESULT "):]) for x in _records(done.stdout, "RESULT ")]
    return {r["rank"]: r for r in found}


@pytest.mark.parametrize("per_node, pairs", [(1, {"ipc": 0, "mpi": 6}),
                                             (2, {"ipc": 2, "mpi": 4})])
def test_collectives_matrix_across_nodes(per_node, pairs):
    results = _results(_mpiexec(4, per_node, str(HERE / "net_matrix.py"), timeout=600))
    assert sorted(results) == [0, 1, 2, 3]
    # 19 kinds x ops x dtypes (a reduce's output only at its root), a transfer and an
    # all_to_allv
    assert sum(r["matched"] for r in results.values()) == 4 * 21 - 3 * 3
    for r in results.values():
        assert r["transports"] == pairs
        assert r["net"]["received_slot"] > 0 and r["net"]["received_row"] > 0


RING = """
import json
import numpy as np
from mpi4py import MPI
import pydfccl
with pydfccl.Communicator.from_mpi(MPI.COMM_WORLD) as comm:
    comm.prepare(0, "all_reduce", count=1000, dtype="float32")
    comm.start()
    for _ in range(3):
        x = comm.empty(1000, "float32")
        x[...] = comm.rank + 1
        assert float(np.asarray(comm.run(0, x).result(timeout=120))[0]) == 10.0
print("RESULT " + json.dumps(dict(rank=comm.rank, net=comm.world.net.stats)), flush=True)
"""


def test_a_pair_across_nodes_goes_through_mpi(tmp_path):
    """A ring all-reduce on nodes {0, 1} and {2, 3}: ranks 1 and 3 send to the other node
    (slots through their proxies), ranks 0 and 2 to their own (shared memory: no slot
    through a proxy) and return the credit of what they receive across (heads). The ring
    is asked for: on a GPU 4,000 bytes go one-shot (every rank sends to every peer)."""
    script = tmp_path / "ring.py"
    script.write_text(RING)
    results = _results(_mpiexec(4, 2, str(script), timeout=300, PYDFCCL_ONE_SHOT_BYTES="0"))
    for rank in (1, 3):
        assert results[rank]["net"]["sent_slot"] > 0
        assert results[rank]["net"]["sent_head"] == 0
    for rank in (0, 2):
        assert results[rank]["net"]["sent_slot"] == 0
        assert results[rank]["net"]["sent_head"] > 0
        assert results[rank]["net"]["received_slot"] == results[rank - 1 + 4 * (rank == 0)][
            "net"]["sent_slot"]


LATE = """
import json
import numpy as np
from mpi4py import MPI
import pydfccl
with pydfccl.Communicator.from_mpi(MPI.COMM_WORLD) as comm:
    comm.prepare(0, "all_reduce", count=8, dtype="int64")
    comm.start()
    x = comm.empty(8, "int64")
    x[...] = 1
    comm.run(0, x).result(timeout=60)
    comm.prepare(1, "all_gather", count=4, dtype="int64")     # after start: published in
    comm.prepare(2, "all_reduce", count=4, dtype="float32")   # the rows, one-shot
    y = comm.empty(4, "int64")
    y[...] = comm.rank
    z = comm.empty(4, "float32")
    z[...] = comm.rank + 1
    gathered = comm.run(1, y, comm.empty(16, "int64")).result(timeout=120)
    reduced = comm.run(2, z).result(timeout=120)
    print("RESULT " + json.dumps(dict(rank=comm.rank, gathered=np.asarray(gathered).tolist(),
                                      reduced=np.asarray(reduced).tolist())), flush=True)
"""


def test_late_registrations_meet_across_nodes(tmp_path):
    """Collectives prepared after start() are matched through the peers' published
    registrations, which reach other nodes in the proxies' copies of the rows."""
    script = tmp_path / "late.py"
    script.write_text(LATE)
    results = _results(_mpiexec(4, 1, str(script), timeout=300))
    for r in results.values():
        assert r["gathered"] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
        assert r["reduced"] == [10.0] * 4


STOPPED = """
import faulthandler, os, signal, threading, time
import numpy as np
from mpi4py import MPI
import pydfccl
comm = pydfccl.Communicator.from_mpi(MPI.COMM_WORLD)

def heartbeats():    # for a run that names no one: this rank's view of its peers' rows
    ctl, now = comm.world.ctl, time.monotonic_ns()
    beats = [int(b) for b in ctl["heartbeat"]]
    seen = [(r, round((now - b) / 1e9, 1) if b > 0 else b, int(ctl["pid"][r]),
             int(ctl["pid_ns"][r])) for r, b in enumerate(beats)]
    print(f"HEARTBEATS rank {comm.rank} (peer, age s or heartbeat, pid, pid ns): {seen}",
          flush=True)
comm.prepare(0, "all_reduce", count=8, dtype="int64")
comm.start()
x = comm.empty(8, "int64")
x[...] = 1
comm.run(0, x).result(timeout=60)        # every rank ran: the heartbeats are watched
MPI.COMM_WORLD.Barrier()                 # and every rank has its result (rank 3's proxy
if comm.rank == 3:                       # sent its last slots before it stops)
    print(f"STOPPING {os.getpid()}", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)     # stops with its peers' collective pending
faulthandler.dump_traceback_later(50)    # a rank that names no one by then: its threads
look = threading.Timer(30, heartbeats)
look.daemon = True
look.start()
t0 = time.monotonic()
try:
    comm.run(0, x).result(timeout=120)
    print("completed?!", flush=True)
except pydfccl.PydfcclError as exc:
    print(f"rank {comm.rank} after {time.monotonic() - t0:.0f} s: {exc}", flush=True)
look.cancel()
comm.close()
"""


# Short, so that the stop is named soon, yet long beside the gaps in a busy machine's
# heartbeats: with 3 s, four rank processes of the simulator beside another test's on two
# cores missed each other's beats during their first collective, before any rank stopped.
HEARTBEAT_S = 15


def test_a_stopped_rank_on_another_node_is_named_on_every_rank(tmp_path):
    """Rank 3 stops: ranks 0 and 1 (the other node) hear nothing from its proxy and name it
    at the heartbeat timeout; rank 2 (its node), whose pid check sees a live process, learns
    it from their report through the proxies. Nothing hangs: the test then kills rank 3."""
    script = tmp_path / "stopped.py"
    script.write_text(STOPPED)
    out = tmp_path / "out.txt"
    with open(out, "w") as sink:
        proc = subprocess.Popen([MPIEXEC, "-n", "4", sys.executable, str(script)],
                                env=_env(2, PYDFCCL_HEARTBEAT_TIMEOUT=str(HEARTBEAT_S)),
                                stdout=sink, stderr=subprocess.STDOUT, text=True)
    stopped = None
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            text = out.read_text()
            found = re.search(r"STOPPING (\d+)", text)
            stopped = int(found.group(1)) if found else None
            if len(_records(text, r"rank \d after ")) >= 3:
                break
            time.sleep(0.5)
    finally:
        if stopped is not None:                  # MPI's finalize waits for it otherwise
            with contextlib.suppress(ProcessLookupError):    # unless the job has ended
                os.kill(stopped, signal.SIGKILL)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    text = out.read_text()
    reports = _records(text, r"rank \d after ")
    assert len(reports) == 3, text
    for rank in (0, 1, 2):
        line = next(x for x in reports if x.startswith(f"rank {rank} "))
        assert "rank 3: no heartbeat for " in line, text[-20000:]
        assert "on another node: nothing from its network proxy" in line, line
        assert int(line.split(" after ")[1].split()[0]) <= 4 * HEARTBEAT_S, line


MORE_THAN_SLOTS = """
from mpi4py import MPI
import pydfccl
comm = pydfccl.Communicator.from_mpi(MPI.COMM_WORLD, max_colls=4)
for coll_id in range(6):
    comm.prepare(coll_id, "all_reduce", count=4, dtype="int64")
comm.start()
"""


def test_more_collectives_than_slots_across_nodes_is_refused_at_start(tmp_path):
    """Shared slots are granted through one host's shared memory: across nodes, start()
    refuses them by name on every rank rather than leaving the runs waiting."""
    script = tmp_path / "more_than_slots.py"
    script.write_text(MORE_THAN_SLOTS)
    done = _mpiexec(2, 1, str(script), timeout=240)
    assert done.returncode != 0
    assert done.stderr.count("shared slots need every rank on one host") == 2, \
        done.stderr[-3000:]
