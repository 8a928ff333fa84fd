"""Host staging (``pccl_torch.transport.staging``) under ``mpiexec -n N``. On CPU (the default) every MPI
transport of the communicator sends its host tensors through the staging schedule a CUDA tensor takes without
CUDA-aware MPI (``MPITransport.stage_host_tensors``); with ``--device cuda`` (the GPU check) CUDA tensors take it
for real, and the side streams must wait for the caller's stream (a slow kernel writes each input just before the
call, on the default stream and on a stream of the caller's own). Messages are cut into many chunks (64 bytes),
and every result is compared with a reference built from each rank's contribution: the transport's native
collectives and point-to-point calls directly, then the public collectives through algorithms that use them.

Contributions are small integers, exact in every dtype here, so the reductions do not depend on MPI's order.
Every rank writes its failures (``rank_result.write``); ``test_staging.py`` checks every rank.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from mpi4py import MPI

import pccl_torch as pc
from pccl_torch.ops import ReduceOp
from pccl_torch.transport.mpi import MPITransport

from rank_result import Checks, write

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64)
SIZES = (0, 1, 7, 1000, 4099)
"""Elements a rank contributes (all-gather input, reduce-scatter output, all-to-all block; all-reduce: the
whole buffer)."""
CHUNK_BYTES = 64


DEVICE = torch.device("cpu")
"""Where the driver's tensors live (``--device``)."""
SLOW_KERNEL_CYCLES = 20_000_000
"""A GPU kernel of about 10 ms that runs before the last write of an input (``late``)."""


