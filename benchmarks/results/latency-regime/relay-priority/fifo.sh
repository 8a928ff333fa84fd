#!/bin/bash
# The relay at nice -10 (as today) against SCHED_FIFO, alternated: 8 x 1, 1 Gbit/s, RTT 20 ms.
set -u
V=/work/main/.venv/bin; F=/tmp/lat/s27/fifo; mkdir -p $F; cd $F
$V/pccl-testbed down --prefix plat >/dev/null 2>&1
$V/pccl-testbed up --prefix plat --nodes 8 --rate 1gbit --delay 20ms > up.log 2>&1; tail -1 up.log
RELAY=$(pgrep -f "pccl-relay.*--prefix plat" | head -1); echo relay=$RELAY
common="--testbed plat -np 8 --local-size 1 -b 4M -e 16M -f 4 -w 1 -n 3 --check -c all_gather,all_reduce --backends pccl,pccl:mpi,gloo,mpi"
for i in 1 2; do
  chrt -o -p 0 $RELAY; renice -n -10 -p $RELAY >/dev/null; chrt -p $RELAY | tail -1
  $V/pccl-testbed probe --prefix plat --ppn 1 > probe-nice$i.txt 2>&1
  $V/pccl-bench $common --json nice$i.json > nice$i.log 2>&1; echo "nice$i rc=$? $(date +%T)"
  chrt -f -p 20 $RELAY; chrt -p $RELAY | tail -1
  $V/pccl-testbed probe --prefix plat --ppn 1 > probe-fifo$i.txt 2>&1
  $V/pccl-bench $common --json fifo$i.json > fifo$i.log 2>&1; echo "fifo$i rc=$? $(date +%T)"
done
$V/pccl-testbed down --prefix plat > /dev/null 2>&1; echo ALL DONE
