"""pccl-bench pieces that need no MPI launch: sizes, backend lists, ratios, table, JSON schema, plot."""

from __future__ import annotations

import json

import pytest

import torch

from pccl_torch import compression
from pccl_torch.bench.backends import DEFAULT_BACKENDS, Backend, parse_backends, validate_backends
from pccl_torch.bench.cli import build_parser
from pccl_torch.bench.cli import main as bench_main
from pccl_torch.bench.report import JSON_FIELDS, format_table, plot, write_json
from pccl_torch.bench.runner import _Buffers, _completed, _count_wrong, a2a_block, add_ratios, bus_factor
from pccl_torch.plan import names_for
from pccl_torch.units import format_size, parse_size, size_range


def test_sizes_parse_like_nccl_tests() -> None:
    assert parse_size("4K") == 4096 and parse_size("16M") == 16 << 20 and parse_size("1GiB") == 1 << 30
    assert parse_size("512") == 512 and parse_size("1.5K") == 1536
    assert format_size(16 << 20) == "16M" and format_size(1000) == "1000"
    assert size_range(1024, 16 << 20, 4) == [1 << k for k in range(10, 25, 2)]
    with pytest.raises(ValueError, match="cannot read size"):
        parse_size("lots")
    with pytest.raises(ValueError, match="factor > 1"):
        size_range(1, 2, 1)


def test_backend_lists() -> None:
    assert parse_backends("pccl,gloo,mpi", "all_reduce") == [Backend("pccl"), Backend("gloo"), Backend("mpi")]
    everything = parse_backends("pccl:all,gloo", "all_gather")
    assert [b.algorithm for b in everything[:-1]] == names_for("all_gather", "cpu")
    assert parse_backends("pccl:ring,pccl:ring", "reduce_scatter") == [Backend("pccl", "ring")]
    with pytest.raises(ValueError, match="valid: "):
        parse_backends("pccl:bruck", "reduce_scatter")
    with pytest.raises(ValueError, match="unknown backend"):
        parse_backends("rccl", "all_reduce")
    assert parse_backends("pccl:bruck,mpi", "all_reduce", skip_foreign=True) == [Backend("mpi")]
    validate_backends("pccl:bruck,gloo", ("all_gather", "all_reduce"))
    with pytest.raises(ValueError, match="exists for none of all_reduce"):
        validate_backends("pccl:bruck", ("all_reduce",))


def test_baselines_follow_the_device() -> None:
    """Host tensors: gloo and MPI's own; CUDA tensors: NCCL (MPI's baseline hands host buffers to mpi4py)."""
    assert parse_backends("pccl,nccl", "all_reduce", device="cuda") == [Backend("pccl"), Backend("nccl")]
    with pytest.raises(ValueError, match="baseline 'nccl' does not run on cpu tensors; there: gloo, mpi"):
        parse_backends("pccl,nccl", "all_reduce")
    with pytest.raises(ValueError, match="baseline 'mpi' does not run on cuda tensors; there: nccl"):
        validate_backends("pccl,mpi", ("all_gather",), "cuda")
    assert DEFAULT_BACKENDS == {"cpu": "pccl,gloo,mpi", "cuda": "pccl,nccl"}


