"""pccl-bench: nccl-tests-style benchmark of pccl's collectives side by side with gloo and MPI.

    pccl-bench -np 4 --local-size 2 -b 1K -e 16M -f 4 --backends pccl,gloo,mpi --check \\
               --json out.json --plot out.png

With ``-np N`` it launches itself under ``mpiexec -n N``; inside an existing MPI launch it runs there.
With ``--testbed`` (after ``pccl-testbed up``) the N ranks run in the testbed's network namespaces,
``--local-size`` per namespace, and pccl detects the nodes itself:

    pccl-bench --testbed -np 4 --local-size 2 -b 1K -e 64M -f 4 --iter-budget 256M \\
               --backends pccl,pccl:ring,gloo,mpi --json tb.json --plot tb.png

Sizes are bytes of the full buffer (all-gather output, reduce-scatter input, all-reduce buffer; all-to-all:
one rank's send buffer, p blocks, as nccl-tests' alltoall_perf). busbw = algbw x 2(p-1)/p for all-reduce and
x (p-1)/p for the others.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
from pathlib import Path

import torch

from pccl_torch.testbed import launch
from pccl_torch.testbed.net import TestbedError
from pccl_torch.topology import TopologyError
from pccl_torch.units import (UsageError, check_size_range, parse_size, run_command, size_argument, size_range,
                              tool_parser)

_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


def build_parser() -> argparse.ArgumentParser:
    p = tool_parser("pccl-bench", __doc__)
    p.add_argument("-b", "--minbytes", default="1K", type=size_argument, help="smallest size (default 1K)")
    p.add_argument("-e", "--maxbytes", default="16M", type=size_argument, help="largest size (default 16M)")
    p.add_argument("-f", "--stepfactor", type=float, default=4, help="size multiplier (default 4)")
    p.add_argument("-c", "--collectives", default="all_reduce,all_gather,reduce_scatter,all_to_all",
                   help="comma list of the collectives to time (default all four)")
    p.add_argument("-d", "--dtype", default="float32",
                   choices=["float32", "float64", "float16", "bfloat16", "int32", "int64"],
                   help="element type (default float32)")
    p.add_argument("-w", "--warmup", type=int, default=3, help="warm-up iterations per size and backend")
    p.add_argument("-n", "--iters", type=int, default=10, help="timed iterations per size and backend")
    p.add_argument("--backends", help="comma list of pccl (auto), pccl:<algorithm>, pccl:all, gloo, mpi (host "
                                      "tensors), nccl (CUDA) (default: pccl,gloo,mpi; with --device cuda pccl,nccl)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the buffers live: cuda puts each rank on its GPU (local rank modulo the GPUs) "
                        "beside torch's NCCL")
    p.add_argument("--compression", default="", metavar="FORMATS",
                   help="also time pccl's own choice with each of these wire formats (comma list of "
                        "bf16, int8, fp8, lossless): columns pccl+<format>, with vs-exact")
    p.add_argument("-np", "--nprocs", type=int, help="launch this many ranks under mpiexec")
    p.add_argument("--local-size", type=int, help="ranks per emulated node (PCCL_LOCAL_SIZE; with --testbed: "
                   "ranks per namespace)")
    p.add_argument("--testbed", nargs="?", const="pccl", metavar="PREFIX",
                   help="with -np: run in the namespaces of pccl-testbed PREFIX (default pccl)")
    p.add_argument("--iter-budget", type=size_argument, help="bytes per size and backend (e.g. 256M): big sizes run fewer "
                   "iterations, at most budget / size (at least 3)")
    p.add_argument("--check", action="store_true", help="check every result (#wrong column)")
    p.add_argument("--confirm", type=int, default=0, metavar="N",
                   help="re-time pccl's own choice head to head against the two fastest fixed algorithms of the "
                        "first pass, N iterations each, and report auto / fastest fixed (needs pccl and pccl:...)")
    p.add_argument("--json", help="write the rows to this JSON file")
    p.add_argument("--plot", help="write a busbw-vs-size plot (PNG) here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def inside_mpi_launch() -> bool:
    return any(v in os.environ for v in _LAUNCHER_VARS)


def ranks_argv(argv: list[str], *, testbed: bool = False) -> list[str]:
    """The ranks' arguments: ``argv`` without the launch flags (``-np``, ``--testbed [PREFIX]``) and, on the
    testbed, without ``--local-size`` (there the ranks detect their nodes)."""
    dropped = ("-np", "--nprocs", "--testbed") + (("--local-size",) if testbed else ())
    rest, i = [], 0
    while i < len(argv):
        item = argv[i]
        if item in dropped:  # the flag and its value (--testbed's is optional)
            has_value = item != "--testbed" or (i + 1 < len(argv) and not argv[i + 1].startswith("-"))
            i += 2 if has_value else 1
            continue
        if not item.startswith(tuple(f"{d}=" for d in dropped)):
            rest.append(item)
        i += 1
    return rest


def relaunch(args: argparse.Namespace, argv: list[str]) -> int:
    """Run this command again under ``mpiexec -n args.nprocs`` (without -np)."""
    mpiexec = Path(sys.prefix) / "bin" / "mpiexec"
    launcher = str(mpiexec) if mpiexec.exists() else shutil.which("mpiexec")
    if not launcher:
        raise UsageError("no mpiexec found; install pccl-torch (it brings the mpich wheel)")
    env = dict(os.environ)
    env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    program = [sys.executable, "-m", "pccl_torch.bench.cli", *ranks_argv(argv, testbed=bool(args.testbed))]
    if args.testbed:
        config = launch.require(args.testbed)
        command = launch.mpiexec_command(config, program, nprocs=args.nprocs, per_node=args.local_size,
                                         mpiexec=launcher)
        return launch.run_released(command, launch.run_environment(config, env))
    if args.local_size:
        env["PCCL_LOCAL_SIZE"] = str(args.local_size)
    return launch.run_released([launcher, "-n", str(args.nprocs), *program], env)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    check_size_range(parser, args)
    return run_command(parser, functools.partial(run, args, argv), (TopologyError, TestbedError))


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """Launch the ranks (``-np``), or time the collectives on this launch's ranks; exit status 1 on a wrong result."""
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device here (torch.cuda.is_available() is False); "
                         "run on host tensors without --device")
    if args.nprocs and not inside_mpi_launch():
        return relaunch(args, argv)
    if args.testbed and not inside_mpi_launch():
        raise UsageError("--testbed needs -np N (the ranks to launch into the testbed)")

    import pccl_torch as pc
    from pccl_torch.bench import report
    from pccl_torch.bench.backends import DEFAULT_BACKENDS, validate_backends
    from pccl_torch.bench.runner import Settings, measure

    settings = Settings(
        collectives=tuple(c.strip() for c in args.collectives.split(",") if c.strip()),
        sizes=tuple(size_range(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)),
        dtype=getattr(torch, args.dtype), warmup=args.warmup, iters=args.iters,
        backends=",".join([args.backends or DEFAULT_BACKENDS[args.device]]
                          + [f"pccl+{f.strip()}" for f in args.compression.split(",") if f.strip()]),
        check=args.check,
        iter_budget=parse_size(args.iter_budget) if args.iter_budget else None,
        confirm=args.confirm,
    )
    validate_backends(settings.backends, settings.collectives, args.device)
    comm = pc.init(local_size=args.local_size, device=args.device if args.device == "cuda" else None)
    try:
        rows = measure(comm, settings, progress=not args.no_progress)
    finally:
        pc.shutdown()
    if comm.topology.rank == 0:
        print(report.format_table(rows), flush=True)
        if args.json:
            report.write_json(rows, args.json)
        if args.plot:
            report.plot(rows, args.plot)
    wrong = sum(max(r["wrong"], 0) for r in rows)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
