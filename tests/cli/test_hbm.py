"""pydfccl.cli.hbm: the device-memory bytes of a collective, walked from the step plan, and the
copy it is compared with (GPU only); the sweep's HBM efficiency table (issue #5)."""

import pytest

from pydfccl import cli, platform
from pydfccl.cli import hbm, sweep_hbm, sweep_measure, sweep_spec
from pydfccl.protocol.one_shot import one_shot
from pydfccl.kernels.primitives import F_RECV, F_SEND, F_USER_IN, F_USER_OUT

WORLDS = [(1, 16), (4, 256), (3, 64), (16, 1 << 20)]   # (nblocks, slot_bytes)


@pytest.mark.parametrize("nranks", range(1, 9))
def test_all_reduce_bytes_are_the_closed_form(nranks):
    # (6n-4)S over all ranks, for counts that split evenly into chunks and counts that do
    # not, one loop or many, one channel or several, and each item size
    for nblocks, slot_bytes in WORLDS:
        for count in (1, 7, 100, 1000, 12345):
            for itemsize in (1, 2, 4, 8):
                if slot_bytes < itemsize:
                    continue
                got = hbm.hbm_bytes("all_reduce", nranks, count, itemsize, nblocks=nblocks,
                                    slot_bytes=slot_bytes)
                if one_shot(count, itemsize, nranks, slot_bytes):
                    assert got == hbm.one_shot_hbm_bytes(count * itemsize, nranks)
                    assert got == nranks * (3 * nranks - 1) * count * itemsize
                else:
                    assert got == hbm.all_reduce_hbm_bytes(count * itemsize, nranks)
                    assert got == (6 * nranks - 4) * count * itemsize


def test_all_reduce_per_rank_is_the_step_sum_when_chunks_are_even():
    # n=4, S = 4 chunks of one slot each, one loop: 2 + 3*(n-2) + 4 + 3*(n-2) + 2 chunks
    # per rank, read and written as hbm.rank_traffic counts them
    n, slot = 4, 256
    count = n * slot // 4
    chunk = slot
    for rank in range(n):
        reads, writes = hbm.rank_traffic("all_reduce", rank, n, count, 4, nblocks=1,
                                         slot_bytes=slot)
        # reads: step 0 the input; n-2 middle steps slot and input; step n-1 slot and
        # input; the n-1 all-gather steps the slot
        assert reads == chunk * (1 + 2 * (n - 2) + 2 + (n - 1))
        # writes: step 0 the next slot; n-2 middle steps the next slot; step n-1 output and
        # next slot; n-2 middle all-gather steps output and next slot; the last the output
        assert writes == chunk * (1 + (n - 2) + 2 + 2 * (n - 2) + 1)
        assert reads + writes == (6 * n - 4) * count * 4 // n


@pytest.mark.parametrize("n", [2, 3, 8])
def test_one_shot_rank_reads_its_input_per_peer_then_every_input(n):
    count = 5                               # 20 bytes: one-shot in any of these worlds
    size = count * 4
    for rank in range(n):
        reads, writes = hbm.rank_traffic("all_reduce", rank, n, count, 4, nblocks=2,
                                         slot_bytes=1024)
        assert reads == (n - 1) * size + n * size     # the send to n-1 lanes, the reduce
        assert writes == (n - 1) * size + size        # n-1 lanes, the output


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                  "reduce", "all_to_all"])
def test_walking_two_loops_per_channel_equals_walking_all(kind):
    for nranks in (1, 2, 3, 5):
        for count in (1, 50, 333):
            for nblocks, slot_bytes in ((1, 16), (3, 32), (2, 64)):
                for rank in range(nranks):
                    args = (kind, rank, nranks, count, 4)
                    kw = dict(root=nranks - 1, nblocks=nblocks, slot_bytes=slot_bytes)
                    assert (hbm.rank_traffic(*args, **kw)
                            == hbm.rank_traffic(*args, every_loop=True, **kw))


# size = the larger buffer (as nccl-tests and the sweep print it); bytes over all ranks
CLOSED_FORMS = {
    # step 0 copies its block out and sends it (3 chunks), n-2 recvCopySend (3), a recv (2)
    "all_gather": lambda n, c: n * (3 * n - 1) * c,
    # a send (2), n-2 recvReduceSend (3), recvReduceCopy (3)
    "reduce_scatter": lambda n, c: n * (3 * n - 1) * c,
    # a chain: the root copies and sends (3), n-2 middle ranks (3), the last receives (2)
    "broadcast": lambda n, c: (3 * n - 1) * c,
    "reduce": lambda n, c: (3 * n - 1) * c,
    # its own block copied (2), n-1 sends (2) and n-1 receives (2) of a block each
    "all_to_all": lambda n, c: n * (4 * n - 2) * c,
}


