"""GB/s of each local kernel (the dispatch path: Triton on CUDA) beside its plain-torch reference and
``torch.Tensor.copy_`` (the practical memory bandwidth), measured in the same run.

    python benchmarks/bench_kernels.py --device cuda -b 4K -e 256M -f 4 --json kernels.json

On CPU the dispatch path is torch (Triton has no CPU backend); ``--interpret`` runs the Triton
interpreter instead (for small sizes only: it is hundreds of times slower).
Bytes counted per call: reads plus writes (a k-way reduce moves (k + 1) x the buffer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("-b", "--minbytes", default="4K")
parser.add_argument("-e", "--maxbytes", default="256M")
parser.add_argument("-f", "--stepfactor", type=float, default=4)
parser.add_argument("-d", "--dtype", default="float32", choices=["float32", "float16", "bfloat16", "float64", "int32", "int64"])
parser.add_argument("-n", "--iters", type=int, default=20)
parser.add_argument("-w", "--warmup", type=int, default=3)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
parser.add_argument("--interpret", action="store_true", help="CPU: run Triton kernels in the interpreter")
parser.add_argument("--json", help="write one object per row here")
ARGS = parser.parse_args()
if ARGS.interpret:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

from pccl_torch.ops import ReduceOp  # noqa: E402
from pccl_torch.triton_kernels import _backend, permute_blocks, reduce_, reduce_n, rotate_, use_backend  # noqa: E402
from pccl_torch.triton_kernels.pack import permute_reference, rotate_reference  # noqa: E402
from pccl_torch.triton_kernels.reduce import reduce_reference  # noqa: E402
from pccl_torch.units import format_size, parse_size, size_range  # noqa: E402


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Median seconds of one call."""
    samples = []
    for i in range(ARGS.warmup + ARGS.iters):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= ARGS.warmup:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> int:
    device = torch.device(ARGS.device)
    dtype = getattr(torch, ARGS.dtype)
    dispatch = "triton" if (device.type == "cuda" or ARGS.interpret) and _backend.HAS_TRITON else "torch"
    rows = []
    print(f"device {device}, dtype {ARGS.dtype}, dispatch path: {dispatch}; GB/s = (reads + writes) / time")
    print(f"{'kernel':<14}{'bytes':>8}  {'impl':<10}{'time(us)':>11}{'GB/s':>9}{'vs copy_':>10}")
    for nbytes in size_range(parse_size(ARGS.minbytes), parse_size(ARGS.maxbytes), ARGS.stepfactor):
        n = max(nbytes // torch.tensor([], dtype=dtype).element_size(), 1)
        x = torch.ones(n, dtype=dtype, device=device)
        y = torch.ones(n, dtype=dtype, device=device)
        z = torch.empty(n, dtype=dtype, device=device)
        eight = [torch.ones(n, dtype=dtype, device=device) for _ in range(8)]
        a, c = 3, n // 3
        cases = {  # kernel: (moved bytes / buffer bytes, dispatch call, torch reference)
            "reduce_2": (3, lambda: reduce_(z, y, ReduceOp.SUM), lambda: reduce_reference(z, [z, y], ReduceOp.SUM)),
            "reduce_8": (9, lambda: reduce_n(z, eight, ReduceOp.SUM), lambda: reduce_reference(z, eight, ReduceOp.SUM)),
            "permute": (2, lambda: permute_blocks(x[: a * 5 * (c // 5)], z[: a * 5 * (c // 5)], a, 5, c // 5),
                        lambda: permute_reference(x[: a * 5 * (c // 5)], z[: a * 5 * (c // 5)], a, 5, c // 5)),
            "rotate": (2, lambda: rotate_(x, z, n // 3), lambda: rotate_reference(x, z, n // 3)),
        }
        copy_time = timed(lambda: z.copy_(x), device)
        copy_bw = 2 * n * x.element_size() / copy_time / 1e9
        rows.append({"kernel": "copy_", "bytes": nbytes, "impl": "torch", "time_us": copy_time * 1e6,
                     "gbps": copy_bw, "vs_copy": 1.0})
        for kernel, (factor, call, reference) in cases.items():
            for impl, fn in ((dispatch, call), ("torch-ref", reference)):
                with use_backend("triton" if impl == "triton" else "torch"):
                    seconds = timed(fn, device)
                gbps = factor * n * x.element_size() / seconds / 1e9
                rows.append({"kernel": kernel, "bytes": nbytes, "impl": impl, "time_us": seconds * 1e6,
                             "gbps": gbps, "vs_copy": gbps / copy_bw})
        for row in rows:
            if row["bytes"] == nbytes:
                print(f"{row['kernel']:<14}{format_size(nbytes):>8}  {row['impl']:<10}{row['time_us']:>11.1f}"
                      f"{row['gbps']:>9.2f}{row['vs_copy']:>10.2f}")
    if ARGS.json:
        meta = {"device": str(device), "dtype": ARGS.dtype, "torch": torch.__version__, "dispatch": dispatch}
        with open(ARGS.json, "w") as fh:
            json.dump([dict(row, **meta) for row in rows], fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
