"""``pccl-sim``: predict collective times on a machine profile, fit a profile to pccl-bench results, check the
model against pccl-bench results, and sweep GPU counts to see where hierarchical collectives beat the vendor
library's flat ring (for all-to-all, its flat all-to-all).

    pccl-sim predict -c all_reduce --bytes 1M --gpus 2048 --machine frontier
    pccl-sim predict -c all_to_all --bytes 64M --gpus 2048 --machine frontier   # bytes: one rank's send buffer
    pccl-sim fit results.json -o configs/machines/local-cpu.yaml --name local-cpu
    pccl-sim validate bench-n2.json bench-n3.json --machine tb200-fitted.yaml   # measured against predicted
    pccl-sim sweep --machine frontier --gpus 8..4096 --sizes 16M,64M,256M --plot sweep.png
    pccl-sim step zero3-*-n{2,3,4}.json --compute zero3-one-rank.json --machine tb200.yaml   # training steps
    pccl-sim cuda-choice --machine perlmutter --gpus-per-node 4,8 --nodes 2..512   # pccl's choice for CUDA tensors
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from pccl_torch.algorithms import COLLECTIVES
from pccl_torch.plan import HIER_PREFIX
from pccl_torch.sim import costs, machine, step, validate
from pccl_torch.sim.fit import fit, format_report
from pccl_torch.sim.machine import MachineProfile
from pccl_torch.testbed.relay import parse_time
from pccl_torch.units import format_size, run_command, size_argument, size_list_argument, table, tool_parser

DEFAULT_SIZES = "1M,16M,64M,256M,1G"
CUDA_CHOICE_SIZES = "1K,4K,16K,64K,256K,1M,4M,16M,64M,256M,1G"
_SHORT = {"ring": "ring", "recursive_doubling": "rd", "recursive_halving": "rh", "rabenseifner": "rab",
          "bruck": "bruck", "pairwise": "pw", "mpi": "mpi", "pipelined": "pipe"}
"""Schedule names as the ``cuda-choice`` table abbreviates them."""


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """The flat vendor collective (a ring; all-to-all: every pair at once) against the best hierarchical
    algorithm at one (collective, size, GPUs)."""

    collective: str
    nbytes: int
    gpus: int
    nodes: int
    vendor_us: float
    hier_algorithm: str
    hier_us: float
    speedup: float


def layout(gpus: int, profile: MachineProfile) -> tuple[int, int]:
    """(nodes, ranks per node) of ``gpus`` ranks on ``profile``: whole nodes, or part of one."""
    if gpus < 1:
        raise ValueError(f"need at least 1 GPU, got {gpus}")
    if gpus <= profile.ranks_per_node:
        return 1, gpus
    if gpus % profile.ranks_per_node:
        raise ValueError(f"{gpus} GPUs is not a whole number of {profile.name} nodes "
                         f"of {profile.ranks_per_node}")
    return gpus // profile.ranks_per_node, profile.ranks_per_node


def parse_gpus(text: str) -> list[int]:
    """``"8..4096"`` -> the powers of two from 8 to 4096; ``"8,96"`` or ``"2048"`` as listed."""
    if ".." in text:
        lo, hi = (int(x) for x in text.split("..", 1))
        if lo < 1 or hi < lo:
            raise ValueError(f"bad GPU range {text!r}: need 1 <= low <= high")
        first = 1 << (lo - 1).bit_length()
        return [1 << k for k in range(first.bit_length() - 1, hi.bit_length()) if lo <= 1 << k <= hi]
    return [int(x) for x in text.split(",")]


def sweep(profile: MachineProfile, gpus: list[int], sizes: list[int],
          collectives: tuple[str, ...] | list[str] = COLLECTIVES) -> list[SweepPoint]:
    """For every collective, size and GPU count: the flat vendor collective (what NCCL/RCCL run: a ring; for
    all-to-all, its grouped sends and receives) against the fastest ``hier:*`` algorithm."""
    points = []
    for collective in collectives:
        hier = [a for a in costs.algorithms(collective) if a.startswith(HIER_PREFIX)]
        for nbytes in sizes:
            for g in gpus:
                nodes, local = layout(g, profile)
                vendor = costs.predict(collective, "vendor", nbytes, nodes, local, profile)
                name, t = costs.best(collective, nbytes, nodes, local, profile, hier)
                points.append(SweepPoint(collective, nbytes, g, nodes, vendor * 1e6, name, t * 1e6, vendor / t))
    return points


def format_sweep(points: list[SweepPoint]) -> str:
    header = ("collective", "size", "gpus", "nodes", "vendor(us)", "best hierarchical", "time(us)", "speedup")
    rows = [(p.collective, format_size(p.nbytes), str(p.gpus), str(p.nodes), f"{p.vendor_us:.1f}", p.hier_algorithm,
             f"{p.hier_us:.1f}", f"{p.speedup:.1f}x") for p in points]
    return "\n".join(table(header, rows, "<>>>><>>"))


def plot_sweep(points: list[SweepPoint], path: str | Path, title: str) -> None:
    """Speedup of the best hierarchical algorithm over the flat vendor collective against GPU count, one
    subplot per collective and one line per size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    collectives = list(dict.fromkeys(p.collective for p in points))
    fig, axes = plt.subplots(1, len(collectives), figsize=(5 * len(collectives), 4), squeeze=False)
    for ax, collective in zip(axes[0], collectives):
        for nbytes in dict.fromkeys(p.nbytes for p in points):
            mine = [p for p in points if p.collective == collective and p.nbytes == nbytes]
            ax.plot([p.gpus for p in mine], [p.speedup for p in mine], marker="o", label=format_size(nbytes))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set(title=collective, xlabel="GPUs",
               ylabel="speedup over vendor all-to-all" if collective == "all_to_all" else "speedup over vendor ring")
        ax.legend(title="buffer", fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _predict(args: argparse.Namespace) -> None:
    profile = _profile(args)
    nodes, local = layout(args.gpus, profile)
    times = {a: costs.predict(args.collective, a, args.bytes, nodes, local, profile)
             for a in costs.algorithms(args.collective)}
    winner = min(times, key=times.__getitem__)
    print(f"{args.collective} of {format_size(args.bytes)} on {args.gpus} GPUs = {nodes} nodes x {local} "
          f"({profile.name})")
    rows = [(name, f"{t * 1e6:.1f}", f"{times['vendor'] / t:.2f}x", "<- best" if name == winner else "")
            for name, t in times.items()]
    print("\n".join(table(("algorithm", "time(us)", "vs vendor", ""), rows, "<>><")))
    print(f"best: {winner}, {times['vendor'] / times[winner]:.1f}x faster than vendor")


def _fit(args: argparse.Namespace) -> None:
    rows = json.loads(Path(args.results).read_text())
    if not isinstance(rows, list):
        raise ValueError(f"{args.results}: expected a JSON list of pccl-bench rows")
    base = machine.load(args.base) if args.base else None
    name = args.name or Path(args.output).stem
    profile, report = fit(rows, base, name=name, nics_per_node=args.nics_per_node, host_cores=args.host_cores,
                          vendor_library=args.vendor_library, tie_links=not args.untie_links)
    print(format_report(report))
    if "chunk_overhead" in profile.sources:
        print(f"chunk_overhead: {profile.chunk_overhead * 1e6:.0f} us a phase and chunk of a pipelined call "
              f"({profile.sources['chunk_overhead']})")
    print(f"wrote {profile.save(args.output)}")


def _validate(args: argparse.Namespace) -> None:
    profile = _profile(args)
    benches = [(path, validate.load_rows(path)) for path in args.results]
    result = validate.validate(benches, profile, args.baseline)
    print(validate.format_validation(result))
    if args.json:
        Path(args.json).write_text(json.dumps(validate.to_json(result), indent=1))
        print(f"wrote {args.json}")
    if args.plot:
        print(f"wrote {validate.plot_trends(result, args.plot)}")


def _step(args: argparse.Namespace) -> None:
    profile = _profile(args)
    runs = [step.load_run(path) for path in args.runs]
    with_sizes = step.load_run(args.sizes) if args.sizes else next((r for r in runs if r.call_sizes), None)
    if with_sizes is None or not with_sizes.call_sizes:
        raise ValueError("no run recorded its call sizes: give --sizes RUN.json (a gloo or NCCL run of the example)")
    one_rank = step.load_run(args.compute)
    if one_rank.nodes * one_rank.local_size != 1:
        raise ValueError(f"{args.compute}: --compute needs a one-rank run, this one has "
                         f"{one_rank.nodes * one_rank.local_size} ranks")
    fit_nodes = args.fit_nodes if args.fit_nodes is not None else min(r.nodes for r in runs)
    predictions = step.predict_steps(runs, with_sizes.call_sizes, one_rank.step_ms, profile, fit_nodes)
    print(f"# training steps on {profile.name}: compute {one_rank.step_ms:.0f} ms a step alone "
          f"({Path(args.compute).name}), call sizes from {Path(with_sizes.source).name}")
    print(step.format_steps(predictions, fit_nodes))
    if args.json:
        Path(args.json).write_text(json.dumps(step.to_json(predictions), indent=1))
        print(f"wrote {args.json}")


def _collectives(text: str) -> list[str]:
    """The collectives of a ``-c`` comma list; an unknown one raises, naming the valid ones."""
    collectives = text.split(",")
    for c in collectives:
        if c not in COLLECTIVES:
            raise ValueError(f"unknown collective {c!r}; valid: {', '.join(COLLECTIVES)}")
    return collectives


def _sweep(args: argparse.Namespace) -> None:
    profile = _profile(args)
    sizes = args.sizes
    collectives = _collectives(args.collective)
    points = sweep(profile, parse_gpus(args.gpus), sizes, collectives)
    print(format_sweep(points))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(p) for p in points], indent=1))
        print(f"wrote {args.json}")
    if args.plot:
        flat = "flat vendor collective" if "all_to_all" in collectives else "flat vendor ring"
        plot_sweep(points, args.plot, f"{profile.name}: best hierarchical vs {flat} (model)")
        print(f"wrote {args.plot}")


