"""The store ranks started with torchrun-style variables meet at (``bootstrap/store.py``):
only the job's own processes can drive it, and nothing another program sends can run code
in it or stall it. Every case is bounded in time."""

import os
import pickle
import socket
import stat
import threading
import time

import pytest

from pydfccl.bootstrap.store import StoreGroup, free_port, secret_path
from pydfccl.errors import PydfcclError


def run_group(size, port, timeout=20.0, secret=None, job=None, ranks=None):
    """Every rank of a group in a thread; each rank's allgather result, or its error."""
    out = {}

    def rank(r):
        try:
            group = StoreGroup(rank=r, size=size, address=("127.0.0.1", port),
                               timeout=timeout, secret=secret, job=job)
            out[r] = group.allgather({r: f"rank {r}"})
        except Exception as exc:          # the test looks at it
            out[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in (ranks or range(size))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    return out


def test_a_job_meets_and_its_generated_secret_is_private_and_removed(monkeypatch):
    monkeypatch.delenv("PYDFCCL_SECRET", raising=False)
    port = free_port()
    job = f"test-{port}"
    path = secret_path(job)
    seen = {}
    real = StoreGroup.allgather

    def looking(self, obj):       # the secret file while the job meets
        if self.rank == 0 and os.path.exists(path):
            seen["mode"] = stat.S_IMODE(os.stat(path).st_mode)
            seen["dir"] = stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode)
        return real(self, obj)

    monkeypatch.setattr(StoreGroup, "allgather", looking)
    out = run_group(3, port, job=job)
    assert all(out[r] == [{0: "rank 0"}, {1: "rank 1"}, {2: "rank 2"}] for r in range(3)), out
    assert seen == {"mode": 0o600, "dir": 0o700}
    assert not os.path.exists(path)        # every rank has it: rank 0 removed it


def test_stray_connections_and_garbage_do_not_stall_the_store():
    port = free_port()
    secret = "s3cret"
    server = StoreGroup(rank=0, size=2, address=("127.0.0.1", port), secret=secret,
                        job="strays", timeout=20)
    hold = socket.create_connection(("127.0.0.1", port))     # connects, then says nothing
    socket.create_connection(("127.0.0.1", port)).close()    # a port scan
    with socket.create_connection(("127.0.0.1", port)) as garbage:
        garbage.sendall(b"GET / HTTP/1.0\r\n\r\n" * 100)
    with socket.create_connection(("127.0.0.1", port)) as huge:
        huge.recv(64)
        huge.sendall((1 << 31).to_bytes(4, "big"))          # announces 2 GiB
    t0 = time.monotonic()
    peer = {}
    thread = threading.Thread(target=lambda: peer.setdefault("out", StoreGroup(
        rank=1, size=2, address=("127.0.0.1", port), secret=secret, job="strays",
        timeout=20).allgather("one")))
    thread.start()
    assert server.allgather("zero") == ["zero", "one"]
    thread.join(20)
    took = time.monotonic() - t0
    assert peer["out"] == ["zero", "one"] and took < 10
    hold.close()
    print(f"\nstrays: the job met {took:.2f} s after its last rank began")


def test_a_pickle_sent_to_the_store_runs_nothing(tmp_path):
    port = free_port()
    StoreGroup(rank=0, size=2, address=("127.0.0.1", port), secret="k", job="pickle")
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    payload = pickle.dumps(("set", "key", Evil()))
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.recv(64)
        conn.sendall(len(payload).to_bytes(4, "big") + payload + b"\x00\x00\x00\x20" + b"x" * 32)
        try:
            conn.recv(64)
        except OSError:
            pass
    took = time.monotonic() - t0
    time.sleep(0.5)
    assert not marker.exists() and took < 10
    print(f"\na pickle: dropped {took:.2f} s after it was sent")


def test_a_rank_with_another_secret_is_refused_with_the_reason():
    port = free_port()
    StoreGroup(rank=0, size=2, address=("127.0.0.1", port), secret="right", job="secrets")
    t0 = time.monotonic()
    with pytest.raises(PydfcclError, match="refused this rank's secret"):
        StoreGroup(rank=1, size=2, address=("127.0.0.1", port), secret="wrong",
                   job="secrets", timeout=3).allgather(None)
    took = time.monotonic() - t0
    assert took < 10
    print(f"\nanother secret: refused in {took:.2f} s (its join timeout, 3 s)")


