"""Run under mpiexec with a different PCCL_PROFILE per rank: every rank must make rank 0's choices.

Prints one JSON line from rank 0: {"choices": [...], "agreed": bool}, or {"errors": [...]} when init fails.
Every rank also writes its own result (``rank_result``: its choices, or its error) after ``shutdown()``.
"""

from __future__ import annotations

import json

if __package__:
    from . import rank_result
else:  # run as a script by mpiexec
    import rank_result

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
        rank_result.write({"error": f"{type(exc).__name__}: {exc}"}, world.Get_rank())
        return
    # The agreed selector itself: on one machine pccl's choice is the native library whatever the profile says
    # (choice.py), so the profile's answers are read from the selector every rank built from rank 0's copy.
    choices = [comm.choice.selector.choose(c, n, comm.topology, 4) for c, n in CALLS]
    everyone = world.gather(choices, root=0)
    if comm.topology.rank == 0:
        print(json.dumps({"choices": choices, "agreed": all(c == choices for c in everyone)}))
    pc.shutdown()
    rank_result.write({"choices": choices}, world.Get_rank())


if __name__ == "__main__":
    main()
