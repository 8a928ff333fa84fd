import sys, time
import numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD; r = c.rank; p = c.size
mode = sys.argv[1] if len(sys.argv) > 1 else "pingpong"
for size in [1 << 10, 64 << 10, 128 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]:
    buf = np.zeros(size, np.uint8); ack = np.zeros(1, np.uint8)
    ts = []
    for it in range(4):
        c.Barrier(); t0 = time.perf_counter()
        if mode == "pingpong":
            if r == 0: c.Send(buf, 1); c.Recv(ack, 1)
            elif r == 1: c.Recv(buf, 0); c.Send(ack, 0)
        elif mode == "a2av":
            blk = size // p
            sb = np.zeros(blk * p, np.uint8); rb = np.zeros(blk * p, np.uint8)
            c.Alltoallv([sb, [blk]*p, [i*blk for i in range(p)], MPI.BYTE], [rb, [blk]*p, [i*blk for i in range(p)], MPI.BYTE])
        ts.append(time.perf_counter() - t0)
    if r == 0: print(f"{mode} {size>>10:6d} KiB  min {min(ts)*1e3:8.1f} ms  med {sorted(ts)[len(ts)//2]*1e3:8.1f} ms", flush=True)
