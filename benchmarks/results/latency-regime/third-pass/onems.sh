#!/bin/bash
# After big.sh: 4 x 2 at RTT 1 ms again, with the links cache re-check that sees the latency (the first run kept
# the 20 ms entry and ran the latency rules).
set -u
while pgrep -f "final4.sh|big.sh" >/dev/null; do sleep 5; done
V=/work/main/.venv/bin; F=/tmp/lat/s27/onems; mkdir -p $F; cd $F
$V/pccl-testbed down --prefix plat >/dev/null 2>&1
$V/pccl-testbed up --prefix plat --nodes 4 --rate 1gbit --delay 1ms > up.log 2>&1; tail -1 up.log
$V/pccl-testbed probe --prefix plat --ppn 1 > probe.txt 2>&1
$V/pccl-bench --testbed plat -np 8 --local-size 2 -b 64K -e 16M -f 4 -c all_gather,reduce_scatter,all_reduce,all_to_all -w 1 -n 5 --backends pccl,gloo,mpi --check --json 4x2-1g-1ms.json > 4x2-1g-1ms.log 2>&1; echo "1ms rc=$? $(date +%T)"
$V/pccl-testbed down --prefix plat > /dev/null 2>&1; echo ALL DONE
