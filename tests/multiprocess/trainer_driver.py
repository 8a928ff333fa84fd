"""An ordinary Hugging Face ``Trainer`` script: a tiny GPT-2 built from a config (nothing downloaded), trained on CPU
for a few steps with DDP under torchrun. It names no backend and does not import pccl_torch to train:

    torchrun --standalone --nproc-per-node 2 trainer_driver.py --output-dir OUT                    # gloo
    torchrun --standalone --nproc-per-node 2 -m pccl_torch.run trainer_driver.py --output-dir OUT  # pccl

After training, every rank writes its result (``rank_result``) after ``destroy_process_group()``: the Trainer's
per-step losses and gradient norms, the default group's type, and, when pccl_torch was imported (by
``pccl_torch.run``), pccl's counters.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script by torchrun or pccl_torch.run
import rank_result  # noqa: E402

VOCAB, CONTEXT = 64, 16


class TokenData(torch.utils.data.Dataset):
    """Fixed random token sequences (the same on every rank; the Trainer's sampler shards them)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.tokens = torch.randint(0, VOCAB, (n, CONTEXT), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    training = TrainingArguments(
        output_dir=args.output_dir, use_cpu=True, max_steps=args.steps, per_device_train_batch_size=4,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, ddp_find_unused_parameters=False, seed=0,
    )
    trainer = Trainer(model=model, args=training, train_dataset=TokenData(8 * args.steps))
    trainer.train()

    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    result: dict = {"losses": [e["loss"] for e in logged], "grad_norms": [e["grad_norm"] for e in logged],
                    "group": type(dist.group.WORLD).__name__,
                    "backend": dist.get_backend(), "world_size": dist.get_world_size()}
    pccl = sys.modules.get("pccl_torch")
    if pccl is not None:  # imported by `python -m pccl_torch.run`, not by this script
        everything = pccl.stats("all")
        result.update(calls=everything["calls"], bypassed=everything["bypassed"])
    dist.destroy_process_group()
    rank_result.write(result)
    if pccl is None:  # the gloo baseline: the wait at exit that `import pccl_torch` registers for pccl's run (torch
        # 2.13's gloo workers, still held by the Trainer's DDP model, can abort a finalizing interpreter: seen once)
        from pccl_torch.gloo_exit import drain_gloo_workers

        drain_gloo_workers()


if __name__ == "__main__":
    main()
