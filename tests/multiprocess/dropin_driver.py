"""The ``pccl`` backend as a drop-in, under mpiexec or torchrun, in one launch per backend string:

- ``dist.init_process_group(BACKEND)`` with no init_method, as a torchrun script calls it (under mpiexec the
  rank, world size and rendezvous come from MPI);
- with ``--drop-in``: on the pccl world group, every dtype and op a gloo group accepts gives gloo's result, what
  pccl does not implement is counted per kind in ``bypassed`` and logged once per kind; PREMUL_SUM with a
  factor; other collectives; and the FSDP adapter's checks made at the call (``fully_shard`` without
  ``pccl_torch.init()``, ``use_pccl`` on a plain module, the communicator picked by the tensors' device).

Every rank writes its own result (``rank_result``): the checks passed and failed, its rank, world size and
backend, and pccl's counters.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections import Counter
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

import pccl_torch as pc
from pccl_torch.integrations.torch_backend import PcclProcessGroup, bypassed

try:
    from . import rank_result
except ImportError:  # run as a script: this folder is on sys.path
    import rank_result

Check = Callable[[], str | None]
GLOO_DTYPES = (torch.uint8, torch.int8, torch.int32, torch.int64, torch.bool, torch.float16, torch.bfloat16,
               torch.float32, torch.float64)
"""Every dtype a gloo group reduces and gathers (it rejects int16)."""
PCCL_DTYPES = frozenset(pc.ops.SUPPORTED_DTYPES)
BITWISE = ("BAND", "BOR", "BXOR")


def ops_for(dtype: torch.dtype) -> tuple[str, ...]:
    """The ops a gloo group accepts on ``dtype`` (AVG on floats only, the bitwise ops on integers and bool)."""
    if dtype.is_floating_point:
        return ("SUM", "AVG", "PRODUCT", "MIN", "MAX")
    return ("SUM", "PRODUCT", "MIN", "MAX", *BITWISE)


def values(dtype: torch.dtype, n: int, rank: int) -> torch.Tensor:
    """Small integers, exact in every dtype, whose sums and products over a few ranks stay exact."""
    return ((torch.arange(n) + rank) % 3 + 1).to(dtype) if dtype is not torch.bool else (torch.arange(n) + rank) % 2 == 0


def differ(a: torch.Tensor, b: torch.Tensor, what: str) -> str | None:
    return None if torch.equal(a, b) else f"{what}: pccl {a.flatten()[:6].tolist()} vs gloo {b.flatten()[:6].tolist()}"


def short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class DropIn:
    """The checks on the pccl world group against a gloo group of the same ranks."""

    def __init__(self) -> None:
        self.pg, self.gloo = dist.group.WORLD, dist.new_group(backend="gloo")
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.expected: Counter[str] = Counter()
        """What each check expects ``bypassed(pg)`` to have counted, by key."""
        self.pccl_calls = 0
        """How many all-reduce calls each check expects pccl to have run."""

    def _both(self, call: Callable[[dist.ProcessGroup], torch.Tensor], what: str) -> str | None:
        return differ(call(self.pg), call(self.gloo), what)

    def all_reduce_every_dtype_and_op(self) -> str | None:
        for dtype in GLOO_DTYPES:
            for op in ops_for(dtype):
                def call(group, dtype=dtype, op=op) -> torch.Tensor:
                    t = values(dtype, 7, self.rank)
                    dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
                    return t

                if problem := self._both(call, f"all_reduce {short(dtype)} {op}"):
                    return problem
                if dtype not in PCCL_DTYPES:
                    self.expected[f"allreduce:dtype {short(dtype)}"] += 1
                elif op in BITWISE:
                    self.expected[f"allreduce:op {op}"] += 1
                else:
                    self.pccl_calls += 1
        return None

    def gathers_and_scatters_every_dtype(self) -> str | None:
        p = self.size
        for dtype in GLOO_DTYPES:
            def gather(group, dtype=dtype) -> torch.Tensor:
                out = torch.empty(5 * p, dtype=dtype)
                dist.all_gather_into_tensor(out, values(dtype, 5, self.rank), group=group)
                return out

            def gather_list(group, dtype=dtype) -> torch.Tensor:
                outs = [torch.empty(5, dtype=dtype) for _ in range(p)]
                dist.all_gather(outs, values(dtype, 5, self.rank), group=group)
                return torch.cat(outs)

            def scatter(group, dtype=dtype) -> torch.Tensor:
                out = torch.empty(4, dtype=dtype)
                dist.reduce_scatter_tensor(out, values(dtype, 4 * p, self.rank), group=group)
                return out

            for call, method in ((gather, "_allgather_base"), (gather_list, "allgather"), (scatter, "_reduce_scatter_base")):
                if problem := self._both(call, f"{method} {short(dtype)}"):
                    return problem
                if dtype not in PCCL_DTYPES:
                    self.expected[f"{method}:dtype {short(dtype)}"] += 1
        return None

    def layouts_pccl_does_not_take(self) -> str | None:
        """A non-contiguous tensor, a sparse one, a complex one (torch hands the backend its real view: pccl)."""
        def transposed(group) -> torch.Tensor:
            t = values(torch.float32, 12, self.rank).view(3, 4).t()
            dist.all_reduce(t, group=group)
            return t

        def sparse(group) -> torch.Tensor:
            t = torch.eye(3).mul(self.rank + 1).to_sparse()
            dist.all_reduce(t, group=group)
            return t.to_dense()

        def complex_sum(group) -> torch.Tensor:
            t = torch.complex(values(torch.float32, 4, self.rank), values(torch.float32, 4, self.rank + 1))
            dist.all_reduce(t, group=group)
            return t

        for call, what in ((transposed, "non-contiguous"), (sparse, "layout sparse_coo"), (complex_sum, None)):
            if problem := self._both(call, f"all_reduce {what or 'complex64'}"):
                return problem
            if what:
                self.expected[f"allreduce:{what}"] += 1
            else:
                self.pccl_calls += 1
        return None

    def premul_sum_with_a_factor(self) -> str | None:
        """torch's PREMUL_SUM (gloo has none: the reference is factor x gloo's SUM), float and tensor factors."""
        for factor in (0.5, torch.tensor(0.25)):
            t, reference = values(torch.float32, 6, self.rank), values(torch.float32, 6, self.rank)
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
            dist.all_reduce(reference, group=self.gloo)
            if problem := differ(t, float(factor) * reference, f"all_reduce PREMUL_SUM({factor})"):
                return problem
            self.pccl_calls += 1
            out, reference = torch.empty(2), torch.empty(2)
            dist.reduce_scatter_tensor(out, values(torch.float32, 2 * self.size, self.rank),
                                       op=dist._make_nccl_premul_sum(factor))
            dist.reduce_scatter_tensor(reference, values(torch.float32, 2 * self.size, self.rank), group=self.gloo)
            if problem := differ(out, float(factor) * reference, f"reduce_scatter_tensor PREMUL_SUM({factor})"):
                return problem
        return None

    def other_collectives(self) -> str | None:
        """What a gloo group accepts beyond the three collectives, on the pccl group (delegated to gloo)."""
        def objects(group) -> torch.Tensor:
            gathered: list[object] = [None] * self.size
            dist.all_gather_object(gathered, {"rank": self.rank}, group=group)
            box = [self.rank * 10]
            dist.broadcast_object_list(box, src=1, group=group)
            return torch.tensor([g["rank"] for g in gathered] + box)

        def rooted(group) -> torch.Tensor:
            t = values(torch.int64, 3, self.rank)
            dist.reduce(t, dst=0, group=group)
            gathered = [torch.empty(3, dtype=torch.int64) for _ in range(self.size)] if self.rank == 0 else None
            dist.gather(values(torch.int64, 3, self.rank), gathered, dst=0, group=group)
            got = torch.empty(2, dtype=torch.int64)
            parts = [torch.full((2,), r, dtype=torch.int64) for r in range(self.size)] if self.rank == 0 else None
            dist.scatter(got, parts, src=0, group=group)
            return torch.cat([t, got, *(gathered or [])])

        def exchanges(group) -> torch.Tensor:
            outs = [torch.empty(2, dtype=torch.int64) for _ in range(self.size)]
            dist.all_to_all(outs, [torch.full((2,), 10 * self.rank + r, dtype=torch.int64) for r in range(self.size)],
                            group=group)
            right, left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
            got = torch.empty(1, dtype=torch.int64)
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.tensor([self.rank]), right, group=group),
                                                dist.P2POp(dist.irecv, got, left, group=group)]):
                work.wait()
            dist.barrier(group=group)  # (torch's monitored_barrier checks for a gloo group itself: NCCL's fail too)
            return torch.cat([*outs, got])

        for call, what in ((objects, "object collectives"), (rooted, "reduce/gather/scatter"),
                           (exchanges, "all_to_all/batch_isend_irecv/barrier")):
            if problem := self._both(call, what):
                return problem
        self.expected["allgather:dtype uint8"] += 1  # all_gather_object gathers the pickled objects as uint8
        return None

    def counted_and_logged_once_per_kind(self, log_lines: list[str]) -> str | None:
        """``bypassed`` holds exactly what the checks expected; one debug line per kind, whatever the count."""
        got = bypassed(self.pg)
        if got != dict(self.expected):
            return f"bypassed {got}, expected {dict(self.expected)}"
        kinds = [line for line in log_lines if "to the vendor library" in line]
        logged = Counter(key for line in kinds for key in self.expected if repr(key) in line)
        if sorted(logged) != sorted(self.expected) or max(logged.values()) != 1 or len(kinds) != len(self.expected):
            return f"debug lines per kind: {dict(logged)} ({len(kinds)} lines) for {sorted(self.expected)}"
        calls = pc.stats(self.pg)["calls"].get("all_reduce", 0)
        if calls < self.pccl_calls:
            return f"pccl ran {calls} all-reduces, expected at least {self.pccl_calls}"
        return None


def fsdp_checks(pg: dist.ProcessGroup, gloo: dist.ProcessGroup) -> list[tuple[str, Check]]:
    """The FSDP adapter's errors at the call, and its communicator by the tensors' device."""
    from pccl_torch.integrations import fsdp

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))

    def fully_shard_without_init() -> str | None:
        try:
            fsdp.fully_shard(model(), mesh=DeviceMesh.from_group(gloo, "cpu"), comm="pccl")
        except pc.NotInitializedError as exc:
            return None if "pccl_torch.init()" in str(exc) else f"the error does not say what to do: {exc}"
        return "fully_shard(comm='pccl') over a gloo group without pccl_torch.init() did not raise"

    def use_pccl_on_a_plain_module() -> str | None:
        try:
            fsdp.use_pccl(model())
        except TypeError as exc:
            return None if "FSDPModule" in str(exc) else f"the error does not name FSDPModule: {exc}"
        return "use_pccl on a module that is not an FSDPModule did not raise TypeError"

    def communicator_by_device() -> str | None:
        cpu = fsdp.communicator_for(pg, torch.device("cpu"))
        if cpu is not pg.comm_for(torch.device("cpu")) or cpu.device.type != "cpu":
            return f"a pccl group's CPU tensors got {cpu.device} communicator"
        try:
            fsdp.communicator_for(pg, torch.device("meta"))
            return "a device pccl does not run on got a communicator"
        except ValueError as exc:
            if "meta" not in str(exc):
                return f"the error does not name the device: {exc}"
        try:
            fsdp.communicator_for(gloo, torch.device("cpu"))
            return "a gloo group got a communicator without pccl_torch.init()"
        except pc.NotInitializedError:
            return None

    def fully_shard_over_the_pccl_group() -> str | None:
        """No init() needed over a pccl group: FSDP's all-gathers and reduce-scatters run in pccl."""
        before = pc.stats(pg)["calls"]
        sharded = fsdp.fully_shard(model(), mesh=DeviceMesh.from_group(pg, "cpu"), comm="pccl")
        sharded(torch.ones(2, 4)).sum().backward()
        after = pc.stats(pg)["calls"]
        grew = {c: after.get(c, 0) - before.get(c, 0) for c in ("all_gather", "reduce_scatter")}
        return None if min(grew.values()) > 0 else f"FSDP's collectives did not run in pccl: {grew}"

    return [("fsdp: fully_shard without init raises at the call", fully_shard_without_init),
            ("fsdp: use_pccl on a plain module raises TypeError", use_pccl_on_a_plain_module),
            ("fsdp: communicator by the tensors' device", communicator_by_device),
            ("fsdp: fully_shard over the pccl group", fully_shard_over_the_pccl_group)]


