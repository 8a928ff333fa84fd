"""MPI probe of a launch's network (run under mpiexec): where the nodes are and how fast MPI moves data
inside a node and between nodes, one pair of ranks at a time.

    pccl-testbed probe                 # = pccl-testbed run -np 4 -- python -m pccl_torch.testbed.probe

Rank 0 prints one JSON object: ``nodes`` and ``local_size`` as MPI's shared-memory split sees them,
``netns_per_node`` (how many network namespaces each node's ranks are in, and whether nodes share one),
and ``intra_mbit``/``inter_mbit``: the median rate of a ``Sendrecv`` of ``--mbytes`` between local
ranks 0 and 1 of node 0 and between rank 0 of node 0 and rank 0 of node 1, in Mbit/s per direction;
``inter_all_links_mbit``: the same per node link with every node's leader exchanging with its neighbours at once
(``ring_rate``; on 2 nodes, ``inter_mbit``); per other node (keyed by its index), ``rtt_ms``: the median round trip
of a 1-byte ``Send``/``Recv`` ping-pong between rank 0 of node 0 and rank 0 of that node (the path crosses both
nodes' links, so with ``pccl-testbed up --delay RTT`` it is RTT plus MPI's own cost), and ``mbit``: the
``Sendrecv`` rate between them (node 1's is ``inter_mbit``); ``intra_rtt_ms`` inside node 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np


def sendrecv_rate(world, pair: tuple[int, int], nbytes: int, repeats: int = 3) -> float | None:
    """Median Mbit/s per direction of a ``Sendrecv`` of ``nbytes`` between the ranks of ``pair``, the others
    waiting (collective over ``world``); None when ``pair`` is one rank. (A ring of two: :func:`ring_rate`.)"""
    return None if pair[0] == pair[1] else ring_rate(world, list(pair), nbytes, repeats)


def ring_rate(world, ranks: list[int], nbytes: int, repeats: int = 3) -> float | None:
    """Median Mbit/s per direction per link while every link of a ring is busy at once: each of ``ranks`` sends
    ``nbytes`` to the next and receives as much from the previous one by ``Sendrecv``, the other ranks waiting
    (collective over ``world``); None for fewer than two. Over the nodes' leaders, against :func:`sendrecv_rate`
    between two nodes, it shows what the network joining the nodes carries when all of them send (a switch's or
    a shared host's capacity)."""
    from mpi4py import MPI

    rank = world.Get_rank()
    if len(ranks) < 2:
        return None
    buf, out = np.ones(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8)
    times = []
    for _ in range(repeats + 1):  # the first exchange also opens the connections: not timed
        world.Barrier()
        start = MPI.Wtime()
        if rank in ranks:
            i = ranks.index(rank)
            world.Sendrecv(buf, ranks[(i + 1) % len(ranks)], 7, out, ranks[i - 1], 7)
        times.append(world.allreduce(MPI.Wtime() - start, op=MPI.MAX))
    return nbytes * 8 / statistics.median(times[1:]) / 1e6


def pingpong_ms(world, pair: tuple[int, int], repeats: int = 20) -> float | None:
    """Median round trip in milliseconds of a 1-byte message from ``pair[0]`` to ``pair[1]`` and back (the first
    not counted), the other ranks waiting (collective over ``world``); None when ``pair`` is one rank."""
    from mpi4py import MPI

    if pair[0] == pair[1]:
        return None
    rank, byte = world.Get_rank(), np.zeros(1, dtype=np.uint8)
    times = []
    world.Barrier()
    for _ in range(repeats + 1):
        start = MPI.Wtime()
        if rank == pair[0]:
            world.Send(byte, pair[1], 9)
            world.Recv(byte, pair[1], 9)
        elif rank == pair[1]:
            world.Recv(byte, pair[0], 9)
            world.Send(byte, pair[0], 9)
        times.append((MPI.Wtime() - start) * 1e3)
    return world.bcast(statistics.median(times[1:]) if rank == pair[0] else None, root=pair[0])


def layout(world) -> dict:
    """Nodes as MPI's shared-memory split sees them, and the network namespaces of their ranks
    (collective): ``nodes``, ``local_size``, ``leaders`` (rank of local rank 0 of each node),
    ``netns_per_node`` (namespaces among each node's ranks) and ``nodes_share_netns``."""
    from mpi4py import MPI

    rank = world.Get_rank()
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = node.Get_rank(), node.Get_size()
    node.Free()
    places = world.allgather((local_rank, local_size, os.stat("/proc/self/ns/net").st_ino))
    leaders = [r for r, (lr, _, _) in enumerate(places) if lr == 0]
    netns = [sorted({places[r][2] for r in range(lead, lead + places[lead][1])}) for lead in leaders]
    return {"ranks": world.Get_size(), "nodes": len(leaders), "local_size": local_size, "leaders": leaders,
            "netns_per_node": [len(n) for n in netns],
            "nodes_share_netns": len({i for n in netns for i in n}) < sum(len(n) for n in netns)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pccl_torch.testbed.probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mbytes", type=float, default=8, help="bytes exchanged per direction, in MiB")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    found = layout(world)
    nbytes = int(args.mbytes * (1 << 20))
    intra = sendrecv_rate(world, (0, 1), nbytes, args.repeats) if found["local_size"] > 1 else None
    inter = sendrecv_rate(world, (0, found["leaders"][1]), nbytes, args.repeats) if found["nodes"] > 1 else None
    every = ring_rate(world, found["leaders"], nbytes, args.repeats) if found["nodes"] > 2 else inter
    others = list(enumerate(found["leaders"]))[1:]
    rtt = {str(node): pingpong_ms(world, (0, leader)) for node, leader in others}
    rates = {str(node): inter if node == 1 else sendrecv_rate(world, (0, leader), nbytes, args.repeats)
             for node, leader in others}
    intra_rtt = pingpong_ms(world, (0, 1)) if found["local_size"] > 1 else None
    if world.Get_rank() == 0:
        print(json.dumps({**found, "mbytes": args.mbytes, "intra_mbit": intra, "inter_mbit": inter,
                          "inter_all_links_mbit": every, "rtt_ms": rtt, "mbit": rates, "intra_rtt_ms": intra_rtt}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
