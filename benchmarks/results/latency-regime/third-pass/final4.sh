#!/bin/bash
# Issue 58, session 27, with the relay in the real-time class: 8 x 1 and 4 x 2 at RTT 20 ms, 4 x 2 at RTT 1 ms (the
# model's rows), 8 x 1 at 200 Mbit/s, 4 x 2 at RTT 5 ms. One after another.
set -u
V=/work/main/.venv/bin; F=/tmp/lat/s27/final4; mkdir -p $F; cd $F
up() { $V/pccl-testbed down --prefix plat >/dev/null 2>&1; $V/pccl-testbed up --prefix plat "$@" > up-$tag.log 2>&1; tail -1 up-$tag.log;
       $V/pccl-testbed probe --prefix plat --ppn 1 > probe-$tag.txt 2>&1; $V/pccl-testbed status --prefix plat | grep relay; }
bench() { $V/pccl-bench --testbed plat "$@" --check --json $tag.json > $tag.log 2>&1; echo "$tag rc=$? $(date +%T)"; }
ALL4=all_gather,reduce_scatter,all_reduce,all_to_all
date
tag=8x1-1g-20ms; up --nodes 8 --rate 1gbit --delay 20ms
bench -np 8 --local-size 1 -b 4K -e 64M -f 4 -c $ALL4 -w 1 -n 5 --backends pccl,gloo,mpi
tag=4x2-1g-20ms; up --nodes 4 --rate 1gbit --delay 20ms
N=5 /tmp/lat/sel.sh $F/sel-4x2-1g-20ms; echo "sel rc=$? $(date +%T)"
tag=4x2-1g-20ms-a2a-4k-64m; bench -np 8 --local-size 2 -b 4K -e 64M -f 4 -c $ALL4 -w 1 -n 3 --backends pccl,gloo,mpi
tag=4x2-1g-1ms; up --nodes 4 --rate 1gbit --delay 1ms
bench -np 8 --local-size 2 -b 64K -e 16M -f 4 -c $ALL4 -w 1 -n 5 --backends pccl,gloo,mpi
tag=8x1-200m-20ms; up --nodes 8 --rate 200mbit --delay 20ms
bench -np 8 --local-size 1 -b 64K -e 16M -f 4 -c all_gather,reduce_scatter,all_reduce -w 1 -n 3 --backends pccl,pccl:mpi,pccl:vendor,gloo,mpi
tag=4x2-1g-5ms; up --nodes 4 --rate 1gbit --delay 5ms
bench -np 8 --local-size 2 -b 64K -e 16M -f 4 -c all_gather,reduce_scatter,all_reduce -w 1 -n 3 --backends pccl,pccl:mpi,pccl:hier:mpi,pccl:hier:pipelined,pccl:hier:bruck,pccl:hier:recursive_halving,pccl:hier:recursive_doubling,gloo,mpi
$V/pccl-testbed down --prefix plat > /dev/null 2>&1
date; echo ALL DONE
