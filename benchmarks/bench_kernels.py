"""GB/s of each local kernel (Triton, forced) beside its plain-torch reference and ``torch.Tensor.copy_`` (the
practical memory bandwidth), measured in the same run; which path the dispatch (``auto``) takes for each kernel
and size, and whether it is the faster one measured; the per-call cost of each kernel on 1-element buffers.

    python benchmarks/bench_kernels.py --device cuda -b 64K -e 256M -f 4 -d float32 --json kernels.json

Kernels: reduce_2 / reduce_8 (2- and 8-way SUM), permute (the pack/unpack block transpose), rotate, and for
float dtypes the wire kernels: quantize (int8, per-block absmax), dequantize, dequantize_acc (fused decode + SUM),
split_planes / merge_planes (byte planes). Bytes counted per call: reads plus writes (a k-way reduce moves
(k + 1) x the buffer). Each call is timed to its completion (median of ``-n``).

The ``auto`` column marks, for each kernel and size, the row of the path the dispatch table
(``triton_kernels/_backend.py``, ``ROUTES``) picks on this device, and says when the other path was faster.
The footer prints the table rows this run's measurements give ("proposed routes"), by the table's rule.

On CPU the forced path is torch (Triton has no CPU backend) and nothing is routed; ``--interpret`` runs the
Triton interpreter instead (small sizes only: it is hundreds of times slower).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

MIB = 1 << 20


class Case(NamedTuple):
    """One kernel at one size: what it moves, the dispatching call, the torch reference."""

    kernel: str
    """The dispatch table's name (``_backend.KERNELS``)."""
    moved: int
    """Bytes read plus written by one call."""
    call: Callable[[], object]
    """The library function (runs Triton under ``use_backend("triton")``)."""
    reference: Callable[[], object]
    """Its plain-torch reference, called directly."""
    route_bytes: int
    """The size the dispatch routes this call by (bytes of the call's buffer)."""
    has_triton: bool = True
    """False where the kernel has no Triton path for this dtype (the call runs the reference on every path)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-b", "--minbytes", default="4K")
    parser.add_argument("-e", "--maxbytes", default="256M")
    parser.add_argument("-f", "--stepfactor", type=float, default=4)
    parser.add_argument("-d", "--dtype", default="float32", choices=["float32", "float16", "bfloat16", "float64", "int32",
                                                                     "int64"])
    parser.add_argument("-n", "--iters", type=int, default=20)
    parser.add_argument("-w", "--warmup", type=int, default=3)
    parser.add_argument("--launch-calls", type=int, default=200,
                        help="back-to-back calls timed for the per-call cost on 1-element buffers (0: skip it)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--interpret", action="store_true", help="CPU: run Triton kernels in the interpreter")
    parser.add_argument("--json", help="write one object per row here")
    return parser.parse_args(argv)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, iters: int, warmup: int) -> float:
    """Median seconds of one call, each timed to its completion."""
    samples = []
    for i in range(warmup + iters):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        if i >= warmup:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def per_call(fn: Callable[[], object], device: torch.device, calls: int) -> float:
    """Mean seconds a call of ``calls`` made back to back: the launch cost when the buffers are tiny."""
    for _ in range(3):
        fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / calls


def cases(n: int, dtype: torch.dtype, device: torch.device) -> list[Case]:
    """Every kernel on buffers of ``n`` elements (the wire kernels for float dtypes only)."""
    from pccl_torch.ops import ReduceOp
    from pccl_torch.triton_kernels import (dequantize, merge_planes, permute_blocks, quantize, reduce_, reduce_n,
                                           rotate_, split_planes)
    from pccl_torch.triton_kernels.pack import permute_reference, rotate_reference
    from pccl_torch.triton_kernels.planes import merge_reference, split_reference
    from pccl_torch.triton_kernels.quantize import (TRITON_DEQUANTIZE_DTYPES, blocks_of, dequantize_reference,
                                                    quantize_reference)
    from pccl_torch.triton_kernels.reduce import reduce_reference

    es = torch.empty(0, dtype=dtype).element_size()
    size = n * es
    x, y = torch.ones(n, dtype=dtype, device=device), torch.ones(n, dtype=dtype, device=device)
    z = torch.empty(n, dtype=dtype, device=device)
    eight = [torch.ones(n, dtype=dtype, device=device) for _ in range(8)]
    a, b = min(3, n), 5 if n >= 15 else 1
    c = n // (a * b)
    src, dst = x[: a * b * c], z[: a * b * c]
    out = [
        Case("reduce_2", 3 * size, lambda: reduce_(z, y, ReduceOp.SUM),
             lambda: reduce_reference(z, [z, y], ReduceOp.SUM), size),
        Case("reduce_8", 9 * size, lambda: reduce_n(z, eight, ReduceOp.SUM),
             lambda: reduce_reference(z, eight, ReduceOp.SUM), size),
        Case("permute", 2 * a * b * c * es, lambda: permute_blocks(src, dst, a, b, c),
             lambda: permute_reference(src, dst, a, b, c), a * b * c * es),
        Case("rotate", 2 * size, lambda: rotate_(x, z, n // 3), lambda: rotate_reference(x, z, n // 3), size),
    ]
    if not dtype.is_floating_point:
        return out
    q = torch.empty(n, dtype=torch.int8, device=device)
    absmax = torch.empty(blocks_of(n), dtype=torch.float32, device=device)
    values = torch.randn(n, device=device).to(dtype)  # the encoder reads values, not ones
    quantize_reference(values, q, absmax)
    top = torch.empty(n, dtype=torch.uint8, device=device)
    rest = torch.empty(n * (es - 1), dtype=torch.uint8, device=device)
    coded = n + 4 * blocks_of(n)  # int8 values and float32 scales
    decodes = dtype in TRITON_DEQUANTIZE_DTYPES
    return out + [
        Case("quantize", size + coded, lambda: quantize(values, q, absmax),
             lambda: quantize_reference(values, q, absmax), size),
        Case("dequantize", coded + size, lambda: dequantize(q, absmax, z), lambda: dequantize_reference(q, absmax, z),
             size, decodes),
        Case("dequantize_acc", coded + 2 * size, lambda: dequantize(q, absmax, z, accumulate=ReduceOp.SUM),
             lambda: dequantize_reference(q, absmax, z, ReduceOp.SUM), size, decodes),
        Case("split_planes", 2 * size, lambda: split_planes(values, top, rest),
             lambda: split_reference(values, top, rest), size),
        Case("merge_planes", 2 * size, lambda: merge_planes(top, rest, z), lambda: merge_reference(top, rest, z), size),
    ]


def auto_path(case: Case, dtype: torch.dtype, device: torch.device) -> str | None:
    """The path ``auto`` takes for the case: ``"triton"`` or ``"torch"``; None where nothing is routed (CPU)."""
    from pccl_torch.triton_kernels import _backend

    if device.type != "cuda":
        return None
    return _backend.route(case.kernel, dtype, case.route_bytes, device.type) if case.has_triton else "torch"


def _impls(case: Case, forced: str) -> tuple[tuple[str, Callable[[], object]], ...]:
    """The paths to time: the forced one (the library call) and the reference; the reference alone where a forced
    Triton call would run the reference anyway."""
    reference = ("torch-ref", case.reference)
    return ((forced, case.call), reference) if case.has_triton or forced == "torch" else (reference,)


def measure(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, forced: str) -> list[dict]:
    """Rows of the size sweep: copy_, then each kernel's forced path and its reference."""
    from pccl_torch.triton_kernels import use_backend
    from pccl_torch.units import parse_size, size_range

    es = torch.empty(0, dtype=dtype).element_size()
    rows = []
    for nbytes in size_range(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor):
        n = max(nbytes // es, 1)
        x, z = torch.ones(n, dtype=dtype, device=device), torch.empty(n, dtype=dtype, device=device)
        copy_time = timed(lambda: z.copy_(x), device, args.iters, args.warmup)
        copy_bw = 2 * n * es / copy_time / 1e9
        rows.append({"kernel": "copy_", "bytes": nbytes, "impl": "torch", "time_us": copy_time * 1e6,
                     "gbps": copy_bw, "vs_copy": 1.0})
        for case in cases(n, dtype, device):
            auto = auto_path(case, dtype, device)
            for impl, fn in _impls(case, forced):
                with use_backend("triton" if impl == "triton" else "torch"):
                    seconds = timed(fn, device, args.iters, args.warmup)
                gbps = case.moved / seconds / 1e9
                rows.append({"kernel": case.kernel, "bytes": nbytes, "impl": impl, "time_us": seconds * 1e6,
                             "gbps": gbps, "vs_copy": gbps / copy_bw, "auto": auto})
        del x, z
    return rows


def launch_costs(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, forced: str) -> list[dict]:
    """Per-call cost on 1-element buffers (back to back): each kernel's forced path, its reference, a torch op."""
    from pccl_torch.triton_kernels import use_backend

    es = torch.empty(0, dtype=dtype).element_size()
    x, z = torch.ones(1, dtype=dtype, device=device), torch.empty(1, dtype=dtype, device=device)
    rows = [{"kernel": "copy_", "bytes": es, "impl": "torch", "kind": "launch",
             "time_us": per_call(lambda: z.copy_(x), device, args.launch_calls) * 1e6}]
    for case in cases(1, dtype, device):
        for impl, fn in _impls(case, forced):
            with use_backend("triton" if impl == "triton" else "torch"):
                seconds = per_call(fn, device, args.launch_calls)
            rows.append({"kernel": case.kernel, "bytes": es, "impl": impl, "kind": "launch", "time_us": seconds * 1e6,
                         "auto": auto_path(case, dtype, device)})
    return rows


def _pairs(rows: list[dict]) -> dict[tuple[str, int], dict[str, dict]]:
    """Sweep rows by (kernel, bytes), then impl: the kernels measured on both paths."""
    table: dict[tuple[str, int], dict[str, dict]] = {}
    for r in rows:
        if r["kernel"] != "copy_" and r.get("kind") != "launch":
            table.setdefault((r["kernel"], r["bytes"]), {})[r["impl"]] = r
    return {key: impls for key, impls in table.items() if {"triton", "torch-ref"} <= impls.keys()}


def dispatch_check(rows: list[dict]) -> tuple[int, list[str]]:
    """How many routed (kernel, size) pairs auto sends down the faster measured path, and a line for each other."""
    good, slower = 0, []
    for (kernel, nbytes), impls in _pairs(rows).items():
        auto = impls["triton"].get("auto")
        if auto is None:
            continue
        picked, other = (impls["triton"], impls["torch-ref"]) if auto == "triton" else (impls["torch-ref"],
                                                                                           impls["triton"])
        if picked["time_us"] <= other["time_us"]:
            good += 1
        else:
            slower.append(f"{kernel} {_size(nbytes)}: auto runs {auto} ({picked['time_us']:.1f} us), the other path "
                          f"took {other['time_us']:.1f} us ({picked['time_us'] / other['time_us']:.2f}x)")
    return good, slower


def propose_routes(rows: list[dict], dtype_class: str, label: str) -> list[str]:
    """``_backend.ROUTES`` rows from this run, by the table's rule: Triton over each run of measured sizes where it
    was faster (ties to torch), each range ending half-way (geometric mean) to the next measured size; a range
    from the smallest size starts at 0, one through the largest has no end."""
    by_kernel: dict[str, list[tuple[int, bool]]] = {}
    for (kernel, nbytes), impls in sorted(_pairs(rows).items()):
        by_kernel.setdefault(kernel, []).append((nbytes, impls["triton"]["time_us"] < impls["torch-ref"]["time_us"]))
    lines = []
    for kernel, points in by_kernel.items():
        sizes = [s for s, _ in points]
        i = 0
        while i < len(points):
            if not points[i][1]:
                i += 1
                continue
            j = i
            while j + 1 < len(points) and points[j + 1][1]:
                j += 1
            start = 0 if i == 0 else round(math.sqrt(sizes[i - 1] * sizes[i]))
            stop = "" if j == len(points) - 1 else f", stop={_literal(round(math.sqrt(sizes[j] * sizes[j + 1])))}"
            lines.append(f'Route(kernel="{kernel}", dtypes="{dtype_class}", start={_literal(start)}{stop}, '
                         f'measured="{label}: Triton faster at {_size(sizes[i])}-{_size(sizes[j])}"),')
            i = j + 1
    return lines


def _literal(nbytes: int) -> str:
    return f"{nbytes // MIB} * MIB" if nbytes and nbytes % MIB == 0 else (
        f"{nbytes >> 10} << 10" if nbytes and nbytes % 1024 == 0 else str(nbytes))


def _size(nbytes: int) -> str:
    from pccl_torch.units import format_size

    return format_size(nbytes)


def report(rows: list[dict], launch: list[dict], device: torch.device, args: argparse.Namespace) -> None:
    """The sweep table, the per-call costs, the dispatch check and the proposed routes."""
    from pccl_torch.triton_kernels import _backend

    print(f"{'kernel':<16}{'bytes':>8}  {'impl':<10}{'time(us)':>11}{'GB/s':>9}{'vs copy_':>10}  auto")
    pairs = _pairs(rows)
    for r in rows:
        mark = ""
        impls = pairs.get((r["kernel"], r["bytes"]))
        if impls and r.get("auto") is not None and r["impl"] == ("triton" if r["auto"] == "triton" else "torch-ref"):
            other = impls["torch-ref" if r["impl"] == "triton" else "triton"]
            mark = "<- auto" if r["time_us"] <= other["time_us"] else \
                f"<- auto, SLOWER ({r['time_us'] / other['time_us']:.2f}x the other)"
        print(f"{r['kernel']:<16}{_size(r['bytes']):>8}  {r['impl']:<10}{r['time_us']:>11.1f}{r['gbps']:>9.2f}"
              f"{r['vs_copy']:>10.2f}  {mark}".rstrip())
    if launch:
        print(f"per-call cost, 1-element buffers ({args.launch_calls} calls back to back, us a call; "
              f"a torch op, copy_: {launch[0]['time_us']:.1f} us)")
        costs: dict[str, dict[str, float]] = {}
        for r in launch[1:]:
            costs.setdefault(r["kernel"], {"auto": r.get("auto")})[r["impl"]] = r["time_us"]
        print(f"  {'kernel':<16}{'forced':>10}{'torch-ref':>11}  auto")
        for kernel, c in costs.items():
            forced = next((v for k, v in c.items() if k not in ("auto", "torch-ref")), None)
            print(f"  {kernel:<16}{'-' if forced is None else f'{forced:.1f}':>10}{c['torch-ref']:>11.1f}  "
                  f"{c['auto'] or '-'}")
    good, slower = dispatch_check(rows)
    if device.type != "cuda":
        print(f"dispatch check: nothing is routed on {device.type} (the table is for CUDA)")
    else:
        print(f"dispatch check: auto takes the faster measured path for {good} of {good + len(slower)} kernel sizes")
        for line in slower:
            print(f"  slower: {line}")
    label = f"bench {args.dtype} {time.strftime('%Y-%m-%d')}"
    proposed = propose_routes(rows, _backend.dtype_class(getattr(torch, args.dtype)), label)
    print(f"proposed routes ({_backend.dtype_class(getattr(torch, args.dtype))} dtypes, Triton where it was faster "
          f"here; kernels absent run torch):")
    for line in proposed:
        print(f"    {line}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    from pccl_torch.triton_kernels import _backend

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    forced = "triton" if (device.type == "cuda" or args.interpret) and _backend.HAS_TRITON else "torch"
    print(f"device {device}, dtype {args.dtype}, forced path: {forced}, auto: the dispatch table on CUDA; "
          f"GB/s = (reads + writes) / time")
    rows = measure(args, device, dtype, forced)
    launch = launch_costs(args, device, dtype, forced) if args.launch_calls > 0 else []
    report(rows, launch, device, args)
    if args.json:
        meta = {"device": str(device), "dtype": args.dtype, "torch": torch.__version__, "dispatch": forced,
                "dtype_class": _backend.dtype_class(dtype)}
        with open(args.json, "w") as fh:
            json.dump([dict(row, **meta) for row in rows + launch], fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
