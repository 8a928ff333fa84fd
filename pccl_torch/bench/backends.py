"""What pccl-bench measures: pccl (one algorithm, every algorithm, or its own choice; exact, or with a
compressed wire format: ``pccl+int8``, ``pccl:hier:mpi+bf16``) and the baselines, each called directly: on host
tensors torch.distributed's gloo and the MPI library's native collective, on CUDA tensors torch.distributed's
NCCL."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import pccl_torch as pc
from pccl_torch import compression
from pccl_torch.algorithms import COLLECTIVES

DEVICE_BASELINES: dict[str, tuple[str, ...]] = {"cpu": ("gloo", "mpi"), "cuda": ("nccl",)}
"""The baselines each device's tensors run: gloo and MPI's own on host memory; NCCL on CUDA (the MPI baseline
hands host buffers to mpi4py; pccl's CUDA communicator's torch.distributed world is NCCL)."""
BASELINES = tuple(dict.fromkeys(b for names in DEVICE_BASELINES.values() for b in names))
DEFAULT_BACKENDS = {"cpu": "pccl,gloo,mpi", "cuda": "pccl,nccl"}


@dataclass(frozen=True, slots=True)
class Backend:
    """One measured column: ``name`` is pccl, gloo or mpi; ``algorithm`` the pccl name (None = auto);
    ``compression`` pccl's wire format (None = exact)."""

    name: str
    algorithm: str | None = None
    compression: str | None = None

    @property
    def label(self) -> str:
        if self.name != "pccl":
            return self.name
        base = f"pccl:{self.algorithm}" if self.algorithm else "pccl"
        return f"{base}+{self.compression}" if self.compression else base

    @property
    def auto(self) -> bool:
        """pccl's own exact choice (the column compared with the baselines and the fixed algorithms)."""
        return self.name == "pccl" and self.algorithm is None and self.compression is None


def validate_backends(text: str, collectives: tuple[str, ...], device: str = "cpu") -> None:
    """Fail before any launch if a backend is malformed, a baseline does not run on ``device`` tensors or an
    algorithm exists for none of ``collectives``."""
    for collective in collectives:
        parse_backends(text, collective, skip_foreign=True, device=device)
    for item in filter(None, (part.strip() for part in text.split(","))):
        item, _ = _split_compression(item)
        name, _, algorithm = item.partition(":")
        if name == "pccl" and algorithm not in ("", "all") and not any(
                algorithm in pc.algorithms(c) for c in collectives):
            raise ValueError(f"pccl algorithm {algorithm!r} exists for none of {', '.join(collectives)}; valid: "
                             + "; ".join(f"{c}: {', '.join(pc.algorithms(c))}" for c in collectives))


def _split_compression(item: str) -> tuple[str, str | None]:
    """``pccl:hier:mpi+int8`` -> (``pccl:hier:mpi``, ``int8``); an unknown format raises."""
    base, plus, fmt = item.rpartition("+")
    if not plus:
        return item, None
    compression.get(fmt)
    if not base.startswith("pccl"):
        raise ValueError(f"backend {item!r}: only pccl compresses (pccl+{fmt}, pccl:<algorithm>+{fmt})")
    return base, fmt


