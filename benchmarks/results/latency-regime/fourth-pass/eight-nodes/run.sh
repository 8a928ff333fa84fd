#!/bin/bash
# 8 nodes x 2 ranks at RTT 1 ms: pccl auto beside its forced plans and the baselines at 1 and 16 MiB (the scaling
# run's 8-node points, where MPICH's flat all-gather beat pccl's choice).
set -u
V=/work/main/.venv/bin; F=${F:-/tmp/s28/eight}; cd $F
$V/pccl-testbed down --prefix plat >/dev/null 2>&1
$V/pccl-testbed up --prefix plat --nodes 8 --rate 1gbit --delay 1ms > up.log 2>&1; tail -1 up.log
$V/pccl-testbed probe --prefix plat --ppn 1 > probe.txt 2>&1
$V/pccl-bench --testbed plat -np 16 --local-size 2 -b 1M -e 16M -f 16 -w 1 -n 3 --check -c all_gather \
  --backends pccl,pccl:mpi,pccl:hier:mpi,pccl:hier:ring,pccl:hier:pipelined,gloo,mpi --json ag.json > ag.log 2>&1; echo "ag rc=$? $(date +%T)"
$V/pccl-bench --testbed plat -np 16 --local-size 2 -b 1M -e 16M -f 16 -w 1 -n 3 --check -c all_reduce \
  --backends pccl,pccl:mpi,pccl:hier:mpi,pccl:hier:ring,pccl:hier:pipelined,gloo,mpi --json ar.json > ar.log 2>&1; echo "ar rc=$? $(date +%T)"
$V/pccl-testbed down --prefix plat > /dev/null 2>&1; echo ALL DONE
