"""pccl-tune: measure this machine, train the selector, write its profile; or explain a choice.

    pccl-tune -np 4 --local-size 2 --out profile.json          # measure (resumable), train, validate, write
    pccl-tune --bench-json a.json b.json --out profile.json    # train on existing pccl-bench runs
    pccl-tune --explain --profile profile.json -c all_reduce --bytes 1M --ranks 2048 --local-size 8
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from pccl_torch.selection.learned.features import LEARNED_COLLECTIVES
from pccl_torch.topology import TopologyError
from pccl_torch.units import (UsageError, check_size_range, format_size, parse_size, run_command, size_argument,
                              size_range, table, tool_parser)

DEFAULT_WORK_DIR = Path.home() / ".cache" / "pccl-torch" / "tune"


def build_parser() -> argparse.ArgumentParser:
    p = tool_parser("pccl-tune", __doc__)
    p.add_argument("-np", "--nprocs", type=int, help="measure with this many ranks (mpiexec)")
    p.add_argument("--local-size", type=int, default=1, help="ranks per emulated node while measuring")
    p.add_argument("-b", "--minbytes", default="1K", type=size_argument,
                   help="smallest full buffer size measured (default 1K)")
    p.add_argument("-e", "--maxbytes", default="16M", type=size_argument,
                   help="largest full buffer size measured (default 16M)")
    p.add_argument("-f", "--stepfactor", type=float, default=2, help="size multiplier between measurements (default 2)")
    p.add_argument("-n", "--iters", type=int, default=7, help="timed iterations per size and algorithm (default 7)")
    p.add_argument("-w", "--warmup", type=int, default=2, help="warm-up iterations per size and algorithm (default 2)")
    p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR,
                   help="measurements are kept here, one file per size: an interrupted run resumes")
    p.add_argument("--bench-json", nargs="*", default=[], help="pccl-bench --backends pccl:all results to train on")
    p.add_argument("--model-layouts", default="8x2,16x4,64x8",
                   help="RANKSxLOCAL layouts added from the cost model fitted on the measurements ('' for none)")
    p.add_argument("--out", type=Path, help="write the profile here (e.g. ~/.cache/pccl-torch/profile.json)")
    p.add_argument("--explain", action="store_true", help="explain a choice instead of training")
    p.add_argument("--profile", help="profile to explain (default: the one pccl would load)")
    p.add_argument("-c", "--collective", default="all_reduce", choices=LEARNED_COLLECTIVES,
                   help="collective of the call to explain (default all_reduce)")
    p.add_argument("--bytes", default="1M", type=size_argument, help="full buffer size of the call to explain")
    p.add_argument("--ranks", type=int, default=8, help="ranks of the call to explain (default 8)")
    p.add_argument("--dtype-size", type=int, default=4, help="bytes per element of the call to explain (default 4)")
    p.add_argument("--link-ratio", type=float, default=1.0,
                   help="intra- over inter-node link bandwidth of the call to explain (stats()['links']['ratio']; "
                        "1: one machine, ~9 at 1 Gbit/s between nodes here)")
    return p


def measure(args: argparse.Namespace) -> list[Path]:
    """One pccl-bench --backends pccl:all run per size, skipped when its file already exists."""
    from tqdm import tqdm

    layout_dir = args.work_dir / f"n{args.nprocs}_L{args.local_size}"
    layout_dir.mkdir(parents=True, exist_ok=True)
    files = []
    sizes = size_range(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    for size in tqdm(sizes, desc=f"measuring {args.nprocs} ranks x {args.local_size}", unit="size"):
        target = layout_dir / f"{size}.json"
        files.append(target)
        if target.exists():
            continue
        partial = target.with_suffix(".part")
        command = [sys.executable, "-m", "pccl_torch.bench.cli", "-np", str(args.nprocs), "--local-size",
                   str(args.local_size), "-b", str(size), "-e", str(size), "-n", str(args.iters), "-w",
                   str(args.warmup), "--backends", "pccl:all", "-c", ",".join(LEARNED_COLLECTIVES), "--check", "--json",
                   str(partial), "--no-progress"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0 or not partial.exists():
            raise SystemExit(f"pccl-tune: measuring {format_size(size)} failed:\n{result.stdout[-2000:]}"
                             f"{result.stderr[-2000:]}")
        partial.rename(target)  # only complete measurements count on resume
    return files


def train_command(args: argparse.Namespace) -> int:
    from pccl_torch.bench.runner import versions
    from pccl_torch.selection.learned.dataset import cases_from_bench, cases_from_model
    from pccl_torch.selection.learned.train import train
    from pccl_torch.sim.fit import fit

    files = [Path(f) for f in args.bench_json] + (measure(args) if args.nprocs else [])
    rows = [row for f in files for row in json.loads(Path(f).read_text())]
    cases = cases_from_bench(rows)
    if not cases:
        raise UsageError("no pccl:all measurements to train on (give -np or --bench-json)")
    machine, _report = fit(rows, None)
    layouts = [tuple(int(x) for x in item.split("x")) for item in filter(None, args.model_layouts.split(","))]
    sizes = sorted({c.nbytes for c in cases})
    cases += cases_from_model(machine, layouts, sizes)
    profile, scores, held_out = train(cases, machine_profile=machine.to_dict(), versions=versions())
    print(f"{len(cases)} cases ({profile.metadata['cases']['measured']} measured, "
          f"{profile.metadata['cases']['model']} from the cost model fitted on them)\n")
    print("held-out sizes (cross-validation on the measured cases):")
    rows = [(name, f"{s.mean_regret:.1%}", f"{s.within_10pct:.1%}", f"{s.accuracy:.1%}",
             "<- chosen" if name == profile.metadata["model"] else "") for name, s in scores.items()]
    print("\n".join(table(("model", "mean regret", "within 10%", "accuracy", ""), rows, "<>>><")))
    print("\nchosen (rows) vs fastest measured (columns) on held-out sizes:")
    print(format_confusion(held_out))
    print(f"distilled into a decision tree of {len(profile.tree['feature'])} nodes "
          f"(agrees with the model on {profile.metadata['distillation_fidelity']:.1%} of training and grid points)")
    if args.out:
        profile.save(args.out)
        print(f"wrote {args.out}")
    return 0


def format_confusion(held_out) -> str:
    counts = Counter((chosen, case.best) for case, chosen in held_out)
    names = sorted({n for pair in counts for n in pair})
    width = max(len(n) for n in names) + 2
    lines = [" " * width + "".join(f"{n:>{width}}" for n in names)]
    for chosen in names:
        if any(counts.get((chosen, best)) for best in names):
            lines.append(f"{chosen:<{width}}" + "".join(f"{counts.get((chosen, best), 0) or '.':>{width}}"
                                                        for best in names))
    return "\n".join(lines)


def explain_command(args: argparse.Namespace) -> int:
    from pccl_torch.plan import valid_names
    from pccl_torch.selection.learned.features import feature_vector
    from pccl_torch.selection.learned.profile import Profile
    from pccl_torch.selection.learned.runtime import Selector, profile_path
    from pccl_torch.topology import Topology

    path = args.profile or profile_path()
    if path is None:
        raise UsageError("no profile (PCCL_PROFILE, ~/.cache/pccl-torch/profile.json or configs/selector/)")
    profile = Profile.load(path)
    nbytes = parse_size(args.bytes)
    topo = Topology(0, args.ranks, args.local_size)
    links = _links_for(Selector(profile).machine_profile(), args.link_ratio)
    features = feature_vector(args.collective, nbytes, args.ranks, args.local_size, args.dtype_size, links.ratio())
    choice, why = Selector(profile, str(path)).explain(args.collective, nbytes, topo, args.dtype_size, links=links)
    meta = profile.metadata
    print(f"profile {path}: {meta['model']} trained {meta['date']} on {meta['machine']} "
          f"({meta['cases']['measured']} measured + {meta['cases']['model']} modelled cases, layouts "
          f"{', '.join(f'{r}x{l}' for r, l in meta['layouts'])})")
    print(f"call: {args.collective}, {format_size(nbytes)}, {topo.num_nodes} nodes x {topo.local_size} ranks")
    ranking = [a for a in profile.rank(features) if a in valid_names(args.collective)]
    machine = Selector(profile).machine_profile(links)
    from pccl_torch.sim import costs

    rows = []
    for name in valid_names(args.collective):
        rank = str(ranking.index(name) + 1) if name in ranking else "-"
        predicted = (f"{costs.predict(args.collective, name, nbytes, topo.num_nodes, topo.local_size, machine) * 1e6:.1f}"
                     if machine else "-")
        rows.append((name, rank, predicted))
    print()
    print("\n".join(table(("algorithm", "model rank", "predicted (us)"), rows, "<>>")))
    reason = {"profile": "inside the trained range: the learned model (trained on measurements) decides",
              "cost model": "outside the trained range: the cost model fitted on this machine decides",
              "heuristic": "outside the trained range and no cost model in the profile: the heuristic decides"}
    print(f"\nchoice: {choice} ({reason[why]})")
    _explain_tuned(args.collective, nbytes, args.ranks, args.local_size)
    return 0


def _explain_tuned(collective: str, nbytes: int, ranks: int, local_size: int) -> None:
    """What online tuning (PCCL_TUNE=online) chose for this call shape, from its cache, on every layout of these
    ranks (any transport, device, dtype)."""
    from pccl_torch.selection import tuning

    path = tuning.default_cache()
    for entry in tuning.cache_entries(path):
        layout = entry["layout"]
        if (layout.get("ranks"), layout.get("local_size")) != (ranks, local_size):
            continue
        for key, name in sorted(entry["choices"].items()):
            if key.startswith(f"{collective}:{nbytes}:"):
                print(f"online tuning ({path}, {layout.get('transport')} on {layout.get('device')}, "
                      f"{layout.get('hosts')} host(s)): {key} -> {name}")


def _links_for(machine, ratio: float):
    """Links of a call to explain: the profile's intra-node link, and one ``ratio`` times slower between nodes."""
    from pccl_torch.selection.links import NONE, Link, Links

    if ratio <= 1.0:
        return NONE
    intra = Link(machine.alpha_intra, 1.0 / machine.beta_intra) if machine else Link(0.0, ratio)
    return Links(intra, Link(machine.alpha_inter if machine else 0.0, intra.bytes_per_s / ratio), "explain")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_size_range(parser, args)
    command = explain_command if args.explain else train_command
    return run_command(parser, functools.partial(command, args), (TopologyError,))


if __name__ == "__main__":
    sys.exit(main())