def values(rank: int, numel: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s contribution on the host (what the references are built from)."""
    return ((torch.arange(numel) % 7) + 1 + rank + salt).to(dtype)


def contribution(rank: int, numel: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input, on :data:`DEVICE`; on CUDA written last by a kernel queued behind a slow one, so a
    staging that does not wait for the caller's stream reads zeros."""
    host = values(rank, numel, dtype, salt)
    if DEVICE.type != "cuda":
        return host
    tensor = torch.zeros(numel, dtype=dtype, device=DEVICE)
    torch.cuda._sleep(SLOW_KERNEL_CYCLES)
    tensor.add_(host.to(DEVICE))
    return tensor


def exact(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got, want = got.cpu(), want.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{tuple(got.shape)}"
    assert torch.equal(got, want), f"{what}: got {got[:8].tolist()} want {want[:8].tolist()}"


def empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(numel, dtype=dtype, device=DEVICE)


def native_collectives(t: MPITransport, dtype: torch.dtype, n: int) -> None:
    """The transport's native all-gather, reduce-scatter, all-reduce and all-to-all (equal and uneven); every
    collective runs before any result is compared, so a wrong result on one rank fails it without a hang."""
    rank, world = t.rank, t.size
    mine = contribution(rank, n, dtype)
    kept = mine.clone()
    gathered = empty(world * n, dtype)
    t.native_all_gather(gathered, mine)
    blocks = torch.cat([contribution(rank, n, dtype, salt=b) for b in range(world)])
    scattered = empty(n, dtype)
    t.native_reduce_scatter(scattered, blocks, ReduceOp.SUM)
    buf = contribution(rank, n, dtype)
    t.native_all_reduce(buf, ReduceOp.MAX)
    exchanged = empty(world * n, dtype)
    t.native_all_to_all(exchanged, blocks, [n] * world, [n] * world)
    # Uneven: rank r sends (r + j) % 3 * n elements to rank j.
    sends = [(rank + j) % 3 * n for j in range(world)]
    receives = [(i + rank) % 3 * n for i in range(world)]
    source = torch.cat([contribution(rank, c, dtype, salt=j) for j, c in enumerate(sends)])
    target = empty(sum(receives), dtype)
    t.native_all_to_all(target, source, sends, receives)
    exact(gathered, torch.cat([values(r, n, dtype) for r in range(world)]), "all-gather")
    exact(scattered, sum(values(r, n, torch.int64, salt=rank) for r in range(world)).to(dtype),
          "reduce-scatter")
    exact(buf, values(world - 1, n, dtype), "all-reduce max")
    exact(exchanged, torch.cat([values(r, n, dtype, salt=rank) for r in range(world)]), "all-to-all")
    exact(target, torch.cat([values(i, c, dtype, salt=rank) for i, c in enumerate(receives)]),
          "uneven all-to-all")
    exact(mine, kept, "input left as it was")


def point_to_point(t: MPITransport, dtype: torch.dtype, n: int) -> None:
    """A ring of sendrecv, then send/recv between pairs."""
    rank, world = t.rank, t.size
    right, left = (rank + 1) % world, (rank - 1) % world
    got = empty(n, dtype)
    t.sendrecv(contribution(rank, n, dtype), right, got, left)
    received = empty(n, dtype)
    if world % 2 == 0:
        if rank % 2 == 0:
            t.send(contribution(rank, n, dtype), rank + 1)
        else:
            t.recv(received, rank - 1)
    exact(got, values(left, n, dtype), "sendrecv")
    if world % 2 == 0 and rank % 2:
        exact(received, values(rank - 1, n, dtype), "recv")


def public_collectives(comm, algorithm: str, dtype: torch.dtype, n: int) -> None:
    """The public all-gather, reduce-scatter and all-reduce under ``algorithm`` (compared after all three)."""
    rank, world = comm.topology.rank, comm.topology.world_size
    gathered = empty(world * n, dtype)
    pc.all_gather_into_tensor(gathered, contribution(rank, n, dtype), algorithm=algorithm, comm=comm)
    blocks = torch.cat([contribution(rank, n, dtype, salt=b) for b in range(world)])
    out = empty(n, dtype)
    pc.reduce_scatter_tensor(out, blocks, algorithm=algorithm, comm=comm)
    buf = contribution(rank, world * n, dtype)
    pc.all_reduce(buf, algorithm=algorithm, comm=comm)
    exact(gathered, torch.cat([values(r, n, dtype) for r in range(world)]), f"all-gather {algorithm}")
    exact(out, sum(values(r, n, torch.int64, salt=rank) for r in range(world)).to(dtype),
          f"reduce-scatter {algorithm}")
    exact(buf, sum(values(r, world * n, torch.int64) for r in range(world)).to(dtype),
          f"all-reduce {algorithm}")


def main() -> None:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--json", help="rank 0 writes every rank's checks here; the launch exits 1 on a failure "
                                       "(the GPU check's staging-cuda section)")
    args = parser.parse_args()
    DEVICE = torch.device(args.device)
    started = time.perf_counter()
    comm = pc.init(device=DEVICE.type)
    DEVICE = comm.device
    checks = Checks(frames=4)
    transports = [t for t in (comm.world, comm.inter, comm.intra_mpi) if isinstance(t, MPITransport)]
    for transport in transports:
        transport.stage_host_tensors = DEVICE.type == "cpu"
        transport.staging.chunk_bytes = CHUNK_BYTES
    for name, transport in zip(("world", "inter", "intra"), transports):
        for dtype in DTYPES:
            for n in SIZES:
                checks.check(f"{name} native {dtype} {n}", lambda: native_collectives(transport, dtype, n))
                checks.check(f"{name} point-to-point {dtype} {n}", lambda: point_to_point(transport, dtype, n))
    if DEVICE.type == "cuda":  # the caller on a stream of its own: staging waits for it, and it for staging
        with torch.cuda.stream(torch.cuda.Stream(DEVICE)):
            for n in SIZES:
                checks.check(f"caller's stream native {n}", lambda: native_collectives(comm.world, torch.float32, n))
    algorithms = ["ring", "mpi"] + (["hier:ring", "hier:mpi"] if comm.topology.is_hierarchical else [])
    for algorithm in algorithms:
        for dtype in DTYPES:
            for n in SIZES:
                checks.check(f"{algorithm} {dtype} {n}", lambda: public_collectives(comm, algorithm, dtype, n))
    ranks, rank = comm.topology.world_size, comm.topology.rank
    pc.shutdown()
    write({"passed": checks.passed, "failures": checks.failures, "world": ranks, "device": DEVICE.type})
    if args.json:
        reports = MPI.COMM_WORLD.allgather((checks.passed, checks.failures))
        failures = [f"rank {r}: {f}" for r, (_, fs) in enumerate(reports) for f in fs]
        if rank == 0:
            Path(args.json).write_text(json.dumps({
                "passed": sum(p for p, _ in reports), "failed": len(failures), "failures": failures,
                "ranks": ranks, "device": DEVICE.type, "seconds": round(time.perf_counter() - started, 1),
                "mpi": MPI.Get_library_version().splitlines()[0]}))
        sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