def test_cuda_without_a_gpu_is_a_usage_error(capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert bench_main(["--device", "cuda", "-np", "2", "-b", "1K", "-e", "1K"]) == 2
    assert "--device cuda: no CUDA device here" in capsys.readouterr().err


def test_buffers_and_completion_on_the_host() -> None:
    bufs = _Buffers("all_gather", 8, 2, torch.float32, "cpu")
    assert (bufs.inp.device.type, bufs.inp.numel(), bufs.out.numel()) == ("cpu", 4, 8)
    calls = []
    call = calls.append
    assert _completed(call, torch.device("cpu")) is call  # host calls are complete when they return


def test_compressed_backends() -> None:
    import torch

    parsed = parse_backends("pccl+int8,pccl:hier:mpi+bf16,mpi", "all_reduce")
    assert parsed == [Backend("pccl", None, "int8"), Backend("pccl", "hier:mpi", "bf16"), Backend("mpi")]
    assert [b.label for b in parsed] == ["pccl+int8", "pccl:hier:mpi+bf16", "mpi"]
    assert not parsed[0].auto and Backend("pccl").auto
    # bf16 does not apply to bfloat16: left out when skipping foreign entries, an error otherwise
    assert parse_backends("pccl,pccl+bf16", "all_gather", skip_foreign=True, dtype=torch.bfloat16) == [Backend("pccl")]
    with pytest.raises(TypeError, match="'bf16' does not apply"):
        parse_backends("pccl+bf16", "all_gather", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="unknown compression 'zip'"):
        validate_backends("pccl+zip", ("all_reduce",))
    with pytest.raises(ValueError, match="only pccl compresses"):
        parse_backends("gloo+bf16", "all_reduce")


def test_bus_bandwidth_factors_follow_nccl_tests() -> None:
    assert bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert bus_factor("reduce_scatter", 1) == 0
    # alltoall_perf: busbw = algbw x (n-1)/n, size = one rank's send buffer
    assert bus_factor("all_to_all", 4) == pytest.approx(0.75)
    assert bus_factor("all_to_all", 3) == pytest.approx(2 / 3)
    assert bus_factor("all_to_all", 1) == 0


def test_all_to_all_backends_and_default_collectives() -> None:
    everything = parse_backends("pccl:all,gloo,mpi", "all_to_all")
    assert [b.algorithm for b in everything[:-2]] == names_for("all_to_all", "cpu")
    assert {"pairwise", "mpi", "vendor", "hier:pairwise", "hier:mpi"} <= {b.algorithm for b in everything}
    assert not any(b.algorithm and b.algorithm.endswith(":pipelined") for b in everything)
    assert everything[-2:] == [Backend("gloo"), Backend("mpi")]
    assert parse_backends("pccl:hier:pairwise+int8", "all_to_all") == [Backend("pccl", "hier:pairwise", "int8")]
    # another collective's algorithm: left out of the all-to-all columns, or rejected
    assert parse_backends("pccl:ring,pccl:pairwise,mpi", "all_to_all", skip_foreign=True) == [
        Backend("pccl", "pairwise"), Backend("mpi")]
    with pytest.raises(ValueError, match="unknown all_to_all algorithm 'ring'; valid: pairwise"):
        parse_backends("pccl:ring", "all_to_all")
    validate_backends("pccl:hier:pairwise,gloo", ("all_reduce", "all_to_all"))
    with pytest.raises(ValueError, match="exists for none of all_gather"):
        validate_backends("pccl:hier:pairwise", ("all_gather",))
    assert build_parser().parse_args([]).collectives.split(",") == [
        "all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


def _a2a_sent(p: int, numel: int, dtype: torch.dtype, wire: str | None = None, local: int = 1) -> list[torch.Tensor]:
    """What each of ``p`` ranks sends in pccl-bench's all-to-all check (its input, captured by the call)."""
    sent: list[torch.Tensor] = []
    for rank in range(p):
        bufs = _Buffers("all_to_all", numel, p, dtype)
        _count_wrong("all_to_all", lambda b=bufs: sent.append(b.inp.clone()), bufs, rank, p, wire, local)
    return sent


def _a2a_wrong(rank: int, p: int, received: torch.Tensor, wire: str | None = None, local: int = 1) -> int:
    """#wrong of ``rank`` when the all-to-all leaves ``received`` in its output."""
    bufs = _Buffers("all_to_all", received.numel(), p, received.dtype)
    return _count_wrong("all_to_all", lambda: bufs.out.copy_(received), bufs, rank, p, wire, local)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_all_to_all_check_counts_what_a_receiver_did_not_get(dtype) -> None:
    p, block = 3, 300
    sent = _a2a_sent(p, p * block, dtype)
    assert sent[1].view(p, block)[2].equal(a2a_block(block, 1, 2, dtype))  # rank 1's block for rank 2

    def exchanged(rank: int) -> torch.Tensor:  # block `rank` of every rank's input, in source order
        return torch.cat([sent[source].view(p, block)[rank] for source in range(p)])

    assert [_a2a_wrong(r, p, exchanged(r)) for r in range(p)] == [0, 0, 0]
    swapped = exchanged(2).view(p, block)[[1, 0, 2]].reshape(-1)  # sources 0 and 1 in each other's place
    assert _a2a_wrong(2, p, swapped) >= 2 * (block - 2)
    assert _a2a_wrong(1, p, sent[1]) >= 2 * (block - 2)  # its own input back: no exchange at all
    shifted = exchanged(0).roll(1)  # every block one element late
    assert _a2a_wrong(0, p, shifted) >= p * (block - 2)
    one_off = exchanged(0)
    one_off[block + 7] += 1
    assert _a2a_wrong(0, p, one_off) == 1


def test_all_to_all_check_with_a_wire_format() -> None:
    """With int8 on the wire (2 nodes x 2), blocks from the other node arrive as their round trip, each encoded
    on its own; the node's own blocks arrive exactly."""
    p, local, block, fmt = 4, 2, 300, compression.get("int8")
    sent = _a2a_sent(p, p * block, torch.float32, "int8", local)
    for rank in range(p):
        blocks = [sent[source].view(p, block)[rank] for source in range(p)]
        through = torch.cat([fmt.round_trip(b) if source // local != rank // local else b
                             for source, b in enumerate(blocks)])
        assert _a2a_wrong(rank, p, through, "int8", local) == 0
        assert _a2a_wrong(rank, p, torch.cat(blocks), "int8", local) > 0  # exact where int8 cannot be
        everything = torch.cat([fmt.round_trip(b) for b in blocks])  # the node's own blocks must stay exact
        assert _a2a_wrong(rank, p, everything, "int8", local) > 0


def _row(backend: str, algorithm: str, time_us: float, auto: bool = False, compression: str | None = None) -> dict:
    label = backend if backend != "pccl" else (f"pccl+{compression}" if compression else
                                               ("pccl" if auto else f"pccl:{algorithm}"))
    return {"collective": "all_reduce", "backend": backend, "label": label, "algorithm": algorithm, "auto": auto,
            "compression": compression,
            "size_bytes": 4096, "count": 1024, "dtype": "float32", "time_us": time_us, "algbw_gbps": 1.0,
            "busbw_gbps": 1.5, "wrong": 0, "ranks": 4, "local_size": 2, "nodes": 2, "iters": 5, "warmup": 1,
            "hostname": "h", "versions": {"torch": "2.13.0"}, "transport": "mpi", "links": None}


def test_ratios_table_json_and_plot(tmp_path) -> None:
    rows = [_row("pccl", "ring", 50.0), _row("pccl", "hier:ring", 200.0, auto=True),
            _row("gloo", "native", 100.0), _row("mpi", "native", 80.0),
            _row("pccl", "hier:mpi", 125.0, compression="int8")]
    add_ratios(rows)
    assert rows[0]["vs_best_baseline"] == pytest.approx(80 / 50)
    assert rows[1]["vs_best_baseline"] == pytest.approx(80 / 200)
    assert rows[2]["vs_best_baseline"] is None
    assert rows[4]["vs_exact"] == pytest.approx(200 / 125) and rows[0]["vs_exact"] is None
    table = format_table(rows)
    assert "hier:ring (auto)" in table and "1.60" in table and "Out of bounds values : 0 OK" in table
    assert "hier:mpi+int8" in table and "vs-exact 1.60" in table and "pccl+int8" in table
    path = tmp_path / "rows.json"
    write_json(rows, path)
    loaded = json.loads(path.read_text())
    assert [sorted(r) for r in loaded] == [sorted(JSON_FIELDS)] * 5
    plot(rows, tmp_path / "busbw.png")
    assert (tmp_path / "busbw.png").read_bytes()[:4] == b"\x89PNG"
