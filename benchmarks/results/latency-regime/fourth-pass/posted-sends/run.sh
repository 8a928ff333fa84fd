#!/bin/bash
# pccl's own all-gather and reduce-scatter schedules with each step waiting for its send (before: A, the code of
# /work/main) and waiting for its receive only, the sends completed at the end (after: B, the worktree on
# PYTHONPATH); 8 nodes x 1 rank, 1 Gbit/s, RTT 20 ms; A and B alternated twice.
set -u
V=/work/main/.venv/bin; F=${F:-/tmp/s28/posted}; NEW=${NEW:-/work/wt-rules}; cd $F
$V/pccl-testbed down --prefix plat >/dev/null 2>&1
$V/pccl-testbed up --prefix plat --nodes 8 --rate 1gbit --delay 20ms > up.log 2>&1; tail -1 up.log
$V/pccl-testbed probe --prefix plat --ppn 1 > probe.txt 2>&1
for rep in 1 2; do
  for side in A B; do
    if [ $side = B ]; then export PYTHONPATH=$NEW; else unset PYTHONPATH; fi
    $V/python -c "import pccl_torch.transport.base as b; print('$side', b.__file__, hasattr(b.Transport, 'sendrecv_posted'))"
    $V/pccl-bench --testbed plat -np 8 --local-size 1 -b 4K -e 1M -f 4 -w 1 -n 3 --check -c all_gather \
      --backends pccl,pccl:recursive_doubling,pccl:bruck,pccl:ring,gloo,mpi --json ag-$side$rep.json > ag-$side$rep.log 2>&1
    echo "ag $side$rep rc=$? $(date +%T)"
    $V/pccl-bench --testbed plat -np 8 --local-size 1 -b 4K -e 1M -f 4 -w 1 -n 3 --check -c reduce_scatter \
      --backends pccl,pccl:recursive_halving,pccl:pairwise,gloo,mpi --json rs-$side$rep.json > rs-$side$rep.log 2>&1
    echo "rs $side$rep rc=$? $(date +%T)"
  done
done
unset PYTHONPATH
$V/pccl-testbed down --prefix plat > /dev/null 2>&1; echo ALL DONE
