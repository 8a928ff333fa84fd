#!/bin/bash
# The ZeRO-3 GPT on a running testbed (pccl-testbed up --nodes 2 --rate 1gbit; root): pccl's automatic choice
# against fixed PCCL_ALGO settings and online tuning (cold, then from its cache), 100 steps each, JSON into
# out/gpt-algos/; then: python scripts/gpt_step_summary.py out/gpt-algos/*.json (docs/testbed/tuning/README.md).
set -u
cd "$(dirname "$0")/.."
export TORCH_EXTENSIONS_DIR=$PWD/.cache/torch_extensions DS_ACCELERATOR=cpu
OUT=out/gpt-algos; mkdir -p $OUT
run() {  # name, then env assignments
  name=$1; shift
  echo "== $name $(date +%T)"
  env "$@" timeout 600 .venv/bin/pccl-testbed run -np 4 --ppn 2 -- $PWD/.venv/bin/python examples/gpt/train_deepspeed.py \
      --comm_backend pccl --steps 100 --log-every 50 --n-layer 4 --n-embd 256 --json $OUT/$name.json </dev/null > $OUT/$name.log 2>&1
  echo "rc=$? $(grep -m1 'summary' -A1 $OUT/$name.log | tail -1)"
}
run auto PCCL_TUNE=off
run fixed-hier-pipelined PCCL_TUNE=off PCCL_ALGO=all_gather:hier:pipelined,reduce_scatter:hier:pipelined,all_reduce:hier:pipelined
run fixed-hier-mpi PCCL_TUNE=off PCCL_ALGO=all_gather:hier:mpi,reduce_scatter:hier:mpi,all_reduce:hier:mpi
run fixed-mpi PCCL_TUNE=off PCCL_ALGO=all_gather:mpi,reduce_scatter:mpi,all_reduce:mpi
run fixed-hier-ring PCCL_TUNE=off PCCL_ALGO=all_gather:hier:ring,reduce_scatter:hier:ring,all_reduce:hier:ring
TUNE_CACHE=$(mktemp -u --suffix .json /tmp/pccl-gpt-tune.XXXXXX)
run online-cold PCCL_TUNE=online PCCL_TUNE_CACHE=$TUNE_CACHE
run online-warm PCCL_TUNE=online PCCL_TUNE_CACHE=$TUNE_CACHE
run auto-again PCCL_TUNE=off
echo done $(date +%T)
