"""Per-call cost of choosing an algorithm: the cached selector lookup, and the whole choice as the API
makes it (PCCL_ALGO check, selector, name resolution), beside the heuristic. Goal: <= 10 us per call.

    python benchmarks/bench_selector.py [--profile configs/selector/default.json] [--calls 100000]
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch

from pccl_torch import api
from pccl_torch.selection import heuristic
from pccl_torch.selection import Choice
from pccl_torch.selection.learned.profile import Profile
from pccl_torch.selection.learned.runtime import Selector, profile_path
from pccl_torch.topology import Topology


def per_call_us(fn, calls: int) -> float:
    fn()  # fill caches
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--calls", type=int, default=100_000)
    args = parser.parse_args()
    path = args.profile or profile_path()
    if path is None:
        raise SystemExit("no selector profile: run pccl-tune or pass --profile")
    selector = Selector(Profile.load(path), str(path))
    topo = Topology(0, 4, 2)
    comm = SimpleNamespace(choice=Choice(selector=selector, overrides={}), topology=topo)
    nbytes = 1 << 20
    first = per_call_us(lambda: Selector(selector.profile).choose("all_reduce", nbytes, topo, 4), 2_000)
    rows = [
        ("selector, first call (tree walk, no cache)", first),
        ("selector, cached", per_call_us(lambda: selector.choose("all_reduce", nbytes, topo, 4), args.calls)),
        ("API choice (per-communicator cache)",
         per_call_us(lambda: api._plan(comm, "all_reduce", None, nbytes, torch.float32), args.calls)),
        ("heuristic (for comparison)", per_call_us(lambda: heuristic.choose("all_reduce", nbytes, topo), args.calls)),
    ]
    print(f"profile: {path}")
    for label, us in rows:
        print(f"{label:<45}{us:8.2f} us/call")
    print("goal: cached choice <= 10 us/call:", "met" if rows[2][1] <= 10 else "NOT met")


if __name__ == "__main__":
    main()
