"""The wire formats on real training tensors: the example GPT (examples/gpt) trained for a few steps in one
process, then its flattened weights and gradients (float32, and the same cast to bfloat16) encoded by each
format: the lossless compression ratio, encode and decode throughput, and each lossy format's maximum
error relative to the largest magnitude of the tensor and per element.

    python benchmarks/bench_wire_formats.py --n-layer 4 --n-embd 256 --steps 20

With ``--link-mbit R`` it also prints what a lossless all-gather of these bytes would gain on a link of R
Mbit/s if the time were wire time plus encode and decode (an estimate; the testbed runs measure it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "gpt"))

from data import VOCAB_SIZE, get_batch, load_splits  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

from pccl_torch.compression import FORMATS  # noqa: E402


def trained_tensors(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB_SIZE, block_size=64, n_layer=args.n_layer, n_head=4, n_embd=args.n_embd))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data, g = load_splits().train, torch.Generator().manual_seed(0)
    for _ in range(args.steps):
        x, y = get_batch(data, 8, 64, g)
        optimizer.zero_grad()
        model(x, y)[1].backward()
        optimizer.step()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return {"weights fp32": weights, "grads fp32": grads,
            "weights bf16": weights.to(torch.bfloat16), "grads bf16": grads.to(torch.bfloat16)}


def timed(fn, repeat: int = 3) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20, help="training steps before the tensors are taken")
    parser.add_argument("--link-mbit", type=float, default=200.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tensors = trained_tensors(args)
    print(f"# GPT n_layer={args.n_layer} n_embd={args.n_embd}, {tensors['weights fp32'].numel()} parameters, "
          f"after {args.steps} steps; one thread")
    print("| tensor | format | wire/raw | encode MB/s | decode MB/s | max err / max abs | max rel err (|x| > 1e-3 max) |")
    print("|---|---|---|---|---|---|---|")
    link = args.link_mbit * 1e6 / 8
    for label, x in tensors.items():
        raw = x.numel() * x.element_size()
        for fmt in FORMATS.values():
            if not fmt.applies_to(x.dtype):
                continue
            wire = fmt.encode(x)
            out = torch.empty_like(x)
            fmt.decode(wire, out)
            enc, dec = timed(lambda: fmt.encode(x)), timed(lambda: fmt.decode(wire, out))
            err = (out.double() - x.double()).abs()
            scale = x.double().abs().max().item()
            big = x.double().abs() > 1e-3 * scale
            rel = (err[big] / x.double().abs()[big]).max().item() if big.any() else 0.0
            if fmt.lossless:
                assert torch.equal(out.view(torch.uint8), x.view(torch.uint8)), "lossless round trip differs"
            line = (f"| {label} | {fmt.name} | {wire.numel() / raw:.3f} | {raw / enc / 1e6:.0f} | {raw / dec / 1e6:.0f} "
                    f"| {err.max().item() / scale:.2e} | {rel:.2e} |")
            if fmt.lossless:
                exact_s, lossless_s = raw / link, wire.numel() / link + enc + dec
                line += f" est. {exact_s / lossless_s:.2f}x at {args.link_mbit:g} Mbit/s"
            print(line)


if __name__ == "__main__":
    main()
