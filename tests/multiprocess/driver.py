"""Multi-rank correctness driver: run under ``mpiexec -n N`` (optionally ``PCCL_LOCAL_SIZE=L``).

One launch loops over every case (collective x algorithm x dtype x op x size), checks each against a
reference every rank computes locally from the seeded inputs of all ranks, checks that inputs of
out-of-place calls are unchanged and that all-reduce results are bitwise identical on all ranks, runs the
bad-input cases, and reports every failure. Exit status 1 if any case failed on any rank.

``--compression FMT`` runs the float cases the format applies to with ``compression=FMT``: all-gathers must
equal every rank's input through the format exactly, reductions stay within the format's error, and
all-reduce results stay bitwise identical on all ranks.

``--device cuda`` runs the same cases on CUDA tensors (inputs and references are still made on the CPU,
results are copied back to be checked): what ``scripts/gpu_check.sh`` runs on a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
from mpi4py import MPI

import pccl_torch as pc
from pccl_torch import compression as wire_formats
from pccl_torch.algorithms import COLLECTIVES
from pccl_torch.ops import FLOAT_DTYPES, INT_DTYPES, SUPPORTED_DTYPES
from pccl_torch.work import Queue

if __package__:  # imported (soak, unit tests) or run with -m
    from . import rank_result
else:  # run as a script by mpiexec
    import rank_result

LARGE = 1 << 20  # "about 1 Mi elements" in the full buffer
SMALL_BLOCKS = (0, 1, 37)  # elements per rank's block (AG, RS) or in the buffer (AR)
FLOAT_OPS = ("sum", "avg", "product", "min", "max", "premul_sum")
INT_OPS = ("sum", "product", "min", "max")
PREMUL_FACTOR = 0.5
ASYNC_ALGORITHMS = ("ring", "recursive_doubling", "hier:ring", "mpi")
#: Where the collectives' tensors live (``--device``); the CPU unless asked otherwise.
DEVICE = torch.device("cpu")


def on_device() -> contextlib.AbstractContextManager:
    """Tensors made without a device inside go to ``DEVICE`` (nothing changes on the CPU)."""
    return contextlib.nullcontext() if DEVICE.type == "cpu" else DEVICE

#: Unit roundoff u of each float dtype (half the distance from 1 to the next value).
UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
}


def roundings(ranks: int) -> int:
    """How many times a reduction of ``ranks`` inputs may round, whatever its schedule: ``ranks - 1``
    combinations (any tree of them: ring, halving, two levels, an MPI library's own), one scale (AVG,
    PREMUL_SUM) and one final store (an accumulator wider than the dtype, as the kernels and the MPI
    bf16 path use, rounds once more at the end)."""
    return ranks + 1


def error_bound(inputs: list[torch.Tensor], op: str, dtype: torch.dtype) -> torch.Tensor:
    """Per element, the largest error a correct reduction of ``inputs`` in ``dtype`` can have against the
    float64 reference of the same inputs: Higham's gamma_k = k u / (1 - k u) with k = :func:`roundings`,
    times the sum of magnitudes (SUM, AVG, PREMUL_SUM: every partial sum is bounded by it) or the product's
    magnitude (PRODUCT: each multiplication errs relatively). MIN and MAX round nothing: exact."""
    k = roundings(len(inputs))
    u = UNIT_ROUNDOFF[dtype]
    gamma = k * u / (1 - k * u)
    stack = torch.stack([x.to(torch.float64) for x in inputs])
    if op in ("min", "max"):
        return torch.zeros(stack.shape[1:], dtype=torch.float64)
    if op == "product":
        return gamma * stack.prod(0).abs()
    scale = {"sum": 1.0, "avg": 1.0 / len(inputs), "premul_sum": PREMUL_FACTOR}[op]
    return gamma * stack.abs().sum(0) * scale


# (rtol, atol per rank) of a compressed reduction of ~N(0,1) values (|x| <= ~4.5), per wire format: bf16
# rounds each contribution to 8 significant bits (2^-8 relative), int8 to half a step of absmax / 127 of its block of
# 256, fp8 (e4m3) to 2^-4 relative; lossless adds nothing to the dtype's own rounding.
COMPRESSED_TOLERANCE = {"bf16": (1e-2, 1e-2), "int8": (1e-2, 2e-2), "fp8": (7e-2, 7e-2)}


@dataclass(frozen=True)
class Case:
    collective: str
    algorithm: str
    dtype: torch.dtype
    op: str | None  # all-to-all: None (no split sizes) or "uneven" (split sizes, zeros among them, rows of 2)
    count: int  # elements per rank block (AG/RS), buffer (AR), or the base rows of an all-to-all block
    compression: str | None = None

    def __str__(self) -> str:
        op = f" {self.op}" if self.op else ""
        wire = f" compression={self.compression}" if self.compression else ""
        return (f"{self.collective}[{self.algorithm}] {str(self.dtype).removeprefix('torch.')}{op} "
                f"count={self.count}{wire}")


def through_format(x: torch.Tensor, name: str | None) -> torch.Tensor:
    """``x`` as a compressed all-gather delivers it: the format's round trip (itself if exact)."""
    return x if name is None else wire_formats.get(name).round_trip(x)


