#!/bin/bash
# 4 x 2 at RTT 1 ms on the corrected testbed: pccl auto beside its forced plans and the baselines (for a rule for
# links of 0.3-2 ms one way).
set -u
V=/work/main/.venv/bin; F=/tmp/lat/s27/sel1ms; mkdir -p $F; cd $F
$V/pccl-testbed down --prefix plat >/dev/null 2>&1
$V/pccl-testbed up --prefix plat --nodes 4 --rate 1gbit --delay 1ms > up.log 2>&1; tail -1 up.log
$V/pccl-testbed probe --prefix plat --ppn 1 > probe.txt 2>&1
N=5 /tmp/lat/sel.sh $F/sel; echo "sel rc=$? $(date +%T)"
$V/pccl-testbed down --prefix plat > /dev/null 2>&1; echo ALL DONE
