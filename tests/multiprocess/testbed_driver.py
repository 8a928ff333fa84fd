"""Run by test_testbed.py as ranks in the testbed's namespaces (no PCCL_LOCAL_SIZE): pccl must find the
nodes from the namespaces, the hierarchical collectives must be right, and MPI traffic between nodes must
be held to the link rate while traffic inside a node is not. Rank 0 prints one JSON line; every rank writes
its own result (``rank_result``: its errors and place) after ``shutdown()``."""

from __future__ import annotations

import json
import os
import sys

import torch
from mpi4py import MPI

import pccl_torch as pc
from pccl_torch.testbed.probe import layout, ring_rate, sendrecv_rate

import rank_result  # beside this script (run as one by mpiexec)


def main() -> int:
    mbytes = float(sys.argv[1]) if len(sys.argv) > 1 else 4
    comm = pc.init()
    topo = comm.topology
    world = MPI.COMM_WORLD
    errors: list[str] = []
    p, n = topo.world_size, 1000
    t = torch.arange(n, dtype=torch.float32) + 1000 * topo.rank
    pc.all_reduce(t, algorithm="hier:ring")
    expected = torch.arange(n, dtype=torch.float32) * p + 1000 * sum(range(p))
    if not torch.equal(t, expected):
        errors.append(f"rank {topo.rank}: hier:ring all_reduce wrong at {int((t != expected).sum())} elements")
    out = torch.empty(p * n)
    pc.all_gather_into_tensor(out, torch.full((n,), float(topo.rank)), algorithm="hier:bruck")
    if not torch.equal(out, torch.arange(p, dtype=torch.float32).repeat_interleave(n)):
        errors.append(f"rank {topo.rank}: hier:bruck all_gather wrong")
    shard = torch.empty(n)
    pc.reduce_scatter_tensor(shard, torch.ones(p * n), algorithm="hier:ring")
    if not torch.equal(shard, torch.full((n,), float(p))):
        errors.append(f"rank {topo.rank}: hier:ring reduce_scatter wrong")
    places = world.gather((topo.rank, topo.node, topo.local_rank, os.stat("/proc/self/ns/net").st_ino), root=0)
    found = layout(world)
    intra = sendrecv_rate(world, (0, 1), int(mbytes * (1 << 20)))
    inter = sendrecv_rate(world, (0, topo.local_size), int(mbytes * (1 << 20)))
    every = ring_rate(world, found["leaders"], int(mbytes * (1 << 20)))
    links = world.gather(json.dumps(pc.stats()["links"], sort_keys=True), root=0)
    gathered = world.gather(errors, root=0)
    if topo.rank == 0:
        print(json.dumps({"world": p, "num_nodes": topo.num_nodes, "local_size": topo.local_size,
                          "places": places, "mpi_layout": found, "intra_mbit": intra, "inter_mbit": inter,
                          "inter_all_links_mbit": every,
                          "links": [json.loads(entry) for entry in links],
                          "errors": [e for errs in gathered for e in errs]}), flush=True)
    pc.shutdown()
    rank_result.write({"errors": errors, "node": topo.node, "local_rank": topo.local_rank,
                       "num_nodes": topo.num_nodes}, topo.rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