def split_table(p: int, count: int, uneven: bool, seed: int) -> list[list[int]]:
    """``table[i][j]``: rows rank ``i`` sends rank ``j`` in an all-to-all case: ``count`` each, or with split sizes
    0, count/2, count or 3 count/2 by pair (zeros, and rows and columns of different sums)."""
    if not uneven:
        return [[count] * p for _ in range(p)]
    return [[(i + 2 * j + seed) % 4 * count // 2 for j in range(p)] for i in range(p)]


PIECE = 1 << 16  # elements of an input generated from one seed (the first piece: the whole of a small input)


def make_input(rank: int, numel: int, dtype: torch.dtype, op: str | None, seed: int,
               compression: str | None = None, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """Elements ``start:stop`` (default: all) of rank ``rank``'s deterministic input of ``numel`` elements, chosen
    so that a wrong result cannot hide in the tolerance. Generated in pieces of ``PIECE`` elements, each from a seed
    of its own, so that any slice of any rank's input costs only its own pieces: a rank checks its share of a large
    result against the same slice of every rank's input (:meth:`Runner.run_case`).

    Every element's magnitude is at least 1 (ints: nonzero), so leaving a rank out or counting one twice
    moves a SUM by at least 1, far beyond :func:`error_bound` (at most ``(p + 1) u 2p``: 0.33 in bf16 at
    p = 6). AVG, PREMUL_SUM and PRODUCT get positive values only (no cancellation), so dividing by p - 1
    moves an AVG by a factor p / (p - 1) and a missing factor moves a PRODUCT by a factor >= 1.25, both far
    beyond the relative bound (p + 1) u (2.7% in bf16 at p = 6). Ints: SUM/MIN/MAX in +-[1, 50], PRODUCT
    in {-3, -2, 2, 3} (no zero that would absorb a missing rank; |product| <= 3^6).

    A compressed PRODUCT gets values near 1 (1 + 0.1 N(0, 1)), what ``COMPRESSED_TOLERANCE`` was measured on:
    each factor's wire error is relative, so a product of p factors near 1.4 errs by up to ~0.8 in fp8, as
    much as a missing factor moves it (a lossy format cannot tell those apart)."""
    stop = numel if stop is None else stop
    first, last = start // PIECE, -(-stop // PIECE)
    pieces = [_input_piece(rank, min(PIECE, numel - k * PIECE), dtype, op, seed + k * 1_000_003, compression)
              for k in range(first, last)]
    whole = torch.cat(pieces) if pieces else torch.empty(0, dtype=dtype)
    return whole[start - first * PIECE:stop - first * PIECE]


def _input_piece(rank: int, numel: int, dtype: torch.dtype, op: str | None, seed: int,
                 compression: str | None) -> torch.Tensor:
    """``numel`` elements of a rank's input from one seed: see :func:`make_input`."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    if dtype in INT_DTYPES:
        if op == "product":
            choices = torch.tensor([-3, -2, 2, 3])
            return choices[torch.randint(0, 4, (numel,), generator=g)].to(dtype)
        magnitude = torch.randint(1, 51, (numel,), generator=g, dtype=torch.int64)
        sign = torch.randint(0, 2, (numel,), generator=g, dtype=torch.int64) * 2 - 1
        return (magnitude * sign).to(dtype)
    if op == "product" and compression is not None:
        values = 1.0 + 0.1 * torch.randn(numel, generator=g, dtype=torch.float64)
    elif op == "product":
        values = 1.25 + 0.25 * torch.rand(numel, generator=g, dtype=torch.float64)  # [1.25, 1.5): 1.5^6 = 11.4
    else:
        values = 1.0 + torch.rand(numel, generator=g, dtype=torch.float64)  # [1, 2)
        if op not in ("avg", "premul_sum"):
            values = values * (torch.randint(0, 2, (numel,), generator=g, dtype=torch.float64) * 2 - 1)
    return values.to(dtype)


def share(numel: int, p: int, r: int) -> tuple[int, int]:
    """The slice of a ``numel``-element result that rank ``r`` of ``p`` checks against the reference."""
    return numel * r // p, numel * (r + 1) // p


def reference(inputs: list[torch.Tensor], op: str) -> torch.Tensor:
    """Element-wise ``op`` over every rank's input, in float64 (floats) or int64 (ints)."""
    wide = torch.float64 if inputs[0].dtype.is_floating_point else torch.int64
    stack = torch.stack([x.to(wide) for x in inputs])
    if op in ("sum", "avg", "premul_sum"):
        out = stack.sum(0)
        if op == "avg":
            out = out / len(inputs)
        elif op == "premul_sum":
            out = out * PREMUL_FACTOR
    elif op == "product":
        out = stack.prod(0)
    elif op == "min":
        out = stack.min(0).values
    else:
        out = stack.max(0).values
    return out


def as_op(op: str):
    return pc.premul_sum(PREMUL_FACTOR) if op == "premul_sum" else op


def matches(result: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, ranks: int,
            compression: str | None = None, *, inputs: list[torch.Tensor] | None = None,
            op: str | None = None) -> str | None:
    """None if ``result`` matches ``expected`` (the float64 / int64 reference of ``inputs`` under ``op``);
    else a short description of the worst mismatch.

    Ints: exact (wrapping as the dtype does). Floats without compression: within :func:`error_bound` of
    ``inputs`` and ``op`` (required). With ``compression``: within the wire format's error
    (``COMPRESSED_TOLERANCE``, relative plus absolute per rank)."""
    if dtype in INT_DTYPES:
        expected = expected.to(dtype)  # exact, wrapping as the dtype does
        if torch.equal(result, expected):
            return None
        bad = (result != expected).nonzero()[0].item()
        return f"index {bad}: got {result[bad].item()}, expected {expected[bad].item()}"
    got = result.to(torch.float64)
    if compression in COMPRESSED_TOLERANCE:
        rtol, atol = COMPRESSED_TOLERANCE[compression]
        bound = rtol * expected.abs() + atol * ranks
    else:
        if inputs is None or op is None:
            raise ValueError("matches() needs the inputs and the op to bound a float result")
        bound = error_bound(inputs, op, dtype)
    err = (got - expected).abs()
    if got.shape == expected.shape and bool((err <= bound).all()):
        return None
    excess = err - bound
    bad = int(excess.argmax())
    return (f"index {bad}: got {got[bad].item()}, expected {expected[bad].item()} "
            f"(error {err[bad].item():.3g} > bound {bound[bad].item():.3g})")


class Runner:
    def __init__(self, world: MPI.Comm, verbose: bool) -> None:
        self.world = world
        self.rank = world.Get_rank()
        self.size = world.Get_size()
        self.failures: list[str] = []
        self.passed = 0
        self.verbose = verbose
        self.seed = 0

    def check(self, name: str, fn: Callable[[], str | None]) -> None:
        try:
            problem = fn()
        except Exception as exc:  # noqa: BLE001 - every failure is reported, the loop goes on
            problem = f"raised {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
        if problem:
            self.failures.append(f"rank {self.rank}: {name}: {problem}")
        else:
            self.passed += 1

    def identical_everywhere(self, tensor: torch.Tensor) -> bool:
        digest = hashlib.sha1(tensor.cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
        return len(set(self.world.allgather(digest))) == 1

    def run_case(self, case: Case) -> str | None:
        self.seed += 1
        p, r = self.size, self.rank
        block = case.count
        if case.collective == "all_gather":
            inputs = [make_input(i, block, case.dtype, None, self.seed) for i in range(p)]
            inp = inputs[r].clone().to(DEVICE)
            out = torch.full((p * block,), 7, dtype=case.dtype, device=DEVICE)
            pc.all_gather_into_tensor(out, inp, algorithm=case.algorithm, compression=case.compression)
            if not torch.equal(inp.cpu(), inputs[r]):
                return "input was modified"
            expected = torch.cat([through_format(x, case.compression) for x in inputs])
            same = torch.equal(out.cpu().view(torch.uint8), expected.view(torch.uint8))
            return None if same else "output differs from the concatenated inputs"
        if case.collective == "reduce_scatter":
            own = make_input(r, p * block, case.dtype, case.op, self.seed, case.compression)
            inp = own.clone().to(DEVICE)
            out = torch.full((block,), 7, dtype=case.dtype, device=DEVICE)
            pc.reduce_scatter_tensor(out, inp, as_op(case.op), algorithm=case.algorithm, compression=case.compression)
            if not torch.equal(inp.cpu(), own):
                return "input was modified"
            mine = [make_input(i, p * block, case.dtype, case.op, self.seed, case.compression, r * block,
                               (r + 1) * block) for i in range(p)]
            return matches(out.cpu(), reference(mine, case.op), case.dtype, p, case.compression,
                           inputs=mine, op=case.op)
        if case.collective == "all_to_all":
            return self.run_all_to_all(case)
        buf = make_input(r, block, case.dtype, case.op, self.seed, case.compression).to(DEVICE)
        pc.all_reduce(buf, as_op(case.op), algorithm=case.algorithm, compression=case.compression)
        buf = buf.cpu()
        # Each rank checks its share against the reference; the ranks' results are then shown identical.
        lo, hi = share(block, p, r)
        inputs = [make_input(i, block, case.dtype, case.op, self.seed, case.compression, lo, hi) for i in range(p)]
        problem = matches(buf[lo:hi], reference(inputs, case.op), case.dtype, p, case.compression, inputs=inputs,
                          op=case.op)
        if problem:
            problem = f"elements {lo}:{hi}: {problem}"
        if not self.identical_everywhere(buf):
            problem = (problem + "; " if problem else "") + "results differ between ranks"
        return problem


    def run_all_to_all(self, case: Case) -> str | None:
        """Every rank's input holds its blocks for each rank; what rank ``r`` must get is sliced from them (the
        format's round trip of each block that crosses nodes, with compression)."""
        p, r, uneven = self.size, self.rank, case.op == "uneven"
        width = 2 if uneven else 1
        table = split_table(p, case.count, uneven, self.seed)
        inputs = [make_input(i, sum(row) * width, case.dtype, None, self.seed).view(-1, width)
                  for i, row in enumerate(table)]
        inp = inputs[r].clone().to(DEVICE)
        recv = [row[r] for row in table]
        out = torch.full((sum(recv), width), 7, dtype=case.dtype, device=DEVICE)
        splits = (recv, table[r]) if uneven else (None, None)
        pc.all_to_all_single(out, inp, *splits, algorithm=case.algorithm, compression=case.compression)
        if not torch.equal(inp.cpu(), inputs[r]):
            return "input was modified"
        local = pc.default_communicator().topology.local_size
        expected = []
        for i, row in enumerate(table):
            block = inputs[i][sum(row[:r]):sum(row[:r]) + row[r]].reshape(-1)
            crosses = i // local != r // local and pc.default_communicator().topology.num_nodes > 1
            expected.append(through_format(block, case.compression) if crosses and block.numel() else block)
        same = torch.equal(out.cpu().reshape(-1).view(torch.uint8), torch.cat(expected).view(torch.uint8))
        return None if same else f"output differs from every rank's block for rank {r} (splits {table})"


def async_algorithms(wanted: set[str]) -> tuple[str, ...]:
    """The all-reduce algorithms of the async check: ``ASYNC_ALGORITHMS``, or with ``--algorithms`` each
    one not asked for replaced by one that was (so a run can leave out a level that cannot work)."""
    if not wanted:
        return ASYNC_ALGORITHMS
    usable = [a for a in pc.algorithms("all_reduce") if a in wanted] or ["ring"]
    return tuple(a if a in usable else usable[0] for a in ASYNC_ALGORITHMS)


def check_async(p: int, r: int, names: tuple[str, ...] = ASYNC_ALGORITHMS) -> str | None:
    """Several async collectives in flight, then a blocking one: all complete, in issue order."""
    bufs = [torch.full((33,), float(r + k)) for k in range(4)]
    inp = torch.arange(5, dtype=torch.int64) + r
    gathered = torch.empty(5 * p, dtype=torch.int64)
    works = [pc.all_reduce(b, algorithm=name, async_op=True)
             for b, name in zip(bufs, names, strict=True)]
    works.append(pc.all_gather_into_tensor(gathered, inp, async_op=True))
    sends = [(r + j) % 3 for j in range(p)]  # an all-to-all with split sizes, and one without, in flight too
    exchanged = torch.empty(sum((i + r) % 3 for i in range(p)), dtype=torch.int64)
    works.append(pc.all_to_all_single(exchanged, torch.cat([torch.full((n,), 10 * r + j) for j, n in enumerate(sends)]),
                                      [(i + r) % 3 for i in range(p)], sends, async_op=True))
    even = torch.empty(2 * p)
    works.append(pc.all_to_all_single(even, torch.arange(2 * p, dtype=torch.float32) + 100 * r, async_op=True))
    scattered = torch.empty(2)
    pc.reduce_scatter_tensor(scattered, torch.ones(2 * p), "sum")  # blocking: waits for the queued ones
    for w in works:
        if not isinstance(w, pc.Work):
            return f"async_op=True returned {type(w).__name__}, expected pccl_torch.Work"
        w.wait(timeout=120)
        if not (w.is_completed() and w.is_success()):
            return "a waited work is not completed successfully"
    for k, b in enumerate(bufs):
        if not torch.equal(b, torch.full((33,), float(sum(range(p)) + k * p))):
            return f"async all-reduce {k} wrong: {b[:3]}"
    if not torch.equal(gathered, torch.cat([torch.arange(5, dtype=torch.int64) + i for i in range(p)])):
        return "async all-gather wrong"
    if not torch.equal(exchanged, torch.cat([torch.full(((i + r) % 3,), 10 * i + r) for i in range(p)])):
        return "async all-to-all with split sizes wrong"
    if not torch.equal(even, torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * i
                                        for i in range(p)])):
        return "async all-to-all wrong"
    if not torch.equal(scattered, torch.full((2,), float(p))):
        return "blocking reduce-scatter after async calls wrong"
    future = pc.all_reduce(torch.ones(3), async_op=True).get_future()
    if not torch.equal(future.wait(), torch.full((3,), float(p))):
        return "torch future of an async all-reduce has the wrong value"
    return None


def correctness_cases(algorithms: dict[str, list[str]], large: bool, compression: str | None = None,
                      sample: bool = False) -> list[Case]:
    """Every collective x algorithm x dtype x op x size. ``sample``: one reduction op per (algorithm, dtype)
    and one large case per algorithm, rotated over the dtypes and algorithms so that each algorithm still
    meets several ops and every op and large kind still runs (for layouts whose full product others cover)."""
    dtypes = SUPPORTED_DTYPES if compression is None else [
        d for d in FLOAT_DTYPES if wire_formats.get(compression).applies_to(d)]
    cases = []
    for collective, names in algorithms.items():
        for n, name in enumerate(names):
            for d, dtype in enumerate(dtypes):
                ops: tuple[str | None, ...]
                if collective == "all_gather":
                    ops = (None,)
                elif collective == "all_to_all":
                    ops = (None, "uneven")
                else:
                    ops = FLOAT_OPS if dtype in FLOAT_DTYPES else INT_OPS
                    if sample:
                        ops = (ops[(n + d) % len(ops)],)
                for op in ops:
                    for count in SMALL_BLOCKS + ((300,) if compression else ()):  # 300: two blocks of scales
                        cases.append(Case(collective, name, dtype, op, count, compression))
            if not large:
                continue
            if collective == "all_to_all":
                kinds: tuple[tuple[torch.dtype, str | None], ...] = ((torch.float32, None), (torch.bfloat16, "uneven"))
            else:
                kinds = ((torch.float32, "sum"), (torch.int32, "sum"), (torch.bfloat16, "max"))
            kinds = tuple(kind for kind in kinds if kind[0] in dtypes)
            if sample and kinds:
                kinds = (kinds[n % len(kinds)],)
            cases += [Case(collective, name, dtype, op if collective != "all_gather" else None, -1, compression)
                      for dtype, op in kinds]
    return cases


def expect_error(kind: type[BaseException], fragment: str, call: Callable[[], object]) -> str | None:
    try:
        call()
    except kind as exc:
        return None if fragment in str(exc) else f"{kind.__name__} without {fragment!r}: {exc}"
    except Exception as exc:  # noqa: BLE001
        return f"expected {kind.__name__} ({fragment!r}), got {type(exc).__name__}: {exc}"
    return f"expected {kind.__name__} ({fragment!r}), nothing was raised"


def bad_input_cases(p: int) -> list[tuple[str, type[BaseException], str, Callable[[], object]]]:
    x = torch.ones(4)
    return [
        ("AG wrong output size", ValueError, f"must have input.numel() * {p}",
         lambda: pc.all_gather_into_tensor(torch.empty(4 * p + 1), x)),
        ("RS wrong input size", ValueError, f"must have output.numel() * {p}",
         lambda: pc.reduce_scatter_tensor(torch.empty(4), torch.ones(4 * p + 2))),
        ("AG dtype mismatch", TypeError, "must match",
         lambda: pc.all_gather_into_tensor(torch.empty(4 * p, dtype=torch.float64), x)),
        ("AR unsupported dtype", TypeError, "supports",
         lambda: pc.all_reduce(torch.ones(4, dtype=torch.bool))),
        ("AR complex dtype", TypeError, "supports",
         lambda: pc.all_reduce(torch.ones(4, dtype=torch.complex64))),
        ("AR non-contiguous", ValueError, "not contiguous",
         lambda: pc.all_reduce(torch.ones(4, 4).t())),
        ("RS non-contiguous input", ValueError, "not contiguous",
         lambda: pc.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * p, 2)[:, 0])),
        ("AR wrong device", ValueError, f"initialised for {DEVICE.type}",
         lambda: pc.all_reduce(torch.ones(4, device="meta"))),
        ("AR not a tensor", TypeError, "must be a torch.Tensor",
         lambda: pc.all_reduce([1.0, 2.0])),  # type: ignore[arg-type]
        ("AR AVG on int", TypeError, "floating-point",
         lambda: pc.all_reduce(torch.ones(4, dtype=torch.int32), "avg")),
        ("RS PREMUL_SUM on int", TypeError, "floating-point",
         lambda: pc.reduce_scatter_tensor(torch.empty(1, dtype=torch.int64), torch.ones(p, dtype=torch.int64),
                                          pc.premul_sum(2.0))),
        ("AR unknown op", ValueError, "unsupported reduction",
         lambda: pc.all_reduce(torch.ones(4), "xor")),
        ("AR PREMUL_SUM without factor", ValueError, "needs a factor",
         lambda: pc.all_reduce(torch.ones(4), pc.ReduceOp.PREMUL_SUM)),
        ("AR unknown algorithm", ValueError, "valid: ",
         lambda: pc.all_reduce(torch.ones(4), algorithm="telepathy")),
        ("AR compression on integers", TypeError, "'int8' does not apply to torch.int32",
         lambda: pc.all_reduce(torch.ones(4, dtype=torch.int32), compression="int8")),
        ("AG bf16 compression of bf16", TypeError, "'bf16' does not apply to torch.bfloat16",
         lambda: pc.all_gather_into_tensor(torch.empty(2 * p, dtype=torch.bfloat16), torch.ones(2, dtype=torch.bfloat16),
                                           compression="bf16")),
        ("RS unknown compression", ValueError, "unknown compression 'zip'",
         lambda: pc.reduce_scatter_tensor(torch.empty(1), torch.ones(p), compression="zip")),
        ("AG overlapping buffers", ValueError, "overlaps",
         lambda: (lambda base: pc.all_gather_into_tensor(base[: 4 * p], base[1:5]))(torch.zeros(4 * p + 1))),
        ("A2A split sizes that do not sum to the input's rows", ValueError, "input_split_sizes sums to",
         lambda: pc.all_to_all_single(torch.empty(p), torch.ones(p), [1] * p, [2] + [1] * (p - 1))),
        ("A2A negative split size", ValueError, "cannot be negative",
         lambda: pc.all_to_all_single(torch.empty(p), torch.ones(p), [1] * p, [-1, 2] + [1] * (p - 2) if p > 1
                                      else [-1])),
        ("A2A split sizes of the wrong length", ValueError, f"expected one per rank ({p})",
         lambda: pc.all_to_all_single(torch.empty(p), torch.ones(p), [1] * p, [1] * (p + 1))),
        ("A2A split size that is not an int", TypeError, "split sizes are ints",
         lambda: pc.all_to_all_single(torch.empty(p), torch.ones(p), [1] * p, [1.0] * p)),
        ("A2A dtype mismatch", TypeError, "must match",
         lambda: pc.all_to_all_single(torch.empty(p, dtype=torch.float64), torch.ones(p))),
        ("A2A rows that do not split equally", ValueError, "do not split equally" if p > 1 else "with no split sizes",
         lambda: pc.all_to_all_single(torch.empty(p + 1), torch.ones(p + 1)) if p > 1 else
         pc.all_to_all_single(torch.empty(2), torch.ones(1))),
        ("A2A rows of different shapes", ValueError, "rows (dim 0) have 3 elements",
         lambda: pc.all_to_all_single(torch.empty(p, 3), torch.ones(p, 2))),
        ("A2A overlapping buffers", ValueError, "overlaps",
         lambda: (lambda base: pc.all_to_all_single(base[:p], base[p - 1:2 * p - 1]))(torch.zeros(2 * p))),
        ("A2A compression on integers", TypeError, "'fp8' does not apply to torch.int64",
         lambda: pc.all_to_all_single(torch.empty(p, dtype=torch.int64), torch.ones(p, dtype=torch.int64),
                                      compression="fp8")),
        ("A2A 0-dim tensor", ValueError, "0-dim",
         lambda: pc.all_to_all_single(torch.empty(()), torch.ones(()))),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-large", action="store_true", help="skip the ~1 Mi element cases")
    parser.add_argument("--sample", action="store_true",
                        help="one reduction op per algorithm and dtype and one large case per algorithm, rotated")
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--algorithms", default="", help="comma list; default: every valid name")
    parser.add_argument("--json", help="rank 0 writes the summary here")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--compression", choices=wire_formats.NAMES,
                        help="run the cases with this wire format (the float dtypes it applies to)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="where the collectives' tensors live (default cpu)")
    parser.add_argument("--pairwise-bytes-from", type=int,
                        help="plan.PAIRWISE_BYTES_FROM for this run (small: the compressed all-to-all's pairwise move)")
    parser.add_argument("--chunk-bytes", type=int,
                        help="compression.schedules.CHUNK_BYTES for this run, on any link (small: the compressed "
                             "all-to-all's exchange in many pieces)")
    args = parser.parse_args()
    if args.pairwise_bytes_from is not None:
        import pccl_torch.plan

        pccl_torch.plan.PAIRWISE_BYTES_FROM = args.pairwise_bytes_from
    if args.chunk_bytes is not None:
        import pccl_torch.compression.schedules

        pccl_torch.compression.schedules.CHUNK_BYTES = args.chunk_bytes
        pccl_torch.compression.schedules.SLOW_LINK_BYTES_PER_S = float("inf")  # no link measured here: pieces anyway
    global DEVICE
    DEVICE = torch.device(args.device)

    world = MPI.COMM_WORLD
    runner = Runner(world, args.verbose)
    start = time.perf_counter()

    runner.check("use before init", lambda: expect_error(pc.NotInitializedError, "call pccl_torch.init() first",
                                                         lambda: pc.all_reduce(torch.ones(2))))
    comm = pc.init() if DEVICE.type == "cpu" else pc.init(device=DEVICE)
    topo = comm.topology
    collectives = args.collectives.split(",")
    wanted = set(filter(None, args.algorithms.split(",")))
    algorithms = {c: [a for a in pc.algorithms(c, DEVICE.type) if not wanted or a in wanted] for c in collectives}
    cases = correctness_cases(algorithms, large=not args.no_large, compression=args.compression,
                              sample=args.sample)
    for case in cases:
        if case.count < 0:
            per_block = LARGE // topo.world_size + 1 if case.collective != "all_reduce" else LARGE + 3
            per_block = LARGE // topo.world_size ** 2 + 1 if case.collective == "all_to_all" else per_block
            case = dataclasses.replace(case, count=per_block)
        if args.verbose and runner.rank == 0:
            print(case, flush=True)
        runner.check(str(case), lambda case=case: runner.run_case(case))
    exercised = {c: sorted({case.algorithm for case in cases if case.collective == c}) for c in collectives}

    names = async_algorithms(wanted)

    def async_check(threaded: bool) -> str | None:
        """The async checks with the worker thread and inline (PCCL_ASYNC's two ways), whichever the
        communicator chose for this machine."""
        chosen = comm.executor
        comm.executor = Queue("pccl-check", inline=not threaded)
        try:
            with on_device():
                return check_async(topo.world_size, topo.rank, names)
        finally:
            comm.executor.shutdown()
            comm.executor = chosen

    runner.check("async work handles (worker thread)", lambda: async_check(threaded=True))
    runner.check("async work handles (inline)", lambda: async_check(threaded=False))
    runner.check("ranks on this machine counted", lambda: None if topo.cpu_ranks == topo.world_size else
                 f"topology counts {topo.cpu_ranks} ranks on this machine, expected all {topo.world_size}")
    with on_device():
        bad_inputs = bad_input_cases(topo.world_size)
    for name, kind, fragment, call in bad_inputs:
        def bad_input(kind=kind, fragment=fragment, call=call) -> str | None:
            with on_device():
                return expect_error(kind, fragment, call)

        runner.check(f"bad input: {name}", bad_input)
    # After all the rejected calls, the communicator still works and nothing is pending.
    runner.check("collective after rejected calls", lambda: runner.run_case(
        Case("all_reduce", "ring", torch.float32, "sum", 5)))
    transport = comm.transport  # what carried the levels: mpi, or torch:gloo (PCCL_TRANSPORT=torch)
    pc.shutdown()
    runner.check("use after shutdown", lambda: expect_error(pc.NotInitializedError, "shut down",
                                                            lambda: pc.all_reduce(torch.ones(2))))

    failures = [f for per_rank in world.gather(runner.failures, root=0) or [] for f in per_rank]
    passed = world.reduce(runner.passed, op=MPI.SUM, root=0)
    if runner.rank == 0:
        elapsed = time.perf_counter() - start
        for failure in failures:
            print("FAIL", failure, file=sys.stderr)
        print(f"mpiexec -n {topo.world_size} local_size={topo.local_size}: {len(cases)} cases, "
              f"{elapsed:.1f} s")
        print(f"{passed} passed, {len(failures)} failed")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"ranks": topo.world_size, "local_size": topo.local_size, "device": str(comm.device),
                       "passed": passed,
                           "failed": len(failures), "failures": failures, "seconds": elapsed,
                           "mpi": MPI.Get_library_version().splitlines()[0]}, fh, indent=1)
    failed_anywhere = world.allreduce(len(runner.failures), op=MPI.SUM)
    # Every rank's own result, written after its shutdown returned (the test checks all of them).
    rank_result.write({"ranks": topo.world_size, "local_size": topo.local_size, "cases": len(cases),
                       "algorithms": exercised, "transport": transport,
                       "passed": runner.passed, "failed": len(runner.failures), "failures": runner.failures[:50],
                       "mpi": MPI.Get_library_version().splitlines()[0]}, runner.rank)
    return 1 if failed_anywhere else 0


if __name__ == "__main__":
    sys.exit(main())