def parse_backends(text: str, collective: str, *, skip_foreign: bool = False, device: str = "cpu",
                   dtype: torch.dtype = torch.float32) -> list[Backend]:
    """``pccl,gloo,mpi``, ``pccl:ring``, ``pccl:all`` (every distinct algorithm of ``collective`` that runs
    on ``device`` tensors), each pccl entry optionally with a wire format (``pccl+bf16``).

    With ``skip_foreign``, ``pccl:<algorithm>`` entries that belong to another collective (``bruck`` for
    an all-reduce) are left out instead of rejected, and so are wire formats that do not apply to ``dtype``.
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")
    backends: list[Backend] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        item, fmt = _split_compression(item)
        if fmt is not None and not compression.get(fmt).applies_to(dtype):
            if skip_foreign:
                continue
            compression.get(fmt).check_dtype(dtype)
        name, _, algorithm = item.partition(":")
        if name in BASELINES and not algorithm:
            if name not in DEVICE_BASELINES[device]:
                raise ValueError(f"baseline {name!r} does not run on {device} tensors; there: "
                                 f"{', '.join(DEVICE_BASELINES[device])}")
            backends.append(Backend(name))
        elif name == "pccl" and algorithm == "all":
            backends.extend(Backend("pccl", a, fmt) for a in pc.algorithms(collective, device))
        elif name == "pccl":
            if algorithm and algorithm not in pc.algorithms(collective):
                if skip_foreign and any(algorithm in pc.algorithms(c) for c in COLLECTIVES):
                    continue
                raise ValueError(f"unknown {collective} algorithm {algorithm!r}; valid: "
                                 f"{', '.join(pc.algorithms(collective))}")
            backends.append(Backend("pccl", algorithm or None, fmt))
        else:
            raise ValueError(f"unknown backend {item!r}: expected pccl, pccl:<algorithm>, pccl:all (each optionally "
                             f"+<format>: {', '.join(compression.NAMES)}), {', '.join(BASELINES)}")
    seen: dict[str, Backend] = {b.label: b for b in backends}  # drop repeats, keep order
    return list(seen.values())


def make_call(backend: Backend, collective: str, comm: pc.Communicator,
              output: torch.Tensor, inp: torch.Tensor) -> Callable[[], None]:
    """A zero-argument call running ``collective`` once with ``backend`` (SUM for reductions).

    For all-reduce, ``output`` is the buffer (reduced in place) and ``inp`` is ignored; for all-to-all, both
    hold one block per rank, equal blocks (``all_to_all_single`` without split sizes). The baselines
    call the libraries directly (torch.distributed on the world group, mpi4py on a world communicator),
    bypassing pccl's dispatch (``nccl``: the world group of pccl's CUDA communicator). The MPI baseline is the
    blocking call a user makes (``comm.Allreduce``, where
    MPICH's ``MPIR_CVAR_*_COMPOSITION`` settings apply), for the dtypes MPI reduces (an all-to-all reduces
    nothing: every dtype, as bytes); others go through pccl's MPI transport (non-blocking, host-typed).
    """
    if backend.name == "pccl":
        algo, wire = backend.algorithm, backend.compression
        if collective == "all_gather":
            return lambda: pc.all_gather_into_tensor(output, inp, algorithm=algo, comm=comm, compression=wire)
        if collective == "reduce_scatter":
            return lambda: pc.reduce_scatter_tensor(output, inp, algorithm=algo, comm=comm, compression=wire)
        if collective == "all_to_all":
            return lambda: pc.all_to_all_single(output, inp, algorithm=algo, comm=comm, compression=wire)
        return lambda: pc.all_reduce(output, algorithm=algo, comm=comm, compression=wire)
    if backend.name == "mpi" and (output.dtype in _NUMPY_REDUCIBLE or collective == "all_to_all"):
        return _blocking_mpi_call(collective, comm.world.comm, output, inp)
    library = comm.world if backend.name == "mpi" else comm.vendor
    if collective == "all_gather":
        return lambda: library.native_all_gather(output, inp)
    if collective == "reduce_scatter":
        return lambda: library.native_reduce_scatter(output, inp, pc.ReduceOp.SUM)
    if collective == "all_to_all":  # torch's all_to_all_single on the group (alltoall_base), equal blocks
        counts = [inp.numel() // library.size] * library.size
        return lambda: library.native_all_to_all(output, inp, counts, counts)
    return lambda: library.native_all_reduce(output, pc.ReduceOp.SUM)


_NUMPY_REDUCIBLE = (torch.float32, torch.float64, torch.int32, torch.int64)


def _blocking_mpi_call(collective: str, mpi_comm, output: torch.Tensor, inp: torch.Tensor) -> Callable[[], None]:
    """mpi4py's blocking collective on NumPy views of the (CPU) buffers, as a user would call it; the
    all-to-all (``Alltoall``, equal blocks) on byte views, so that every dtype goes (bfloat16 has no NumPy
    type), with MPICH's choice of schedule unchanged (it goes by bytes per block)."""
    from mpi4py import MPI

    if collective == "all_to_all":
        send, recv = inp.view(torch.uint8).numpy(), output.view(torch.uint8).numpy()
        return lambda: mpi_comm.Alltoall(send, recv)
    out, src = output.numpy(), inp.numpy()
    if collective == "all_gather":
        return lambda: mpi_comm.Allgather(src, out)
    if collective == "reduce_scatter":
        return lambda: mpi_comm.Reduce_scatter_block(src, out, op=MPI.SUM)
    return lambda: mpi_comm.Allreduce(MPI.IN_PLACE, out, op=MPI.SUM)
