"""Build the compiled hot path ahead of time: ``python -m pccl_torch.hotpath.build`` (``make install`` runs it).

The same route as the first ``import pccl_torch`` of an environment, which builds it when missing
(``_builder.py`` says how and where): this command is for building before a job starts (on a login node whose
cache the compute nodes share), retrying after a failed compile (which imports do not repeat), or ``--rebuild``.
Without a C++ compiler, Python's headers or MPICH's ``mpicc`` it says why and exits 1; pccl then runs its Python
path (``pccl_torch.hotpath.why_not``).
"""

from __future__ import annotations

import argparse
import sys

from mpi4py import MPI

from pccl_torch.hotpath._builder import BuildError, ensure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rebuild", action="store_true", help="compile again even where it is built")
    parser.add_argument("--verbose", action="store_true", help="print the compiler command")
    args = parser.parse_args()
    try:
        built = ensure(MPI.Get_library_version(), retry_failed=True, rebuild=args.rebuild, verbose=args.verbose)
    except BuildError as exc:
        print(f"pccl hot path not built: {exc.__cause__ or exc}", file=sys.stderr)
        sys.exit(1)
    print(f"pccl hot path: {built}")


if __name__ == "__main__":
    main()
