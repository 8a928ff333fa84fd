"""A raw TCP exchange between 2 testbed nodes (no MPI on the data path): both ranks write a block, then read the
peer's, STEPS times; with and without TCP_NODELAY."""
import socket, subprocess, sys, time, re
from mpi4py import MPI
c = MPI.COMM_WORLD; r = c.rank
ips = re.findall(r"inet (10\.77\.\d+\.\d+)", subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout)
ip0 = c.bcast(ips[0] if r == 0 else None)
for nodelay in (0, 1):
    if r == 0:
        srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); srv.bind((ip0, 45123 + nodelay)); srv.listen(1)
        c.Barrier(); s, _ = srv.accept()
    else:
        c.Barrier(); s = socket.create_connection((ip0, 45123 + nodelay))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, nodelay)
    for size in (4 << 10, 64 << 10):
        blk = b"x" * size
        ts = []
        for it in range(5):
            c.Barrier(); t0 = time.perf_counter()
            for _ in range(5):
                s.sendall(blk); got = 0
                while got < size: got += len(s.recv(size - got))
            ts.append((time.perf_counter() - t0) / 5)
        if r == 0: print(f"TCP_NODELAY={nodelay} {size>>10:4d} KiB: a step min {min(ts)*1e3:6.1f} ms median {sorted(ts)[2]*1e3:6.1f} ms", flush=True)
    s.close()
