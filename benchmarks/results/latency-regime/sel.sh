#!/bin/bash
# Selection under latency: pccl auto against its forced plans and the baselines, one collective a launch.
set -u
out=${1:?outdir}; mkdir -p "$out"; cd "$out"
B=/work/main/.venv/bin/pccl-bench
common="--testbed plat -np 8 --local-size 2 -b 64K -e 16M -f 4 -w 1 -n ${N:-3} --check"
$B $common -c all_gather --backends pccl,pccl:mpi,pccl:hier:bruck,pccl:hier:mpi,pccl:hier:ring,pccl:hier:pipelined,gloo,mpi --json ag.json > ag.log 2>&1
$B $common -c reduce_scatter --backends pccl,pccl:mpi,pccl:hier:recursive_halving,pccl:hier:mpi,pccl:hier:ring,pccl:hier:pipelined,gloo,mpi --json rs.json > rs.log 2>&1
$B $common -c all_reduce --backends pccl,pccl:mpi,pccl:hier:recursive_doubling,pccl:hier:mpi,pccl:hier:rabenseifner,pccl:hier:pipelined,gloo,mpi --json ar.json > ar.log 2>&1