class Lines(logging.Handler):
    """Keeps the formatted records of a logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def run_checks(checks: list[tuple[str, Check]]) -> tuple[list[str], list[str]]:
    passed, failures = [], []
    for name, check in checks:
        try:
            problem = check()
        except Exception as exc:  # noqa: BLE001 - reported
            problem = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
        (failures.append(f"{name}: {problem}") if problem else passed.append(name))
    return passed, failures


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="pccl", help="what the script passes to init_process_group")
    parser.add_argument("--drop-in", action="store_true", help="run the drop-in checks (needs the pccl backend)")
    args = parser.parse_args()
    lines = Lines()
    for name in ("pccl_torch.integrations.torch_backend", "pccl_torch.run"):  # the bypasses; what run switched
        logging.getLogger(name).addHandler(lines)
        logging.getLogger(name).setLevel(logging.DEBUG)
    had_rank = "RANK" in os.environ
    dist.init_process_group(args.backend)  # no init_method: torch's env:// rendezvous, as under torchrun
    rank, size = dist.get_rank(), dist.get_world_size()
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    checks: list[tuple[str, Check]] = [
        ("all_reduce on the default group", lambda: differ(t, torch.full((3,), float(sum(range(size)))), "all_reduce")),
    ]
    if args.drop_in:
        drop_in = DropIn()
        checks += [
            ("all_reduce: every dtype and op gloo accepts", drop_in.all_reduce_every_dtype_and_op),
            ("all_gather, reduce_scatter: every dtype gloo accepts", drop_in.gathers_and_scatters_every_dtype),
            ("all_reduce: layouts pccl does not take", drop_in.layouts_pccl_does_not_take),
            ("PREMUL_SUM with a factor", drop_in.premul_sum_with_a_factor),
            ("other collectives", drop_in.other_collectives),
            ("the same calls again", drop_in.all_reduce_every_dtype_and_op),
            ("bypasses counted and logged once per kind", lambda: drop_in.counted_and_logged_once_per_kind(lines.lines)),
            *fsdp_checks(drop_in.pg, drop_in.gloo),
        ]
    passed, failures = run_checks(checks)
    everything = pc.stats("all")
    result = {"passed": passed, "failures": failures, "torch_rank": rank, "world_size": size,
              "backend": dist.get_backend(), "group": type(dist.group.WORLD).__name__, "had_rank": had_rank,
              "calls": everything["calls"], "bypassed": everything["bypassed"],
              "switched": [line for line in lines.lines if "pccl_torch.run" in line]}
    dist.destroy_process_group()
    rank_result.write(result, rank)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
