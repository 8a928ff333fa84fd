#!/bin/bash
# RTT 1 ms on the corrected testbed, with the rule for links of 0.4-2 ms one way: (1) 4 x 2, pccl auto beside its
# forced plans and the baselines; (2) scaling with node count (2, 4, 8 nodes x 2 ranks) at 1 and 16 MiB.
set -u
V=/work/main/.venv/bin; F=${F:-/tmp/s28/onems}; mkdir -p $F; cd $F
up() { $V/pccl-testbed down --prefix plat >/dev/null 2>&1; $V/pccl-testbed up --prefix plat "$@" > $F/up-$tag.log 2>&1; tail -1 $F/up-$tag.log;
       $V/pccl-testbed probe --prefix plat --ppn 1 > $F/probe-$tag.txt 2>&1; }
bench() { $V/pccl-bench --testbed plat "$@" --check --json $F/$tag.json > $F/$tag.log 2>&1; echo "$tag rc=$? $(date +%T)"; }
date
tag=4x2-1g-1ms; up --nodes 4 --rate 1gbit --delay 1ms
N=5 /work/main/benchmarks/results/latency-regime/sel.sh $F/sel-4x2-1g-1ms; echo "sel done $(date +%T)"
tag=scale-4n-1ms; bench -np 8 --local-size 2 -b 1M -e 16M -f 16 -c all_gather,reduce_scatter,all_reduce -w 1 -n 3 --backends pccl,pccl:ring,gloo,mpi
tag=scale-2n-1ms; up --nodes 2 --rate 1gbit --delay 1ms
bench -np 4 --local-size 2 -b 1M -e 16M -f 16 -c all_gather,reduce_scatter,all_reduce -w 1 -n 3 --backends pccl,pccl:ring,gloo,mpi
tag=scale-8n-1ms; up --nodes 8 --rate 1gbit --delay 1ms
bench -np 16 --local-size 2 -b 1M -e 16M -f 16 -c all_gather,reduce_scatter,all_reduce -w 1 -n 3 --backends pccl,pccl:ring,gloo,mpi
$V/pccl-testbed down --prefix plat > /dev/null 2>&1; date; echo ALL DONE
