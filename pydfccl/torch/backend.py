"""The "dfccl" torch.distributed backend: ``init_process_group(backend="dfccl")``,
``new_group(..., backend="dfccl")``, and ``"cpu:gloo,cuda:dfccl"``.

torch (up to its newer Python backend base class) lets a Python backend only be a whole
``ProcessGroup``. So that torch sees it as it sees its own backends, the group answers what
torch asks a group of them: its devices (``_device_types``), the backend of a device
(``_get_backend``: this group, or the gloo backend of a mixed string), its name and
description (which functional collectives, DTensor and FSDP2 resolve it by), the device it
is bound to (``device_id``), and what it supports. Collectives on a device that a mixed
string gives to gloo go to gloo; CPU tensors on a GPU machine (torch's object collectives)
are staged through the GPU.

torch hands the backend's creator a c10d Store; ``C10dStoreGroup`` (``bootstrap/c10d.py``)
makes it the process group that pydfccl's bootstrap needs, so each torch process group gets
its own pydfccl world and daemon. Without a GPU the ranks run the CUDA simulator.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from concurrent.futures import Future
from datetime import timedelta

import torch
import torch.distributed as dist

from ..bootstrap.c10d import C10dStoreGroup
from ..sched.choice import policy_from_env
from .collectives import CollectivesMixin
from .group import TorchGroup, _simulated
from .work import Work

__all__ = ["C10dStoreGroup", "ProcessGroupDfccl", "register", "status_report", "stats",
           "BACKEND_NAME", "comm_options"]

BACKEND_NAME = "dfccl"
_live = weakref.WeakSet()     # this process's dfccl process groups, for status_report()

# A torch job makes several process groups (the default one, tensor- and data-parallel
# ones, ...), each a communicator with a daemon of its own on the rank's GPU. Each daemon
# takes a quarter of the rank's share of the GPU's resident blocks, so that the daemons of
# four groups on every rank fit at once beside torch's own kernels.
DAEMONS_PER_RANK = 4

# torch's name of each collective -> this class's implementation (collectives.py)
_METHODS = {
    "allreduce": "_allreduce", "allreduce_coalesced": "_allreduce_coalesced",
    "all_gather_single": "_all_gather_single", "_allgather_base": "_all_gather_single",
    "allgather": "_allgather", "allgather_coalesced": "_allgather_coalesced",
    "allgather_into_tensor_coalesced": "_allgather_into_tensor_coalesced",
    "all_gather_single_coalesced": "_allgather_into_tensor_coalesced",
    "reduce_scatter_single": "_reduce_scatter_single",
    "_reduce_scatter_base": "_reduce_scatter_single", "reduce_scatter": "_reduce_scatter",
    "reduce_scatter_tensor_coalesced": "_reduce_scatter_tensor_coalesced",
    "reduce_scatter_single_coalesced": "_reduce_scatter_tensor_coalesced",
    "broadcast": "_broadcast", "reduce": "_reduce", "gather": "_gather", "scatter": "_scatter",
    "alltoall": "_alltoall", "all_to_all_single": "_all_to_all_single",
    "alltoall_base": "_all_to_all_single", "send": "_send", "recv": "_recv",
    "recv_anysource": "_recv_anysource", "barrier": "_barrier",
}


def comm_options() -> dict:
    """Options of a torch group's communicator: the policy of ``PYDFCCL_POLICY`` and
    ``PYDFCCL_PARAMS`` (``dfccl`` by default), room for 64 signatures (and transfer
    places; each costs a connector set), under the simulator 4 KiB slots (fewer simulated
    steps per collective), and daemons sized for DAEMONS_PER_RANK groups a rank.
    ``PYDFCCL_TORCH_MAX_COLLS``, ``PYDFCCL_TORCH_SLOT_BYTES`` and ``PYDFCCL_TORCH_NBLOCKS``
    (a rank's daemon blocks) change them."""
    from ..platform import backend

    options = dict(max_colls=int(os.environ.get("PYDFCCL_TORCH_MAX_COLLS", "64")),
                   daemons_per_rank=DAEMONS_PER_RANK, policy=policy_from_env())
    slot = os.environ.get("PYDFCCL_TORCH_SLOT_BYTES", "4096" if backend.kernels_on_host else "")
    if slot:
        options["slot_bytes"] = int(slot)
    nblocks = os.environ.get("PYDFCCL_TORCH_NBLOCKS", "")
    if nblocks:
        options["nblocks"] = int(nblocks)
    return options


def shared_slots_mode() -> bool | str:
    """``start(share_slots=...)`` of a torch group's communicator, from
    ``PYDFCCL_TORCH_SHARED_SLOTS``: ``overflow`` (the default: a signature keeps a slot of
    its own while one is left, and those beyond share the last few, so a program with ever
    new shapes never runs out), ``1`` (every signature shares the slots) or ``0`` (slots of
    their own only: the group fails at its ``PYDFCCL_TORCH_MAX_COLLS``-th signature)."""
    value = os.environ.get("PYDFCCL_TORCH_SHARED_SLOTS", "overflow")
    modes = {"overflow": "overflow", "1": True, "0": False}
    if value not in modes:
        raise ValueError(f"PYDFCCL_TORCH_SHARED_SLOTS={value!r}: use one of "
                         f"{', '.join(modes)}")
    return modes[value]


def _creation_context() -> tuple[dict, torch.device | None]:
    """What torch's ``_new_process_group_helper`` (the caller of the backend's creator)
    knows and does not pass on: the device -> backend map of the backend string, and
    ``device_id``. Empty when the creator is called some other way."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_new_process_group_helper":
            config = frame.f_locals.get("backend_config")
            devices = dict(config.get_device_backend_map()) if config is not None else {}
            return devices, frame.f_locals.get("device_id")
        frame = frame.f_back
    return {}, None


def _tensors_in(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors_in(item)


def _map_tensors(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(item, fn) for item in obj)
    return obj


class ProcessGroupDfccl(CollectivesMixin, dist.ProcessGroup):
    """A torch process group whose collectives run on a pydfccl communicator (see
    docs/torch.md for what it supports)."""

    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False

    def __init__(self, store, rank: int, size: int, timeout: timedelta | None = None,
                 devices: dict | None = None, device_id=None, **options):
        super().__init__(rank, size)
        from ..bootstrap.mpi import communicator_from_group

        timeout = timeout if timeout is not None else dist.default_pg_timeout
        self._timeout = timeout
        devices = devices or {"cpu": BACKEND_NAME, "cuda": BACKEND_NAME}
        self._devices = [torch.device(d) for d in devices]
        self._delegates = {d: self._other_backend(b, d, store, rank, size, timeout)
                           for d, b in devices.items() if b.lower() != BACKEND_NAME}
        options = {**comm_options(), **options}
        # A collective some rank has not issued yet is late, not deadlocked: it fails the
        # group at the group's timeout, as torch's own backends do; a proven deadlock (a
        # wait-for cycle no preemption can break) is reported at pydfccl's watchdog.
        comm = communicator_from_group(C10dStoreGroup(store, rank, size, timeout),
                                       timeout=timeout.total_seconds(), **options)
        comm.start(share_slots=shared_slots_mode())
        self.dfccl_group = TorchGroup(comm, timeout=timeout.total_seconds())
        self._rank, self._size = rank, size
        self._group_name = self._group_desc = ""
        if device_id is not None:
            self.bound_device_id = device_id
        _live.add(self)

    @staticmethod
    def _other_backend(name, device, store, rank, size, timeout):
        if name.lower() != "gloo":
            raise ValueError(f"pydfccl.torch: a dfccl group shares its devices only with "
                             f"gloo, not {name!r} (for {device})")
        return dist.ProcessGroupGloo(dist.PrefixStore(f"gloo-{device}/", store), rank, size,
                                     timeout)

    # -- what torch asks a process group about its backends ---------------------------------
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def getGroupName(self) -> str:
        if not self._group_name:
            raise RuntimeError("ProcessGroup name not set")
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def _set_group_name(self, name: str) -> None:
        self.setGroupName(name)

    def _set_group_desc(self, desc: str) -> None:
        self.setGroupDesc(desc)

    @property
    def group_name(self) -> str:
        return self.getGroupName()

    @property
    def group_desc(self) -> str:
        return self._group_desc

    @property
    def _device_types(self) -> list:
        return list(self._devices)

    def _get_backend(self, device):
        kind = torch.device(device).type if not isinstance(device, torch.device) else \
            device.type
        if kind in self._delegates:
            return self._delegates[kind]
        if any(d.type == kind for d in self._devices):
            return self
        raise RuntimeError(f"No backend type associated with device type {kind}: this dfccl "
                           f"group serves {[d.type for d in self._devices]}")

    def supports_tensor_alloc(self, device) -> bool:
        return False

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout
        self.dfccl_group.timeout = timeout.total_seconds()

    @property
    def comm(self):
        return self.dfccl_group.comm

    def _comm_device(self):
        if _simulated() or not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", torch.cuda.current_device())

    def _staged(self, impl, args, kwargs):
        """CPU tensors on a GPU machine (torch's object collectives use them): copied to
        the GPU and run there; the Work completes once the results are copied back (by a
        thread of its own: the call returns at once, as with CUDA tensors). Its result is
        the first argument's tensors, as torch's backends give (not the options: DDP's
        reducer takes a result apart by pickling it). A failed run leaves NaN in the float
        outputs, as a failed run does in any host-memory recv buffer (``host.poison``)."""
        device, pairs = self._comm_device(), []

        def stage(t):
            on_gpu = t.to(device).contiguous()
            pairs.append((t, on_gpu))
            return on_gpu

        run = getattr(self, impl)(*_map_tensors(args, stage), **kwargs)
        outputs = list(_tensors_in(args[:1]))
        done = Future()

        def copy_back():
            try:
                run.wait()
                for cpu, gpu in pairs:
                    if cpu.data_ptr() != gpu.data_ptr():
                        cpu.copy_(gpu)
            except BaseException as exc:     # the run's error is the Work's
                _poison(outputs)
                done.set_exception(exc)
            else:
                done.set_result(outputs)

        threading.Thread(target=copy_back, name="pydfccl-torch-staged", daemon=True).start()
        return Work(done, outputs, timeout=run.timeout, rank=self._rank, what=run.what,
                    on_group_timeout=run.on_group_timeout)

    def shutdown(self) -> None:
        self.dfccl_group.close()
        for backend in self._delegates.values():
            getattr(backend, "shutdown", lambda: None)()

    def abort(self) -> None:
        self.shutdown()

    def __repr__(self):
        return f"ProcessGroupDfccl(rank={self._rank}, size={self._size})"


def _poison(tensors) -> None:
    """NaN in the float CPU tensors of a failed staged run: the GPU copy never came back,
    and the input they still hold must not pass for a result."""
    with torch.no_grad():
        for t in tensors:
            if t.is_floating_point() or t.is_complex():
                t.fill_(float("nan"))


def _routed(name: str, impl: str):
    """torch's ``name``: to the gloo backend of the tensors' device in a mixed group, staged
    through the GPU for CPU tensors on a GPU machine, else ``impl`` on pydfccl."""

    def method(self, *args, **kwargs):
        tensors = list(_tensors_in(args))
        kind = tensors[0].device.type if tensors else None
        if kind in self._delegates:
            return getattr(self._delegates[kind], name)(*args, **kwargs)
        if not _simulated() and any(not t.is_cuda for t in tensors):
            return self._staged(impl, args, kwargs)
        return getattr(self, impl)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"torch's ``{name}`` on pydfccl."
    return method


for _name, _impl in _METHODS.items():
    setattr(ProcessGroupDfccl, _name, _routed(_name, _impl))


def status_report() -> str:
    """What every dfccl process group of this process is doing, one line per rank of each
    (``Communicator.status()`` made readable): for a job that seems stuck, the collective
    each rank's daemon is on and whom it waits for."""
    from ..host.watchdog import format_status

    parts = []
    for pg in sorted(_live, key=id):
        comm = pg.comm
        parts.append(f"dfccl group of {comm.nranks} ranks (this process is its rank "
                     f"{comm.rank}):\n" + format_status(comm.status()))
    return "\n".join(parts) or "no dfccl process group in this process"


def stats() -> list[dict]:
    """``Communicator.stats()`` of every dfccl process group of this process (its rank in
    each): collectives completed, preemptions, relaunches of its daemon, ..."""
    return [pg.comm.stats() for pg in sorted(_live, key=id)]


def _create(store, rank, size, timeout):
    devices, device_id = _creation_context()
    return ProcessGroupDfccl(store, rank, size, timeout, devices=devices or None,
                             device_id=device_id)


def register() -> None:
    """Make backend "dfccl" known to torch.distributed (importing pydfccl.torch does it)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
