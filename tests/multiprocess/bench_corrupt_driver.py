"""pccl-bench inside an MPI launch with one pccl schedule deliberately broken: ``--corrupt NAME`` replaces
the registered flat algorithm ``NAME`` of every collective with a wrapper that runs it and then adds 1 to
the first element of rank 0's output. Everything after ``--`` goes to ``pccl-bench`` unchanged. Used by
test_bench_smoke.py to show that ``--check`` counts the wrong elements (the #wrong column) of exactly the
broken backend; nothing in the library changes."""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from pccl_torch.algorithms import registry


def corrupt(name: str) -> None:
    """Break algorithm ``name`` of every collective that has it (before ``pc.init``, as plans are built)."""
    for (collective, algorithm), entry in list(registry._REGISTRY.items()):
        if algorithm != name:
            continue
        real = entry.fn
        position = {"all_gather": 1, "reduce_scatter": 2, "all_reduce": 1, "all_to_all": 1}[collective]  # the output argument

        def broken(t, *args, _real=real, _position=position, **kwargs):
            _real(t, *args, **kwargs)
            out: torch.Tensor = args[_position - 1]
            if t.rank == 0 and out.numel():
                out.view(-1)[0] += 1

        registry._REGISTRY[(collective, algorithm)] = dataclasses.replace(entry, fn=broken)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corrupt", required=True)
    ours, bench_args = sys.argv[1:sys.argv.index("--")], sys.argv[sys.argv.index("--") + 1:]
    corrupt(parser.parse_args(ours).corrupt)
    from pccl_torch.bench import cli

    return cli.main(bench_args)


if __name__ == "__main__":
    sys.exit(main())
