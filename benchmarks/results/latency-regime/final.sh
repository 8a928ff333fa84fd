#!/bin/bash
# Issue 58 measurements, one after another on a quiet machine.
set -u
V=/work/main/.venv/bin
F=/tmp/lat/final
up() { $V/pccl-testbed down --prefix plat >/dev/null 2>&1; $V/pccl-testbed up --prefix plat "$@" > $F/up-$tag.log 2>&1; tail -1 $F/up-$tag.log;
       $V/pccl-testbed probe --prefix plat --ppn 1 > $F/probe-$tag.txt 2>&1; grep -i "rtt\|between" $F/probe-$tag.txt | head -3; }
bench() { $V/pccl-bench --testbed plat "$@" --check --json $F/$tag.json > $F/$tag.log 2>&1; echo "$tag rc=$?"; }
ALL4=all_gather,reduce_scatter,all_reduce,all_to_all
date
# 1. 4 x 2, 1 Gbit/s, RTT 20 ms: auto against its forced plans and the baselines
tag=4x2-1g-20ms; up --nodes 4 --rate 1gbit --delay 20ms
N=5 /tmp/lat/sel.sh $F/sel-4x2-1g-20ms; echo "sel done"; date
tag=4x2-1g-20ms-a2a; bench -np 8 --local-size 2 -b 64K -e 16M -f 4 -c all_to_all -w 1 -n 5 --backends pccl,pccl:hier:mpi,pccl:hier:pairwise,pccl:pairwise,gloo,mpi
# 2. 8 x 1 at 20 ms (flat: pccl's own schedules over MPI)
tag=8x1-1g-20ms; up --nodes 8 --rate 1gbit --delay 20ms
bench -np 8 --local-size 1 -b 64K -e 16M -f 4 -c $ALL4 -w 1 -n 5 --backends pccl,gloo,mpi; date
# 3. 4 x 2 and 8 x 1 at 1 ms
tag=8x1-1g-1ms; up --nodes 8 --rate 1gbit --delay 1ms
bench -np 8 --local-size 1 -b 64K -e 16M -f 4 -c $ALL4 -w 1 -n 5 --backends pccl,gloo,mpi
tag=scale-8n-1ms; bench -np 16 --local-size 2 -b 1M -e 16M -f 16 -c all_gather,reduce_scatter,all_reduce -w 1 -n 3 --backends pccl,pccl:ring,gloo,mpi; date
tag=4x2-1g-1ms; up --nodes 4 --rate 1gbit --delay 1ms
bench -np 8 --local-size 2 -b 64K -e 16M -f 4 -c $ALL4 -w 1 -n 5 --backends pccl,gloo,mpi
tag=scale-4n-1ms; bench -np 8 --local-size 2 -b 1M -e 16M -f 16 -c all_gather,reduce_scatter,all_reduce -w 1 -n 3 --backends pccl,pccl:ring,gloo,mpi
tag=scale-2n-1ms; up --nodes 2 --rate 1gbit --delay 1ms
bench -np 4 --local-size 2 -b 1M -e 16M -f 16 -c all_gather,reduce_scatter,all_reduce -w 1 -n 3 --backends pccl,pccl:ring,gloo,mpi; date
# 4. 4 x 2 at 200 Mbit/s, RTT 20 ms
tag=4x2-200m-20ms; up --nodes 4 --rate 200mbit --delay 20ms
bench -np 8 --local-size 2 -b 64K -e 16M -f 4 -c $ALL4 -w 1 -n 3 --backends pccl,gloo,mpi; date
$V/pccl-testbed down --prefix plat > /dev/null 2>&1
# 5. GPT ZeRO-3 on 2 x 2, 200 Mbit/s, RTT 20 ms
cd /work/main && $V/python examples/gpt/demo.py --testbed 200mbit --delay 20ms --frameworks deepspeed --steps 30 --n-layer 4 --n-embd 256 \
   --compression all_gather:int8,reduce_scatter:bf16,all_reduce:bf16 --out $F/gpt > $F/gpt.log 2>&1; echo "gpt rc=$?"; date
echo ALL DONE
