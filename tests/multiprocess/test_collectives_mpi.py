"""Every collective x algorithm (flat and hierarchical) x dtype x op x size, under real ``mpiexec`` runs
with 1..6 ranks and emulated nodes of 1, 2 or 3 ranks; plus the bad-input cases on every rank."""

from __future__ import annotations

import os
import sys

import pytest

from pccl_torch.algorithms import COLLECTIVES
from pccl_torch.plan import family, hierarchical_inner, names_for

from .conftest import OPENMPI_PREFIX, RankLaunch, check_exit, launch_ranks, mpiexec, openmpi_available, run_checked

# (ranks, ranks per emulated node): n = 1..6, local sizes 1, 2, 3 wherever they divide n.
LAYOUTS = [(n, local) for n in range(1, 7) for local in (1, 2, 3) if n % local == 0 and local <= n]


def assert_every_algorithm_ran(run: RankLaunch) -> None:
    """The algorithms the driver ran are exactly ``names_for(collective, "cpu")``, and that list still holds
    every flat schedule of the family, every ``hier:`` form (``hierarchical_inner``), and each flat schedule
    with the other intra-node library (``hier-<library>:``), so the case count cannot stay high while a whole
    level of names vanished."""
    for collective in COLLECTIVES:
        ran = set(run[0]["algorithms"][collective])
        assert ran == set(names_for(collective, "cpu")), (collective, sorted(ran ^ set(names_for(collective, "cpu"))))
        flat = set(family(collective))
        assert flat <= ran, (collective, sorted(flat - ran))
        assert {"hier:" + name for name in hierarchical_inner(collective)} <= ran, (collective, sorted(ran))
        for name in flat:
            assert any(a.startswith("hier-") and a.endswith(":" + name) for a in ran), (collective, name, sorted(ran))
        assert {"mpi", "vendor"} <= ran, (collective, sorted(ran))


def driver(ranks: int, tmp_path, *args: str, min_passed_per_rank: int, **options) -> RankLaunch:
    """driver.py under mpiexec: exit status 0, every rank's result there, no rank with a failure, every rank
    ran the same cases, and each passed at least ``min_passed_per_rank`` checks."""
    run = launch_ranks("driver.py", ranks, *args, result_dir=tmp_path / "ranks", same=("ranks", "local_size", "cases"),
                       **options)
    for r, report in enumerate(run.ranks):
        assert report["failed"] == 0, f"rank {r}:\n" + "\n".join(report["failures"][:30])
        assert report["ranks"] == ranks
        assert report["passed"] >= min_passed_per_rank, f"rank {r}: too few checks passed: {report['passed']}"
    assert len({report["passed"] for report in run.ranks}) == 1, [report["passed"] for report in run.ranks]
    return run


@pytest.mark.multiprocess
@pytest.mark.parametrize("ranks,local_size", LAYOUTS, ids=[f"n{n}-L{l}" for n, l in LAYOUTS])
def test_every_collective_algorithm_dtype_and_op(ranks: int, local_size: int, tmp_path) -> None:
    """At n = 5 and 6 a rotated sample: one reduction op per algorithm and dtype, one large case per algorithm
    (every algorithm still meets several ops, and every op x dtype pair and large kind still runs at that n).
    Every op x dtype pair and large case runs in full at n = 1..4 on the same local sizes (an odd count at
    n = 3, flat and one node); n = 5 and 6 add the rank count, which the ops and dtypes do not interact with."""
    sampled = ("--sample",) if ranks >= 5 else ()
    run = driver(ranks, tmp_path, *sampled, local_size=local_size, min_passed_per_rank=1000)
    assert run[0]["local_size"] == local_size
    assert_every_algorithm_ran(run)