def test_another_jobs_rank_is_told_whose_store_it_reached():
    port = free_port()
    StoreGroup(rank=0, size=2, address=("127.0.0.1", port), secret="same", job="first")
    t0 = time.monotonic()
    with pytest.raises(PydfcclError, match="serves job 'first' of 2 ranks, not job 'second' "
                                           "of 3"):
        StoreGroup(rank=1, size=3, address=("127.0.0.1", port), secret="same",
                   job="second", timeout=3).allgather(None)
    took = time.monotonic() - t0
    assert took < 10
    print(f"\nanother job's rank: told in {took:.2f} s")


RANK_SCRIPT = """
import sys
from pydfccl.bootstrap.store import StoreGroup
try:
    print("got", StoreGroup().allgather(sys.argv[1]), flush=True)
except Exception as exc:
    print("error", exc, flush=True)
    sys.exit(1)
"""


def test_two_processes_as_one_rank_one_is_refused_and_the_job_meets(tmp_path):
    """Ranks started by hand with torchrun's variables and the generated secret (no
    PYDFCCL_SECRET), two of them as rank 1 (a second job started on the port while the
    first's ranks are still meeting, its secret file still there): whichever speaks second
    is refused naming the clash, and ranks 0, 1 and 2 meet, one process each."""
    import subprocess
    import sys

    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYDFCCL_SECRET", "PYDFCCL_JOB_ID")}
    env.update(WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYDFCCL_JOIN_TIMEOUT="60")

    def rank(r, name):
        return subprocess.Popen([sys.executable, str(script), name], env=dict(env, RANK=str(r)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    procs = {"zero": rank(0, "zero")}
    try:
        path = secret_path(f"port-{port}")
        deadline = time.monotonic() + 120
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.exists(path), procs["zero"].stderr.read()
        procs["one"], procs["other one"] = rank(1, "one"), rank(1, "other one")
        t0 = time.monotonic()
        while all(p.poll() is None for p in (procs["one"], procs["other one"])) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        took = time.monotonic() - t0
        procs["two"] = rank(2, "two")
        outs = {name: p.communicate(timeout=120) for name, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
    refused = [name for name in ("one", "other one") if procs[name].returncode == 1]
    assert len(refused) == 1, outs
    assert (f"another process already joined job 'port-{port}' as rank 1: two jobs on one "
            "port?") in outs[refused[0]][0], outs
    (member,) = {"one", "other one"} - set(refused)
    for name in ("zero", member, "two"):
        assert procs[name].returncode == 0, outs
        assert outs[name][0].strip() == f"got ['zero', '{member}', 'two']", outs
    print(f"\ntwo processes as rank 1: the second refused within {took:.2f} s of their start")


def test_a_rank_outside_the_job_is_refused():
    port = free_port()
    StoreGroup(rank=0, size=2, address=("127.0.0.1", port), secret="k", job="two")
    with pytest.raises(PydfcclError, match="rank 2 is not a rank of a job of 2"):
        StoreGroup(rank=2, size=2, address=("127.0.0.1", port), secret="k", job="two",
                   timeout=3).allgather(None)


def test_a_port_another_program_holds_is_named():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(PydfcclError, match=f"cannot serve the bootstrap store at "
                                               f"127.0.0.1:{port}"):
            StoreGroup(rank=0, size=2, address=("127.0.0.1", port), secret="x", job="held")
        took = time.monotonic() - t0
    assert took < 10
    print(f"\na held port: named in {took:.2f} s")


def test_ranks_across_hosts_need_a_secret(monkeypatch):
    monkeypatch.delenv("PYDFCCL_SECRET", raising=False)
    with pytest.raises(PydfcclError, match="set PYDFCCL_SECRET"):
        StoreGroup(rank=1, size=2, address=("10.11.12.13", 29500))


JOB = """
import os, sys, time
import numpy as np
import pydfccl

t0 = time.monotonic()
try:
    comm = pydfccl.Communicator.from_env()
except pydfccl.PydfcclError as exc:
    print(f"refused after {time.monotonic() - t0:.2f} s: {exc}", flush=True)
    sys.exit(1)
comm.prepare(0, "all_reduce", count=4, dtype="int64")
comm.start()
print("up", flush=True)
go = sys.argv[1]
deadline = time.monotonic() + 300
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.05)
x = comm.empty(4, "int64")
x[...] = comm.rank + 1
print("result", np.asarray(comm.run(0, x).result(timeout=120)).tolist(), flush=True)
comm.close()
"""


def test_a_second_job_on_the_same_port_fails_and_the_first_completes(tmp_path):
    """Two jobs started by hand with torchrun's variables and one MASTER_PORT, the second
    while the first runs: the second's rank 0 cannot serve the port, its rank 1 finds no
    store of its own (the first's secret is gone once its ranks joined), and the first job
    runs on unharmed."""
    import subprocess
    import sys

    script, go = tmp_path / "job.py", tmp_path / "go"
    script.write_text(JOB)
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "PYDFCCL_SECRET", "PYDFCCL_JOB_ID")}
    env.update(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYDFCCL_JOIN_TIMEOUT="5")

    def job():
        return [subprocess.Popen([sys.executable, str(script), str(go)],
                                 env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for r in range(2)]

    first = job()
    try:
        for p in first:
            line = p.stdout.readline()
            assert line == "up\n", line + p.stderr.read()[-3000:]
        second = job()
        outs = [p.communicate(timeout=120) for p in second]
        go.touch()
        done = [p.communicate(timeout=120) for p in first]
    finally:
        for p in first:
            p.kill()
    assert [p.returncode for p in second] == [1, 1], outs
    assert f"cannot serve the bootstrap store at 127.0.0.1:{port}" in outs[0][0], outs
    assert f"no store of job 'port-{port}' at 127.0.0.1:{port} (rank 0) within 5 s" \
        in outs[1][0], outs
    assert [p.returncode for p in first] == [0, 0], done
    assert all("result [3, 3, 3, 3]" in out for out, _ in done), done
    took = [float(out.split("refused after ")[1].split(" s")[0]) for out, _ in outs]
    assert took[0] < 120 and took[1] < 5 + 120, took      # from from_env(); loaded: 50 s
    print(f"\nsecond job: rank 0 refused in {took[0]:.2f} s, rank 1 in {took[1]:.2f} s "
          "(its join timeout, 5 s)")


def test_free_ports_are_outside_the_range_of_outgoing_connections():
    """A port from ``bind(0)`` is one the kernel also hands to client sockets, so another
    program's connection can take it before rank 0 binds it; ``free_port`` draws below."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(10000 <= p < low for p in ports), (sorted(ports), low)
    assert len(ports) > 1                      # drawn, not one fixed port
    port = ports.pop()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))            # still free


def test_rank_zero_waits_for_the_replies_the_store_owes():
    """Rank 0's last allgather returns only once the store has sent every reply it decided:
    a rank whose "read" mark was stored (waking rank 0) but whose reply was still on its
    way found rank 0 gone and retried against a closed port until its join timeout. A
    ``get`` that waits for its key owes nothing while it waits."""
    from pydfccl.bootstrap.store import StoreServer

    server = StoreServer(("127.0.0.1", 0), "job", 2, b"secret")
    try:
        ask = dict(job="job", size=2, rank=1, token="t")
        assert server._handle(dict(ask, op="set", key="1/read/1", value=True)) == \
            dict(found=True)
        waiter = threading.Thread(target=server.wait_for_replies, args=(60,))
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive()          # the reply is decided, not sent
        server._paid()                    # what _serve does once it is sent
        waiter.join(30)
        assert not waiter.is_alive() and server.owed == 0

        got = []
        getter = threading.Thread(target=lambda: got.append(
            server._handle(dict(ask, op="get", key="late", timeout=30))))
        getter.start()
        getter.join(0.3)
        assert getter.is_alive() and server.owed == 0    # waiting: owes nothing yet
        server._handle(dict(ask, op="set", key="late", value=5))
        getter.join(30)
        assert got == [dict(found=True, value=5)] and server.owed == 2
    finally:
        server.close()
