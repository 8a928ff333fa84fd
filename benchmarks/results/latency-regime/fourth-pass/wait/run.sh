#!/bin/bash
# 4 x 2 at RTT 1 ms: pccl's flat MPI plan with its waits polled (PCCL_WAIT=auto where ranks share cores) against
# MPI's blocking calls (PCCL_WAIT=blocking), beside the MPI baseline; alternated twice.
set -u
V=/work/main/.venv/bin; F=${F:-/tmp/s28/wait}; cd $F
$V/pccl-testbed down --prefix plat >/dev/null 2>&1
$V/pccl-testbed up --prefix plat --nodes 4 --rate 1gbit --delay ${DELAY:-1ms} > up.log 2>&1; tail -1 up.log
$V/pccl-testbed probe --prefix plat --ppn 1 > probe.txt 2>&1
for rep in 1 2; do
  for wait in auto blocking; do
    PCCL_WAIT=$wait $V/pccl-bench --testbed plat -np 8 --local-size 2 -b 64K -e 4M -f 4 -w 2 -n 10 --check \
      -c all_gather,reduce_scatter,all_reduce --backends pccl:mpi,mpi --json $wait-$rep.json > $wait-$rep.log 2>&1
    echo "$wait $rep rc=$? $(date +%T)"
  done
done
$V/pccl-testbed down --prefix plat > /dev/null 2>&1; echo ALL DONE
