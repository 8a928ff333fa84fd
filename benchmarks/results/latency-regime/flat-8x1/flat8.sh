#!/bin/bash
# 8 x 1 at RTT 20 ms, 1 Gbit/s: pccl auto against its forced flat plans and the baselines.
set -u
V=/work/main/.venv/bin; F=${F:-/tmp/lat/s27/flat8}; mkdir -p $F; cd $F
$V/pccl-testbed down --prefix plat >/dev/null 2>&1
$V/pccl-testbed up --prefix plat --nodes 8 --rate 1gbit --delay 20ms > up.log 2>&1; tail -1 up.log
$V/pccl-testbed probe --prefix plat --ppn 1 > probe.txt 2>&1
common="--testbed plat -np 8 --local-size 1 -b ${B:-64K} -e ${E:-16M} -f 4 -w 1 -n ${N:-5} --check"
date
$V/pccl-bench $common -c all_gather --backends pccl,pccl:mpi,pccl:ring,pccl:recursive_doubling,pccl:bruck,pccl:vendor,gloo,mpi --json ag.json > ag.log 2>&1; echo "ag rc=$?"; date
$V/pccl-bench $common -c reduce_scatter --backends pccl,pccl:mpi,pccl:ring,pccl:recursive_halving,pccl:pairwise,pccl:vendor,gloo,mpi --json rs.json > rs.log 2>&1; echo "rs rc=$?"; date
$V/pccl-bench $common -c all_reduce --backends pccl,pccl:mpi,pccl:ring,pccl:rabenseifner,pccl:recursive_doubling,pccl:vendor,gloo,mpi --json ar.json > ar.log 2>&1; echo "ar rc=$?"; date
$V/pccl-testbed down --prefix plat > /dev/null 2>&1
echo ALL DONE
