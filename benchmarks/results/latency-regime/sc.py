import time, numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD; r = c.rank
for size in [8, 1 << 10, 64 << 10]:
    s = np.zeros(size, np.uint8); d = np.zeros(size, np.uint8)
    ts = []
    for _ in range(5):
        if r == 1: req = c.Irecv(d, 0)
        c.Barrier(); time.sleep(0.05)
        if r == 0:
            t0 = time.perf_counter(); c.Send(s, 1); ts.append(time.perf_counter() - t0)
        else:
            req.Wait()
    if r == 0: print(f"{size:6d} B: blocking Send returns after {np.median(ts)*1e3:6.2f} ms (peer's receive posted)", flush=True)
