"""The networked plans forced on CUDA tensors (issue 52, item 4), for ``scripts/gpu_check.sh``: under mpiexec with
emulated nodes (``PCCL_LOCAL_SIZE``), every hierarchical plan whose intra-node level is NCCL (``hier:*`` and its
synonym ``hier-nccl:*``) and ``hier:pipelined``, named whether or not ``pccl_torch.algorithms(collective, "cuda")``
lists it, each collective checked against a reference by ``tests/multiprocess/driver.py``'s cases (sampled: one
reduction op per dtype, blocks of 0, 1 and 37 elements and one case of about 1 Mi elements per plan).

    mpiexec -n 4 env PCCL_LOCAL_SIZE=2 python scripts/gpu_plans_check.py --rows DIR --hostid-per-rank

Every rank appends its rows to ``DIR/rank<r>.jsonl`` (``gpu_cuda_contract.Rows``): one ``plans_expected`` row, then
per plan ``{"phase": "plans", "collective", "name", "intra", "cases", "failed", "failures"}``. Exit 0 unless it
crashed; ``gpu_check_lib.py`` judges the rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "multiprocess"))

from gpu_cuda_contract import Rows, _error_row, launched_rank  # noqa: E402

PIPELINED = "hier:pipelined"
PIPELINED_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")


def forced_names(collective: str) -> list[str]:
    """The hierarchical names with NCCL (or the device's default) inside the node that ``algorithm=`` accepts on
    CUDA, and ``hier:pipelined`` for the collectives that have it."""
    from pccl_torch.plan import intra_library, runnable_names

    names = [n for n in runnable_names(collective, "cuda")
             if n.startswith("hier") and intra_library(n) in (None, "nccl")]
    if collective in PIPELINED_COLLECTIVES and PIPELINED not in names:
        names.append(PIPELINED)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=Path)
    parser.add_argument("--label", default="plans")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--names", default="", help="comma list of collective:name (default: every forced name)")
    parser.add_argument("--hostid-per-rank", action="store_true", help="NCCL_HOSTID per rank (ranks sharing a GPU)")
    parser.add_argument("--no-large", action="store_true", help="skip the ~1 Mi element case of each plan")
    args = parser.parse_args(argv)
    rank, world, local_rank = launched_rank()
    rows = Rows(args.rows, rank, {"label": args.label, "device": args.device, "world": world,
                                  "local_size": os.environ.get("PCCL_LOCAL_SIZE"), "launcher": "mpiexec"})
    if args.hostid_per_rank:
        os.environ["NCCL_HOSTID"] = f"pccl-gpu-check-{rank}"
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_IB_DISABLE", "1")
    rows.begin("init")
    try:
        import driver as drv  # tests/multiprocess/driver.py: cases, inputs, references
        import pccl_torch as pc
        from pccl_torch.algorithms import COLLECTIVES
        from pccl_torch.plan import resolve
        from mpi4py import MPI

        if args.device == "cuda":
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
            comm = pc.init(device=device)
        else:
            device = torch.device("cpu")
            comm = pc.init()
        drv.DEVICE = device
    except Exception as exc:  # noqa: BLE001 - the row names it
        rows.add({"phase": "init", **_error_row(exc)})
        return 1
    topo = comm.topology
    rows.add({"phase": "init", "topology": [topo.num_nodes, topo.local_size], "torch": torch.__version__})
    if args.names:
        plan = [tuple(item.split(":", 1)) for item in args.names.split(",") if item]
    else:
        plan = [(c, n) for c in COLLECTIVES for n in forced_names(c)]
    rows.add({"phase": "plans_expected", "names": [f"{c}:{n}" for c, n in plan]})
    runner = drv.Runner(MPI.COMM_WORLD, verbose=False)
    started = time.perf_counter()
    for collective, name in plan:
        rows.begin(f"plans {collective}:{name}")
        try:
            intra = resolve(collective, name).intra
        except Exception as exc:  # noqa: BLE001 - an unknown name is reported by its cases too
            intra = f"unresolved: {exc}"
        before_failed, before_passed = len(runner.failures), runner.passed
        cases = drv.correctness_cases({collective: [name]}, large=not args.no_large, sample=True)
        for case in cases:
            if case.count < 0:  # the large case: about 1 Mi elements in the full buffer, as the driver sizes it
                per_block = drv.LARGE // world + 1 if collective != "all_reduce" else drv.LARGE + 3
                per_block = drv.LARGE // world ** 2 + 1 if collective == "all_to_all" else per_block
                case = dataclasses.replace(case, count=per_block)
            runner.check(str(case), lambda case=case: runner.run_case(case))
        failures = runner.failures[before_failed:]
        rows.add({"phase": "plans", "collective": collective, "name": name, "intra": intra, "cases": len(cases),
                  "passed": runner.passed - before_passed, "failed": len(failures),
                  "failures": [f[:600] for f in failures[:3]]})
    rows.add({"phase": "end", "seconds": round(time.perf_counter() - started, 1),
              "algorithms": pc.stats(comm).get("algorithms", {})})
    try:
        pc.shutdown()
    except Exception:  # noqa: BLE001 - the rows are written
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
