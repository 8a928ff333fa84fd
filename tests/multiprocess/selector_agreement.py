"""Run under mpiexec with a different PCCL_PROFILE per rank: every rank must make rank 0's choices.

Prints one JSON line from rank 0: {"choices": [...], "agreed": bool}, or {"errors": [...]} when init fails.
"""

from __future__ import annotations

import json

CALLS = [(c, 1 << k) for c in ("all_gather", "reduce_scatter", "all_reduce") for k in range(10, 25, 2)]


def main() -> None:
    from mpi4py import MPI

    import pccl_torch as pc

    world = MPI.COMM_WORLD
    try:
        comm = pc.init()
    except Exception as exc:  # noqa: BLE001 - reported to the test
        errors = world.gather(f"{type(exc).__name__}: {exc}", root=0)
        if world.Get_rank() == 0:
            print(json.dumps({"errors": errors}))
        return
    choices = [pc.choose_algorithm(c, n, comm) for c, n in CALLS]
    everyone = world.gather(choices, root=0)
    if comm.topology.rank == 0:
        print(json.dumps({"choices": choices, "agreed": all(c == choices for c in everyone)}))
    pc.shutdown()


if __name__ == "__main__":
    main()
