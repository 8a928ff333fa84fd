#!/usr/bin/env bash
# One short GPU check (for the device tool's machine): the Triton kernels compiled on CUDA against their
# torch references, then bench_kernels.py on CUDA (GB/s and ratio to copy_). Writes under ${OUT:-out}/.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
python -m pip install --quiet -e '.[dev,triton]' 2>&1 | tail -2
python - <<'PY'
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY
unset TRITON_INTERPRET
python -m pytest -q tests/kernels 2>&1 | tee "$OUT/kernel_tests.txt" | tail -5
python benchmarks/bench_kernels.py --device cuda -b 4K -e 256M -f 4 --json "$OUT/bench_kernels.json" | tee "$OUT/bench_kernels.txt"
