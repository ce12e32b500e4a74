"""The sweep's "HBM efficiency" table: each row of pydfccl's own kernels against a
device-to-device copy of the same size timed in the same run (GPU, every rank on it; the
bytes are ``pydfccl.cli.hbm``'s walk of the step plan). The platform and ``hbm`` (which
load Numba's CUDA target) are imported once the sweep has run, not with the command."""

from __future__ import annotations

from ..bootstrap.launch import default_backend
from ..host.world_config import WorldConfig
from ..protocol.codes import storage_dtype
from .sweep_measure import all_ranks_on_this_gpu
from .sweep_spec import SweepOptions

__all__ = ["HBM_MODES", "add_hbm", "format_hbm_table", "hbm_report"]

HBM_MODES = ("daemon", "launch", "nccl")    # pydfccl's kernels: the step plan hbm.py walks


def add_hbm(results: dict, opts: SweepOptions, copy_gbs: dict) -> list[dict]:
    """Add ``hbm_bytes`` (read plus written by all ranks per run), ``hbm_gbs``, ``copy_gbs``
    (``copy_gbs[size]``: the copy of the row's size) and ``hbm_pct_of_copy`` to each row of
    the modes in HBM_MODES; return those rows."""
    from . import hbm

    cfg = WorldConfig(opts.nranks, **opts.world)      # the sizes launch gives the ranks
    itemsize = storage_dtype(opts.dtype).itemsize
    counted, out = {}, []
    for mode in HBM_MODES:
        for r in results.get(mode, []):
            if r["count"] not in counted:
                counted[r["count"]] = hbm.hbm_bytes(opts.coll, opts.nranks, r["count"],
                                                    itemsize, root=opts.root,
                                                    nblocks=cfg.nblocks,
                                                    slot_bytes=cfg.slot_bytes)
            nbytes = counted[r["count"]]
            gbs = nbytes / (r["time_us"] * 1e-6) / 1e9
            copy = copy_gbs[r["size"]]
            r.update(hbm_bytes=nbytes, hbm_gbs=gbs, copy_gbs=copy,
                     hbm_pct_of_copy=100 * gbs / copy)
            out.append(r)
    return out


def format_hbm_table(rows: list[dict]) -> str:
    head = (f"{'mode':>8} {'size(B)':>12} {'time(us)':>10} {'HBM bytes':>14} "
            f"{'HBM GB/s':>10} {'copy GB/s':>10} {'% of copy':>10}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['mode']:>8} {r['size']:>12} {r['time_us']:>10.1f} "
                     f"{r['hbm_bytes']:>14} {r['hbm_gbs']:>10.1f} {r['copy_gbs']:>10.1f} "
                     f"{r['hbm_pct_of_copy']:>10.1f}")
    return "\n".join(lines)


def hbm_report(results: dict, opts: SweepOptions, backend: str | None) -> str:
    """The "HBM efficiency" table (adding its values to the rows), or the line that says
    why there is none: it needs a GPU, and every rank on it (the threads backend)."""
    from .. import platform
    from . import hbm

    if not platform.gpu_available():
        return "# HBM efficiency: needs a GPU (not measured on the CUDA simulator)"
    if not all_ranks_on_this_gpu(backend):
        return (f"# HBM efficiency: only with every rank on this one GPU (the threads "
                f"backend), not with the {backend or default_backend()} backend")
    if not any(results.get(mode) for mode in HBM_MODES):
        return "# HBM efficiency: no row of pydfccl's kernels to count"
    copy = hbm.copy_bandwidths({r["size"] for m in HBM_MODES for r in results.get(m, [])})
    rows = add_hbm(results, opts, copy)
    lines = [f"# HBM efficiency ({opts.coll}, {opts.nranks} ranks on this GPU): HBM bytes = "
             "read plus written in device memory by all ranks per run, as the step plan "
             "moves them (pydfccl.cli.hbm); copy = cuMemcpyDtoDAsync of the same size in this run, "
             "read plus written"]
    try:
        l2 = platform.device_attribute("L2_CACHE_SIZE")
        lines.append(f"# sizes near or under the L2 cache ({l2 / 2**20:.0f} MiB) need not "
                     "reach HBM")
    except Exception:     # only a note: the table stands without it
        pass
    return "\n".join(lines + [format_hbm_table(rows)])