@pytest.mark.parametrize("kind", sorted(CLOSED_FORMS))
def test_other_kinds_count_each_chunk_they_move(kind):
    for nranks in range(1, 9):
        for count in (1, 100, 999):
            for nblocks, slot_bytes in ((1, 16), (4, 64)):
                for root in {0, nranks - 1}:
                    got = hbm.hbm_bytes(kind, nranks, count, 4, root=root, nblocks=nblocks,
                                        slot_bytes=slot_bytes)
                    assert got == CLOSED_FORMS[kind](nranks, count * 4) > 0
    assert hbm.hbm_bytes(kind, 1, 10, 4) == 2 * 40          # one rank: a copy


def test_point_to_point_counts_one_rank():
    with pytest.raises(ValueError, match="rank_traffic"):
        hbm.hbm_bytes("send", 2, 10)
    assert hbm.rank_traffic("send", 0, 2, 10, 4, root=1, nblocks=1, slot_bytes=16) == (40, 40)
    assert hbm.rank_traffic("recv", 1, 2, 10, 4, root=0, nblocks=1, slot_bytes=16) == (40, 40)


def test_host_function_calls_python_bodies_not_dispatchers():
    from pydfccl.kernels import plans

    plan_step = hbm.host_function(plans.plan_step)
    # all_reduce, rank 0 of 4, step 0: a send of chunk 3 (input read, next slot written)
    flags, first, _, n = plan_step(plans.KIND_ALL_REDUCE, 0, 4, 0, 100, 0, 100, 0, 0, 10)
    assert flags & (F_USER_IN | F_SEND) == F_USER_IN | F_SEND
    assert not flags & (F_RECV | F_USER_OUT)
    assert (first, n) == (30, 10)
    assert hbm.host_function(plans.plan_step) is plan_step      # made once


def test_copy_measurement_is_none_without_a_gpu():
    if platform.gpu_available():
        pytest.skip("a GPU: the copy is measured (the tests above check the CPU path)")
    assert hbm.copy_bandwidth(1 << 20) is None
    assert hbm.copy_bandwidths([8, 1 << 20]) is None


def _rows(mode, sizes_us):
    return [dict(mode=mode, size=size, count=size // 4, time_us=us) for size, us in sizes_us]


def test_hbm_report_on_a_gpu_adds_the_table_and_the_keys(monkeypatch):
    # what main() prints on a GPU, with the copy's figures given (the CPU cannot time one)
    monkeypatch.setattr(platform, "gpu_available", lambda: True)
    monkeypatch.setattr(sweep_measure, "on_gpu", lambda: True)
    monkeypatch.setattr(hbm, "copy_bandwidths", lambda sizes: {s: 3000.0 for s in sizes})
    opts = sweep_spec.SweepOptions(nranks=4, world=dict(nblocks=16, slot_bytes=1 << 20))
    big = 256 << 20
    results = {"daemon": _rows("daemon", [(1 << 20, 2000.0), (big, 3107.8)]),
               "NCCL": _rows("NCCL", [(big, 1000.0)])}      # torch's: not our algorithm
    text = sweep_hbm.hbm_report(results, opts, "threads")
    assert "HBM efficiency" in text and "% of copy" in text and "copy GB/s" in text
    r = results["daemon"][1]
    assert r["hbm_bytes"] == 20 * big                   # (6n-4)S, n = 4
    assert r["hbm_gbs"] == pytest.approx(20 * big / 3107.8e-6 / 1e9)     # about 1727
    assert r["copy_gbs"] == 3000.0
    assert r["hbm_pct_of_copy"] == pytest.approx(100 * r["hbm_gbs"] / 3000.0)
    assert f"{r['hbm_bytes']:>14}" in text and f"{r['hbm_pct_of_copy']:.1f}" in text
    assert "hbm_bytes" not in results["NCCL"][0]
    # ranks on several GPUs (processes): the bytes are not one GPU's, so no table
    text = sweep_hbm.hbm_report({"daemon": _rows("daemon", [(64, 10.0)])}, opts, "processes")
    assert "only with every rank on this one GPU" in text and "% of copy" not in text


def test_hbm_report_without_a_gpu_says_it_needs_one():
    if platform.gpu_available():
        pytest.skip("a GPU")
    rows = _rows("daemon", [(64, 10.0)])
    text = sweep_hbm.hbm_report({"daemon": rows}, sweep_spec.SweepOptions(), None)
    assert text == "# HBM efficiency: needs a GPU (not measured on the CUDA simulator)"
    assert "hbm_bytes" not in rows[0]


def test_bench_on_the_simulator_says_the_hbm_table_needs_a_gpu(tmp_path, capsys):
    import json

    out_json = tmp_path / "b.json"
    argv = ["bench", "--nranks", "2", "-b", "8", "-e", "64", "-n", "1", "-w", "0",
            "--baseline", "none", "--json", str(out_json)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "busbw(GB/s)" in out                           # the main table is still there
    assert "# HBM efficiency: needs a GPU" in out
    rows = json.loads(out_json.read_text())["rows"]
    assert [r["size"] for r in rows] == [8, 16, 32, 64] and all(r["wrong"] == 0 for r in rows)
    assert not any("hbm_bytes" in r for r in rows)        # nothing measured, nothing claimed
    assert cli.main(argv[:-2] + ["--no-hbm"]) == 0
    assert "HBM efficiency" not in capsys.readouterr().out