@pytest.mark.multiprocess
@pytest.mark.skipif(not openmpi_available(), reason=f"no Open MPI under {OPENMPI_PREFIX}: make ulfm")
@pytest.mark.parametrize("ranks,local_size", [(4, 2), (5, 1)], ids=["n4-L2", "n5-L1"])
def test_every_collective_under_open_mpi(ranks: int, local_size: int, tmp_path) -> None:
    """The same cases (small sizes) on Open MPI 5 instead of MPICH: the transports and native collectives
    depend on no one MPI library."""
    run = driver(ranks, tmp_path, "--no-large", local_size=local_size, openmpi=True, min_passed_per_rank=1000)
    assert_every_algorithm_ran(run)
    assert all(report["mpi"].startswith("Open MPI") for report in run.ranks), run[0]["mpi"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("ranks,local_size", [(4, 2), (6, 3), (5, 1)], ids=["n4-L2", "n6-L3", "n5-L1"])
def test_pipelined_in_several_chunks(ranks: int, local_size: int, tmp_path) -> None:
    """The pipelined schedule cut into 3 chunks at every size (uneven last chunks, chunks of padding only):
    the same results as every other schedule, all-reduce bitwise identical on all ranks."""
    driver(ranks, tmp_path, "--algorithms", "hier:pipelined,hier-mpi:pipelined", local_size=local_size,
           env={"PCCL_PIPELINE_CHUNKS": "3"}, min_passed_per_rank=150)


COMPRESSED_RUNS = [("bf16", 6, 3), ("int8", 4, 2), ("fp8", 5, 1), ("lossless", 4, 2), ("int8", 3, 1)]


@pytest.mark.multiprocess
@pytest.mark.parametrize("fmt,ranks,local_size", COMPRESSED_RUNS, ids=[f"{f}-n{n}-L{l}" for f, n, l in COMPRESSED_RUNS])
def test_compressed_collectives(fmt: str, ranks: int, local_size: int, tmp_path) -> None:
    """``compression=`` on flat, hierarchical, pipelined and gloo-inside-the-node plans: all-gathers deliver
    exactly the format's round trip of every input, reductions stay within the format's error, all-reduce
    results are bitwise identical on every rank; bad formats and dtypes are rejected on every rank. The
    pipelined plan runs in 3 chunks (its compressed form for the fixed-size formats, ``hier:mpi`` for lossless)."""
    driver(ranks, tmp_path, "--compression", fmt, "--algorithms", "mpi,ring,hier:mpi,hier:pipelined,hier-gloo:ring,vendor",
           local_size=local_size, env={"PCCL_PIPELINE_CHUNKS": "3"}, min_passed_per_rank=300)


@pytest.mark.multiprocess
@pytest.mark.parametrize("fmt", ["int8", "bf16"])
def test_compressed_all_to_all_moves_large_blocks_pairwise(fmt: str, tmp_path) -> None:
    """A compressed flat ``mpi`` all-to-all of large blocks moves its bytes by pairwise exchange (the threshold
    lowered to 64 bytes, so every case with blocks takes that path): the same results as every other plan."""
    driver(4, tmp_path, "--compression", fmt, "--collectives", "all_to_all", "--algorithms", "mpi",
           "--pairwise-bytes-from", "64", local_size=2, min_passed_per_rank=40)


@pytest.mark.multiprocess
@pytest.mark.parametrize("fmt,ranks,local_size,chunk_bytes", [("int8", 4, 2, 1 << 20), ("fp8", 6, 3, 64),
                                                               ("bf16", 5, 1, 64)])
def test_compressed_all_to_all_in_pieces(fmt: str, ranks: int, local_size: int, chunk_bytes: int, tmp_path) -> None:
    """A compressed flat ``mpi`` all-to-all on host tensors exchanges its blocks in pieces whose transfers overlap
    the encoding (``chunked_all_to_all``), two in flight: ``--chunk-bytes 64`` (most calls in many exchanges, up
    to MAX_CHUNKS, the pieces on 256-element boundaries and the rest empty), or 1 MiB (the largest even cases, just
    over 1 MiB a rank, in 2 pieces whose messages are past MPI's eager size, so a piece's send buffer freed before
    its exchange completed shows): the same results as every other plan."""
    driver(ranks, tmp_path, "--compression", fmt, "--collectives", "all_to_all", "--algorithms", "mpi,pairwise",
           "--chunk-bytes", str(chunk_bytes), local_size=local_size, min_passed_per_rank=40)


@pytest.mark.multiprocess
def test_triton_interpreter_kernels_over_torch_groups_under_mpiexec(tmp_path) -> None:
    """The same cases (small sizes, every algorithm, dtype, op, async and in-place form), 2 nodes x 2, in one
    launch that checks two things the other runs do not: every local kernel run by the Triton interpreter, and
    ``PCCL_TRANSPORT=torch`` (pccl's levels as torch groups under mpiexec). The kernels run inside the algorithms,
    which see only the transport interface, so neither hides a defect of the other: a wrong kernel or a wrong
    torch-group level fails its cases here as it did in a launch of its own (one launch instead of two; 98 s in a
    fresh clone's suite, against 45 s and 42 s for the two on a quicker day)."""
    run = driver(4, tmp_path, "--no-large", local_size=2, timeout_s=900,
                 env={"TRITON_INTERPRET": "1", "PCCL_KERNELS": "triton", "PCCL_TRANSPORT": "torch"},
                 min_passed_per_rank=1000)
    assert_every_algorithm_ran(run)
    assert {report["transport"] for report in run.ranks} == {"torch:gloo"}, [r["transport"] for r in run.ranks]


@pytest.mark.multiprocess
@pytest.mark.parametrize("ranks,local_size", [(2, 1), (4, 2)], ids=["n2-L1", "n4-L2"])
def test_torch_backend_and_ddp(ranks: int, local_size: int, tmp_path) -> None:
    """The `pccl` torch.distributed backend (routed and delegated calls, subgroups, functional collectives,
    DeviceMesh/DTensor, device-mapped backend strings) and DDP over it and with pccl's comm hook: same
    losses and weights as plain gloo."""
    run = launch_ranks("torch_backend_driver.py", ranks, result_dir=tmp_path / "ranks", local_size=local_size,
                       same=("ranks", "checks"))
    for r, report in enumerate(run.ranks):  # exit status 0 and every rank's result, written after its shutdown
        assert report["failed"] == 0, f"rank {r}:\n" + "\n".join(report["failures"])
        assert report["ranks"] == ranks and report["checks"] == 6 and report["passed"] == 6, report


@pytest.mark.multiprocess
def test_pccl_as_the_default_process_group(tmp_path) -> None:
    """init_process_group('pccl'): plain dist.* calls, DDP with no group argument and a 2-D DeviceMesh go
    through pccl."""
    run = launch_ranks("torch_backend_driver.py", 4, "--default-pccl", result_dir=tmp_path / "ranks", local_size=2,
                       same=("ranks", "checks"))
    for r, report in enumerate(run.ranks):  # 7 checks on each of the 4 ranks (28 in all)
        assert report["failed"] == 0, f"rank {r}:\n" + "\n".join(report["failures"])
        assert report["default_pccl"] and report["checks"] == 7 and report["passed"] == 7, report


@pytest.mark.multiprocess
@pytest.mark.parametrize("ranks,local_size", [(2, 1), (4, 2)], ids=["n2-L1", "n4-L2"])
def test_fsdp2_with_pccl_matches_gloo(ranks: int, local_size: int, tmp_path) -> None:
    """FSDP2 with pccl's all-gather/reduce-scatter hooks, and FSDP1 over a pccl process group: same losses
    and weights as on gloo, clip_grad_norm_ and full_tensor() still working, collectives counted by pccl."""
    run = launch_ranks("fsdp_driver.py", ranks, result_dir=tmp_path / "ranks", local_size=local_size, same=("ranks",))
    for r, report in enumerate(run.ranks):  # exit status 0 and every rank's result, written after its shutdown
        assert report["problem"] is None, f"rank {r}: {report['problem']}"
        assert report["ranks"] == ranks
        assert min(report["pccl_calls"].get(c, 0) for c in ("all_gather", "reduce_scatter")) > 0, (r, report)


@pytest.mark.multiprocess
def test_a_world_pccl_group_rejects_a_local_size_that_does_not_divide_it() -> None:
    """As init() does: a PCCL_LOCAL_SIZE that does not divide the world fails the world group on every rank
    (a subgroup that does not split into whole nodes still runs flat)."""
    code = ("import os, pccl_torch\n"  # one write per rank: the ranks' lines must not interleave
            "try:\n    pccl_torch.init_process_group('pccl')\n    os.write(1, b'created\\n')\n"
            "except Exception as e:\n    os.write(1, f'raised {type(e).__name__} {e}\\n'.encode())\n")
    environment = dict(os.environ, PCCL_LOCAL_SIZE="3", PYTHONWARNINGS="ignore::FutureWarning")
    result = run_checked([mpiexec(), "-n", "4", sys.executable, "-c", code], environment, 300)
    assert result.stdout.count("raised TopologyError") == 4 and "created" not in result.stdout, result.stdout
    assert "local size 3 does not divide the world size 4" in result.stdout
    check_exit(result, "init_process_group('pccl') with PCCL_LOCAL_SIZE=3")
