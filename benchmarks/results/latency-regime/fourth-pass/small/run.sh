#!/bin/bash
# 4 x 2 at RTT 1 ms: the 256 KiB-1 MiB points where pccl auto runs MPI's own collective, timed with 20 iterations
# (the selection runs used 5), to tell pccl's delegation to MPI from the run-to-run spread.
set -u
V=/work/main/.venv/bin; F=${F:-/tmp/s28/small}; cd $F
$V/pccl-testbed down --prefix plat >/dev/null 2>&1
$V/pccl-testbed up --prefix plat --nodes 4 --rate 1gbit --delay 1ms > up.log 2>&1; tail -1 up.log
$V/pccl-testbed probe --prefix plat --ppn 1 > probe.txt 2>&1
for rep in 1 2; do
  $V/pccl-bench --testbed plat -np 8 --local-size 2 -b 256K -e 1M -f 4 -w 2 -n 20 --check -c all_gather,reduce_scatter,all_reduce \
    --backends pccl,pccl:mpi,gloo,mpi --json small-$rep.json > small-$rep.log 2>&1; echo "rep $rep rc=$? $(date +%T)"
done
$V/pccl-testbed down --prefix plat > /dev/null 2>&1; echo ALL DONE
