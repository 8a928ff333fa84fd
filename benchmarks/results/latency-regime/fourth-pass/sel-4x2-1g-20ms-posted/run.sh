#!/bin/bash
# 4 x 2, 1 Gbit/s, RTT 20 ms, with pccl's posted steps: auto beside its forced plans and the baselines (../sel.sh).
set -u
V=/work/main/.venv/bin; F=${F:-/tmp/s28/sel20}; cd $F
$V/pccl-testbed down --prefix plat >/dev/null 2>&1
$V/pccl-testbed up --prefix plat --nodes 4 --rate 1gbit --delay 20ms > up.log 2>&1; tail -1 up.log
$V/pccl-testbed probe --prefix plat --ppn 1 > probe.txt 2>&1
N=5 /work/main/benchmarks/results/latency-regime/sel.sh $F/sel; echo "sel rc=$? $(date +%T)"
$V/pccl-testbed down --prefix plat > /dev/null 2>&1; echo ALL DONE
