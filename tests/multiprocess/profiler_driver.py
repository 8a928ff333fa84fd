"""pccl's collectives in ``torch.profiler`` traces under ``mpiexec -n N`` (``PCCL_LOCAL_SIZE`` emulating nodes).

Every rank profiles one call of each route, each of its own size so that its events can be told apart: the API
through the compiled hot path, through the Python path, async, hierarchical (exact and compressed) and the
``pccl`` torch.distributed backend, blocking and async. It exports the Chrome trace and checks in it that each
call shows once as ``pccl:<collective>`` carrying its collective, bytes, dtype, algorithm, group size, rank and
async flag; with the extension, inside torch's ``record_param_comms`` with torch's fields; and that a hierarchical
call's phases (``pccl:intra:*``, ``pccl:inter:*``, pack, unpack, encode, decode) nest inside its range, a
pipelined call's as each chunk's steps and waits.
``--python-path`` (run with ``PCCL_HOTPATH=off``): the ranges recorded from Python, no ``record_param_comms``, and
the async calls not looked for where they run on the worker thread (which only the extension carries the profiler
to). The backend asks pccl for a ``Work`` even for torch's blocking calls: its calls are async ones to pccl.

Every rank writes its failures (``rank_result.write``); ``test_profiler.py`` checks every rank and the exit status.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import profile

import pccl_torch as pc
from pccl_torch import hotpath
from rank_result import RESULT_DIR_ENV, Checks, write


@dataclass
class Call:
    """What one profiled call's range must say."""

    collective: str
    nbytes: int
    algorithm: str | None  # None: whatever the choice ran (checked to be a name)
    async_op: bool = False
    phases: tuple[str, ...] = ()


def require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def events(trace: Path) -> list[dict]:
    """The complete events (``ph: X``) of a Chrome trace."""
    return [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]


def inside(inner: dict, outer: dict) -> bool:
    """Whether ``inner`` lies within ``outer`` on the same thread (the trace's microseconds, rounded)."""
    start, end = float(outer["ts"]), float(outer["ts"]) + float(outer["dur"])
    return inner["tid"] == outer["tid"] and start - 1e-3 <= float(inner["ts"]) and \
        float(inner["ts"]) + float(inner["dur"]) <= end + 1e-3


