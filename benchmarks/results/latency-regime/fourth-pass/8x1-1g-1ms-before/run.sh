#!/bin/bash
# 8 nodes x 1 rank, 1 Gbit/s, RTT 1 ms, corrected relay, pccl's posted steps: auto beside pccl's lg p schedules and the baselines.
set -u
V=/work/main/.venv/bin; F=${F:-/tmp/s28/eight1ms}; cd $F
$V/pccl-testbed down --prefix plat >/dev/null 2>&1
$V/pccl-testbed up --prefix plat --nodes 8 --rate 1gbit --delay 1ms > up.log 2>&1; tail -1 up.log
$V/pccl-testbed probe --prefix plat --ppn 1 > probe.txt 2>&1
common="--testbed plat -np 8 --local-size 1 -b 64K -e 16M -f 4 -w 1 -n 5 --check"
$V/pccl-bench $common -c all_gather --backends pccl,pccl:recursive_doubling,pccl:ring,gloo,mpi --json ag.json > ag.log 2>&1; echo "ag rc=$? $(date +%T)"
$V/pccl-bench $common -c reduce_scatter --backends pccl,pccl:recursive_halving,pccl:pairwise,gloo,mpi --json rs.json > rs.log 2>&1; echo "rs rc=$? $(date +%T)"
$V/pccl-bench $common -c all_reduce --backends pccl,pccl:recursive_doubling,pccl:ring,gloo,mpi --json ar.json > ar.log 2>&1; echo "ar rc=$? $(date +%T)"
$V/pccl-testbed down --prefix plat > /dev/null 2>&1; echo ALL DONE
