"""Exchange steps between 2 nodes: each rank sends a block to its partner and receives one, STEPS times in a row
(as one step of recursive doubling does). A step that costs a round trip, not a one-way latency, means a send
waited for the previous one's acknowledgement (Nagle's algorithm against delayed ACKs)."""
import sys, time
import numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD; r = c.rank; peer = r ^ 1
STEPS = 5
for size in [4 << 10, 64 << 10, 1 << 20]:
    s = np.zeros(size, np.uint8); d = np.zeros(size, np.uint8)
    ts = []
    for it in range(5):
        c.Barrier(); t0 = time.perf_counter()
        for _ in range(STEPS):
            c.Sendrecv(s, peer, 0, d, peer, 0)
        ts.append((time.perf_counter() - t0) / STEPS)
    if r == 0:
        print(f"{sys.argv[1] if len(sys.argv) > 1 else ''} {size >> 10:5d} KiB: a step min {min(ts)*1e3:6.1f} ms, median {sorted(ts)[2]*1e3:6.1f} ms", flush=True)