def format_cuda_choice(profile: MachineProfile, collective: str, local: int, nodes: list[int],
                       sizes: list[int]) -> str:
    """pccl's choice for CUDA tensors (``cuda_rule.cuda_rule``) over ``nodes`` x ``sizes`` at ``local`` GPUs a node:
    each cell the chosen hierarchical schedule and its predicted speed-up over NCCL's own collective, or ``nccl``
    and the best hierarchical one's (below the margin)."""
    from pccl_torch.selection.cuda_rule import CUDA_HIER_MARGIN, cuda_rule

    rows = []
    for n in nodes:
        cells = []
        for nbytes in sizes:
            choice, best, speedup = cuda_rule(profile, collective, nbytes, n, local)
            label = "nccl" if choice == "vendor" else _SHORT.get(best.partition(":")[2], best)
            cells.append(f"{label} {speedup:.2f}")
        rows.append((str(n), *cells))
    lines = [f"{collective}, {local} GPUs a node ({profile.name}): hier:<schedule> where the model predicts >= "
             f"{CUDA_HIER_MARGIN}x NCCL's own, else nccl (with the best hierarchical one's speed-up)"]
    header = ("nodes", *(format_size(b) for b in sizes))
    return "\n".join(lines + table(header, rows, ">" * len(header)))


