import time, numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD; r = c.rank; p = c.size
for size in [64 << 10, 1 << 20]:
    sb = np.zeros(size // p // 4, np.float32); rb = np.zeros(size // 4, np.float32)
    for name, fn in [("allgather", lambda: c.Allgather(sb, rb)), ("allreduce", lambda: c.Allreduce(MPI.IN_PLACE, rb)),
                     ("barrier", lambda: c.Barrier())]:
        fn()
        per = []
        for it in range(5):
            c.Barrier(); t0 = time.perf_counter(); fn(); per.append(time.perf_counter() - t0)
        worst = c.allreduce(np.median(per), op=MPI.MAX); best = c.allreduce(np.median(per), op=MPI.MIN)
        c.Barrier(); t0 = time.perf_counter()
        for it in range(10): fn()
        loop = (time.perf_counter() - t0) / 10
        loop = c.allreduce(loop, op=MPI.MAX)
        if r == 0: print(f"{name:9s} {size>>10:5d}K  after barrier: slowest rank {worst*1e3:6.1f} ms, fastest {best*1e3:6.1f} ms; back to back {loop*1e3:6.1f} ms", flush=True)
