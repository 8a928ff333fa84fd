"""The mixture-of-experts example (examples/gpt/moe.py, train_moe.py) on real ranks; every rank writes its
result (rank_result) after its teardown.

    mpiexec -n 4 python tests/multiprocess/moe_driver.py grads --backend pccl
    mpiexec -n 4 python tests/multiprocess/moe_driver.py train --comm pccl --steps 4 ...   # train_moe.py's flags
    torchrun --standalone --nproc-per-node 4 tests/multiprocess/moe_driver.py train --comm gloo ...

``grads``: one forward and backward of a distributed MoE layer (float64, a different number of tokens on each
rank) against the same layer whole in one process on every rank's tokens: outputs, input gradients, each
rank's experts' gradients and the router's gradient summed over ranks must agree.

``train``: ``train_moe.main`` with the given flags; the result carries this rank's losses and, for a ``pccl``
default group, read just before the teardown, the all-to-alls pccl's communicator ran and the calls the group
handed to gloo.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

import pccl_torch  # noqa: F401 - registers the "pccl" backend
from pccl_torch.integrations import torch_backend

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "gpt"
sys.path.insert(0, str(EXAMPLES))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import rank_result  # noqa: E402
import train_moe  # noqa: E402
from moe import MoE  # noqa: E402

N_EMBD, N_EXPERTS = 8, 8


def _max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def grads(backend: str) -> dict:
    torch.manual_seed(0)
    whole = MoE(N_EMBD, N_EXPERTS).double()  # before init_process_group: one process, every expert
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    layer = MoE(N_EMBD, N_EXPERTS).double()  # this rank's share of the same experts
    g = torch.Generator().manual_seed(1)
    tokens = [5 + 3 * r for r in range(world)]  # uneven on purpose
    xs = [torch.randn(t, N_EMBD, generator=g, dtype=torch.float64) for t in tokens]
    ws = [torch.randn(t, N_EMBD, generator=g, dtype=torch.float64) for t in tokens]

    x = xs[rank].clone().requires_grad_()
    sent: list[list[int]] = []
    original = dist.all_to_all_single

    def recording(output, input, output_split_sizes=None, input_split_sizes=None, **kwargs):
        if input_split_sizes is not None:
            sent.append(list(input_split_sizes))  # what the layer sent: the splits it computed
        return original(output, input, output_split_sizes, input_split_sizes, **kwargs)

    dist.all_to_all_single = recording
    try:
        y = layer(x)
        (y * ws[rank]).sum().backward()
    finally:
        dist.all_to_all_single = original
    router = layer.router.weight.grad.clone()
    dist.all_reduce(router)  # each rank's router gradient comes from its own tokens only

    big = torch.cat(xs).requires_grad_()
    big_y = whole(big)
    (big_y * torch.cat(ws)).sum().backward()
    rows = slice(sum(tokens[:rank]), sum(tokens[:rank + 1]))
    mine = slice(rank * layer.n_local, (rank + 1) * layer.n_local)
    errors = {
        "output": _max_error(y.detach(), big_y.detach()[rows]),
        "input_grad": _max_error(x.grad, big.grad[rows]),
        "router_grad": _max_error(router, whole.router.weight.grad),
        **{f"expert_{name}_grad": _max_error(getattr(layer.experts, name).grad, getattr(whole.experts, name).grad[mine])
           for name in ("w_fc", "b_fc", "w_proj", "b_proj")},
    }
    expert_grad_norm = float(sum(p.grad.norm() for p in layer.experts.parameters()))
    dist.destroy_process_group()
    return {"errors": errors, "splits": sent, "n_local": layer.n_local, "expert_grad_norm": expert_grad_norm}


def _pccl_view() -> dict:
    """What pccl's world group did: the all-to-alls its communicator ran and the calls it handed to gloo."""
    if not isinstance(dist.group.WORLD, torch_backend.PcclProcessGroup):
        return {}
    group = dist.group.WORLD
    return {"pccl_all_to_all_calls": torch_backend.communicator_of(group).stats.calls.get("all_to_all", 0),
            "bypassed": dict(torch_backend.bypassed(group)), "delegated": dict(group.delegated),
            # whether this build of the backend serves all_to_all_single itself (before it did, gloo did)
            "backend_serves_all_to_all": "alltoall_base" not in torch_backend.DELEGATED}


def train(argv: list[str]) -> dict:
    seen: dict = {}
    close = harness.close

    def close_after_reading() -> None:  # read the group's counters while it exists, then tear down as usual
        seen.update(_pccl_view())
        close()

    harness.close = close_after_reading
    result = train_moe.main(argv)
    return {"losses": [s.loss for s in result.steps], "val_loss": result.val_loss,
            "all_to_all_calls": [s.comm["all_to_all"]["calls"] for s in result.steps],
            "algorithms": result.algorithms, **seen}


def main() -> None:
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "grads":
        backend = rest[rest.index("--backend") + 1] if "--backend" in rest else "gloo"
        result = grads(backend)
    elif mode == "train":
        result = train(rest)
    else:
        raise SystemExit(f"unknown mode {mode!r}: grads or train")
    rank_result.write(result)


if __name__ == "__main__":
    main()
