#!/bin/bash
cd /work/main
B=.venv/bin
$B/pccl-testbed up --nodes 2 --rate 1gbit > /dev/null 2>&1
pids=""
for i in 1 2 3 4; do ( while :; do :; done ) & pids="$pids $!"; done
for k in 1 2 4 8; do
  PCCL_PIPELINE_CHUNKS=$k $B/pccl-bench --testbed -np 4 --local-size 2 -c all_gather,reduce_scatter -b 4M -e 16M -f 4 \
    --iter-budget 64M --backends pccl:hier:pipelined,pccl:hier:mpi --check --no-progress --json /tmp/busy/busy4-n2-k$k.json > /tmp/busy/busy4-n2-k$k.txt 2>&1
  echo "k$k rc $?"
done
kill $pids
$B/pccl-testbed down > /dev/null 2>&1
echo done
