"""The staging schedule's pieces on one process (``pccl_torch.transport.staging``); the collectives through it
run under mpiexec in ``tests/multiprocess/test_staging.py``."""

from __future__ import annotations

import torch

from pccl_torch.transport.staging import (CHUNK_BYTES, MAX_CHUNKS, Chunk, HostStaging, chunk_bounds, chunk_count,
                                         transfer)


def test_chunks_cover_the_message_once() -> None:
    for total in (0, 1, 7, 64, 1000):
        for chunks in (1, 2, 3, 16):
            bounds = chunk_bounds(total, chunks)
            assert bounds[0][0] == 0 and bounds[-1][1] == total
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            assert len(bounds) <= max(chunks, 1)


def test_chunk_count_grows_with_the_message_up_to_its_cap() -> None:
    assert chunk_count(0) == chunk_count(1) == chunk_count(CHUNK_BYTES) == 1
    assert chunk_count(CHUNK_BYTES + 1) == 2
    assert chunk_count(4 * CHUNK_BYTES) == 4
    assert chunk_count(1 << 40) == MAX_CHUNKS


def test_host_memory_is_reused_and_grown() -> None:
    staging = HostStaging()
    small = staging.host("send", 10, torch.float32)
    again = staging.host("send", 5, torch.float32)
    assert again.data_ptr() == small.data_ptr()
    assert staging.host("recv", 10, torch.float32).data_ptr() != small.data_ptr()
    grown = staging.host("send", 1000, torch.bfloat16)
    assert grown.numel() == 1000 and grown.dtype == torch.bfloat16


def test_host_schedule_runs_each_chunk_in_order() -> None:
    staging = HostStaging()
    source, target = torch.arange(12.0), torch.zeros(12)
    host = staging.host("send", 12, torch.float32)
    seen: list[float] = []

    def work(lo: int, hi: int) -> None:
        seen.append(float(host[lo:hi].sum()))
        host[lo:hi] *= 2

    chunks = [Chunk([(source[lo:hi], host[lo:hi])], lambda lo=lo, hi=hi: work(lo, hi), [(host[lo:hi], target[lo:hi])])
              for lo, hi in chunk_bounds(12, 3)]
    staging.run(chunks, torch.device("cpu"))
    assert seen == [6.0, 22.0, 38.0]
    assert torch.equal(target, 2 * source)


def test_transfer_converts_dtypes() -> None:
    source, destination = torch.arange(6, dtype=torch.bfloat16), torch.zeros(6)
    transfer(source, destination, non_blocking=False)
    assert destination.dtype == torch.float32 and torch.equal(destination, torch.arange(6.0))
