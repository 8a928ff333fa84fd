"""Exchange steps as steps.py, but each step waits for its receive only; the sends are completed at the end
(their buffers are not touched again). Does a step then cost the one-way latency?"""
import time
import numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD; r = c.rank; peer = r ^ 1
STEPS = 5
for size in [4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 1 << 20]:
    s = [np.zeros(size, np.uint8) for _ in range(STEPS)]; d = [np.zeros(size, np.uint8) for _ in range(STEPS)]
    for mode in ("sendrecv", "recv-only"):
        ts = []
        for it in range(5):
            c.Barrier(); t0 = time.perf_counter()
            sends = []
            for k in range(STEPS):
                rq = c.Irecv(d[k], peer, k); sq = c.Isend(s[k], peer, k)
                if mode == "sendrecv":
                    MPI.Request.Waitall([rq, sq])
                else:
                    rq.Wait(); sends.append(sq)
            MPI.Request.Waitall(sends)
            ts.append((time.perf_counter() - t0) / STEPS)
        if r == 0:
            print(f"{mode:10s} {size >> 10:5d} KiB: a step min {min(ts)*1e3:6.1f} ms, median {sorted(ts)[2]*1e3:6.1f} ms", flush=True)
