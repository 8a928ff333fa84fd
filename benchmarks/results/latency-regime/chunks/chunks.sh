#!/bin/bash
# hier:pipelined by chunk count beside hier:mpi, 4 x 2, 1 Gbit/s, no added delay and RTT 1 ms (corrected relay):
# where does cutting a call into chunks pay on 8 ranks of 2 cores?
set -u
V=/work/main/.venv/bin; F=${F:-/tmp/s28/chunks}; cd $F
for delay in ${DELAYS:-none 1ms}; do
  $V/pccl-testbed down --prefix plat >/dev/null 2>&1
  if [ $delay = none ]; then d=""; else d="--delay $delay"; fi
  $V/pccl-testbed up --prefix plat --nodes 4 --rate 1gbit $d > up-$delay.log 2>&1; tail -1 up-$delay.log
  $V/pccl-testbed probe --prefix plat --ppn 1 > probe-$delay.txt 2>&1
  for c in 2 4 8 16; do
    PCCL_PIPELINE_CHUNKS=$c $V/pccl-bench --testbed plat -np 8 --local-size 2 -b 4M -e 16M -f 4 -w 1 -n 5 --check \
      -c all_gather,reduce_scatter,all_reduce --backends pccl:hier:mpi,pccl:hier:pipelined \
      --json c$c-$delay.json > c$c-$delay.log 2>&1; echo "chunks $c $delay rc=$? $(date +%T)"
  done
done
$V/pccl-testbed down --prefix plat > /dev/null 2>&1; echo ALL DONE
