#!/bin/bash
# After final4: 8 x 1 at RTT 20 ms, 1 Gbit/s, the largest calls: which plan wins at 32-64 MiB.
set -u
while pgrep -f final4.sh >/dev/null; do sleep 5; done
V=/work/main/.venv/bin; F=/tmp/lat/s27/big; mkdir -p $F; cd $F
$V/pccl-testbed down --prefix plat >/dev/null 2>&1
$V/pccl-testbed up --prefix plat --nodes 8 --rate 1gbit --delay 20ms > up.log 2>&1; tail -1 up.log
common="--testbed plat -np 8 --local-size 1 -b 16M -e 64M -f 2 -w 1 -n 3 --check"
$V/pccl-bench $common -c all_gather --backends pccl,pccl:mpi,pccl:recursive_doubling,pccl:ring,pccl:vendor,gloo,mpi --json ag.json > ag.log 2>&1; echo "ag rc=$? $(date +%T)"
$V/pccl-bench $common -c all_to_all --backends pccl,pccl:mpi,pccl:pairwise,pccl:vendor,gloo,mpi --json a2a.json > a2a.log 2>&1; echo "a2a rc=$? $(date +%T)"
$V/pccl-bench $common -c all_reduce --backends pccl,pccl:mpi,pccl:rabenseifner,pccl:vendor,gloo,mpi --json ar.json > ar.log 2>&1; echo "ar rc=$? $(date +%T)"
$V/pccl-testbed down --prefix plat > /dev/null 2>&1; echo ALL DONE