def check_call(trace: list[dict], call: Call, rank: int, size: int, extension: bool) -> None:
    name = f"pccl:{call.collective}"
    found = [e for e in trace if e["name"] == name and e["args"].get("bytes") == call.nbytes
             and e["args"].get("async_op") == call.async_op]
    assert len(found) == 1, f"{name} of {call.nbytes} bytes (async {call.async_op}): {len(found)} ranges"
    event = found[0]
    args = event["args"]
    assert args["collective"] == call.collective and args["dtype"] == "float32", args
    assert args["group_size"] == size and args["rank"] == rank, args
    assert isinstance(args["seq"], int) and args["seq"] > 0, args
    if call.algorithm is not None:
        assert args["algorithm"] == call.algorithm, args
    else:
        assert isinstance(args["algorithm"], str) and args["algorithm"], args
    params = [e for e in trace if e["name"] == "record_param_comms" and inside(event, e)]
    if extension:
        assert len(params) == 1, f"{name}: {len(params)} record_param_comms around it"
        meta = params[0]["args"]
        elements = call.nbytes // 4
        block = elements // size
        assert meta["Collective name"] == call.collective and meta["dtype"] == "Float", meta
        assert meta["Group size"] == size and meta["Rank"] == rank and meta["Seq"] == args["seq"], meta
        assert meta["In msg nelems"] == (block if call.collective == "all_gather" else elements), meta
        assert meta["Out msg nelems"] == (block if call.collective == "reduce_scatter" else elements), meta
        assert meta["Process Group Name"] == "pccl" and meta["Is asynchronized op"] == int(call.async_op), meta
    else:
        assert not params, f"{name}: record_param_comms without the extension"
    nested = [e for e in trace if e is not event and e["name"].startswith("pccl:") and inside(e, event)]
    names = [e["name"] for e in nested]
    if call.algorithm == "hier:pipelined":  # short steps back to back may share a microsecond: in any order
        names, want = sorted(names), sorted(call.phases)
    else:
        want = list(call.phases)
    assert names == want, f"{name} {call.algorithm}: phases {names}, want {want}"
    for e in nested:
        if "chunk" in e["args"]:  # a pipelined call's step: its chunk and what it runs, no bytes
            assert e["args"]["chunk"] in (0, 1) and e["args"]["phase"].startswith("pccl:"), e
        else:
            assert e["args"]["bytes"] > 0, e
        if ":intra:" in e["name"] or ":inter:" in e["name"]:
            assert e["args"]["group_size"] in (size // int(os.environ.get("PCCL_LOCAL_SIZE", "1")),
                                               int(os.environ.get("PCCL_LOCAL_SIZE", "1"))), e


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--python-path", action="store_true", help="run with PCCL_HOTPATH=off: no extension")
    args = parser.parse_args()
    comm = pc.init()
    rank, size = comm.topology.rank, comm.topology.world_size
    pg = dist.new_group(backend="pccl")
    checks = Checks(rank)
    extension = hotpath.available
    assert extension == (not args.python_path), hotpath.why_not
    async_recorded = extension or not comm.threaded_async  # carried to the worker, or run inline

    def floats(blocks: int) -> torch.Tensor:
        return torch.full((blocks * size,), float(rank + 1))

    hot = floats(16)
    pc.all_reduce(hot)  # binds the shape: its next call runs in the hot path (with the extension)
    calls: list[Call] = []
    with profile(record_shapes=True) as prof:
        before = hotpath.hits(comm)
        pc.all_reduce(hot)
        hot_hits = hotpath.hits(comm) - before
        calls.append(Call("all_reduce", hot.numel() * 4, "mpi"))

        out, inp = floats(17 * size), floats(17)
        pc.all_gather_into_tensor(out, inp, algorithm="ring")
        calls.append(Call("all_gather", out.numel() * 4, "ring"))

        full, part = floats(18 * size), floats(18)
        work = pc.reduce_scatter_tensor(part, full, async_op=True)
        work.wait()
        if async_recorded:
            calls.append(Call("reduce_scatter", full.numel() * 4, work.algorithm, async_op=True))

        buf = floats(19)
        pc.all_reduce(buf, algorithm="hier:ring")
        calls.append(Call("all_reduce", buf.numel() * 4, "hier:ring",
                          phases=("pccl:intra:reduce_scatter", "pccl:inter:all_reduce", "pccl:intra:all_gather")))

        out, inp = floats(20 * size), floats(20)
        pc.all_gather_into_tensor(out, inp, algorithm="hier:ring")
        calls.append(Call("all_gather", out.numel() * 4, "hier:ring",
                          phases=("pccl:inter:all_gather", "pccl:intra:all_gather", "pccl:unpack")))

        full, part = floats(21 * size), floats(21)
        pc.reduce_scatter_tensor(part, full, algorithm="hier:ring")
        calls.append(Call("reduce_scatter", full.numel() * 4, "hier:ring",
                          phases=("pccl:pack", "pccl:intra:reduce_scatter", "pccl:inter:reduce_scatter")))

        buf = floats(64)
        pc.all_reduce(buf, algorithm="hier:mpi", compression="int8")
        calls.append(Call("all_reduce", buf.numel() * 4, "hier:mpi+int8",
                          phases=("pccl:intra:reduce_scatter", "pccl:inter:reduce_scatter", "pccl:encode",
                                  "pccl:inter:all_gather", "pccl:intra:all_gather", "pccl:decode")))

        out, inp = floats(24 * size), floats(24)  # two chunks (PCCL_PIPELINE_CHUNKS=2): each step a range
        pc.all_gather_into_tensor(out, inp, algorithm="hier:pipelined")
        calls.append(Call("all_gather", out.numel() * 4, "hier:pipelined",
                          phases=("pccl:inter:all_gather", "pccl:inter:all_gather", "pccl:wait", "pccl:intra:all_gather",
                                  "pccl:wait", "pccl:intra:all_gather", "pccl:wait", "pccl:unpack", "pccl:wait",
                                  "pccl:unpack")))

        buf = floats(22)
        dist.all_reduce(buf, group=pg)  # the pccl backend
        if async_recorded:
            calls.append(Call("all_reduce", buf.numel() * 4, None, async_op=True))

        out, inp = floats(23 * size), floats(23)
        dist.all_gather_into_tensor(out, inp, group=pg, async_op=True).wait()
        if async_recorded:
            calls.append(Call("all_gather", out.numel() * 4, None, async_op=True))
    trace_path = Path(os.environ.get(RESULT_DIR_ENV, ".")) / f"trace{rank}.json"
    prof.export_chrome_trace(str(trace_path))
    trace = events(trace_path)

    if extension:
        checks.check("the hot path ran the bound call", lambda: require(hot_hits == 1, f"hot path hits {hot_hits}"))
    for call in calls:
        checks.check(f"{call.collective} {call.algorithm} async={call.async_op}",
                     lambda call=call: check_call(trace, call, rank, size, extension))
    ranges = [e for e in trace if e["name"].startswith("pccl:") and "collective" in e["args"]]
    checks.check("one range per call", lambda: require(len(ranges) == len(calls), f"{len(ranges)} call ranges for "
                                                       f"{len(calls)} calls: {[e['name'] for e in ranges]}"))
    pc.shutdown()
    write({"passed": checks.passed, "failures": checks.failures, "calls": len(calls),
           "worker": comm.threaded_async})


if __name__ == "__main__":
    main()
