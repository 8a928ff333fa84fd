#!/bin/bash
set -u
V=/work/main/.venv/bin; F=/tmp/lat/final2; mkdir -p $F
up() { $V/pccl-testbed down --prefix plat >/dev/null 2>&1; $V/pccl-testbed up --prefix plat "$@" > $F/up-$tag.log 2>&1; tail -1 $F/up-$tag.log;
       $V/pccl-testbed probe --prefix plat --ppn 1 > $F/probe-$tag.txt 2>&1; }
bench() { $V/pccl-bench --testbed plat "$@" --check --json $F/$tag.json > $F/$tag.log 2>&1; echo "$tag rc=$?"; }
date
tag=4x2-1g-20ms; up --nodes 4 --rate 1gbit --delay 20ms
N=5 /tmp/lat/sel.sh $F/sel-4x2-1g-20ms; echo "sel done"; date
tag=4x2-1g-20ms-a2a; bench -np 8 --local-size 2 -b 64K -e 16M -f 4 -c all_to_all -w 1 -n 5 --backends pccl,pccl:mpi,pccl:hier:mpi,pccl:hier:pairwise,pccl:vendor,gloo,mpi
tag=8x1-1g-20ms-a2a; up --nodes 8 --rate 1gbit --delay 20ms
bench -np 8 --local-size 1 -b 64K -e 16M -f 4 -c all_to_all -w 1 -n 5 --backends pccl,pccl:mpi,pccl:vendor,gloo,mpi
$V/pccl-testbed down --prefix plat > /dev/null 2>&1; date; echo ALL DONE
