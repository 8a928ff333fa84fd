#!/bin/bash
# 8 nodes x 1 rank, 1 Gbit/s, RTT 20 ms, with pccl's posted sends and its lg p schedules at every size below the
# vendor share: pccl auto against gloo and MPICH, 4 KiB-64 MiB (the third pass's 8x1-1g-20ms run, without all-to-all).
set -u
V=/work/main/.venv/bin; F=${F:-/tmp/s28/eightx1}; cd $F
$V/pccl-testbed down --prefix plat >/dev/null 2>&1
$V/pccl-testbed up --prefix plat --nodes 8 --rate 1gbit --delay 20ms > up.log 2>&1; tail -1 up.log
$V/pccl-testbed probe --prefix plat --ppn 1 > probe.txt 2>&1
$V/pccl-bench --testbed plat -np 8 --local-size 1 -b 4K -e 64M -f 4 -c all_gather,reduce_scatter,all_reduce -w 1 -n 5 \
  --check --backends pccl,gloo,mpi --json 8x1-1g-20ms.json > 8x1-1g-20ms.log 2>&1; echo "8x1 rc=$? $(date +%T)"
$V/pccl-testbed down --prefix plat > /dev/null 2>&1; echo ALL DONE
