"""One rank of a flight-recorder trial (run by ``test_trace.py`` under ``mpiexec -disable-auto-cleanup -n 4``,
``PCCL_LOCAL_SIZE=2``, ``PCCL_WAIT=bounded``, ``PCCL_TRACE_DIR`` set).

Kinds: ``late`` (after a few hierarchical all-reduces the last rank sleeps past the timeout before the next one:
the others time out and dump; the late rank dumps on the launcher's failure notice, before it ever makes the
call), ``mismatch`` (with checking on, the last rank's all-reduce has other sizes: every rank catches
``PcclMismatchError`` and calls ``pccl_torch.dump_trace()``), ``kill`` (on the testbed, 2 nodes x 2 ranks: the
last rank SIGKILLs itself once its own flight recorder shows the large ``hier:ring`` all-gather in its inter-node
phase; the survivors dump on the launcher's failure notice, or at the timeout; hydra's proxy SIGKILLs the victim's
node-mate soon after, often before it wrote its result). Each rank writes ``rank<r>.json`` with what it saw; the
victim writes ``victim.json`` (the phase its recorder showed when it killed itself).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import threading
import time
from pathlib import Path

import torch

import pccl_torch as pc
from pccl_torch.errors import PcclError

WARM_CALLS = 3
"""Calls every rank completes before the faulty one (its number is ``WARM_CALLS + 1``)."""


def late(comm: pc.Communicator, victim: int, timeout_s: float) -> dict:
    for _ in range(WARM_CALLS):
        pc.all_reduce(torch.ones(4096), algorithm="hier:ring")
    if comm.topology.rank == victim:
        time.sleep(timeout_s + 3)  # alive but late: the others give up, then the launcher's notice comes
    try:
        pc.all_reduce(torch.ones(4096), algorithm="hier:ring")
        return {"error": None}
    except PcclError as exc:
        return {"error": str(exc), "type": type(exc).__name__}


KILL_ELEMENTS = 2 << 20
"""float32 elements of each rank's block in the killed all-gather: 8 MiB a rank, so 16 MiB cross each node's link
each way in the inter-node phase (~1.4 s on the test's 100 Mbit/s links)."""
KILL_AFTER_S = 0.1
"""How long into its inter-node phase the victim dies: data is moving across the nodes then."""


def _die_in_inter_phase(comm: pc.Communicator, seq: int, out: Path) -> None:
    """On a thread of the victim: wait until call ``seq``'s slot in its own flight recorder shows an inter-node
    phase, let it run ``KILL_AFTER_S``, say what the slot showed, and SIGKILL this process."""
    slot = comm.recorder.slots[seq % comm.recorder.size]
    while not (slot.seq == seq and slot.phase and ":inter:" in slot.phase):
        time.sleep(0.001)
    time.sleep(KILL_AFTER_S)
    seen = {"seq": slot.seq, "phase": slot.phase, "completed": bool(slot.completed)}
    (out / "victim.json").write_text(json.dumps(seen))
    os.kill(os.getpid(), signal.SIGKILL)


def kill(comm: pc.Communicator, victim: int, out: Path) -> dict:
    world = comm.topology.world_size
    for _ in range(WARM_CALLS):
        pc.all_gather_into_tensor(torch.empty(world * 1024), torch.ones(1024), algorithm="hier:ring")
    if comm.topology.rank == victim:
        threading.Thread(target=_die_in_inter_phase, args=(comm, WARM_CALLS + 1, out), daemon=True).start()
    start = time.monotonic()
    try:
        pc.all_gather_into_tensor(torch.empty(world * KILL_ELEMENTS), torch.ones(KILL_ELEMENTS),
                                  algorithm="hier:ring")
        return {"error": None}
    except PcclError as exc:
        return {"error": str(exc), "type": type(exc).__name__, "elapsed_s": time.monotonic() - start}


def mismatch(comm: pc.Communicator, victim: int) -> dict:
    for _ in range(WARM_CALLS):
        pc.all_reduce(torch.ones(1024))
    try:
        pc.all_reduce(torch.ones(1000 if comm.topology.rank == victim else 1024))
        seen = {"error": None}
    except PcclError as exc:
        seen = {"error": str(exc), "type": type(exc).__name__}
    seen["dump"] = str(pc.dump_trace())
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=("late", "mismatch", "kill"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=2.0)
    args = parser.parse_args()
    comm = pc.init(timeout=datetime.timedelta(seconds=args.timeout), check=args.kind == "mismatch")
    rank, victim = comm.topology.rank, comm.topology.world_size - 1
    trials = {"late": lambda: late(comm, victim, args.timeout), "mismatch": lambda: mismatch(comm, victim),
              "kill": lambda: kill(comm, victim, args.out)}
    seen = trials[args.kind]()
    (args.out / f"rank{rank}.json").write_text(json.dumps(seen))
    pc.shutdown()


if __name__ == "__main__":
    main()
