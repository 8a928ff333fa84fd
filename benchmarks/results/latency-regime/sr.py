import time, numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD; r = c.rank; peer = 1 - r
for size in [1 << 10, 16 << 10, 64 << 10, 1 << 20]:
    s = np.zeros(size, np.uint8); d = np.zeros(size, np.uint8)
    c.Sendrecv(s, peer, 0, d, peer, 0)
    c.Barrier(); t0 = time.perf_counter()
    for _ in range(10): c.Sendrecv(s, peer, 0, d, peer, 0)
    t = (time.perf_counter() - t0) / 10
    c.Barrier(); t0 = time.perf_counter()
    for _ in range(10):
        if r == 0: c.Send(s, 1); c.Recv(d, 1)
        else: c.Recv(d, 0); c.Send(s, 0)
    pp = (time.perf_counter() - t0) / 10
    if r == 0: print(f"{size>>10:5d} KiB: sendrecv {t*1e3:6.1f} ms a step; ping-pong (both ways full) {pp*1e3:6.1f} ms", flush=True)