def _cuda_choice(args: argparse.Namespace) -> None:
    profile = machine.load(args.machine)
    if profile.device != "cuda":
        raise ValueError(f"{profile.name} is not a GPU machine profile (device: {profile.device}); give one with "
                         "device: cuda, such as perlmutter")
    collectives = _collectives(args.collective)
    per_node = [int(x) for x in args.gpus_per_node.split(",")]
    print("\n\n".join(format_cuda_choice(profile, c, local, parse_gpus(args.nodes), args.sizes)
                       for c in collectives for local in per_node))


def _link_rtt_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--link-rtt", type=parse_time, metavar="TIME",
                   help="round trip added between nodes (e.g. 20ms, as pccl-testbed up --delay and probe give it): "
                        "every step across nodes pays half of it besides the profile's latencies (the profile's "
                        "link_latency_us); for a profile fitted on links without added delay")


def _profile(args: argparse.Namespace) -> MachineProfile:
    """The machine profile ``--machine`` names, with ``--link-rtt`` added where given."""
    profile = machine.load(args.machine)
    return profile.with_link_rtt(args.link_rtt) if getattr(args, "link_rtt", None) is not None else profile


def parser() -> argparse.ArgumentParser:
    top = tool_parser("pccl-sim", __doc__)
    sub = top.add_subparsers(dest="command", required=True, help="what to do (each has its own --help)")

    p = sub.add_parser("predict", help="predicted time of every algorithm of one call")
    p.add_argument("-c", "--collective", required=True, choices=COLLECTIVES, help="the collective of the call")
    p.add_argument("--bytes", required=True, type=size_argument,
                   help="full buffer size, e.g. 1M (all-to-all: one rank's send buffer)")
    p.add_argument("--gpus", required=True, type=int,
                   help="ranks of the call: whole nodes of the machine, or part of one")
    p.add_argument("--machine", required=True, help=f"profile name ({', '.join(machine.available())}) or path")
    _link_rtt_argument(p)
    p.set_defaults(run=_predict)

    f = sub.add_parser("fit", help="fit a machine profile to pccl-bench JSON results")
    f.add_argument("results", help="pccl-bench JSON (a list of rows)")
    f.add_argument("-o", "--output", required=True, help="where to write the profile (.yaml)")
    f.add_argument("--name", help="profile name (default: the output file's stem)")
    f.add_argument("--base", help="profile whose values are kept for parameters the rows cannot determine")
    f.add_argument("--nics-per-node", type=int, help="NICs a node, shared by its ranks (default: the base "
                                                     "profile's, else one a rank)")
    f.add_argument("--host-cores", type=int, help="cores of the one host all ranks share (the testbed: this "
                                                  "machine's); 0 = a core a rank (default: the base profile's, else 0)")
    f.add_argument("--vendor-library", choices=machine.VENDOR_LIBRARIES,
                   help="the library the baseline rows ran (default: the base profile's, else the rows' one "
                        "vendor baseline, else nccl)")
    f.add_argument("--untie-links", action="store_true",
                   help="fit the vendor ring's bandwidth across nodes apart from MPI's (default: the same links)")
    f.set_defaults(run=_fit)

    v = sub.add_parser("validate", help="predicted against measured time of every pccl-bench row, and whether the "
                                        "predicted speed-up moves with the node count as measured")
    v.add_argument("results", nargs="+", help="pccl-bench JSON files (lists of rows); files at several node "
                                              "counts add the direction check, several files at one node count "
                                              "are repeated runs (their median speed-up)")
    v.add_argument("--machine", required=True, help=f"profile name ({', '.join(machine.available())}) or path")
    _link_rtt_argument(v)
    v.add_argument("--json", help="write the rows, errors, skipped rows and speed-ups as JSON")
    v.add_argument("--plot", help="write the measured and predicted speed-up against the node count (PNG)")
    v.add_argument("--baseline", help="the direction check's speed-up over this backend's rows only (gloo: the "
                                      "vendor library the fit models); default: the best baseline at each point")
    v.set_defaults(run=_validate)

    t = sub.add_parser("step", help="training steps predicted from a one-rank run's computation and the model's "
                                     "collectives, against the measured ones")
    t.add_argument("runs", nargs="+", help="training runs' JSON (examples/gpt --json) at one or more node counts")
    t.add_argument("--compute", required=True, help="a one-rank run of the same model and batch (its step is the "
                                                   "computation)")
    t.add_argument("--sizes", help="a run that recorded its call sizes (default: the first of the runs that did)")
    t.add_argument("--machine", required=True, help=f"profile name ({', '.join(machine.available())}) or path")
    _link_rtt_argument(t)
    t.add_argument("--fit-nodes", type=int, help="fit each backend's overlap on its runs at this node count "
                                                 "(default: the fewest)")
    t.add_argument("--json", help="write the predictions as JSON")
    t.set_defaults(run=_step)

    s = sub.add_parser("sweep", help="flat vendor collective vs best hierarchical algorithm over GPU counts")
    s.add_argument("--machine", required=True, help=f"profile name ({', '.join(machine.available())}) or path")
    _link_rtt_argument(s)
    s.add_argument("--gpus", default="8..4096", help="A..B (powers of two) or a comma list")
    s.add_argument("--sizes", default=DEFAULT_SIZES, type=size_list_argument, help=f"comma list (default {DEFAULT_SIZES})")
    s.add_argument("-c", "--collective", default=",".join(COLLECTIVES),
                   help="comma list of collectives (default all of them)")
    s.add_argument("--json", help="write the points as JSON")
    s.add_argument("--plot", help="write a speedup plot (PNG)")
    s.set_defaults(run=_sweep)

    g = sub.add_parser("cuda-choice", help="pccl's default choice for CUDA tensors across nodes (NCCL inside the "
                                           "node), as the cost model predicts it against NCCL's own collective")
    g.add_argument("--machine", default="perlmutter",
                   help="GPU profile name or path (pccl's CUDA rule uses perlmutter)")
    g.add_argument("--gpus-per-node", default="4,8", help="comma list of GPUs a node")
    g.add_argument("--nodes", default="2..512", help="A..B (powers of two) or a comma list")
    g.add_argument("--sizes", default=CUDA_CHOICE_SIZES, type=size_list_argument,
                   help="comma list of sizes (all-to-all: one rank's send buffer)")
    g.add_argument("-c", "--collective", default=",".join(COLLECTIVES), help="comma list of collectives")
    g.set_defaults(run=_cuda_choice)
    return top


def main(argv: list[str] | None = None) -> int:
    top = parser()
    args = top.parse_args(argv)
    return run_command(top, functools.partial(args.run, args), (TypeError, OSError))


if __name__ == "__main__":
    sys.exit(main())
